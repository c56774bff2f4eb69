"""The service's one settings object, read from the environment (prefix FORECASTER_SERVICE_).

Every value is checked when the settings are built, so a bad deployment fails at start with a
message naming the setting instead of on the first request.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from pipelines.settings import TrackingUri

ENV_PREFIX = "FORECASTER_SERVICE_"
DEFAULT_MODEL_URI = "models:/forecaster@champion"


class ServiceSettings(BaseSettings):
    """Deployment settings of the forecasting service."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        extra="ignore",
        validate_default=True,
        populate_by_name=True,
        # `${VAR:-}` in docker-compose.yml passes unset variables as empty: they mean "the
        # default" (an empty HOST once meant every interface, an empty DATA_DIR ".").
        env_ignore_empty=True,
        # No setting is meaningful at infinity (REQUEST_TIMEOUT_S=inf crashed the CLI).
        allow_inf_nan=False,
    )

    # Where uvicorn listens; `forecaster serve --host/--port/--workers` override these.
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # Worker processes. Each loads its own copy of the model and runs its own batcher.
    workers: int = Field(1, ge=1, le=64)

    # Registry URI of the model to serve; the alias is polled and followed.
    model_uri: str = DEFAULT_MODEL_URI
    # MLflow tracking/registry URI; None means MLflow's own resolution (MLFLOW_TRACKING_URI).
    tracking_uri: TrackingUri = None
    # torch device for inference ("cpu", "cuda", "cuda:1"); None picks cuda when present.
    # FORECASTER_DEVICE is read too: the registered pyfunc model honours the same variable.
    device: str | None = Field(
        None, validation_alias=AliasChoices(f"{ENV_PREFIX}DEVICE", "FORECASTER_DEVICE", "device")
    )
    # torch intra-op threads per process; None keeps torch's default (one per core). On
    # shared or CPU-limited machines 1 is usually fastest for online requests.
    torch_threads: int | None = Field(None, ge=1, le=256)
    # Seconds between checks of the registry alias for a new version.
    poll_interval_s: float = Field(30.0, gt=0)

    # API keys (comma-separated in the environment). When set, every route needs one in the
    # `X-API-Key` header or as `Authorization: Bearer <key>`; model reload always needs one.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)

    # Dynamic micro-batching of online requests: most series per forward pass, and how long
    # the first request of a batch may wait for others that are already on their way.
    max_batch_size: int = Field(256, ge=1)
    max_batch_wait_ms: float = Field(5.0, ge=0, le=10_000)
    # Online requests (forecast, invocations) running longer than this get 504.
    request_timeout_s: float = Field(30.0, gt=0)

    # Limits, each answered with a 4xx naming the limit.
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_series_per_request: int = Field(1000, ge=1)
    max_history_length: int = Field(20_000, ge=1)
    # A file uploaded to /v1/batch-jobs (streamed to disk); a JSON body there naming a file on
    # the server is held to max_body_bytes.
    max_upload_bytes: int = Field(4 * 1024**3, ge=1024)
    # Series per request with include_attention: the maps grow with heads x layers x tokens².
    max_attention_series: int = Field(16, ge=1)

    # Batch jobs: SQLite database and files live here; jobs submitted by path must name a
    # file under `input_dir` (default: `<data_dir>/inputs`), which is only read.
    data_dir: Path = Path("data/service")
    input_dir: Path | None = None
    # Jobs processed at the same time, series per model call within a job, and the input
    # bytes per partition (what one worker holds in memory at once, roughly 3-5x this).
    batch_workers: int = Field(1, ge=1, le=64)
    batch_chunk_series: int = Field(2048, ge=1)
    batch_partition_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # A running job whose worker has not reported for this long is taken over by another.
    job_lease_s: float = Field(60.0, gt=0)
    # Finished jobs (and their files) are deleted this long after they ended; None ("none" in
    # the environment) keeps them.
    job_ttl_hours: float | None = Field(168.0, gt=0)
    # The batch-job database: None is SQLite at <data_dir>/jobs.db, for one host. Replicas share
    # jobs through PostgreSQL (postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB) plus a data_dir
    # they all mount at the same path.
    jobs_db: str | None = None

    # Every forecast served (online and batch) is appended to the forecast log, which
    # `forecaster retrain` / `forecaster monitor` score once the actuals arrive (point their
    # `forecast_log` setting here). Default directory: `<data_dir>/forecast_log`.
    forecast_log: bool = True
    forecast_log_dir: Path | None = None
    # Buffered rows are written every this many seconds (and at shutdown); log files older
    # than the retention are deleted.
    forecast_log_flush_s: float = Field(10.0, gt=0)
    forecast_log_retention_days: float = Field(90.0, gt=0)

    log_level: str = "info"

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_variables(cls, data: object) -> object:
        from pipelines.settings import check_variables  # the one check of our variables

        check_variables(ENV_PREFIX, cls.model_fields)
        return data

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_long_enough(cls, value: list[SecretStr]) -> list[SecretStr]:
        for key in value:
            if len(key.get_secret_value()) < 16:
                raise ValueError("every API key must have at least 16 characters")
        return value

    @field_validator("model_uri")
    @classmethod
    def _check_model_uri(cls, value: str) -> str:
        from pipelines.registry import parse_model_uri  # the one parser of model URIs

        value = value.strip()
        parse_model_uri(value)  # InvalidModelUriError is a ValueError: pydantic reports it
        return value

    @field_validator("jobs_db")
    @classmethod
    def _check_jobs_db(cls, value: str | None) -> str | None:
        from service.job_store import job_store_url  # the one parser of job-store locations

        return job_store_url(value.strip()) if value and value.strip() else None

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("expected an address to listen on, such as 127.0.0.1 or 0.0.0.0")
        return value.strip()

    @field_validator("job_ttl_hours", mode="before")
    @classmethod
    def _none_keeps_jobs(cls, value: object) -> object:
        # The environment has no None: an empty value is the default (env_ignore_empty).
        return None if isinstance(value, str) and value.strip().lower() == "none" else value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str | None) -> str | None:
        if value in (None, "", "auto"):
            return None
        from forecaster.training import resolve_device  # the library's one device check

        resolve_device(value)  # InvalidConfigError is a ValueError: pydantic reports it
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if value.lower() not in levels:
            raise ValueError(f"expected one of {levels}, got {value!r}")
        return value.lower()

    @model_validator(mode="after")
    def _check_dirs(self) -> ServiceSettings:
        if self.input_dir is None:
            self.input_dir = self.data_dir / "inputs"
        if self.forecast_log_dir is None:
            self.forecast_log_dir = self.data_dir / "forecast_log"
        # Jobs and downloaded models are written under data_dir; inputs are only read, so the
        # input directory may be a read-only mount.
        checks = [
            ("data_dir", os.W_OK | os.X_OK, "writable"),
            ("input_dir", os.R_OK | os.X_OK, "readable"),
        ]
        if self.forecast_log:  # else every flush would fail, and the rows be lost
            checks.append(("forecast_log_dir", os.W_OK | os.X_OK, "writable"))
        for name, access, needs in checks:
            path = Path(getattr(self, name))
            if not path.is_dir():
                try:
                    path.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ValueError(f"{name}: cannot create {str(path)!r}: {exc}") from exc
            if not os.access(path, access):
                raise ValueError(f"{name}: expected a {needs} directory, {str(path)!r} is not")
        return self

    @property
    def model_label(self) -> str:
        """`NAME@alias` (or NAME/version) of the configured model, for messages."""
        return self.model_uri.removeprefix("models:/")


def settings_env(overrides: dict[str, object]) -> dict[str, str]:
    """Environment variables that carry CLI overrides into uvicorn's worker processes."""
    return {f"{ENV_PREFIX}{k.upper()}": str(v) for k, v in overrides.items() if v is not None}
