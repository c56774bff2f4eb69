"""PostgreSQL, started by the tests (pgserver): the job store that replicas share, two
`forecaster serve` replicas finishing each other's jobs, and MLflow's tracking server on it."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import socket
import threading
import time

import httpx
import pandas as pd
import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from pipelines.cli import main as pipelines_cli
from service.job_runner import ORPHAN_AGE_S
from service.job_store import JobStore
from service.settings import ServiceSettings
from tests.pipelines.pipeline_helpers import (
    PROMOTABLE_TRAIN,
    TINY_MODEL,
    noisy_history,
    synthetic,
)
from tests.servers import API_KEY, free_port, mlflow_server, postgres, start_service, wait_until

HEADERS = {"X-API-Key": API_KEY}


@pytest.fixture()
def pg_uri(tmp_path):
    with postgres(tmp_path / "pg") as uri:
        yield uri


def add_job(store: JobStore, job_id: str) -> None:
    store.create(
        id=job_id,
        input_path=f"/data/{job_id}.csv",
        input_format="csv",
        input_bytes=1,
        output_format="csv",
    )


# -- settings and the shared job directory, no server ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/srv/jobs.db", "sqlite:////srv/jobs.db"),
        ("sqlite:///jobs.db", "sqlite:///jobs.db"),
        ("postgresql://app:secret@db:5432/jobs", "postgresql+psycopg://app:secret@db:5432/jobs"),
        ("postgresql+psycopg://app@db/jobs", "postgresql+psycopg://app@db/jobs"),
    ],
)
def test_jobs_db_setting(tmp_path, value, expected):
    assert ServiceSettings(data_dir=tmp_path, jobs_db=value).jobs_db == expected
    assert ServiceSettings(data_dir=tmp_path).jobs_db is None  # SQLite under data_dir


@pytest.mark.parametrize(
    "value", ["mysql://app:secret@db/jobs", "postgresql+psycopg2://app:secret@db/jobs"]
)
def test_jobs_db_setting_fails_fast_without_showing_the_password(tmp_path, value):
    with pytest.raises(ValidationError) as caught:
        ServiceSettings(data_dir=tmp_path, jobs_db=value)
    (error,) = caught.value.errors()
    assert error["loc"] == ("jobs_db",)
    # what `forecaster serve` prints
    assert "jobs_db: expected a SQLite file path" in error["msg"]
    assert "secret" not in error["msg"]


def test_a_postgres_store_without_its_driver_says_how_to_install_it(tmp_path, monkeypatch):
    """psycopg is an extra: without it the setting fails at start, not at the first job."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "psycopg" else find_spec(name, *a),
    )
    with pytest.raises(ValidationError) as caught:
        ServiceSettings(data_dir=tmp_path, jobs_db="postgresql://app:secret@db/jobs")
    (error,) = caught.value.errors()
    assert error["loc"] == ("jobs_db",)
    assert "needs the psycopg driver" in error["msg"]
    assert "pip install 'forecaster[postgres]'" in error["msg"]
    assert "secret" not in error["msg"]


def test_orphan_cleanup_spares_uploads_that_may_still_be_arriving(make_client, tmp_path):
    """Replicas and worker processes share the job directory: at start, a directory without
    a row is removed only once nothing in it has changed for ORPHAN_AGE_S."""
    jobs = tmp_path / "data" / "jobs"
    for name in ("arriving", "still-writing", "abandoned"):
        (jobs / name).mkdir(parents=True)
        (jobs / name / "input.upload").write_text("unique_id,ds,y\n")
    old = time.time() - ORPHAN_AGE_S - 60
    # An upload streams into its file: the directory's own time stops at the file's creation.
    for path in (jobs / "abandoned", jobs / "abandoned" / "input.upload", jobs / "still-writing"):
        os.utime(path, (old, old))
    make_client()
    assert sorted(p.name for p in jobs.iterdir()) == ["arriving", "still-writing"]


# -- the PostgreSQL job store ----------------------------------------------------------------------


