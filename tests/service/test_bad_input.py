"""Every kind of bad input is a 4xx whose message names the field and the series; never a 500."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from forecaster.forecaster import ModelInputs
from forecaster.outputs import ForecastArrays
from service.model_manager import StaticSource

CONTEXT, HORIZON = 48, 12  # the tiny model of conftest.py


def _series(payload, **changes):
    series = payload("series_002")
    series.update(changes)
    return series


def _break(payload, how):
    s = payload("series_002")
    if how == "empty":
        s["values"], s["timestamps"] = [], []
    elif how == "all_nan":
        s["values"] = [float("nan")] * len(s["values"])
    elif how == "all_null":
        s["values"] = [None] * len(s["values"])
    elif how == "text":
        s["values"][3] = "abc"
    elif how == "duplicate":
        s["timestamps"][4] = s["timestamps"][3]
    elif how == "length_mismatch":
        s["values"] = s["values"][:-1]
    elif how == "bad_timestamp":
        s["timestamps"][2] = "yesterday-ish"
    elif how == "mixed_zones":  # an offset among naive times, as /invocations refuses it
        local = pd.Timestamp(s["timestamps"][5]) + pd.Timedelta(hours=1)
        s["timestamps"][5] = f"{local.isoformat()}+01:00"  # the same instant, if naive is UTC
    elif how == "bad_freq":
        s = {"id": "series_002", "start": "2024-01-01", "freq": "fortnightly", "values": [1.0] * 60}
    elif how == "wrong_freq":
        s = {"id": "series_002", "start": "2024-01-01", "freq": "D", "values": s["values"]}
    elif how == "coarser_freq":  # on the hour, so on the model's grid too
        s = {"id": "series_002", "start": "2024-01-01", "freq": "2h", "values": s["values"]}
    elif how == "off_grid_start":  # a Monday, for weekly data on Sundays
        s = {"id": "series_002", "start": "2024-01-01", "freq": "W-SUN", "values": s["values"]}
    elif how == "both_timestamps_and_start":
        s["start"], s["freq"] = s["timestamps"][0], "h"
    elif how == "neither":
        del s["timestamps"]
    return s


CASES = {
    # how: (status, field the error names)
    "empty": (422, "series[1].values"),
    "all_nan": (422, "series[1].values"),
    "all_null": (422, "series[1].values"),
    "text": (422, "series[1].values[3]"),
    "duplicate": (422, "series[1].timestamps"),
    "length_mismatch": (422, "series[1]"),
    "bad_timestamp": (422, "series[1].timestamps[2]"),
    "mixed_zones": (422, "series[1].timestamps"),
    "bad_freq": (422, "series[1].freq"),
    "wrong_freq": (422, "series[1].freq"),
    "coarser_freq": (422, "series[1].freq"),
    "off_grid_start": (422, "series[1].start"),
    "both_timestamps_and_start": (422, "series[1]"),
    "neither": (422, "series[1]"),
}


@pytest.mark.parametrize("how", list(CASES))
def test_bad_series_is_422_naming_field_and_series(client, payload, how):
    body = {"series": [payload("series_000"), _break(payload, how)]}
    # json.dumps writes NaN as the literal JSON parsers such as Python's accept
    response = client.post(
        "/v1/forecast", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    status, field = CASES[how]
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field, error
    assert error["series_id"] == "series_002", error
    assert "series_002" in error["detail"], error["detail"]


def test_pairs_out_of_time_order_forecast_as_sorted(client, payload):
    """Timestamps and values are pairs: sent out of order, they are read in time order (they
    were refused as unsorted)."""
    swapped = payload("series_002")
    for pairs in (swapped["timestamps"], swapped["values"]):
        pairs[3], pairs[4] = pairs[4], pairs[3]
    answers = [
        client.post("/v1/forecast", json={"series": [series]})
        for series in (payload("series_002"), swapped)
    ]
    assert [a.status_code for a in answers] == [200, 200], answers[1].text
    assert answers[1].json()["forecasts"] == answers[0].json()["forecasts"]


def test_every_error_is_the_body_the_openapi_schema_documents(make_client, payload):
    """The schema documented 422 as FastAPI's default validation error (a list under
    `detail`), a body the service never sends; clients generated from it failed to read ours."""
    from service.schemas import ErrorResponse

    client = make_client(max_body_bytes=2048, api_keys="k" * 20)
    key = {"X-API-Key": "k" * 20}
    schema = client.get("/openapi.json", headers=key).json()
    assert "HTTPValidationError" not in json.dumps(schema)
    answers = {
        ("post", "/v1/forecast", "422"): client.post(
            "/v1/forecast", json={"series": [_break(payload, "empty")]}, headers=key
        ),
        ("post", "/v1/forecast", "401"): client.post("/v1/forecast", json={}),
        ("post", "/v1/forecast", "413"): client.post(
            "/v1/forecast", json={"series": [payload("series_000", 96)]}, headers=key
        ),
        ("get", "/v1/batch-jobs", "422"): client.get("/v1/batch-jobs?limit=0", headers=key),
        ("get", "/v1/batch-jobs/{job_id}", "404"): client.get("/v1/batch-jobs/nope", headers=key),
    }
    for (method, path, status), response in answers.items():
        assert str(response.status_code) == status, response.text
        documented = schema["paths"][path][method]["responses"][status]["content"]
        ref = documented["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/ErrorResponse"
        body = ErrorResponse.model_validate(response.json(), strict=True)
        assert body.detail and body.error, response.text


_TIME_FIELDS = {
    "timestamps only": {"timestamps": ["2024-01-01T00:00:00", "2024-01-01T01:00:00"]},
    "start and freq": {"start": "2024-01-01T00:00:00", "freq": "h"},
    "start, freq and null timestamps": {
        "start": "2024-01-01T00:00:00",
        "freq": "h",
        "timestamps": None,
    },
    "neither": {},
    "start alone": {"start": "2024-01-01T00:00:00"},
    "freq alone": {"freq": "h"},
    "timestamps and freq": {
        "timestamps": ["2024-01-01T00:00:00", "2024-01-01T01:00:00"],
        "freq": "h",
    },
    "all three": {
        "timestamps": ["2024-01-01T00:00:00", "2024-01-01T01:00:00"],
        "start": "2024-01-01T00:00:00",
        "freq": "h",
    },
}


@pytest.mark.parametrize("how", list(_TIME_FIELDS))
def test_the_openapi_schema_states_which_time_fields_a_series_needs(how):
    """A client or fuzzer generated from the schema could not tell that a series needs
    `timestamps` or `start` + `freq` (every field was optional there): the schema now accepts
    exactly the series the service's own validation does."""
    import jsonschema_rs
    import pydantic

    from service.app import create_app
    from service.schemas import SeriesIn
    from service.settings import ServiceSettings

    spec = create_app(ServiceSettings.model_construct()).openapi()
    validator = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/SeriesIn", "components": spec["components"]}
    )
    series = {"id": "a", "values": [1.0, 2.0], **_TIME_FIELDS[how]}
    try:
        SeriesIn.model_validate(series)
        accepted = True
    except pydantic.ValidationError:
        accepted = False
    assert accepted == (
        how in ("timestamps only", "start and freq", "start, freq and null timestamps")
    )
    assert validator.is_valid(series) == accepted, how


