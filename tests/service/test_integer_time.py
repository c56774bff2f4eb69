"""Time axes pandas has no alias for, served: integer ds (steps in, steps out, the other kind
refused), and months on a day inside the month."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from forecaster import Forecaster
from service.app import create_app
from service.model_manager import StaticSource
from service.settings import ServiceSettings

from .conftest import CONTEXT, HORIZON, tiny_config
from .test_batch_jobs import wait_for_job

STEP = 5


@pytest.fixture(scope="module")
def step_frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    t = np.arange(200)
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "unique_id": sid,
                    "ds": 1000 + STEP * t,
                    "y": k + np.sin(t / 4) + rng.normal(0, 0.1, 200),
                }
            )
            for k, sid in enumerate(["a", "b"])
        ],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def step_model(step_frame) -> Forecaster:
    model_config, train_config = tiny_config()
    return Forecaster(model_config, train_config).fit(step_frame)


@pytest.fixture()
def step_client(tmp_path, step_model, identity):
    settings = ServiceSettings(_env_file=None, data_dir=tmp_path / "data", poll_interval_s=3600)
    app = create_app(settings, model_source=StaticSource(step_model, identity))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _series(frame: pd.DataFrame, sid: str) -> dict:
    part = frame[frame["unique_id"] == sid].tail(CONTEXT)
    return {"id": sid, "timestamps": part["ds"].tolist(), "values": part["y"].tolist()}


def test_integer_steps_forecast_as_the_library_does(step_client, step_model, step_frame):
    body = {"series": [_series(step_frame, "a"), _series(step_frame, "b")]}
    response = step_client.post("/v1/forecast", json=body)
    assert response.status_code == 200, response.text
    forecasts = response.json()["forecasts"]
    expected = step_model.predict(step_frame.groupby("unique_id").tail(CONTEXT))
    for entry in forecasts:
        rows = expected[expected["unique_id"] == entry["id"]]
        assert entry["timestamps"] == rows["ds"].tolist()  # integers, not ISO text
        assert entry["timestamps"][0] == 1000 + STEP * 200
        np.testing.assert_allclose(entry["mean"], rows["mean"], rtol=1e-5, atol=1e-6)


def test_an_integer_start_and_the_models_step_frequency(step_client, step_frame):
    part = _series(step_frame, "a")
    by_timestamps = step_client.post("/v1/forecast", json={"series": [part]}).json()
    for freq in ("5ns", "5"):  # the model's alias, or the bare step (Nixtla's freq=5)
        by_start = {
            "id": "a",
            "start": part["timestamps"][0],
            "freq": freq,
            "values": part["values"],
        }
        response = step_client.post("/v1/forecast", json={"series": [by_start]})
        assert response.status_code == 200, response.text
        assert response.json()["forecasts"] == by_timestamps["forecasts"]


def test_mlflow_scoring_gives_integer_ds_back(step_client, step_frame):
    part = step_frame[step_frame["unique_id"] == "b"].tail(CONTEXT)
    split = {"columns": ["unique_id", "ds", "y"], "data": part.to_numpy().tolist()}
    response = step_client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["ds"] for p in predictions] == [1000 + STEP * (200 + k) for k in range(HORIZON)]


def test_timestamps_sent_to_a_step_model_are_a_422_naming_the_series(step_client, step_frame):
    part = _series(step_frame, "a")
    part["timestamps"] = [f"2024-01-01T{h % 24:02d}:00:00" for h in range(CONTEXT)]
    response = step_client.post("/v1/forecast", json={"series": [part]})
    assert response.status_code == 422
    error = response.json()
    assert error["field"] == "series[0].timestamps" and error["series_id"] == "a"
    assert "expected integer steps" in error["detail"]


def test_steps_sent_to_a_timestamp_model_are_a_422(client, history):
    part = history[history["unique_id"] == history["unique_id"].iloc[0]].tail(CONTEXT)
    body = {
        "series": [{"id": "s", "timestamps": list(range(CONTEXT)), "values": part["y"].tolist()}]
    }
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422
    assert "series[0].timestamps" in response.text
    assert "expected timestamps at frequency 'h'" in response.text


def test_a_bad_step_is_a_422_naming_its_position(step_client, step_frame):
    part = _series(step_frame, "a")
    part["timestamps"][2] = "soon"
    response = step_client.post("/v1/forecast", json={"series": [part]})
    assert response.status_code == 422
    assert response.json()["field"] == "series[0].timestamps[2]"


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_batch_job_of_integer_steps_gives_steps_back(step_client, step_model, step_frame, fmt):
    history = step_frame.groupby("unique_id").tail(CONTEXT)
    if fmt == "csv":
        upload = ("history.csv", history.to_csv(index=False).encode(), "text/csv")
    else:
        upload = ("history.parquet", history.to_parquet(index=False), "application/octet-stream")
    response = step_client.post("/v1/batch-jobs", files={"file": upload}, data={"format": fmt})
    assert response.status_code == 202, response.text
    job = wait_for_job(step_client, response.json()["id"])
    assert job["status"] == "succeeded", job
    body = step_client.get(job["result_url"]).content
    got = pd.read_csv(io.BytesIO(body)) if fmt == "csv" else pd.read_parquet(io.BytesIO(body))
    want = step_model.predict(history)
    assert got["ds"].dtype.kind == "i"
    assert got["ds"].tolist() == want["ds"].tolist()
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-5, atol=1e-6)


def test_a_model_of_monthly_data_on_the_15th_takes_a_start_and_md(tmp_path, identity):
    """The other time axis pandas has no alias for: months on a day inside the month."""
    from forecaster.synthetic import generate_synthetic

    data = generate_synthetic(n_series=2, n_steps=60, freq="MD", start="2019-01-15", seed=0)
    model_config, train_config = tiny_config()
    model = Forecaster(model_config, train_config).fit(data)
    settings = ServiceSettings(_env_file=None, data_dir=tmp_path / "data", poll_interval_s=3600)
    app = create_app(settings, model_source=StaticSource(model, identity))
    part = data[data["unique_id"] == data["unique_id"].iloc[0]].tail(CONTEXT)
    series = {"id": "m", "start": "2020-01-15", "freq": "MD", "values": part["y"].tolist()}
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/v1/forecast", json={"series": [series]})
        assert response.status_code == 200, response.text
        stamps = response.json()["forecasts"][0]["timestamps"]
        assert stamps[:2] == ["2024-01-15T00:00:00", "2024-02-15T00:00:00"]
        off = {**series, "start": "2020-01-16", "freq": "MS"}
        response = client.post("/v1/forecast", json={"series": [off]})
        assert response.status_code == 422 and response.json()["field"] == "series[0].start"