@pytest.mark.slow
def test_postgres_job_store_is_shared_and_leased(pg_uri):
    replica_a, replica_b = JobStore(pg_uri), JobStore(pg_uri)  # as two replicas open it
    try:
        ids = [f"job-{i:02d}" for i in range(30)]
        for job_id in ids:
            add_job(replica_a, job_id)
        assert replica_b.get("job-00") is not None and len(replica_b.list(limit=100)) == 30

        # Eight workers on the two replicas claim at once: every job exactly once.
        claimed: list[str] = []
        lock = threading.Lock()

        def drain(store: JobStore, owner: str) -> None:
            while (job := store.claim(owner, lease_s=3600)) is not None:
                with lock:
                    claimed.append(job.id)

        threads = [
            threading.Thread(target=drain, args=(store, f"host-{i}:{i}:token"))
            for i, store in enumerate([replica_a, replica_b] * 4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(claimed) == ids
        for job_id in ids:
            replica_a.delete(job_id)

        # A lease that has not expired holds, even when its owner's pid is gone from this
        # host: on a shared store pids mean nothing.
        dead = f"{socket.gethostname()}:999999999:gone"
        add_job(replica_a, "leased")
        taken = replica_a.claim(dead, lease_s=3600)
        assert taken is not None and taken.id == "leased" and taken.attempts == 1
        assert replica_b.claim("host-b:1:b", lease_s=3600) is None
        # Once it has expired, the other replica takes the job over; the first owner's
        # progress reports and its finish are refused from then on.
        time.sleep(0.2)
        again = replica_b.claim("host-b:1:b", lease_s=0.1)
        assert again is not None and again.id == "leased" and again.attempts == 2
        assert again.owner == "host-b:1:b"
        assert not replica_a.update("leased", dead, rows_done=5)
        assert not replica_a.finish("leased", dead, "succeeded")
        assert replica_b.finish("leased", "host-b:1:b", "succeeded")
        assert replica_a.get("leased").status == "succeeded"
    finally:
        replica_a.close()
        replica_b.close()


def test_replicas_starting_together_all_open_a_new_store(pg_uri):
    """Replicas of a new deployment start at once, and each creates the jobs table if it is
    not there: without a lock around that, PostgreSQL fails all but one of them."""
    admin = create_engine(pg_uri, isolation_level="AUTOCOMMIT")
    failures: list[Exception] = []
    for start in range(2):  # the race is lost often, not always: two fresh stores
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE fresh_{start}")
        uri = pg_uri.replace("@/postgres?", f"@/fresh_{start}?")
        barrier = threading.Barrier(8)

        def open_store(uri: str = uri, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                JobStore(uri).close()
            except DBAPIError as exc:  # the lost race: a duplicate key in the catalogue
                failures.append(exc)

        replicas = [threading.Thread(target=open_store) for _ in range(8)]
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.join(60)
    admin.dispose()
    assert failures == []


def test_a_store_carries_on_after_the_database_drops_its_connections(pg_uri):
    """A database restart or failover, or an idle timeout, cuts the pooled connections: the
    store's next call must not fail on a dead one."""
    store = JobStore(pg_uri)
    admin = create_engine(pg_uri, isolation_level="AUTOCOMMIT")
    try:
        add_job(store, "job")
        with admin.connect() as conn:
            cut = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).all()
        assert cut  # the store's pooled connection was among them
        assert store.get("job").status == "queued"
    finally:
        admin.dispose()
        store.close()


@pytest.mark.slow
def test_replicas_share_jobs_and_finish_a_killed_replicas_job(
    tmp_path, pg_uri, registry, fitted, training_frame
):
    """Two `forecaster serve` on one PostgreSQL job store and one data directory: a job
    submitted to A is seen from B; the replica running it is killed (SIGKILL) mid-job, the
    other takes it over once its lease has expired, finishes it, and serves the result."""
    registry.register(fitted, training_frame)
    env = {"FORECASTER_SERVICE_JOBS_DB": pg_uri, "FORECASTER_SERVICE_JOB_LEASE_S": "5"}
    data_dir = tmp_path / "shared-data"
    ports = {"a": free_port(), "b": free_port()}
    replicas = {
        name: start_service(tmp_path, port, registry.tracking_uri, name, data_dir=data_dir, env=env)
        for name, port in ports.items()
    }
    http = {
        name: httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=HEADERS, timeout=30)
        for name, port in ports.items()
    }
    store = JobStore(pg_uri)
    try:
        for name, client in http.items():
            wait_until(
                lambda c=client: c.get("/readyz").status_code == 200,
                120,
                f"replica {name}",
                replicas[name].proc,
            )
        history = training_frame.groupby("unique_id").tail(60)
        # 600 series in chunks of 4: seconds of work, so the job is killed part-way
        big = pd.concat(
            [history.assign(unique_id=history["unique_id"] + f"-{k}") for k in range(150)],
            ignore_index=True,
        )
        accepted = http["a"].post(
            "/v1/batch-jobs",
            content=big.to_csv(index=False).encode(),
            headers={"content-type": "text/csv"},
        )
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        running = wait_until(
            lambda: (
                (j := http["b"].get(f"/v1/batch-jobs/{job_id}").json())["status"] == "running"
                and j["rows_done"] > 0
                and j
            ),
            60,
            "the job to run, seen from replica B",
        )
        assert running["rows_done"] < running["rows_total"]

        # A claims the job it was given at once; should B have polled first, B is the one
        # killed and A the one that takes over.
        owner_pid = int(store.get(job_id).owner.split(":")[1])
        victim = next(n for n, r in replicas.items() if r.proc.pid == owner_pid)
        survivor = "b" if victim == "a" else "a"
        replicas[victim].stop(signal.SIGKILL)

        done = wait_until(
            lambda: (
                (j := http[survivor].get(f"/v1/batch-jobs/{job_id}").json())["status"]
                in ("succeeded", "failed")
                and j
            ),
            120,
            "the surviving replica to finish the job",
            replicas[survivor].proc,
        )
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2
        metrics = http[survivor].get("/metrics").text
        assert 'forecaster_batch_jobs_total{event="resumed"} 1.0' in metrics
        result = http[survivor].get(f"/v1/batch-jobs/{job_id}/result?format=csv")
        assert result.status_code == 200
        frame = pd.read_csv(io.BytesIO(result.content))
        assert len(frame) == 600 * fitted.max_horizon
        assert frame["unique_id"].nunique() == 600
    except BaseException:
        for name, replica in replicas.items():
            print(f"--- replica {name}\n{replica.tail()}")
        raise
    finally:
        store.close()
        for client in http.values():
            client.close()
        for replica in replicas.values():
            replica.stop()


# -- MLflow's tracking server on PostgreSQL --------------------------------------------------------


def served_version(http: httpx.Client) -> str | None:
    return (http.get("/v1/models").json()["loaded"] or {}).get("version")


@pytest.mark.slow
def test_retrain_promote_rollback_and_serve_on_mlflow_backed_by_postgres(tmp_path, pg_uri, capsys):
    """`mlflow server --backend-store-uri postgresql+psycopg://...`: two retrains, a promote,
    a rollback, and `forecaster serve` following the champion alias through them."""
    clean = synthetic()
    clean.to_csv(tmp_path / "clean.csv", index=False)
    keep = TINY_MODEL["context_length"] + 3 * TINY_MODEL["prediction_length"]
    noisy_history(clean, keep).to_csv(tmp_path / "noisy.csv", index=False)
    config = tmp_path / "settings.yaml"

    def cli(command: str, *args: str) -> str:
        """A `forecaster` pipeline command, in this process (it has torch and MLflow loaded)."""
        code = pipelines_cli([command, "--config", str(config), *args])
        out = capsys.readouterr().out
        assert code == 0, out
        return out

    with mlflow_server(tmp_path / "mlflow", pg_uri) as (uri, _):
        settings = {
            "tracking_uri": uri,
            "model": TINY_MODEL,
            "train": PROMOTABLE_TRAIN,
            "refit": False,
            "lock_file": str(tmp_path / "lock"),
        }
        config.write_text(json.dumps(settings))
        port = free_port()
        # started first, it waits for a champion (and loads meanwhile)
        service = start_service(tmp_path, port, uri, "pg")
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=HEADERS, timeout=30)
        try:
            # A weak first champion: one epoch on history whose seasonality is noise.
            noisy = str(tmp_path / "noisy.csv")
            first = cli("retrain", "--data", noisy, "--set", "train.max_epochs=1")
            assert "champion  forecaster v1" in first
            wait_until(lambda: served_version(http) == "1", 120, "v1 served", service.proc)
            # A better model, held back by a margin no model meets: @challenger only.
            data = str(tmp_path / "clean.csv")
            second = cli("retrain", "--data", data, "--set", "promotion_margin=0.99")
            assert "decision  not promoted" in second and "champion  forecaster v1" in second
            promoted = cli("promote", "--data", data)
            assert "decision  promoted" in promoted and "champion  forecaster v2" in promoted
            wait_until(lambda: served_version(http) == "2", 60, "v2 served", service.proc)
            assert "champion  forecaster v2 -> v1" in cli("rollback")
            wait_until(lambda: served_version(http) == "1", 60, "v1 served again", service.proc)
        except BaseException:
            print(service.tail())
            raise
        finally:
            http.close()
            service.stop()

    # The registry lives in PostgreSQL: read it there, with the tracking server gone.
    engine = create_engine(pg_uri)
    try:
        with engine.connect() as conn:
            versions = (
                conn.execute(text("SELECT version FROM model_versions WHERE name = 'forecaster'"))
                .scalars()
                .all()
            )
            aliases = conn.execute(
                text(
                    "SELECT alias, version FROM registered_model_aliases WHERE name = 'forecaster'"
                )
            ).all()
        assert sorted(versions) == [1, 2]
        assert dict(aliases) == {"champion": 1, "challenger": 2}
    finally:
        engine.dispose()
