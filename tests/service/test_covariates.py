"""A model with a known-future covariate: requests carry its history and horizon values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from forecaster import Forecaster
from forecaster.synthetic import generate_synthetic
from service.model_manager import ModelIdentity, StaticSource

HORIZON = 12


@pytest.fixture(scope="module")
def promo_frame() -> pd.DataFrame:
    return generate_synthetic(n_series=3, n_steps=24 * 10, seed=2, with_covariates=True)


@pytest.fixture(scope="module")
def promo_model(fitted, promo_frame) -> Forecaster:
    model_config = dataclasses.replace(fitted.model_config, covariates=("promo",))
    return Forecaster(model_config, fitted.train_config).fit(promo_frame)


@pytest.fixture()
def promo_client(make_client, promo_model):
    return make_client(source=StaticSource(promo_model, ModelIdentity("forecaster", "7")))


def _split(frame, series_id, context, horizon=HORIZON):
    part = frame[frame["unique_id"] == series_id]
    return part.iloc[-(context + horizon) : -horizon], part.iloc[-horizon:]


def _dataframe_split(frame):
    """MLflow's `dataframe_split` of a frame: ISO timestamps, empty cells as null."""
    frame = frame.assign(ds=frame["ds"].dt.strftime("%Y-%m-%dT%H:%M:%S"))
    return {
        "columns": list(frame.columns),
        "data": frame.astype(object).where(frame.notna(), None).values.tolist(),
    }


@pytest.mark.parametrize("context", [None, 2], ids=["full_context", "two_points"])
def test_online_forecast_with_future_covariates(promo_client, promo_model, promo_frame, context):
    """A two-point history too: padded and masked, its future stamps from the model's freq."""
    past, future = _split(promo_frame, "series_001", context or promo_model.context_length)
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
        "covariates": {"promo": past["promo"].tolist() + future["promo"].tolist()},
    }
    response = promo_client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 200, response.text
    forecast = response.json()["forecasts"][0]
    assert forecast["timestamps"][0] == future["ds"].iloc[0].isoformat()
    want = promo_model.predict(past, future_df=future[["unique_id", "ds", "promo"]])
    np.testing.assert_allclose(forecast["mean"], want["mean"], atol=1e-5)


def test_attention_for_a_shorter_horizon_reads_the_covariates_as_the_forecast_does(
    promo_client, promo_model, promo_frame
):
    """Covariates for the 3 steps asked for, as the schema asks: the attention maps come
    with the forecast (they asked for all 12 steps' covariates and answered 422), and the
    maps are those of the forecast served."""
    past, future = _split(promo_frame, "series_001", promo_model.context_length, horizon=3)
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
        "covariates": {"promo": past["promo"].tolist() + future["promo"].tolist()},
    }
    body = {"series": [series], "horizon": 3, "include_attention": True}
    response = promo_client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    forecast = response.json()["forecasts"][0]
    maps = promo_model.attention(past, future[["unique_id", "ds", "promo"]], horizon=3)
    np.testing.assert_allclose(forecast["attention"]["cross"][0], maps.cross[0][0], atol=1e-4)
    want = promo_model.predict(past, horizon=3, future_df=future[["unique_id", "ds", "promo"]])
    np.testing.assert_allclose(forecast["mean"], want["mean"], atol=1e-5)


def test_covariates_missing_or_short_name_the_field(promo_client, promo_model, promo_frame):
    past, future = _split(promo_frame, "series_001", promo_model.context_length)
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
    }
    response = promo_client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 422
    assert response.json()["field"] == "series[0].covariates.promo"
    series["covariates"] = {"promo": past["promo"].tolist()}  # history only, no future values
    response = promo_client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 422
    n, h = len(past), promo_model.model_config.prediction_length
    assert response.json()["detail"].endswith(
        f"covariates.promo): expected {n + h} values ({n} history + {h} horizon), got {n}"
    ), response.json()["detail"]
    assert response.json()["series_id"] == "series_001"


