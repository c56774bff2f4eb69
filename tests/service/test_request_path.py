"""One request path: each request validated alone before it joins a batch, the same rules on
every route, large requests split, timestamps checked against pandas' range, ids kept."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

HORIZON = 12


def _split_body(frame: pd.DataFrame, **params) -> dict:
    rows = [[r.unique_id, r.ds.isoformat(), r.y] for r in frame.itertuples()]
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
    return {**body, "params": params} if params else body


def test_a_malformed_request_fails_alone_in_a_merged_batch(make_client, payload, history):
    # A long batching window so that everything sent together shares forward passes.
    client = make_client(max_batch_wait_ms=200, max_batch_size=512)
    one = history[history["unique_id"] == "series_001"]
    repeated = _split_body(one)
    repeated["dataframe_split"]["columns"] = ["unique_id", "ds", "ds"]
    nested = _split_body(one)
    nested["dataframe_split"]["data"][3][2] = [1.0]

    def good(k: int):
        return client.post("/v1/forecast", json={"series": [payload(f"series_00{k % 4}")]})

    with ThreadPoolExecutor(16) as pool:
        goods = [pool.submit(good, k) for k in range(40)]
        bads = [pool.submit(client.post, "/invocations", json=b) for b in (repeated, nested) * 5]
        good_status = [f.result().status_code for f in goods]
        bad_answers = [f.result() for f in bads]
    assert good_status == [200] * 40
    assert all(r.status_code == 400 for r in bad_answers), [r.text for r in bad_answers]
    assert all(r.headers["content-type"].startswith("application/json") for r in bad_answers)


def test_ids_are_returned_exactly_as_sent(client, payload):
    tricky = ["0\x1fa", "a", "1\x1f", "\x1f"]
    series = [{**payload(f"series_00{k}"), "id": sid} for k, sid in enumerate(tricky)]
    response = client.post("/v1/forecast", json={"series": series})
    assert response.status_code == 200, response.text
    assert [f["id"] for f in response.json()["forecasts"]] == tricky


def test_a_large_request_is_split_and_answers_the_same(make_client, payload, fitted, history):
    client = make_client(max_batch_size=3)  # chunks of 3 and 1 series
    batcher = client.app.state.batcher
    process, batches = batcher.process, []

    def recording(items):
        batches.append([item.n_series for item in items])
        return process(items)

    batcher.process = recording
    ids = [f"series_00{k}" for k in (3, 0, 2, 1)]
    response = client.post("/v1/forecast", json={"series": [payload(sid) for sid in ids]})
    assert response.status_code == 200, response.text
    assert batches == [[3], [1]]
    forecasts = response.json()["forecasts"]
    assert [f["id"] for f in forecasts] == ids
    part = history.groupby("unique_id").tail(48)
    expected = fitted.predict(part[part["unique_id"].isin(ids)])
    for f in forecasts:
        mine = expected[expected["unique_id"] == f["id"]]
        np.testing.assert_allclose(f["mean"], mine["mean"], rtol=1e-5, atol=1e-5)
    split = client.post("/invocations", json=_split_body(part[part["unique_id"].isin(ids)]))
    assert split.status_code == 200, split.text
    assert batches[2:] == [[3], [1]]
    got = pd.DataFrame(split.json()["predictions"])
    assert got["unique_id"].unique().tolist() == sorted(ids)  # the frame's order
    np.testing.assert_allclose(got["mean"], expected["mean"], rtol=1e-5, atol=1e-5)


def test_invocations_is_held_to_the_series_limit_before_any_work(make_client, history):
    client = make_client(max_series_per_request=3)
    frame = history.groupby("unique_id").tail(48)
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    response = client.post(
        "/invocations",
        content=buffer.getvalue(),
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 400, response.text
    assert "max_series_per_request" in response.json()["message"]


def test_invocations_is_held_to_the_history_limit(make_client, history):
    """A series of more rows than max_history_length is refused on /invocations as on
    /v1/forecast, naming the series and its y column."""
    client = make_client(max_history_length=60)
    at_limit = history[history["unique_id"] == "series_000"].tail(60)
    over = history[history["unique_id"] == "series_001"].tail(61)
    response = client.post("/invocations", json=_split_body(pd.concat([at_limit, over])))
    assert response.status_code == 400, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == ("series[1].y", "series_001"), error
    assert "61 history points" in error["message"] and "max_history_length" in error["message"]


def test_attention_has_its_own_series_limit(make_client, payload):
    client = make_client(max_attention_series=1)
    body = {"include_attention": True, "series": [payload("series_000"), payload("series_001")]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422
    assert "max_attention_series" in response.json()["detail"]


def test_timestamps_past_the_nanosecond_range_are_refused_on_every_route(client, history):
    # Valid history whose forecast would run past 2262-04-11 23:47 (it wrapped to 1677).
    late = {"id": "a", "start": "2262-04-11T00:00:00", "freq": "h", "values": [1.0] * 20}
    response = client.post("/v1/forecast", json={"series": [late]})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "series[0].start"
    assert "2262-04-11" in response.json()["detail"]

    one = history[history["unique_id"] == "series_001"]
    body = _split_body(one)
    body["dataframe_split"]["data"][-1][1] = "9016-01-01T00:00:00"
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    assert "1677-09-21" in response.json()["message"] or "9016" in response.json()["message"]

    near_end = one.assign(
        ds=pd.date_range(end="2262-04-11 20:00", periods=len(one), freq="h").as_unit("ns")
    )
    response = client.post("/invocations", json=_split_body(near_end))
    assert response.status_code == 400, response.text
    assert "2262-04-11" in response.json()["message"]


@pytest.mark.parametrize("value", ["abc", 0, -1, 1.5, True])
def test_a_bad_horizon_is_refused_on_every_route(client, payload, history, value):
    forecast = client.post(
        "/v1/forecast", json={"horizon": value, "series": [payload("series_000")]}
    )
    assert forecast.status_code == 422, forecast.text
    one = history[history["unique_id"] == "series_000"].tail(48)
    scoring = client.post("/invocations", json=_split_body(one, horizon=value))
    assert scoring.status_code == 400, scoring.text
    assert "horizon" in scoring.json()["message"]
    files = {"file": ("h.csv", one.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files, data={"horizon": str(value)})
    assert job.status_code == 422, job.text


def test_repeated_quantiles_are_refused_on_every_route(client, payload, history):
    body = {"quantiles": [0.9, 0.9], "series": [payload("series_000")]}
    assert client.post("/v1/forecast", json=body).status_code == 422
    one = history[history["unique_id"] == "series_000"].tail(48)
    scoring = client.post("/invocations", json=_split_body(one, quantiles=[0.9, 0.9]))
    assert scoring.status_code == 400 and "distinct" in scoring.json()["message"]
    files = {"file": ("h.csv", one.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files, data={"quantiles": "0.9,0.9"})
    assert job.status_code == 422


def test_strings_that_cannot_be_encoded_or_stored_get_json_4xx(client, payload):
    surrogate = (
        '{"series": [{"id": "\\ud800", "start": "2024-01-01", "freq": "h", "values": [1, 2]}]}'
    )
    response = client.post(
        "/v1/forecast", content=surrogate, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")
    huge_body = client.post(
        "/v1/forecast",
        content=(
            '{"series": [{"id": "a", "start": "2024-01-01", "freq": "h", "values": [1, '
            + "9" * 400
            + "]}]}"
        ),
        headers={"content-type": "application/json"},
    )
    assert huge_body.status_code == 422, huge_body.text
    for path in ("a\x00b.csv", "x" * 300 + ".csv"):
        response = client.post("/v1/batch-jobs", json={"path": path})
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "path"


def test_an_unexpected_error_is_a_json_500_with_a_request_id(client, fitted, payload):
    class Broken(type(fitted)):
        def forecast(self, inputs):
            raise RuntimeError("boom")

    broken = Broken(fitted.model_config, fitted.train_config)
    broken.model, broken.freq = fitted.model, fitted.freq
    manager = client.app.state.manager
    served = manager.current
    manager.current = type(served)(broken, served.identity, served.loaded_at)
    response = client.post("/v1/forecast", json={"series": [payload("series_000")]})
    assert response.status_code == 500
    body = response.json()
    assert body["error"] == "internal_error" and len(body["request_id"]) == 32
    assert response.headers["x-request-id"] == body["request_id"]
    manager.current = served
    assert client.post("/v1/forecast", json={"series": [payload("series_000")]}).is_success


def _set_cells(split: dict, column: int, cell) -> None:
    for row in split["data"]:
        row[column] = cell(row[column])


# Each change of a well-formed dataframe_split body (body, split) -> None, by name.
DAMAGES = {
    "none": lambda body, split: None,
    "repeated column": lambda body, split: split.update(columns=["unique_id", "ds", "ds"]),
    "short row": lambda body, split: split["data"].__setitem__(2, split["data"][2][:2]),
    "row not a list": lambda body, split: split["data"].__setitem__(
        2, dict(zip(split["columns"], split["data"][2], strict=True))
    ),
    "no rows": lambda body, split: split.update(data=[]),
    "unknown key": lambda body, split: body.update(inputs=[]),
    "unknown split key": lambda body, split: split.update(dtypes={}),
    "index": lambda body, split: split.update(index=list(range(len(split["data"])))),
    "columns not text": lambda body, split: split.update(columns=[0, 1, 2]),
    "columns as text": lambda body, split: split.update(columns="unique_id,ds,y"),
    "data not a list": lambda body, split: split.update(data={"0": split["data"][0]}),
    "split not an object": lambda body, split: body.update(dataframe_split=[split]),
    "ids that read as numbers": lambda body, split: _set_cells(split, 0, lambda _: "007"),
    "y as text": lambda body, split: _set_cells(split, 2, str),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_the_fast_split_reader_answers_as_mlflow_s_parser_does(
    client, history, monkeypatch, damage
):
    """Reading a dataframe_split without pandas is a shortcut, not another contract: every
    body, well-formed or not, gets the answer MLflow's own parser gives it."""
    from service.routers import scoring

    body = _split_body(history[history["unique_id"] == "series_001"], horizon=4)
    DAMAGES[damage](body, body["dataframe_split"])
    well_formed = ("none", "index", "ids that read as numbers", "y as text")
    if damage in well_formed:  # the hot path takes a well-formed body itself
        assert scoring.fast_split_parts(body) is not None
    fast = client.post("/invocations", json=body)
    monkeypatch.setattr(scoring, "fast_split_parts", lambda decoded: None)
    parsed = client.post("/invocations", json=body)
    assert fast.status_code == parsed.status_code, (fast.text, parsed.text)
    assert fast.json() == parsed.json()
    # pandas pads a short row with nulls, so MLflow reads its missing y as a gap.
    assert (fast.status_code == 200) == (damage in (*well_formed, "short row"))