def _imperfect(payload, how):
    s = payload("series_002", CONTEXT + 10)
    if how == "nan":
        s["values"][3] = float("nan")
    elif how == "null":
        s["values"][3] = None
    elif how == "gap":
        del s["timestamps"][10]
        del s["values"][10]
    elif how == "short":
        s["values"], s["timestamps"] = s["values"][-2:], s["timestamps"][-2:]
    return s


@pytest.mark.parametrize("how", ["nan", "null", "gap", "short"])
def test_missing_values_gaps_and_short_histories_are_forecast(client, payload, how):
    """Missing steps are masked and a short history is padded: the series still gets a forecast."""
    body = {"series": [payload("series_000"), _imperfect(payload, how)]}
    response = client.post(
        "/v1/forecast", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    forecast = response.json()["forecasts"][1]
    assert forecast["id"] == "series_002"
    assert len(forecast["mean"]) == HORIZON
    assert all(math.isfinite(v) for v in forecast["mean"])


@pytest.mark.parametrize(
    ("changes", "field", "needle"),
    [
        ({"horizon": HORIZON + 1}, "horizon", f"between 1 and {HORIZON}"),
        ({"horizon": 0}, "horizon", "greater than or equal to 1"),
        ({"quantiles": [0.25]}, "quantiles", "0.25"),
        ({"quantiles": [1.5]}, "quantiles[0]", "less than 1"),
        ({"quantiles": [0.1, 0.1]}, "quantiles", "distinct"),
        ({"series": []}, "series", "at least 1"),
        ({"unexpected": 1}, "unexpected", "Extra inputs"),
    ],
)
def test_bad_request_fields(client, payload, changes, field, needle):
    body = {"series": [payload("series_000")], **changes}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert needle in response.json()["detail"]


@pytest.mark.parametrize(
    ("freq", "needle"),
    [
        ("0h", "expected a positive step"),
        ("-1h", "expected a positive step"),
        ("-2D", "expected a positive step"),
        # Steps longer than int64 nanoseconds hold: an OverflowError and a 500 before.
        ("9999999h", "too long for timestamps"),
        ("99999999999min", "too long for timestamps"),
        ("99999999999999999999999h", "not a pandas offset alias"),
    ],
)
def test_a_frequency_that_cannot_step_is_422_on_freq(client, payload, freq, needle):
    series = {"id": "series_002", "start": "2024-01-01", "freq": freq, "values": [1.0] * 60}
    response = client.post("/v1/forecast", json={"series": [payload("series_000"), series]})
    assert response.status_code == 422, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == ("series[1].freq", "series_002")
    assert needle in error["detail"], error["detail"]


def test_covariates_for_a_model_without_covariates_are_422(client, payload):
    series = payload("series_002")
    series["covariates"] = {"promo": [0.0] * (len(series["values"]) + HORIZON)}
    response = client.post("/v1/forecast", json={"series": [payload("series_000"), series]})
    assert response.status_code == 422, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == ("series[1].covariates", "series_002")
    assert "the model has no covariates" in error["detail"], error["detail"]
    assert "promo" in error["detail"]


def test_duplicate_series_ids(client, payload):
    body = {"series": [payload("series_000"), payload("series_000")]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422
    assert "series_000" in response.json()["detail"]


def test_huge_values_give_422_not_500(client, payload):
    series = payload("series_000")
    series["values"] = [1e300 * (-1) ** i for i in range(len(series["values"]))]
    response = client.post("/v1/forecast", json={"series": [series]})
    assert response.status_code == 422, response.text
    assert response.json()["series_id"] == "series_000"


@pytest.mark.parametrize(
    ("content", "content_type", "status", "field", "message"),
    [
        (b"not json at all", "application/json", 422, "body", "Invalid JSON"),
        (b"series=1", "application/x-www-form-urlencoded", 415, "content-type", "not JSON"),
        (b"\xff\xfe\x00", "application/json", 422, "body", "Invalid JSON"),
        (b'{"series": "abc"}', "application/json", 422, "series", "valid array"),
        # Nested deeper than Python's JSON decoder recurses: 2 kB, once a 500.
        (
            b'{"series": [{"id": "a", "values": ' + b"[" * 1000 + b"]" * 1000 + b"}]}",
            "application/json",
            422,
            "body",
            "recursion limit",
        ),
    ],
)
def test_malformed_or_wrong_content_type(client, content, content_type, status, field, message):
    response = client.post("/v1/forecast", content=content, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert response.json()["field"] == field
    assert message in response.json()["detail"]


def test_json_sent_as_a_form_is_read(client, payload):
    """`curl -d` without a content-type header sends a form's type; the JSON is still read."""
    body = json.dumps({"series": [payload("series_000")]})
    headers = {"content-type": "application/x-www-form-urlencoded"}
    response = client.post("/v1/forecast", content=body, headers=headers)
    assert response.status_code == 200, response.text


# -- batch jobs: files ---------------------------------------------------------------------


def _csv(frame) -> bytes:
    return frame.to_csv(index=False).encode()


def test_batch_job_malformed_csv(client):
    response = client.post(
        "/v1/batch-jobs",
        content=b'unique_id,ds,y\n"a,2024-01-01,1\nb,2024',
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "file"
    assert "CSV" in response.json()["detail"]


def test_batch_job_malformed_parquet(client):
    response = client.post(
        "/v1/batch-jobs",
        content=b"PAR1 this is not really parquet",
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 422, response.text
    assert "Parquet" in response.json()["detail"]


def test_batch_job_csv_sent_as_parquet(client, history):
    response = client.post(
        "/v1/batch-jobs",
        content=_csv(history),
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 422
    assert "PAR1" in response.json()["detail"]


def test_batch_job_missing_columns(client, history):
    response = client.post(
        "/v1/batch-jobs",
        content=_csv(history.rename(columns={"y": "value"})),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 422
    assert response.json()["field"] == "y"
    assert "value" in response.json()["detail"]  # it lists what the file has


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "the file is empty"), (b"unique_id,ds,y\n", "the file has a header but no rows")],
)
def test_batch_job_empty_file(client, content, message):
    response = client.post("/v1/batch-jobs", content=content, headers={"content-type": "text/csv"})
    assert response.status_code == 422
    assert response.json()["field"] == "file"
    assert message in response.json()["detail"]


def test_batch_job_wrong_content_type(client, history):
    response = client.post(
        "/v1/batch-jobs", content=_csv(history), headers={"content-type": "image/png"}
    )
    assert response.status_code == 415
    assert "content-type" in response.json()["detail"]


def test_batch_job_multipart_without_file(client):
    response = client.post("/v1/batch-jobs", data={"horizon": "3"}, files={"other": ("x", b"1")})
    assert response.status_code == 422
    assert response.json()["field"] == "file"


def test_batch_job_bad_horizon_and_quantiles(client, history):
    files = {"file": ("h.csv", io.BytesIO(_csv(history)), "text/csv")}
    response = client.post("/v1/batch-jobs", files=files, data={"horizon": str(HORIZON + 5)})
    assert response.status_code == 422
    assert response.json()["field"] == "horizon"
    files = {"file": ("h.csv", io.BytesIO(_csv(history)), "text/csv")}
    response = client.post("/v1/batch-jobs", files=files, data={"quantiles": "0.1,abc"})
    assert response.status_code == 422
    assert response.json()["field"] == "quantiles"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../secret.csv", "outside the input directory"),  # a real file beside inputs/
        ("link.csv", "outside the input directory"),  # a link inside pointing out
        ("/etc/passwd", "outside the input directory"),
        ("missing.csv", "no file"),
    ],
)
def test_batch_job_path_outside_or_missing(client, tmp_path, history, path, message):
    secret = tmp_path / "data" / "secret.csv"
    secret.write_bytes(_csv(history))
    inputs = tmp_path / "data" / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "link.csv").symlink_to(secret)
    response = client.post("/v1/batch-jobs", json={"path": path})
    assert response.status_code == 422
    assert response.json()["field"] == "path"
    assert message in response.json()["detail"]


def test_rejected_uploads_leave_no_files(client, tmp_path):
    client.post("/v1/batch-jobs", content=b"garbage", headers={"content-type": "text/csv"})
    jobs_dir = tmp_path / "data" / "jobs"
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())


