"""Batch jobs: accepted only once on disk, processed in chunks, results in CSV or Parquet,
resumed after a restart."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from service.job_store import JobStore
from service.routers import batch_jobs
from tests.servers import wait_until
from tests.service.conftest import glitch_count

HORIZON = 12


def wait_for_job(client, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/batch-jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def wait_for_metric(client, sample: str, timeout: float = 30.0) -> str:
    """The /metrics text once it holds `sample`: a job's counters follow its status."""

    def holding() -> str | None:
        metrics = client.get("/metrics").text
        return metrics if sample in metrics else None

    return wait_until(holding, timeout, f"{sample} in /metrics")


def read_result(response) -> pd.DataFrame:
    if response.headers["content-type"].startswith("text/csv"):
        frame = pd.read_csv(io.BytesIO(response.content), parse_dates=["ds"])
    else:
        frame = pd.read_parquet(io.BytesIO(response.content))
    frame["unique_id"] = frame["unique_id"].astype("str")
    return frame.sort_values(["unique_id", "ds"]).reset_index(drop=True)


def expected(fitted, history, **kwargs) -> pd.DataFrame:
    out = fitted.predict(history, **kwargs)
    return out.sort_values(["unique_id", "ds"]).reset_index(drop=True)


def assert_same_forecast(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    assert got["unique_id"].tolist() == want["unique_id"].tolist()
    assert (got["ds"].to_numpy() == want["ds"].to_numpy()).all()
    for column in got.columns[2:]:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-5)


def test_csv_upload_to_csv_result(client, history, fitted):
    files = {"file": ("history.csv", history.to_csv(index=False).encode(), "text/csv")}
    response = client.post("/v1/batch-jobs", files=files, data={"horizon": "6"})
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/batch-jobs/{job['id']}"
    assert job["status"] in ("queued", "running", "succeeded")
    done = wait_for_job(client, job["id"])
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0
    assert done["series_done"] == history["unique_id"].nunique()
    assert done["model"]["version"] == "3"
    result = client.get(done["result_url"])
    assert result.headers["content-type"].startswith("text/csv")
    assert_same_forecast(read_result(result), expected(fitted, history, horizon=6))
    metrics = wait_for_metric(client, 'forecaster_batch_jobs_total{event="succeeded"} 1.0')
    assert "forecaster_batch_job_series_total 4.0" in metrics
    assert 'event="failed"' not in metrics


def test_parquet_upload_raw_body_to_parquet_result(client, history, fitted):
    buffer = io.BytesIO()
    history.to_parquet(buffer, index=False)
    response = client.post(
        "/v1/batch-jobs?quantiles=0.1,0.9",
        content=buffer.getvalue(),
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    result = client.get(f"/v1/batch-jobs/{done['id']}/result")
    assert result.headers["content-type"] == "application/vnd.apache.parquet"
    got = read_result(result)
    assert_same_forecast(got, expected(fitted, history, quantiles=[0.1, 0.9]))
    # the same result, converted on request
    as_csv = client.get(f"/v1/batch-jobs/{done['id']}/result?format=csv")
    assert_same_forecast(read_result(as_csv), got)


def test_path_under_input_dir(make_client, tmp_path, history, fitted):
    client = make_client()
    inputs = tmp_path / "data" / "inputs"
    (inputs / "nightly").mkdir(parents=True)
    history.to_csv(inputs / "nightly" / "h.csv", index=False)
    response = client.post(
        "/v1/batch-jobs", json={"path": "nightly/h.csv", "output_format": "parquet"}
    )
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    got = read_result(client.get(f"/v1/batch-jobs/{done['id']}/result"))
    assert_same_forecast(got, expected(fitted, history))
    assert (inputs / "nightly" / "h.csv").exists()  # the caller's file is left alone


@pytest.mark.parametrize("how", ["multipart", "json"])
def test_the_options_a_body_gives_are_the_job_s(make_client, tmp_path, history, how):
    """horizon and output_format given as multipart fields, or in the JSON body naming a
    file, set the job's: the forecast has that many steps, in that format."""
    client = make_client()
    options = {"horizon": 3, "output_format": "parquet"}
    if how == "json":
        history.to_csv(tmp_path / "data" / "inputs" / "h.csv", index=False)
        response = client.post("/v1/batch-jobs", json={"path": "h.csv", **options})
    else:
        files = {"file": ("history.csv", history.to_csv(index=False).encode(), "text/csv")}
        fields = {k: str(v) for k, v in options.items()}
        response = client.post("/v1/batch-jobs", files=files, data=fields)
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["horizon"], job["input_format"], job["output_format"]) == (3, "csv", "parquet")
    done = wait_for_job(client, job["id"])
    assert done["status"] == "succeeded", done
    result = client.get(f"/v1/batch-jobs/{done['id']}/result")
    assert result.headers["content-type"] == "application/vnd.apache.parquet"
    assert (read_result(result).groupby("unique_id").size() == 3).all()


