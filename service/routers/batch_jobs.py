"""Batch jobs: upload (or name) a long-format file, poll the job, fetch the result."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from service import rules
from service.deps import JobRunnerDep, JobStoreDep, ManagerDep, MetricsDep, SettingsDep
from service.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnsupportedMediaTypeError,
)
from service.job_files import (
    JobFiles,
    fsync_dir,
    fsync_file,
    inspect_input,
    sniff_format,
    write_csv,
)
from service.job_processing import check_batchable
from service.job_store import Job
from service.schemas import BatchJobFromPath, BatchJobList, BatchJobOut, FileFormat

router = APIRouter(prefix="/v1/batch-jobs", tags=["batch-jobs"])

CSV_TYPES = ("text/csv", "application/csv")
PARQUET_TYPES = ("application/vnd.apache.parquet", "application/x-parquet", "application/parquet")
MEDIA = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet"}

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The input in long format (unique_id, ds, y): a multipart upload, the "
        "raw file, or a JSON body naming a file under the service's input directory.",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "horizon": {"type": "integer", "minimum": 1},
                        "quantiles": {"type": "string", "description": "e.g. 0.1,0.9"},
                        "output_format": {"type": "string", "enum": ["csv", "parquet"]},
                    },
                }
            },
            "text/csv": {"schema": {"type": "string"}},
            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": BatchJobFromPath.model_json_schema()},
        },
    }
}


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def job_out(job: Job) -> dict[str, Any]:
    model = None
    if job.model_name is not None:
        model = {
            "name": job.model_name,
            "version": job.model_version,
            "alias": job.model_alias,
            "run_id": job.model_run_id,
        }
    return {
        "id": job.id,
        "status": job.status,
        "created_at": _ts(job.created_at),
        "started_at": _ts(job.started_at),
        "finished_at": _ts(job.finished_at),
        "input_format": job.input_format,
        "output_format": job.output_format,
        "horizon": job.horizon,
        "quantiles": job.quantiles,
        "progress": job.progress,
        "rows_total": job.rows_total,
        "rows_done": job.rows_done,
        "series_done": job.series_done,
        "series_failed": job.series_failed,
        "glitches": job.glitches,
        "model": model,
        "attempts": job.attempts,
        "error": job.error,
        "result_url": f"/v1/batch-jobs/{job.id}/result" if job.status == "succeeded" else None,
        "errors_url": f"/v1/batch-jobs/{job.id}/errors" if job.series_failed else None,
        "glitches_url": (
            f"/v1/batch-jobs/{job.id}/glitches"
            if job.glitches and job.status == "succeeded"
            else None
        ),
    }


def _parse_format(text: str | None, field: str) -> str | None:
    if text is None or text == "":
        return None
    if text not in ("csv", "parquet"):
        raise InvalidInputError(f"{field}: expected csv or parquet, got {text!r}", field=field)
    return text


async def _stream_body(request: Request, path: Path) -> None:
    with open(path, "wb") as f:
        async for chunk in request.stream():
            f.write(chunk)


def _copy_upload(upload: UploadFile, path: Path) -> None:
    upload.file.seek(0)
    with open(path, "wb") as f:
        shutil.copyfileobj(upload.file, f, length=1 << 20)


def _resolve_input_path(relative: str, input_dir: Path) -> Path:
    root = input_dir.resolve()
    try:
        candidate = (root / relative).resolve()
        is_file = candidate.is_file()
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long for the file system
        raise InvalidInputError(
            f"path: {relative[:100]!r} is not a usable file name: {exc}", field="path"
        ) from None
    if not candidate.is_relative_to(root):
        raise InvalidInputError(
            f"path: {relative!r} is outside the input directory; give a path relative to it",
            field="path",
        )
    if not is_file:
        raise InvalidInputError(
            f"path: no file {relative!r} under the input directory", field="path"
        )
    return candidate


@router.post(
    "",
    status_code=202,
    response_model=BatchJobOut,
    openapi_extra=_UPLOAD_BODY,
    responses={
        413: {"description": "Upload over max_upload_bytes"},
        415: {"description": "Unsupported content type"},
        422: {"description": "Malformed file, missing columns, bad horizon or quantiles"},
    },
    summary="Submit a batch job (202 once the input is safely on disk)",
)
async def create_job(
    request: Request,
    response: Response,
    store: JobStoreDep,
    runner: JobRunnerDep,
    manager: ManagerDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    horizon: Annotated[str | None, Query(description="Steps to forecast, e.g. 24")] = None,
    quantiles: Annotated[str | None, Query(description="e.g. 0.1,0.9")] = None,
    output_format: FileFormat | None = None,
    format: Annotated[FileFormat | None, Query(description="Input format for raw uploads")] = None,
) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "")
    mime = content_type.split(";")[0].strip().lower()
    job_id = uuid.uuid4().hex
    files = JobFiles(Path(settings.data_dir) / "jobs", job_id)
    files.dir.mkdir(parents=True)
    received = files.dir / "input.upload"
    owned = True
    try:
        steps = rules.parse_horizon(horizon)
        q_values = rules.parse_quantiles(quantiles)
        declared: str | None = format
        if mime == "multipart/form-data":
            form = await request.form(max_files=1, max_fields=16)
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidInputError(
                    "file: the multipart body needs a 'file' part holding the CSV or Parquet",
                    field="file",
                )
            steps = rules.parse_horizon(_text(form.get("horizon"))) or steps
            q_values = _given(rules.parse_quantiles(_text(form.get("quantiles"))), q_values)
            output_format = _parse_format(_text(form.get("output_format")), "output_format") or (
                output_format
            )
            name = (upload.filename or "").lower()
            if name.endswith((".parquet", ".pq")) or (upload.content_type or "") in PARQUET_TYPES:
                declared = declared or "parquet"
            elif name.endswith(".csv"):
                declared = declared or "csv"
            await asyncio.to_thread(_copy_upload, upload, received)
            await form.close()
            input_path = received
        elif mime in CSV_TYPES or mime in PARQUET_TYPES or mime == "application/octet-stream":
            if mime in CSV_TYPES:
                declared = "csv"
            elif mime in PARQUET_TYPES:
                declared = "parquet"
            await _stream_body(request, received)
            input_path = received
        elif mime == "application/json":
            raw = await request.body()
            try:
                spec = BatchJobFromPath.model_validate_json(raw)
            except ValidationError as exc:
                raise RequestValidationError(exc.errors(), body=raw) from None
            input_path = _resolve_input_path(spec.path, Path(settings.input_dir))
            owned = False
            steps = rules.parse_horizon(spec.horizon) or steps
            q_values = _given(rules.parse_quantiles(spec.quantiles), q_values)
            output_format = spec.output_format or output_format
        else:
            raise UnsupportedMediaTypeError(
                f"content-type {content_type!r}: send multipart/form-data with a 'file' part, "
                "the file itself as text/csv or application/vnd.apache.parquet, or JSON "
                '{"path": ...} naming a file under the input directory',
                field="content-type",
            )

        fmt = await asyncio.to_thread(sniff_format, input_path, declared)
        if owned:
            final = files.input_file(fmt)
            os.replace(received, final)
            input_path = final
        served = manager.current
        if served is not None:  # without a model, the job waits and is checked when it runs
            check_batchable(served.forecaster)
            rules.resolve(served, steps, q_values)
        await asyncio.to_thread(inspect_input, input_path, fmt)
        if owned:
            await asyncio.to_thread(_make_durable, input_path)
        job = await asyncio.to_thread(
            lambda: store.create(
                id=job_id,
                input_path=str(input_path),
                input_owned=owned,
                input_format=fmt,
                input_bytes=input_path.stat().st_size,
                output_format=output_format or fmt,
                horizon=steps,
                quantiles=q_values,
            )
        )
    except BaseException:
        shutil.rmtree(files.dir, ignore_errors=True)
        raise
    metrics.jobs.labels("accepted").inc()
    runner.wake()
    response.headers["Location"] = f"/v1/batch-jobs/{job.id}"
    return job_out(job)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _given(value: list[float] | None, default: list[float] | None) -> list[float] | None:
    """`value` when the request gave one, an empty list (the mean alone) included."""
    return default if value is None else value


def _make_durable(path: Path) -> None:
    fsync_file(path)
    fsync_dir(path.parent)


@router.get("", response_model=BatchJobList, summary="Recent batch jobs, newest first")
async def list_jobs(
    store: JobStoreDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    status: Annotated[
        str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$")
    ] = None,
) -> dict[str, Any]:
    jobs = await asyncio.to_thread(store.list, limit, status)
    return {"jobs": [job_out(j) for j in jobs]}


async def _get(store: Any, job_id: str) -> Job:
    job = await asyncio.to_thread(store.get, job_id)
    if job is None:
        raise NotFoundError(f"job_id: no batch job {job_id!r}", field="job_id")
    return job


@router.get(
    "/{job_id}",
    response_model=BatchJobOut,
    summary="Status and progress of a job",
    responses={404: {"description": "No such job"}},
)
async def get_job(job_id: str, store: JobStoreDep) -> dict[str, Any]:
    return job_out(await _get(store, job_id))


@router.get(
    "/{job_id}/result",
    response_class=FileResponse,
    responses={
        200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}}},
        404: {"description": "No such job"},
        409: {"description": "The job has not succeeded (yet)"},
    },
    summary="The forecasts of a finished job, as CSV or Parquet",
)
async def get_result(
    job_id: str,
    store: JobStoreDep,
    settings: SettingsDep,
    format: FileFormat | None = None,
) -> FileResponse:
    job = await _get(store, job_id)
    if job.status != "succeeded":
        detail = f"job {job_id} is {job.status}"
        if job.status in ("queued", "running"):
            detail += f" ({job.progress:.0%} done); try again later"
        elif job.error:
            detail += f": {job.error.get('detail')}"
        raise ConflictError(detail, field="job_id")
    fmt = format or job.output_format
    files = JobFiles(Path(settings.data_dir) / "jobs", job_id)
    path = files.result(fmt)
    if not path.exists():
        if fmt == "csv" and files.result_parquet.exists():
            await asyncio.to_thread(write_csv, files.result_parquet, files.result_csv)
        else:
            raise NotFoundError(f"job {job_id}: its result file is gone", field="job_id")
    return FileResponse(path, media_type=MEDIA[fmt], filename=f"forecast-{job_id}.{fmt}")


@router.get(
    "/{job_id}/errors",
    response_class=FileResponse,
    responses={
        200: {"content": {"text/csv": {}}},
        404: {"description": "No such job, or no series was left out"},
    },
    summary="The series a job left out and why (unique_id, field, error, detail), as CSV",
)
async def get_errors(job_id: str, store: JobStoreDep, settings: SettingsDep) -> FileResponse:
    job = await _get(store, job_id)
    path = JobFiles(Path(settings.data_dir) / "jobs", job_id).errors_csv
    if not job.series_failed or not path.exists():
        raise NotFoundError(f"job {job_id} has left out no series (yet)", field="job_id")
    return FileResponse(path, media_type="text/csv", filename=f"errors-{job_id}.csv")


@router.get(
    "/{job_id}/glitches",
    response_class=FileResponse,
    responses={
        200: {"content": {"text/csv": {}}},
        404: {"description": "No such job, the job has not succeeded, or it met no glitch"},
    },
    summary="The readings a job's forecasts did not use because the model read them as "
    "glitches (unique_id, ds), as CSV",
)
async def get_glitches(job_id: str, store: JobStoreDep, settings: SettingsDep) -> FileResponse:
    job = await _get(store, job_id)
    path = JobFiles(Path(settings.data_dir) / "jobs", job_id).glitches_csv
    if job.status != "succeeded" or not job.glitches or not path.exists():
        raise NotFoundError(
            f"job {job_id} lists no glitch (status {job.status}, {job.glitches} glitches)",
            field="job_id",
        )
    return FileResponse(path, media_type="text/csv", filename=f"glitches-{job_id}.csv")


@router.delete(
    "/{job_id}",
    status_code=204,
    responses={404: {"description": "No such job"}},
    summary="Cancel a job if it is running, and delete it with its files",
)
async def delete_job(job_id: str, store: JobStoreDep, settings: SettingsDep) -> Response:
    job = await _get(store, job_id)
    if job.status in ("queued", "running"):
        await asyncio.to_thread(store.cancel, job_id)
    await asyncio.to_thread(store.delete, job_id)
    files = JobFiles(Path(settings.data_dir) / "jobs", job_id)
    await asyncio.to_thread(shutil.rmtree, files.dir, True)
    return Response(status_code=204)
