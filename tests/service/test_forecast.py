"""POST /v1/forecast: shapes, the model that answered, merged batches, attention."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

from forecaster import Forecaster
from forecaster.synthetic import generate_synthetic
from service.model_manager import ModelIdentity, StaticSource
from tests.service.conftest import glitch_count, series_payload, tiny_config

CONTEXT, HORIZON = 48, 12  # the tiny model of conftest.py


def test_forecast_matches_in_process_predict(client, history, payload, fitted):
    ids = ["series_000", "series_002"]
    body = {"series": [payload(sid) for sid in ids]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["model"] == {
        "name": "forecaster",
        "version": "3",
        "alias": "champion",
        "run_id": "run-abc",
    }
    assert out["horizon"] == HORIZON
    assert out["quantiles"] == [0.1, 0.5, 0.9]
    expected = fitted.predict(history[history["unique_id"].isin(ids)])
    for forecast in out["forecasts"]:
        mine = expected[expected["unique_id"] == forecast["id"]]
        assert forecast["timestamps"] == [t.isoformat() for t in mine["ds"]]
        np.testing.assert_allclose(forecast["mean"], mine["mean"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(forecast["quantiles"]["0.9"], mine["q0.9"], rtol=1e-5, atol=1e-5)
    assert [f["id"] for f in out["forecasts"]] == ids


def test_start_and_freq_instead_of_timestamps(client, history, payload):
    with_ts = payload("series_001")
    with_start = {
        "id": "series_001",
        "start": with_ts["timestamps"][0],
        "freq": "h",
        "values": with_ts["values"],
    }
    a = client.post("/v1/forecast", json={"series": [with_ts]}).json()
    b = client.post("/v1/forecast", json={"series": [with_start]}).json()
    assert a["forecasts"] == b["forecasts"]


def test_horizon_and_quantile_subset(client, history, payload):
    body = {"horizon": 5, "quantiles": [0.9], "series": [payload("series_001")]}
    out = client.post("/v1/forecast", json=body).json()
    forecast = out["forecasts"][0]
    assert out["horizon"] == 5 and out["quantiles"] == [0.9]
    assert len(forecast["timestamps"]) == len(forecast["mean"]) == 5
    assert list(forecast["quantiles"]) == ["0.9"]


def test_include_attention(client, history, payload, fitted):
    body = {"include_attention": True, "series": [payload("series_003")]}
    out = client.post("/v1/forecast", json=body).json()
    attention = out["forecasts"][0]["attention"]
    n_tokens = fitted.model_config.n_patches
    encoder = np.asarray(attention["encoder"][0])  # (heads, N, N)
    assert encoder.shape == (fitted.model_config.n_heads, n_tokens, n_tokens)
    np.testing.assert_allclose(encoder.sum(axis=-1), 1.0, atol=n_tokens * 5e-5)
    assert np.asarray(attention["cross"][0]).shape[-1] == n_tokens
    assert attention["patch_length"] == fitted.model_config.patch_length
    # The model's own maps, to the 4 decimals the response carries.
    maps = fitted.attention(history[history["unique_id"] == "series_003"])
    for name in ("encoder", "decoder_self", "cross"):
        for got, want in zip(attention[name], getattr(maps, name), strict=True):
            np.testing.assert_allclose(np.asarray(got), want[0], atol=5e-5 + 1e-6)


def test_concurrent_requests_are_merged_and_each_gets_its_own_answer(make_client, history, payload):
    # A long wait lets the batcher gather concurrent requests into one forward pass.
    client = make_client(max_batch_wait_ms=200)
    requests = [{"horizon": 3 + i % 4, "series": [payload(f"series_00{i % 4}")]} for i in range(8)]
    alone = [client.post("/v1/forecast", json=r).json() for r in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda r: client.post("/v1/forecast", json=r).json(), requests))
    for a, b in zip(alone, together, strict=True):
        assert a["horizon"] == b["horizon"]
        assert a["forecasts"][0]["id"] == b["forecasts"][0]["id"]
        np.testing.assert_allclose(a["forecasts"][0]["mean"], b["forecasts"][0]["mean"], atol=1e-5)
    metrics = client.get("/metrics").text
    merged = [
        line for line in metrics.splitlines() if line.startswith("forecaster_batch_requests_bucket")
    ]
    # Some batch held more than one request: the le="1.0" bucket is below the total count.
    le1 = next(float(x.split()[-1]) for x in merged if 'le="1.0"' in x)
    count = next(
        float(x.split()[-1])
        for x in metrics.splitlines()
        if x.startswith("forecaster_batch_requests_count")
    )
    assert le1 < count


def test_a_bad_request_in_a_merged_batch_fails_alone(make_client, history, payload):
    client = make_client(max_batch_wait_ms=200)
    good = {"series": [payload("series_000")]}
    bad_series = payload("series_001")
    bad_series["values"] = [None] * len(bad_series["values"])  # nothing observed: no forecast
    bad = {"series": [bad_series]}
    with ThreadPoolExecutor(6) as pool:
        responses = list(
            pool.map(lambda r: client.post("/v1/forecast", json=r), [good, bad, good] * 2)
        )
    assert [r.status_code for r in responses] == [200, 422, 200] * 2
    detail = responses[1].json()
    assert detail["series_id"] == "series_001"
    assert detail["field"] == "series[0].values"
    assert "series_001" in detail["detail"]


def test_a_glitch_is_ignored_and_named_in_the_response(client, payload):
    """One reading ten times too high forecasts as if it had been sent as null, and the
    response names its timestamp, so the caller sees which reading was not used."""
    glitched, missing = payload("series_000"), payload("series_000")
    step = CONTEXT - 10
    before = glitch_count(client, "online")
    glitched["values"][step] *= 10
    missing["values"][step] = None
    clean = client.post("/v1/forecast", json={"series": [payload("series_000")]}).json()
    out = client.post("/v1/forecast", json={"series": [glitched]}).json()["forecasts"][0]
    gap = client.post("/v1/forecast", json={"series": [missing]}).json()["forecasts"][0]
    assert out["glitches"] == [glitched["timestamps"][step]]
    assert clean["forecasts"][0]["glitches"] == [] and gap["glitches"] == []
    assert out["mean"] == gap["mean"] and out["quantiles"] == gap["quantiles"]
    # Operators see the rate in /metrics: one more reading masked.
    assert glitch_count(client, "online") == before + 1


def test_history_longer_than_context_uses_the_latest_points(client, history, payload, fitted):
    body = {"series": [payload("series_000", n=2 * CONTEXT)]}
    out = client.post("/v1/forecast", json=body).json()
    expected = fitted.predict(history[history["unique_id"] == "series_000"].tail(CONTEXT))
    np.testing.assert_allclose(out["forecasts"][0]["mean"], expected["mean"], atol=1e-5)


@pytest.mark.parametrize("tz", ["+00:00", "+02:00"])
def test_aware_timestamps_are_read_as_utc(client, history, payload, tz):
    series = payload("series_000")
    series["timestamps"] = [t + tz for t in series["timestamps"]]
    response = client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 200, response.text
    first = pd.Timestamp(response.json()["forecasts"][0]["timestamps"][0])
    last_given = pd.Timestamp(series["timestamps"][-1]).tz_convert("UTC").tz_localize(None)
    assert first == last_given + pd.Timedelta(hours=1)


@pytest.fixture(scope="module")
def daily_model() -> Forecaster:
    model_config, train_config = tiny_config()
    frame = generate_synthetic(n_series=1, n_steps=120, freq="D", start="2024-01-01", seed=3)
    return Forecaster(model_config, train_config).fit(frame)


def _daily_request(local_dates: bool) -> dict:
    # 48 Berlin midnights across the March change: offsets +01:00, then +02:00 from 31 March.
    days = pd.date_range("2024-03-10", periods=CONTEXT, freq="D")
    stamps = days if local_dates else days.tz_localize("Europe/Berlin")
    values = np.sin(np.arange(CONTEXT) * 2 * np.pi / 7).tolist()
    return {"id": "s", "timestamps": [t.isoformat() for t in stamps], "values": values}


def test_daily_timestamps_with_offsets_across_dst_are_local_dates(make_client, daily_model):
    client = make_client(source=StaticSource(daily_model, ModelIdentity("forecaster", "9")))
    aware = _daily_request(local_dates=False)
    assert aware["timestamps"][0].endswith("+01:00") and aware["timestamps"][-1].endswith("+02:00")
    response = client.post("/v1/forecast", json={"series": [aware]})
    assert response.status_code == 200, response.text
    naive = client.post("/v1/forecast", json={"series": [_daily_request(local_dates=True)]})
    assert response.json()["forecasts"] == naive.json()["forecasts"]
    assert response.json()["forecasts"][0]["timestamps"][0] == "2024-04-27T00:00:00"


def test_daily_start_with_an_offset_is_a_local_date(make_client, daily_model):
    client = make_client(source=StaticSource(daily_model, ModelIdentity("forecaster", "9")))
    explicit = _daily_request(local_dates=True)
    with_start = {
        "id": "s",
        "start": "2024-03-10T00:00:00+01:00",
        "freq": "D",
        "values": explicit["values"],
    }
    a = client.post("/v1/forecast", json={"series": [explicit]})
    b = client.post("/v1/forecast", json={"series": [with_start]})
    assert b.status_code == 200, b.text
    assert a.json()["forecasts"] == b.json()["forecasts"]


def test_a_model_fitted_on_utc_midnights_in_a_local_zone_reads_requests_in_utc(make_client):
    """UTC midnights shown in Berlin (01:00, 02:00 in summer) are daily in UTC, so fit reads
    them there; the service read a request's on the wall clock, as daily models read aware
    data, and refused the model's own data as off the daily grid."""
    model_config, train_config = tiny_config()
    frame = generate_synthetic(n_series=1, n_steps=120, freq="D", start="2024-01-01", seed=3)
    shown = frame.assign(ds=frame["ds"].dt.tz_localize("UTC").dt.tz_convert("Europe/Berlin"))
    model = Forecaster(model_config, train_config).fit(shown)
    client = make_client(source=StaticSource(model, ModelIdentity("forecaster", "9")))
    part = shown.tail(CONTEXT)  # across the March change: +01:00, then +02:00
    series = {
        "id": "s",
        "timestamps": [t.isoformat() for t in part["ds"]],
        "values": part["y"].tolist(),
    }
    response = client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 200, response.text
    expected = model.predict(frame.tail(CONTEXT))  # the same days, naive UTC
    got = response.json()["forecasts"][0]
    assert got["timestamps"] == [t.isoformat() for t in expected["ds"]]
    np.testing.assert_allclose(got["mean"], expected["mean"], atol=1e-5)