def test_a_covariate_missing_where_y_is_observed_is_422_naming_it(
    promo_client, promo_model, promo_frame
):
    """It was a 500: the check of where a covariate may be missing raised numpy's 'truth value
    of an array is ambiguous'."""
    past, future = _split(promo_frame, "series_001", promo_model.context_length)
    promo = past["promo"].tolist() + future["promo"].tolist()
    promo[5] = None
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
        "covariates": {"promo": promo},
    }
    response = promo_client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 422, response.text
    assert response.json()["series_id"] == "series_001"
    assert "'promo'" in response.json()["detail"]


def test_covariates_the_model_does_not_have_are_422(promo_client, promo_model, promo_frame):
    past, future = _split(promo_frame, "series_001", promo_model.context_length)
    promo = past["promo"].tolist() + future["promo"].tolist()
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
        "covariates": {"promo": promo, "price": promo},
    }
    response = promo_client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 422, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == ("series[0].covariates.price", "series_001")
    assert "['price']" in error["detail"] and "['promo']" in error["detail"], error["detail"]


def test_invocations_take_future_rows_with_empty_y(promo_client, promo_model, promo_frame):
    past, future = _split(promo_frame, "series_002", promo_model.context_length)
    frame = pd.concat([past, future.assign(y=np.nan)], ignore_index=True)
    split = _dataframe_split(frame)
    response = promo_client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 200, response.text
    want = promo_model.predict(past, future_df=future)
    got = pd.DataFrame(response.json()["predictions"])
    np.testing.assert_allclose(got["mean"], want["mean"], atol=1e-5)


def test_invocations_split_into_batches_keep_each_series_future_rows(
    make_client, promo_model, promo_frame
):
    """Split into batches of max_batch_size series, each batch carries its own series' future
    rows: the forecasts are one model call's."""
    client = make_client(
        source=StaticSource(promo_model, ModelIdentity("forecaster", "7")), max_batch_size=2
    )
    ids = promo_frame["unique_id"].unique()
    assert len(ids) == 3  # two batches, the second of one series
    parts = [_split(promo_frame, sid, promo_model.context_length) for sid in ids]
    past = pd.concat([p for p, _ in parts], ignore_index=True)
    future = pd.concat([f for _, f in parts], ignore_index=True)
    frame = pd.concat([pair for p, f in parts for pair in (p, f.assign(y=np.nan))])
    split = _dataframe_split(frame)
    response = client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 200, response.text
    want = promo_model.predict(past, future_df=future)
    got = pd.DataFrame(response.json()["predictions"])
    assert got["unique_id"].tolist() == want["unique_id"].tolist()
    np.testing.assert_allclose(got["mean"], want["mean"], atol=1e-5)


def test_invocations_refuse_text_in_the_last_history_y_naming_it(
    promo_client, promo_model, promo_frame
):
    """Text in the last observed `y` is a bad value, not the start of the future rows: read as
    empty it moved the forecast origin one step back and answered 200 with another forecast."""
    past, future = _split(promo_frame, "series_002", promo_model.context_length)
    frame = pd.concat([past, future.assign(y=np.nan)], ignore_index=True).astype({"y": object})
    frame.loc[len(past) - 1, "y"] = "abc"
    split = _dataframe_split(frame)
    response = promo_client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 400, response.text
    assert "'abc'" in response.json()["detail"] and "series_002" in response.json()["detail"]
    # "NA" spells an empty y, as in a CSV: future rows so given still forecast.
    frame.loc[len(past) - 1, "y"] = past["y"].iloc[-1]
    frame.loc[len(past) :, "y"] = "NA"
    split = _dataframe_split(frame)
    response = promo_client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 200, response.text
    want = promo_model.predict(past, future_df=future)
    np.testing.assert_allclose(
        pd.DataFrame(response.json()["predictions"])["mean"], want["mean"], atol=1e-5
    )