@pytest.mark.parametrize(
    ("field", "value"), [("horizon", "0"), ("horizon", "2.5"), ("quantiles", "0.5,0.5")]
)
def test_batch_job_horizon_is_a_positive_integer_and_quantiles_distinct(
    client, history, field, value
):
    """horizon=0 ran the job at the default horizon and 2.5 at 2, instead of a 422."""
    files = {"file": ("h.csv", io.BytesIO(_csv(history)), "text/csv")}
    response = client.post("/v1/batch-jobs", files=files, data={field: value})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": "s" * 256}, None),  # the longest id
        ({"id": "s" * 257}, "series[0].id"),
        ({"id": ""}, "series[0].id"),
        ({"horizon": 1}, None),
        ({"horizon": 0}, "horizon"),
        ({"series": []}, "series"),
    ],
)
def test_request_bounds_hold_at_their_edges(client, payload, change, field):
    body = {"series": [payload("series_000")]}
    if "id" in change:
        body["series"][0]["id"] = change["id"]
    else:
        body.update(change)
    response = client.post("/v1/forecast", json=body)
    if field is None:
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 422, response.text
        assert response.json()["field"] == field, response.json()


@pytest.mark.parametrize("how", ["mixed_zones", "bad_freq", "wrong_freq", "off_grid_start"])
def test_a_bad_series_in_a_later_batch_is_named_by_its_place_in_the_request(
    make_client, payload, how
):
    """A request of more series than max_batch_size is read in chunks; an error in a later
    chunk names the series' index in the request, not in its chunk."""
    client = make_client(max_batch_size=1)
    body = {"series": [payload("series_000"), _break(payload, how)]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert (error["field"], error["series_id"]) == (CASES[how][1], "series_002"), error
    assert f"series 'series_002' ({CASES[how][1]})" in error["detail"], error["detail"]


def test_a_forecast_that_overflows_is_422_naming_its_series(make_client, fitted, identity, payload):
    """The core refuses values past 1e30, so no history here overflows the tiny model; a model
    whose float32 arithmetic does overflow for one series is stood in for: that series is
    named, not the first of the request."""

    def overflowing(inputs: ModelInputs) -> ForecastArrays:
        arrays = type(fitted).forecast(fitted, inputs)
        mean = arrays.mean.copy()
        # series_002 only: the forecast that checks the model as it loads must still pass
        mean[arrays.series_ids == "series_002"] = np.inf
        return dataclasses.replace(arrays, mean=mean)

    model = copy.copy(fitted)
    model.forecast = overflowing
    client = make_client(source=StaticSource(model, identity))
    body = {"series": [payload("series_000"), payload("series_002")]}
    response = client.post("/v1/forecast", json=body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["series_id"] == "series_002", error
    assert error["detail"].startswith("series 'series_002': the forecast is not finite"), error
    assert "rescale the series" in error["detail"], error["detail"]