def test_an_empty_quantile_list_asks_for_the_mean_alone(make_client, tmp_path, history, fitted):
    """As on /v1/forecast: `quantiles: []` is an answer (the mean only), not an absence."""
    client = make_client()
    inputs = tmp_path / "data" / "inputs"
    history.to_csv(inputs / "h.csv", index=False)
    response = client.post("/v1/batch-jobs", json={"path": "h.csv", "quantiles": []})
    assert response.status_code == 202, response.text
    assert response.json()["quantiles"] == []
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    got = read_result(client.get(f"/v1/batch-jobs/{done['id']}/result"))
    assert list(got.columns) == ["unique_id", "ds", "mean"]
    assert_same_forecast(got, expected(fitted, history, quantiles=[]))


def test_many_partitions_and_chunks_give_the_same_result(make_client, fitted, training_frame):
    # Tiny partitions and chunks force the hash-partitioned, chunked path.
    client = make_client(batch_partition_bytes=4096, batch_chunk_series=3)
    frames = []
    for k in range(5):  # 20 series: 4 base series, shifted copies under new ids
        part = training_frame.groupby("unique_id").tail(60).copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        part["y"] = part["y"] + k
        frames.append(part)
    many = pd.concat(frames, ignore_index=True).sample(frac=1.0, random_state=0)  # interleaved
    many = many.sort_values("ds", kind="stable")  # rows of a series in time order, series mixed
    response = client.post(
        "/v1/batch-jobs",
        content=many.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 202
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["rows_total"] == len(many) == done["rows_done"]
    got = read_result(client.get(f"/v1/batch-jobs/{done['id']}/result"))
    assert_same_forecast(got, expected(fitted, many))


def test_bad_series_are_left_out_and_listed_the_others_forecast(client, history, fitted):
    bad = history.copy()
    # A series with no observed value cannot be forecast (a single NaN would just be masked),
    # nor one with text among its values.
    bad.loc[bad["unique_id"] == "series_001", "y"] = np.nan
    bad["y"] = bad["y"].astype(object)
    bad.loc[bad.index[bad["unique_id"] == "series_003"][5], "y"] = "abc"
    # Nor one stamped with an export's sentinel date, out of pandas' range: it failed the job.
    response = client.post(
        "/v1/batch-jobs",
        content=bad.to_csv(index=False).encode() + b"sentinel,9999-12-31 00:00:00,1.0\n",
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 202
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert (done["series_done"], done["series_failed"]) == (2, 3)
    good = history[history["unique_id"].isin(["series_000", "series_002"])]
    result = client.get(done["result_url"])
    assert_same_forecast(read_result(result), expected(fitted, good))
    errors = pd.read_csv(io.BytesIO(client.get(done["errors_url"]).content))
    assert list(errors.columns) == ["unique_id", "field", "error", "detail"]  # documented
    errors = errors.sort_values("unique_id").reset_index(drop=True)
    assert errors["unique_id"].tolist() == ["sentinel", "series_001", "series_003"]
    assert errors["field"].tolist() == ["ds", "y", "y"]
    assert "outside the supported range" in errors["detail"].iloc[0]
    assert "'abc'" in errors["detail"].iloc[2]


def test_glitches_are_counted_and_listed_across_partitions(make_client, fitted, training_frame):
    """A reading far from its neighbours is left out of the forecast (as POST /v1/forecast
    leaves it out) and listed at glitches_url, whichever partition and chunk its series is in;
    a clean job lists none."""
    client = make_client(batch_partition_bytes=4096, batch_chunk_series=3)
    frames = []
    for k in range(3):  # 12 series in several partitions
        part = training_frame.groupby("unique_id").tail(60).copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        frames.append(part)
    many = pd.concat(frames, ignore_index=True)

    clean = client.post(
        "/v1/batch-jobs", content=many.to_csv(index=False).encode(), headers=CSV_HEADERS
    )
    done = wait_for_job(client, clean.json()["id"])
    assert (done["status"], done["glitches"], done["glitches_url"]) == ("succeeded", 0, None)
    assert client.get(f"/v1/batch-jobs/{done['id']}/glitches").status_code == 404

    ids = many["unique_id"].unique()
    glitched = many.copy()
    planted = []
    for sid, back in ((ids[1], 7), (ids[-2], 20)):
        at = np.flatnonzero((glitched["unique_id"] == sid).to_numpy())[-back]
        glitched.loc[glitched.index[at], "y"] = 10 * glitched["y"].iloc[at] + 100
        planted.append((sid, pd.Timestamp(glitched["ds"].iloc[at])))
    response = client.post(
        "/v1/batch-jobs", content=glitched.to_csv(index=False).encode(), headers=CSV_HEADERS
    )
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["glitches"] == 2
    assert glitch_count(client, "batch") == 2  # this client's app: its first glitches
    listed = pd.read_csv(io.BytesIO(client.get(done["glitches_url"]).content), parse_dates=["ds"])
    assert list(listed.columns) == ["unique_id", "ds"]
    assert sorted(zip(listed["unique_id"].astype(str), listed["ds"], strict=True)) == sorted(
        planted
    )
    got = read_result(client.get(done["result_url"]))
    assert_same_forecast(got, expected(fitted, glitched))


CSV_HEADERS = {"content-type": "text/csv"}


def _many_copies(history: pd.DataFrame, n: int = 700) -> pd.DataFrame:
    """`n` copies of the history under new ids (~10 MB of CSV for 700: several 8 MB blocks),
    values as objects so that one can be set to text."""
    copies = [history.assign(unique_id=history["unique_id"] + f"-{k:03d}") for k in range(n)]
    return pd.concat(copies, ignore_index=True).astype({"y": object})


def test_text_far_into_a_large_csv_fails_only_its_series(client, history):
    """CSV blocks are 8 MB: text in a value past the first block is one series' error too."""
    many = _many_copies(history)
    last = many.index[many["unique_id"] == "series_003-699"]
    many.loc[last[10], "y"] = "abc"
    body = many.to_csv(index=False).encode()
    assert len(body) > 9 << 20
    response = client.post("/v1/batch-jobs", content=body, headers={"content-type": "text/csv"})
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert (done["series_done"], done["series_failed"]) == (2799, 1)
    errors = pd.read_csv(io.BytesIO(client.get(done["errors_url"]).content))
    assert errors["unique_id"].tolist() == ["series_003-699"]
    assert "'abc'" in errors["detail"].iloc[0]


def test_text_far_into_a_large_unsorted_csv_fails_only_its_series(make_client, history):
    """Partitioned (rows not grouped by series), the blocks of values that are all numbers and
    the later block holding text share the partitions all the same."""
    client = make_client(batch_partition_bytes=1 << 20)
    many = _many_copies(history)
    last = many.index[many["unique_id"] == "series_003-699"]
    many.loc[last[-5], "y"] = "abc"  # one of the last timestamps: in the file's last block
    many = many.sort_values("ds", kind="stable")
    body = many.to_csv(index=False).encode()
    assert body.index(b",abc") > 9 << 20
    response = client.post("/v1/batch-jobs", content=body, headers={"content-type": "text/csv"})
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert (done["series_done"], done["series_failed"]) == (2799, 1)
    assert done["rows_total"] == done["rows_done"] == len(many)
    errors = pd.read_csv(io.BytesIO(client.get(done["errors_url"]).content))
    assert errors["unique_id"].tolist() == ["series_003-699"]
    assert "'abc'" in errors["detail"].iloc[0]


@pytest.mark.parametrize("blank", ["a_series", "one_row"])
@pytest.mark.parametrize(
    ("layout", "partition_bytes"),
    [
        ("grouped", None),  # one part
        ("grouped", 4096),  # streamed, chunk by chunk
        ("interleaved", 4096),  # hash-partitioned
    ],
)
def test_rows_without_an_id_are_listed_not_lost(
    make_client, history, fitted, blank, layout, partition_bytes
):
    """Rows with a blank unique_id belong to no series: left out, and listed in the errors
    with the first one's row in the file, as `forecaster predict` names it."""
    client = make_client(**({"batch_partition_bytes": partition_bytes} if partition_bytes else {}))
    frame = history.astype({"unique_id": object})
    if blank == "a_series":
        frame.loc[frame["unique_id"] == "series_001", "unique_id"] = None
    else:
        frame.loc[frame.index[frame["unique_id"] == "series_001"][7], "unique_id"] = None
    if layout == "interleaved":
        frame = frame.sort_values("ds", kind="stable")
    frame = frame.reset_index(drop=True)
    without_id = frame["unique_id"].isna()
    first = int(np.flatnonzero(without_id)[0])
    response = client.post(
        "/v1/batch-jobs",
        content=frame.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["rows_total"] == done["rows_done"] == len(frame)
    n_series = 3 if blank == "a_series" else 4
    assert (done["series_done"], done["series_failed"]) == (n_series, 1)
    errors = pd.read_csv(io.BytesIO(client.get(done["errors_url"]).content))
    assert errors["unique_id"].isna().tolist() == [True]
    assert errors["field"].tolist() == ["unique_id"]
    detail = errors["detail"].iloc[0]
    assert f"unique_id is missing at row {first} ({int(without_id.sum())} " in detail, detail
    got = read_result(client.get(done["result_url"]))
    assert_same_forecast(got, expected(fitted, frame[~without_id]))


def test_a_job_whose_every_series_is_bad_fails_naming_the_first(client, history):
    bad = history.assign(y=np.nan)
    response = client.post(
        "/v1/batch-jobs",
        content=bad.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "failed"
    assert done["series_failed"] == 4
    assert done["error"]["series_id"] == "series_000"
    assert "no series could be forecast" in done["error"]["detail"]
    result = client.get(f"/v1/batch-jobs/{done['id']}/result")
    assert result.status_code == 409
    metrics = wait_for_metric(client, 'forecaster_batch_jobs_total{event="failed"} 1.0')
    assert 'event="succeeded"' not in metrics
    assert "forecaster_batch_job_series_total 0.0" in metrics


def test_unknown_job(client):
    assert client.get("/v1/batch-jobs/nope").status_code == 404
    assert client.get("/v1/batch-jobs/nope/result").status_code == 404
    assert client.delete("/v1/batch-jobs/nope").status_code == 404


def test_list_and_delete(client, history):
    response = client.post(
        "/v1/batch-jobs",
        content=history.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    job_id = response.json()["id"]
    wait_for_job(client, job_id)
    listed = client.get("/v1/batch-jobs").json()["jobs"]
    assert job_id in [j["id"] for j in listed]
    assert client.delete(f"/v1/batch-jobs/{job_id}").status_code == 204
    assert client.get(f"/v1/batch-jobs/{job_id}").status_code == 404


@pytest.mark.parametrize(
    ("order", "before", "after"),
    [
        ("grouped", {"batch_chunk_series": 1}, {"batch_chunk_series": 1}),
        # A redeploy that tuned the settings: the kept parts were numbered by the old ones.
        ("grouped", {"batch_chunk_series": 1}, {"batch_chunk_series": 7}),
        (
            "by time",
            {"batch_chunk_series": 1, "batch_partition_bytes": 4096},
            {"batch_chunk_series": 1, "batch_partition_bytes": 65536},
        ),
    ],
)
def test_job_handed_back_at_a_graceful_stop_is_resumed(
    make_client, tmp_path, history, fitted, order, before, after, monkeypatch
):
    """A graceful stop hands a running job back without counting it as a lost worker; the next
    start counts it as resumed and finishes it, every series once, under the settings the job
    started with."""
    import threading

    from service import job_processing

    # The third part waits for the stop, so that the stop lands with parts kept.
    reached, calls = threading.Event(), []
    forecast_partition = job_processing._forecast_partition

    def third_waits_for_the_stop(ctx, *args):
        calls.append(1)
        if len(calls) == 3:
            reached.set()
            assert ctx.stopping.wait(30)
        return forecast_partition(ctx, *args)

    monkeypatch.setattr(job_processing, "_forecast_partition", third_waits_for_the_stop)
    copies = []
    for k in range(300):
        part = history.copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        copies.append(part)
    many = pd.concat(copies, ignore_index=True)
    if order == "by time":
        many = many.sort_values("ds", kind="stable")
    small = {"batch_partition_bytes": 4096}  # streamed a part per chunk, or partitioned
    client = make_client(**{**small, **before})
    response = client.post(
        "/v1/batch-jobs",
        content=many.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    job_id = response.json()["id"]
    assert reached.wait(60)
    if order == "by time":  # the parts kept are the partitions'
        assert (tmp_path / "data" / "jobs" / job_id / "partitions" / "_DONE").exists()
    client.__exit__(None, None, None)  # the lifespan's exit: a graceful stop
    monkeypatch.undo()
    stopped = JobStore(tmp_path / "data" / "jobs.db").get(job_id)
    assert stopped is not None
    assert (stopped.status, stopped.attempts) == ("queued", 0)

    restarted = make_client(**{**small, **after})
    done = wait_for_job(restarted, job_id, timeout=120)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    n_series = many["unique_id"].nunique()
    assert done["series_done"] == n_series
    metrics = restarted.get("/metrics").text
    assert 'forecaster_batch_jobs_total{event="resumed"} 1.0' in metrics
    got = read_result(restarted.get(f"/v1/batch-jobs/{job_id}/result"))
    assert len(got) == n_series * fitted.max_horizon
    assert not got.duplicated(["unique_id", "ds"]).any()


def test_job_of_a_dead_worker_is_resumed_on_start(make_client, tmp_path, history, fitted):
    """A job left 'running' by a process that died is picked up by the next start, keeping
    the partitions it had finished."""
    data = tmp_path / "data"
    client = make_client(batch_partition_bytes=4096, batch_chunk_series=1)
    body = history.to_csv(index=False).encode()
    # Submit while no worker may take it: stop the runner first, as a crash would.
    client.portal.call(client.app.state.job_runner.stop)
    response = client.post("/v1/batch-jobs", content=body, headers={"content-type": "text/csv"})
    job_id = response.json()["id"]
    store = JobStore(data / "jobs.db")
    dead_owner = "some-host-that-is-not-this-one:1:deadbeef"
    claimed = store.claim(dead_owner, lease_s=3600)
    assert claimed is not None and claimed.id == job_id
    # its lease runs out: the dead worker stopped renewing it long ago
    store._execute("UPDATE jobs SET heartbeat_at = 0 WHERE id = :id", id=job_id)
    client.__exit__(None, None, None)

    restarted = make_client(batch_partition_bytes=4096, batch_chunk_series=1)
    done = wait_for_job(restarted, job_id)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    got = read_result(restarted.get(f"/v1/batch-jobs/{job_id}/result"))
    assert_same_forecast(got, expected(fitted, history))


def test_a_job_waits_for_a_model(make_client, history, tmp_path):
    """Accepted without a model (nothing to check horizons against yet); stays queued."""
    from service.model_manager import ModelIdentity

    class Empty:
        label = uri = "forecaster@champion"

        def resolve(self) -> ModelIdentity:
            raise LookupError("registered model forecaster@champion not found")

        def load(self, identity):  # pragma: no cover - never reached
            raise AssertionError

    client = make_client(source=Empty())
    response = client.post(
        "/v1/batch-jobs",
        content=history.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 202
    time.sleep(0.5)
    assert client.get(f"/v1/batch-jobs/{response.json()['id']}").json()["status"] == "queued"


def _file_bytes(frame: pd.DataFrame, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "csv":
        frame.to_csv(buffer, index=False)
    else:
        frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_job_files_are_durable_before_202(client, history, tmp_path, monkeypatch, fmt):
    """The upload is fsynced, file and directory, before the job row that names it exists,
    so a crash after the 202 never leaves a queued job without its input."""
    events: list[str] = []
    monkeypatch.setattr(batch_jobs, "fsync_file", lambda path: events.append(f"file {path}"))
    monkeypatch.setattr(batch_jobs, "fsync_dir", lambda path: events.append(f"dir {path}"))
    create = JobStore.create

    def recording_create(self, **fields):
        events.append("create")
        return create(self, **fields)

    monkeypatch.setattr(JobStore, "create", recording_create)
    upload = _file_bytes(history, fmt)
    response = client.post(
        f"/v1/batch-jobs?format={fmt}",
        content=upload,
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["input_format"] == fmt
    row = JobStore(tmp_path / "data" / "jobs.db").get(job["id"])
    assert row is not None and row.input_format == fmt
    stored = Path(row.input_path)
    assert stored.read_bytes() == upload
    assert events == [f"file {stored}", f"dir {stored.parent}", "create"]


@pytest.mark.parametrize(("declared", "sent"), [("csv", "parquet"), ("parquet", "csv")])
def test_a_declared_format_the_upload_contradicts_is_refused(client, history, declared, sent):
    response = client.post(
        f"/v1/batch-jobs?format={declared}",
        content=_file_bytes(history, sent),
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "file"
    assert ("declared CSV" if declared == "csv" else "malformed Parquet") in response.json()[
        "detail"
    ]


def test_grouped_input_in_many_chunks_gives_the_same_result(make_client, fitted, training_frame):
    client = make_client(batch_partition_bytes=4096, batch_chunk_series=3)
    frames = []
    for k in range(4):
        part = training_frame.groupby("unique_id").tail(60).copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        frames.append(part)
    many = pd.concat(frames, ignore_index=True)
    response = client.post(
        "/v1/batch-jobs",
        content=many.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["rows_total"] == done["rows_done"] == len(many)
    got = read_result(client.get(f"/v1/batch-jobs/{done['id']}/result"))
    assert_same_forecast(got, expected(fitted, many))


def test_deleting_a_running_job_cancels_it_without_a_failure(
    make_client, history, caplog, tmp_path
):
    """Nor does it log forecasts: the rows of the chunks it had forecast were logged though
    no one received them (23,400 for a job cancelled at 31 %)."""
    from pipelines.forecast_log import read_log

    client = make_client(batch_chunk_series=1, forecast_log_flush_s=3600)
    many = pd.concat(
        [history.assign(unique_id=history["unique_id"] + f"-{k}") for k in range(100)],
        ignore_index=True,
    )
    files = {"file": ("h.csv", many.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    deadline = time.monotonic() + 30
    while client.get(f"/v1/batch-jobs/{job['id']}").json()["series_done"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert client.delete(f"/v1/batch-jobs/{job['id']}").status_code == 204
    assert client.get(f"/v1/batch-jobs/{job['id']}").status_code == 404
    metrics = wait_for_metric(client, 'forecaster_batch_jobs_total{event="cancelled"} 1.0')
    assert 'event="failed"' not in metrics
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    client.__exit__(None, None, None)  # flushes the log
    assert read_log(tmp_path / "data" / "forecast_log").empty


def test_an_accepted_job_starts_at_once_not_at_the_next_poll(make_client, history, monkeypatch):
    """Idle workers wait for a wake-up: an accepted job must not wait out the poll interval
    (made an hour here, so only the wake-up can start the job)."""
    from service import job_runner

    monkeypatch.setattr(job_runner, "IDLE_POLL_S", 3600.0)
    client = make_client(job_lease_s=3 * 3600.0)
    time.sleep(0.5)  # the worker has looked, found nothing and waits
    files = {"file": ("h.csv", history.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    assert wait_for_job(client, job["id"], timeout=30)["status"] == "succeeded"


def test_a_job_outlasting_its_lease_stays_with_its_worker(make_client, history, monkeypatch):
    """The running job's lease is renewed while it runs: another worker (or replica) must not
    take over a job that is merely slow, forecasting it twice."""
    from service import job_processing

    forecast_partition = job_processing._forecast_partition
    calls = []

    def slow(*args, **kwargs):
        calls.append(time.monotonic())
        time.sleep(4.5)  # three leases
        return forecast_partition(*args, **kwargs)

    monkeypatch.setattr(job_processing, "_forecast_partition", slow)
    client = make_client(batch_workers=2, job_lease_s=1.5)
    files = {"file": ("h.csv", history.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    assert wait_for_job(client, job["id"], timeout=30)["status"] == "succeeded"
    assert len(calls) == 1
    assert 'event="resumed"' not in client.get("/metrics").text


def test_finished_jobs_are_deleted_after_their_retention(make_client, history, tmp_path):
    client = make_client(job_ttl_hours=0.5 / 3600)  # half a second
    files = {"file": ("h.csv", history.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    assert wait_for_job(client, job["id"])["status"] == "succeeded"
    job_dir = tmp_path / "data" / "jobs" / job["id"]
    assert job_dir.exists()
    deadline = time.monotonic() + 10
    while client.get(f"/v1/batch-jobs/{job['id']}").status_code != 404:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The row goes first, so that no client sees a job whose files are gone; the files follow.
    while job_dir.exists():
        assert time.monotonic() < deadline, "the job's files outlived its row"
        time.sleep(0.05)


def test_a_job_store_from_before_the_counts_existed_gains_them(tmp_path):
    """Stores written by earlier versions lack the newer count columns: opening one adds
    them, and its jobs read as having none."""
    import sqlite3

    from service import job_store

    old_schema = job_store._SCHEMA
    for column in job_store._ADDED_COLUMNS:
        old_schema = "\n".join(line for line in old_schema.splitlines() if column not in line)
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(old_schema)
        conn.execute(
            "INSERT INTO jobs (id, status, created_at, input_path, input_owned, input_format, "
            "input_bytes, output_format) VALUES ('old', 'succeeded', 0, 'x.csv', 1, 'csv', 1, "
            "'csv')"
        )
    job = JobStore(path).get("old")
    assert (job.series_failed, job.glitches) == (0, 0)


def test_an_id_that_spells_a_missing_value_is_a_series_and_na_values_are_missing(
    client, history, fitted
):
    """ "NA" as an id is forecast like any other; "NA" as a value is a missing reading."""
    named = history.assign(unique_id=history["unique_id"].replace({"series_000": "NA"}))
    text = named.assign(y=named["y"].astype(object)).copy()
    text.loc[text.index[5], "y"] = "NA"
    files = {"file": ("h.csv", text.to_csv(index=False).encode(), "text/csv")}
    done = wait_for_job(client, client.post("/v1/batch-jobs", files=files).json()["id"])
    assert done["status"] == "succeeded" and done["series_failed"] == 0, done
    got = pd.read_csv(io.BytesIO(client.get(done["result_url"]).content), keep_default_na=False)
    assert set(got["unique_id"]) == set(named["unique_id"])


@pytest.mark.parametrize("partition_bytes", [None, 4096], ids=["one_part", "many_parts"])
def test_a_parquet_input_gets_its_id_type_and_zone_back(
    make_client, history, fitted, partition_bytes
):
    """Integer ids and Berlin timestamps: the result has them as `predict` and `forecaster
    predict` give them (before: ids '0', '1' that joined with nothing, and naive UTC times
    that read an hour early)."""
    settings = {} if partition_bytes is None else {"batch_partition_bytes": partition_bytes}
    client = make_client(**settings)
    codes = {sid: k for k, sid in enumerate(history["unique_id"].unique())}
    given = history.assign(
        unique_id=history["unique_id"].map(codes).astype("int64"),
        ds=history["ds"].dt.tz_localize("Europe/Berlin"),
    )
    buffer = io.BytesIO()
    given.to_parquet(buffer, index=False)
    response = client.post(
        "/v1/batch-jobs",
        content=buffer.getvalue(),
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    assert response.status_code == 202, response.text
    done = wait_for_job(client, response.json()["id"])
    assert done["status"] == "succeeded", done
    got = pd.read_parquet(io.BytesIO(client.get(done["result_url"]).content))
    got = got.sort_values(["unique_id", "ds"]).reset_index(drop=True)
    want = fitted.predict(given).sort_values(["unique_id", "ds"]).reset_index(drop=True)
    assert got["unique_id"].dtype == "int64" and str(got["ds"].dt.tz) == "Europe/Berlin"
    assert got["unique_id"].tolist() == want["unique_id"].tolist()
    assert (got["ds"] == want["ds"]).all()
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-5, atol=1e-5)
    as_csv = client.get(f"{done['result_url']}?format=csv")
    read_back = pd.read_csv(io.BytesIO(as_csv.content))
    instants = pd.to_datetime(read_back["ds"], utc=True).sort_values(ignore_index=True)
    assert (instants == want["ds"].dt.tz_convert("UTC").sort_values(ignore_index=True)).all()
