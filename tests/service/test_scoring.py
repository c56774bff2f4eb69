"""MLflow's scoring protocol: the same requests `mlflow models serve` takes, the same answers."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

HORIZON = 12


def _records(frame: pd.DataFrame) -> list[dict]:
    out = frame.copy()
    out["ds"] = out["ds"].dt.strftime("%Y-%m-%dT%H:%M:%S")
    return out.to_dict(orient="records")


def _check(predictions: list[dict], want: pd.DataFrame) -> None:
    got = pd.DataFrame(predictions)
    assert list(got.columns) == list(want.columns)
    assert got["unique_id"].tolist() == want["unique_id"].tolist()
    assert got["ds"].tolist() == [t.isoformat() for t in want["ds"]]
    for column in want.columns[2:]:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-5)


@pytest.fixture()
def two_series(history):
    return history[history["unique_id"].isin(["series_000", "series_003"])].reset_index(drop=True)


def test_dataframe_split_with_params(client, two_series, fitted, identity):
    split = {"columns": ["unique_id", "ds", "y"], "data": _records(two_series)}
    split["data"] = [[r["unique_id"], r["ds"], r["y"]] for r in split["data"]]
    body = {"dataframe_split": split, "params": {"horizon": 4, "quantiles": [0.5]}}
    response = client.post("/invocations", json=body)
    assert response.status_code == 200, response.text
    # Which version answered: the alias may move between two requests.
    assert response.headers["x-model-version"] == identity.version
    assert response.headers["x-model-name"] == identity.name
    _check(response.json()["predictions"], fitted.predict(two_series, horizon=4, quantiles=[0.5]))


def test_a_request_of_more_series_than_a_batch_is_answered_whole(make_client, history, fitted):
    """It is split into batches of `max_batch_size` series; every series comes back once, in
    the order given, as one call of the model would forecast it."""
    client = make_client(max_batch_size=3)
    assert history["unique_id"].nunique() == 4  # two batches, the second of one series
    response = client.post("/invocations", json={"dataframe_records": _records(history)})
    assert response.status_code == 200, response.text
    _check(response.json()["predictions"], fitted.predict(history))


def test_the_body_is_what_mlflow_writes(client, two_series, fitted):
    """MLflow's `predictions_to_json` of the same forecast: the same keys in the same order and
    the same values (another encoder writes them, so whitespace and exponents may differ)."""
    from mlflow.pyfunc.scoring_server import predictions_to_json

    response = client.post(
        "/invocations", json={"dataframe_records": _records(two_series), "params": {"horizon": 3}}
    )
    want = fitted.predict(two_series, horizon=3)
    buffer = io.StringIO()
    predictions_to_json(want, buffer)
    assert json.loads(response.content, object_pairs_hook=list) == json.loads(
        buffer.getvalue(), object_pairs_hook=list
    )


@pytest.mark.parametrize("fmt", ["split", "records", "csv"])
def test_ids_come_back_as_given(client, two_series, fitted, fmt):
    """Integer ids answered as text ("7") broke a caller's join on its own ids; `mlflow models
    serve` gives them back as numbers."""
    numbered = two_series.assign(
        unique_id=two_series["unique_id"].map({"series_000": 7, "series_003": 30})
    )
    records = _records(numbered)
    if fmt == "split":
        rows = [[r["unique_id"], r["ds"], r["y"]] for r in records]
        response = client.post(
            "/invocations",
            json={"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}},
        )
    elif fmt == "records":
        response = client.post("/invocations", json={"dataframe_records": records})
    else:
        response = client.post(
            "/invocations",
            content=numbered.to_csv(index=False),
            headers={"content-type": "text/csv"},
        )
    assert response.status_code == 200, response.text
    ids = [p["unique_id"] for p in response.json()["predictions"]]
    assert ids == [7] * HORIZON + [30] * HORIZON
    _check(response.json()["predictions"], fitted.predict(numbered))


def test_dataframe_records(client, two_series, fitted):
    response = client.post("/invocations", json={"dataframe_records": _records(two_series)})
    assert response.status_code == 200, response.text
    _check(response.json()["predictions"], fitted.predict(two_series))


def test_csv_and_parquet_bodies(client, two_series, fitted):
    want = fitted.predict(two_series)
    response = client.post(
        "/invocations",
        content=two_series.to_csv(index=False),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 200, response.text
    _check(response.json()["predictions"], want)
    buffer = io.BytesIO()
    two_series.to_parquet(buffer, index=False)
    response = client.post(
        "/invocations",
        content=buffer.getvalue(),
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 200, response.text
    _check(response.json()["predictions"], want)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"dataframe_records": [{"unique_id": "a", "ds": "2024-01-01", "y": None}]}, "'a'"),
        ({"inputs_wrong": []}, "dataframe_split"),
        ({"dataframe_records": [{"unique_id": "a"}]}, "missing required columns"),
        ({"dataframe_records": [], "params": {"horizon": 99}}, "horizon"),
        ({"dataframe_records": [], "params": {"quantiles": [0.3]}}, "quantiles"),
        ({"dataframe_records": [], "params": {"horizon": "two"}}, "horizon"),
    ],
)
def test_errors_in_mlflow_shape(client, body, needle):
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["error_code"] == "BAD_REQUEST"
    assert needle in error["message"]


def test_a_column_given_twice_is_400_naming_it(client, two_series):
    """MLflow's parser keeps both `y` columns of a dataframe_split, which the core cannot read
    as one: refused naming the column, in MLflow's error shape."""
    rows = [[r["unique_id"], r["ds"], r["y"], r["y"]] for r in _records(two_series)]
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y", "y"], "data": rows}}
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert (error["error_code"], error["field"]) == ("BAD_REQUEST", "y")
    assert "columns ['y'] appear more than once" in error["message"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda rows: rows[3].__setitem__(2, "abc"), "'abc'"),
        (lambda rows: [r.__setitem__(2, None) for r in rows if r[0] == rows[0][0]], "observed"),
        (lambda rows: rows[3].__setitem__(1, "not a time"), "not a timestamp"),
        (lambda rows: rows[3].__setitem__(2, [1, 2]), "holds [1, 2]"),
    ],
)
def test_bad_values_in_split_name_the_series(client, two_series, change, needle):
    rows = [[r["unique_id"], r["ds"], r["y"]] for r in _records(two_series)]
    change(rows)
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert needle in error["message"]
    # every change above is in the first series' rows
    assert error["series_id"] == rows[0][0]
    assert f"series {rows[0][0]!r}" in error["message"]


@pytest.mark.parametrize("fmt", ["split", "records", "csv"])
@pytest.mark.parametrize("row", [0, 5])
def test_a_row_without_an_id_is_400_naming_unique_id_and_the_row(client, two_series, fmt, row):
    frame = two_series.astype({"unique_id": object})
    frame.loc[row, "unique_id"] = None
    if fmt == "csv":
        response = client.post(
            "/invocations",
            content=frame.to_csv(index=False),
            headers={"content-type": "text/csv"},
        )
    elif fmt == "records":
        response = client.post("/invocations", json={"dataframe_records": _records(frame)})
    else:
        rows = [[r["unique_id"], r["ds"], r["y"]] for r in _records(frame)]
        body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
        response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["error_code"] == "BAD_REQUEST"
    assert error["field"] == "unique_id"
    assert f"unique_id is missing at row {row}" in error["message"]


def test_null_ids_only_is_400(client):
    rows = [[None, "2024-01-01T00:00", 1.0], [None, "2024-01-01T01:00", 2.0]]
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "unique_id"
    assert "unique_id is missing at row 0" in response.json()["message"]


def test_aware_timestamps_in_split(client, two_series, fitted):
    rows = [[r["unique_id"], r["ds"] + "+00:00", r["y"]] for r in _records(two_series)]
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
    response = client.post("/invocations", json=body)
    assert response.status_code == 200, response.text
    _check(response.json()["predictions"], fitted.predict(two_series))


def test_unsupported_content_type(client):
    response = client.post("/invocations", content=b"x", headers={"content-type": "text/plain"})
    assert response.status_code == 415


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json; charset=UTF-8", 200),
        ("application/json; charset=latin-1", 415),
        ("application/json; format=pandas-split", 415),
    ],
)
def test_a_json_body_is_read_as_utf_8_only(client, two_series, content_type, status):
    """A charset other than UTF-8, or any other parameter, is refused, not misread."""
    body = json.dumps({"dataframe_records": _records(two_series)})
    response = client.post("/invocations", content=body, headers={"content-type": content_type})
    assert response.status_code == status, response.text


def test_ping_health_version(client):
    assert client.get("/ping").status_code == 200
    assert client.get("/health").status_code == 200
    import mlflow

    assert client.get("/version").text == mlflow.__version__


@pytest.mark.parametrize(
    ("horizon", "quantiles", "accepted"),
    [
        (3, [0.1, 0.9], True),
        ("3", None, False),  # text: MLflow's scoring server refuses it too
        (3.0, None, False),
        (True, None, False),
        (None, "0.1,0.9", False),
        (None, [True], False),
        (1, None, True),  # the bound, both sides of it
        (0, None, False),
        (None, ["0.5"], False),  # a level given as text inside the list
    ],
)
def test_json_parameters_get_one_answer_on_both_routes(
    client, two_series, payload, horizon, quantiles, accepted
):
    """/invocations read `"horizon": "3"` as 3 where /v1/forecast's schema refuses it: the
    same JSON value had two answers by route."""
    params = {k: v for k, v in (("horizon", horizon), ("quantiles", quantiles)) if v is not None}
    scored = client.post(
        "/invocations", json={"dataframe_records": _records(two_series), "params": params}
    )
    online = client.post("/v1/forecast", json={"series": [payload("series_000")], **params})
    assert (scored.status_code == 200, online.status_code == 200) == (accepted, accepted), (
        scored.text,
        online.text,
    )
    if not accepted:
        assert (scored.status_code, online.status_code) == (400, 422)
        named = "horizon" if horizon is not None else "quantiles"
        assert named in scored.json()["message"] and named in online.json()["detail"]


@pytest.mark.parametrize("params", [{"horizon": ""}, {"quantiles": 0.5}, {"quantiles": [0.5, 0.5]}])
def test_json_params_of_the_wrong_shape_are_a_400_naming_the_field(client, two_series, params):
    body = {"dataframe_records": _records(two_series), "params": params}
    response = client.post("/invocations", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "BAD_REQUEST"
    assert next(iter(params)) in response.json()["message"]