def test_a_batch_job_for_a_model_with_covariates_is_refused_at_once(
    promo_client, promo_frame, tmp_path
):
    """Batch jobs cannot carry covariates' future values yet: the job is refused before it is
    accepted, with the route that can, and leaves no file behind."""
    files = {"file": ("h.csv", promo_frame.to_csv(index=False).encode(), "text/csv")}
    response = promo_client.post("/v1/batch-jobs", files=files)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "promo"
    assert "POST /v1/forecast" in response.json()["detail"]
    jobs = tmp_path / "data" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


def test_a_shorter_horizon_reads_the_later_covariates_given_as_the_library_does(
    promo_client, promo_model, promo_frame
):
    """Asked for 3 steps with the covariates of all 12, the service forecast as if the 3rd
    step's value held on, while the library and /invocations read them: the routes differed.
    Each series may give from `horizon` to the model's horizon of future values."""
    h = promo_model.max_horizon
    request, wants = [], []
    for sid, ahead in (("series_000", h), ("series_001", 3)):  # one gives all, one 3 steps
        past, future = _split(promo_frame, sid, promo_model.context_length, horizon=h)
        future = future.iloc[:ahead]
        request.append(
            {
                "id": sid,
                "timestamps": [t.isoformat() for t in past["ds"]],
                "values": past["y"].tolist(),
                "covariates": {"promo": past["promo"].tolist() + future["promo"].tolist()},
            }
        )
        wants.append((past, future))
    response = promo_client.post("/v1/forecast", json={"series": request, "horizon": 3})
    assert response.status_code == 200, response.text
    for got, (past, future) in zip(response.json()["forecasts"], wants, strict=True):
        want = promo_model.predict(past, horizon=3, future_df=future[["unique_id", "ds", "promo"]])
        np.testing.assert_allclose(got["mean"], want["mean"], atol=1e-5)
    too_many = dict(request[0], covariates={"promo": request[0]["covariates"]["promo"] + [0.0]})
    response = promo_client.post("/v1/forecast", json={"series": [too_many], "horizon": 3})
    assert response.status_code == 422
    assert "up to the model's" in response.json()["detail"]


@pytest.fixture(scope="module")
def two_covariate_model(fitted, promo_frame) -> Forecaster:
    frame = promo_frame.assign(price=np.sin(np.arange(len(promo_frame)) / 5.0))
    model_config = dataclasses.replace(fitted.model_config, covariates=("promo", "price"))
    return Forecaster(model_config, fitted.train_config).fit(frame)


@pytest.mark.parametrize(
    ("horizon", "promo_ahead", "price_ahead", "needle"),
    [
        # promo is right, price one step short: it named promo, "expected 60 values ... got 60"
        (HORIZON, HORIZON, HORIZON - 1, f"history + {HORIZON} horizon), got"),
        # each within horizon..12 steps, but the model reads one future per step for both
        (3, 3, 5, "the same for every covariate"),
    ],
)
def test_covariates_of_different_lengths_are_422_naming_the_one_that_differs(
    make_client, two_covariate_model, promo_frame, horizon, promo_ahead, price_ahead, needle
):
    """With two covariates the length check named the first one whatever was wrong (a right
    promo, "expected 60 values ..., got 60"); lengths within range but unequal were refused
    naming promo too. The error names the covariate to fix."""
    client = make_client(source=StaticSource(two_covariate_model, ModelIdentity("forecaster", "8")))
    past, future = _split(promo_frame, "series_001", two_covariate_model.context_length)
    n = len(past)
    price = np.sin(np.arange(n + HORIZON) / 5.0).tolist()
    series = {
        "id": "series_001",
        "timestamps": [t.isoformat() for t in past["ds"]],
        "values": past["y"].tolist(),
        "covariates": {
            "promo": past["promo"].tolist() + future["promo"].tolist()[:promo_ahead],
            "price": price[: n + price_ahead],
        },
    }
    response = client.post("/v1/forecast", json={"series": [series], "horizon": horizon})
    assert response.status_code == 422, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == ("series[0].covariates.price", "series_001")
    assert f"expected {n + horizon}" in error["detail"] and needle in error["detail"], error
    assert error["detail"].endswith(f"got {n + price_ahead}"), error["detail"]
