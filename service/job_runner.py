"""The bounded pool of batch-job workers.

`batch_workers` asyncio tasks claim jobs from the store and run each in a worker thread (one
thread per worker, so at most `batch_workers` jobs hold memory at once). While a job runs, a
heartbeat renews its lease; on a graceful stop a running job is handed back to the queue, and
after a crash the next start (or, sharing a PostgreSQL store, another replica once the lease has
expired) claims it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from service.job_files import JobFiles
from service.job_processing import (
    ForecastHook,
    JobContext,
    JobStopped,
    input_error_payload,
    process_job,
)
from service.job_store import Job, JobStore, new_owner
from service.metrics import ServiceMetrics
from service.model_manager import ModelManager
from service.supervisor import Supervisor

logger = logging.getLogger(__name__)

IDLE_POLL_S = 1.0
RETENTION_CHECK_S = 3600.0
# An upload being received writes its file continuously; one untouched this long is abandoned.
ORPHAN_AGE_S = 3600.0


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        jobs_dir: Path,
        manager: ModelManager,
        metrics: ServiceMetrics,
        *,
        workers: int,
        chunk_series: int,
        partition_bytes: int,
        lease_s: float,
        ttl_s: float | None = None,
        on_forecast: ForecastHook | None = None,
        publish_log: Callable[[list[Path]], None] | None = None,
    ):
        self.store = store
        self.on_forecast = on_forecast
        self.publish_log = publish_log
        self.jobs_dir = Path(jobs_dir)
        self.manager = manager
        self.metrics = metrics
        self.workers = workers
        self.chunk_series = chunk_series
        self.partition_bytes = partition_bytes
        self.lease_s = lease_s
        self.ttl_s = ttl_s
        self.owner = new_owner()
        self._wake = asyncio.Event()
        self._stopping = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batch-job")
        self._supervisor: Supervisor | None = None

    def start(self, supervisor: Supervisor) -> None:
        """Clean up abandoned uploads, then run the workers under `supervisor`."""
        self._cleanup_orphans()
        self._supervisor = supervisor
        for i in range(self.workers):
            supervisor.start(self._name(i), lambda i=i: self._worker(i))
        if self.ttl_s is not None:
            supervisor.start("job-retention", self._retention)

    @staticmethod
    def _name(index: int) -> str:
        return f"batch-worker-{index}"

    def wake(self) -> None:
        """A job was just accepted: look now instead of at the next poll."""
        self._wake.set()

    async def stop(self, timeout: float = 10.0) -> None:
        """Ask the workers to stop (a running job pauses at its next chunk), wait up to
        `timeout`, then cancel them."""
        self._stopping.set()
        self._wake.set()
        if self._supervisor is not None:
            names = [self._name(i) for i in range(self.workers)]
            await self._supervisor.stop(*names, grace_s=timeout)
            await self._supervisor.stop("job-retention")
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _retention(self) -> None:
        """Delete jobs that ended more than `ttl_s` ago, with their files, now and then."""
        assert self.ttl_s is not None
        while True:
            expired = await asyncio.to_thread(self.store.finished_before, time.time() - self.ttl_s)
            for job_id in expired:
                await asyncio.to_thread(self.store.delete, job_id)
                await asyncio.to_thread(shutil.rmtree, self.jobs_dir / job_id, True)
            if expired:
                logger.info("deleted %d batch job(s) past their retention", len(expired))
            await asyncio.sleep(min(RETENTION_CHECK_S, self.ttl_s / 4))

    def _cleanup_orphans(self) -> None:
        """Job directories without a row are uploads never accepted, or still on their way in
        another worker process or replica sharing the directory: remove those left alone for
        ORPHAN_AGE_S."""
        if not self.jobs_dir.exists():
            return
        known = self.store.ids()
        cutoff = time.time() - ORPHAN_AGE_S
        for path in self.jobs_dir.iterdir():
            if path.is_dir() and path.name not in known and _last_change(path) < cutoff:
                shutil.rmtree(path, ignore_errors=True)

    async def _worker(self, index: int) -> None:
        poll = min(IDLE_POLL_S, self.lease_s / 3)
        while not self._stopping.is_set():
            job = None
            served = self.manager.current
            if served is not None:
                try:
                    job = await asyncio.to_thread(self.store.claim, self.owner, self.lease_s)
                except Exception:
                    logger.exception("claiming a batch job failed")
            if job is None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), poll)
                continue
            await self._run(job)

    async def _run(self, job: Job) -> None:
        served = self.manager.current
        assert served is not None
        if job.resumed:
            self.metrics.jobs.labels("resumed").inc()
            logger.info("resuming batch job %s", job.id)
        else:
            logger.info("starting batch job %s", job.id)

        def report(**values: object) -> bool:
            return self.store.update(job.id, self.owner, **values)

        ctx = JobContext(
            job=job,
            files=JobFiles(self.jobs_dir, job.id),
            served=served,
            chunk_series=self.chunk_series,
            partition_bytes=self.partition_bytes,
            report=report,
            stopping=self._stopping,
            on_forecast=self.on_forecast,
            publish_log=self.publish_log,
        )
        heartbeat = asyncio.create_task(self._heartbeat(job.id))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, _run_in_inference_mode, ctx)
        except JobStopped as exc:
            if self._stopping.is_set():
                await asyncio.to_thread(self.store.release, job.id, self.owner)
                logger.info("batch job %s handed back to the queue: %s", job.id, exc)
            else:
                logger.info("batch job %s stopped: %s", job.id, exc)
                self.metrics.jobs.labels("cancelled").inc()
            return
        except Exception as exc:
            current = await asyncio.to_thread(self.store.get, job.id)
            if current is None or current.status == "cancelled":
                # Deleted or cancelled while running: its files may be gone under it.
                logger.info("batch job %s stopped: cancelled or deleted while running", job.id)
                self.metrics.jobs.labels("cancelled").inc()
                return
            payload = input_error_payload(exc)
            if payload["error"] == "internal_error":
                logger.exception("batch job %s failed", job.id)
            else:
                logger.warning("batch job %s failed on its input: %s", job.id, payload["detail"])
            await asyncio.to_thread(self.store.finish, job.id, self.owner, "failed", payload)
            self.metrics.jobs.labels("failed").inc()
            return
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        finished = await asyncio.to_thread(self.store.finish, job.id, self.owner, "succeeded")
        if finished:
            done = await asyncio.to_thread(self.store.get, job.id)
            self.metrics.jobs.labels("succeeded").inc()
            if done is not None:
                self.metrics.job_series.inc(done.series_done)
            logger.info("batch job %s succeeded", job.id)

    async def _heartbeat(self, job_id: str) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await asyncio.to_thread(self.store.update, job_id, self.owner)
            except Exception:
                logger.exception("heartbeat for batch job %s failed", job_id)


def _last_change(directory: Path) -> float:
    """The newest modification time of a directory and the files directly in it."""
    times = [directory.stat().st_mtime]
    for path in directory.iterdir():
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            times.append(path.stat().st_mtime)
    return max(times)


def _run_in_inference_mode(ctx: JobContext) -> None:
    with torch.inference_mode():
        process_job(ctx)