def test_sub_second_steps_keep_their_fractions(client, payload):
    """Timestamps are written to the precision they carry: a history stamped half a second
    past the hour is forecast half a second past the hour, on both routes."""
    series = payload("series_001")
    stamps = pd.to_datetime(series["timestamps"]) + pd.Timedelta(milliseconds=500)
    series["timestamps"] = [t.isoformat() for t in stamps]
    response = client.post("/v1/forecast", json={"horizon": 2, "series": [series]})
    assert response.status_code == 200, response.text
    expected = [(stamps[-1] + pd.Timedelta(hours=h)).isoformat() for h in (1, 2)]
    assert response.json()["forecasts"][0]["timestamps"] == expected
    rows = [
        ["series_001", t, v] for t, v in zip(series["timestamps"], series["values"], strict=True)
    ]
    scoring = client.post(
        "/invocations",
        json={
            "dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows},
            "params": {"horizon": 2},
        },
    )
    assert scoring.status_code == 200, scoring.text
    assert [p["ds"] for p in scoring.json()["predictions"]] == expected


def test_attention_of_each_series_starts_at_its_own_context(client, payload):
    """Series that end at different times: each one's maps are placed on its own timeline
    (the tiny model reads CONTEXT steps, so its first token starts at the first value sent)."""
    early = payload("series_001", CONTEXT + 3)
    early["timestamps"], early["values"] = early["timestamps"][:-3], early["values"][:-3]
    body = {"include_attention": True, "series": [payload("series_000"), early]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    starts = [f["attention"]["context_start"] for f in response.json()["forecasts"]]
    assert starts == [payload("series_000")["timestamps"][0], early["timestamps"][0]]


def test_attention_of_a_request_split_into_batches_covers_every_series(
    make_client, history, payload, fitted
):
    """A request of more series than max_batch_size is forecast in chunks; the maps of the
    later chunks' series come with the response as the first chunk's do."""
    client = make_client(max_batch_size=1)
    ids = ["series_000", "series_003"]
    body = {"include_attention": True, "series": [payload(sid) for sid in ids]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    for forecast in response.json()["forecasts"]:
        assert forecast["attention"] is not None, forecast["id"]
        maps = fitted.attention(history[history["unique_id"] == forecast["id"]].tail(CONTEXT))
        got = np.asarray(forecast["attention"]["encoder"][0])
        np.testing.assert_allclose(got, maps.encoder[0][0], atol=5e-5 + 1e-6)


def test_glitches_are_named_on_the_series_that_has_them(client, payload):
    glitched = payload("series_000")
    glitched["values"][CONTEXT - 10] *= 10
    body = {"series": [payload("series_001"), glitched]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    clean, out = response.json()["forecasts"]
    assert clean["glitches"] == []
    assert out["glitches"] == [glitched["timestamps"][CONTEXT - 10]]


def test_a_series_at_a_large_level_is_forecast_from_its_exact_values(client, history, fitted):
    """Values are read as float64, as the library reads them: in float32 (7 digits) a counter
    near 1e8 moving by a few units a step would lose those units and get another forecast."""
    part = history[history["unique_id"] == "series_000"].tail(CONTEXT)
    part = part.assign(y=part["y"] + 1e8)
    series = series_payload(part, "series_000")
    response = client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 200, response.text
    expected = fitted.predict(part)
    np.testing.assert_allclose(
        response.json()["forecasts"][0]["mean"], expected["mean"], rtol=0, atol=1e-3
    )


def test_sub_second_steps_keep_their_fractions_beside_whole_second_series(client, history):
    """/invocations writes every series' timestamps in one column: a series half a second past
    the hour keeps its fraction when another request's series falls on the hour."""
    part = history[history["unique_id"].isin(["series_000", "series_001"])]
    part = part.groupby("unique_id").tail(CONTEXT)
    shifted = part["unique_id"] == "series_001"
    part = part.assign(ds=part["ds"].where(~shifted, part["ds"] + pd.Timedelta(milliseconds=500)))
    rows = [[r.unique_id, r.ds.isoformat(), r.y] for r in part.itertuples()]
    body = {
        "dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows},
        "params": {"horizon": 2},
    }
    response = client.post("/invocations", json=body)
    assert response.status_code == 200, response.text
    got = pd.DataFrame(response.json()["predictions"]).groupby("unique_id")["ds"].apply(list)
    for sid, stamps in got.items():
        last = part.loc[part["unique_id"] == sid, "ds"].iloc[-1]
        assert stamps == [(last + pd.Timedelta(hours=h)).isoformat() for h in (1, 2)], sid
