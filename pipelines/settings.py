"""`PipelineSettings`: the one settings object of the pipelines.

Sources, highest priority first: explicit overrides (CLI options), environment variables
(prefix ``FORECASTER_``, nested keys with ``__``, e.g. ``FORECASTER_MODEL__CONTEXT_LENGTH=96``),
a ``.env`` file in the working directory, a YAML file given with ``--config``, then defaults.

With nothing configured the tracking store and registry are ``sqlite:///mlflow.db`` with
artifacts in ``./mlartifacts``; ``MLFLOW_TRACKING_URI`` is honoured as MLflow defines it
(``FORECASTER_TRACKING_URI`` / ``tracking_uri`` wins when both are set).
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import os
import typing
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from croniter import CroniterBadDateError, croniter
from dotenv import dotenv_values
from pydantic import (
    AfterValidator,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from forecaster import ModelConfig, TrainConfig
from forecaster.errors import InvalidConfigError
from pipelines import tracking
from pipelines.registry import DEFAULT_MODEL_NAME

# Metrics promotion may compare on; all are "lower is better".
PromotionMetric = Literal["mae", "mse", "rmse", "mase", "smape", "pinball"]

_yaml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("yaml_file", default=None)


# URI schemes of MLflow's tracking stores (SQLAlchemy's "postgresql+psycopg2" read as
# "postgresql"); a single letter is a Windows drive.
TRACKING_SCHEMES = (
    "file",
    "sqlite",
    "postgresql",
    "mysql",
    "mssql",
    "http",
    "https",
    "databricks",
    "databricks-uc",
    "uc",
)


def _known_store(value: str | None) -> str | None:
    """A tracking URI of a store MLflow has: it refuses another scheme only when the store is
    first opened (after the data is read, or never, in a service that then waits for a
    registry that cannot be)."""
    scheme = urlparse(value or "").scheme.split("+")[0]
    if value and len(scheme) > 1 and scheme not in TRACKING_SCHEMES:
        raise ValueError(
            f"expected a path or a URI of an MLflow store ({', '.join(TRACKING_SCHEMES)}), "
            f"got {value!r}"
        )
    return value


# The tracking URI setting of both deployables (this one and the service's).
TrackingUri = Annotated[str | None, AfterValidator(_known_store)]


def cron_problem(expression: str) -> str | None:
    """What is wrong with a cron `expression` for the scheduler, or None: it must parse and
    fire at some date ("0 0 31 2 *", 31 February, parses and never does)."""
    if not expression.strip() or not croniter.is_valid(expression):
        return f"expected a cron expression such as '0 3 * * *', got {expression!r}"
    try:
        croniter(expression, datetime.now()).get_next(datetime)
    except CroniterBadDateError:
        return f"the cron expression {expression!r} never fires (no such date)"
    return None


ENV_PREFIX = "FORECASTER_"
# Variables under ENV_PREFIX that are not the pipelines': the service's settings and the device
# the registered pyfunc model runs on.
OTHER_VARIABLES = ("FORECASTER_SERVICE_", "FORECASTER_DEVICE")


def check_variables(prefix: str, known: Iterable[str], others: Iterable[str] = ()) -> None:
    """Refuse a variable of the environment or of ./.env that starts with `prefix` and names
    no setting in `known` (a nested one by its first part, before "__"): settings ignore such
    variables, so a misspelled one changed nothing, silently. Variables starting with one of
    `others` belong to another deployable.

    Raises:
        InvalidConfigError: naming the variable, and the setting it most resembles.
    """
    known = {k.lower() for k in known}
    found = dict(dotenv_values(".env")) if Path(".env").is_file() else {}
    for name in [*found, *os.environ]:
        upper = name.upper()
        if not upper.startswith(prefix) or any(upper.startswith(o) for o in others):
            continue
        key = name[len(prefix) :].lower().split("__")[0]
        if key not in known:
            guess = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {prefix}{guess[0].upper()}?" if guess else ""
            raise InvalidConfigError(
                f"environment variable {name}: expected {prefix} followed by a setting "
                f"({', '.join(sorted(known))}){hint}",
                field=name,
            )


class PipelineSettings(BaseSettings):
    """Everything the train / evaluate / register / promote / schedule steps read."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_nested_delimiter="__",
        # The service's settings share the prefix and the .env file: ignore what is theirs.
        extra="ignore",
        protected_namespaces=(),
        # `--set experiment=2024` reads 2024 as YAML, a number: a name all the same.
        coerce_numbers_to_str=True,
        # No setting is meaningful at infinity or NaN (`promotion_margin=.nan` was refused as
        # "should be less than 1"), as in the service's settings.
        allow_inf_nan=False,
    )

    # -- MLflow ---------------------------------------------------------------------------
    # Tracking store and registry; None falls back to MLFLOW_TRACKING_URI, then SQLite.
    tracking_uri: TrackingUri = None
    # Artifact root of experiments created on a local store; None means ./mlartifacts.
    artifact_location: str | None = None
    experiment: str = "forecaster"
    # Registered model name; versions get the aliases `challenger` and `champion`.
    model_name: str = DEFAULT_MODEL_NAME

    # -- data -----------------------------------------------------------------------------
    # CSV or Parquet, long (unique_id, ds, y, covariates) or wide (a time column + variables).
    data: Path | None = None
    # Time column of a wide file (default "date").
    time_column: str | None = None
    # Series too short for the split (train, validation, backtest windows): left out of the
    # run's training and evaluation with a warning (new products or sensors; the model still
    # forecasts them), or refused, failing the run.
    short_series: Literal["leave_out", "refuse"] = "leave_out"

    # -- model ----------------------------------------------------------------------------
    # Overrides of forecaster.ModelConfig / TrainConfig fields, e.g. {"context_length": 96}.
    model: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)

    # -- splits and evaluation ---------------------------------------------------------------
    # Points per series held out for early stopping (at least one horizon); None: 2 horizons.
    val_length: int | None = Field(default=None, ge=1)
    # Rolling-origin backtest windows (one horizon each) at the end of every series; promotion
    # scores champion, challenger and seasonal naive on these same windows.
    backtest_windows: int = Field(default=3, ge=1)
    # Series drawn in the forecast plot.
    plot_series: int = Field(default=4, ge=1)

    # -- promotion ------------------------------------------------------------------------
    promotion_metric: PromotionMetric = "mase"
    # Relative improvement the challenger needs over the champion: 0.02 = 2 % lower metric.
    promotion_margin: float = Field(default=0.0, ge=0.0, lt=1.0)
    # One-sided paired test over per-series errors that the improvement is not noise.
    promotion_test: Literal["wilcoxon", "sign"] = "wilcoxon"
    # The test's p-value must be below this; 1.0 switches the test off.
    promotion_alpha: float = Field(default=0.05, gt=0.0, le=1.0)
    # The challenger must also beat seasonal naive on the backtest windows to be promoted.
    require_beats_baseline: bool = True
    # After a promotion, `retrain` refits the promoted configuration on every point (the
    # validation and backtest windows included) along the evaluated run's epochs and learning
    # rates, registers it as a new version linked to the evaluated one, and makes it champion.
    refit: bool = True
    # A retrain that would only repeat a decision (its data, configuration and committed code
    # are the champion's, or those of a version rejected against it) trains and registers
    # nothing; true trains anyway.
    retrain_unchanged: bool = False

    # -- monitoring -----------------------------------------------------------------------
    # The forecast log the service (``<data_dir>/forecast_log``) and ``forecaster predict``
    # write, and that ``retrain`` and ``monitor`` score against newly observed data; empty
    # turns logging by ``forecaster predict`` and scoring off.
    forecast_log: Path | None = Path("data/service/forecast_log")
    # The champion is degraded when its realised MASE exceeds its backtest MASE by more than
    # this share (0.3 = 30 %) ...
    degradation_tolerance: float = Field(default=0.3, ge=0.0)
    # ... over at least this many observed forecast points (fewer say nothing yet).
    degradation_min_points: int = Field(default=50, ge=1)
    # Where scoring sorts a log of more than a million rows into temporary files, about 72
    # bytes a logged row (3.1 GB for 90 days of 10,000 series forecast every half hour):
    # a disk with room for it when the system's temporary directory (TMPDIR) is small or in
    # memory; None: that directory. Created if missing; the files go when scoring ends.
    forecast_log_spill_dir: Path | None = None

    # -- schedule -------------------------------------------------------------------------
    schedule: str = "0 3 * * *"
    # IANA time zone the schedule's times are read in, daylight saving included ("0 3 * * *"
    # is 03:00 there every day); None: the machine's (TZ, else /etc/localtime).
    schedule_timezone: str | None = None
    # Lock file that keeps two pipeline runs from overlapping: only runs that share it (runs
    # from other directories or hosts against one tracking server need it on shared storage).
    lock_file: Path = Path(".forecaster-pipeline.lock")

    # -- batch prediction -----------------------------------------------------------------
    # Series per predict() call when scoring a file.
    predict_chunk_series: int = Field(default=2048, ge=1)

    @field_validator("schedule")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        problem = cron_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("schedule_timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"expected an IANA time zone such as 'Europe/Berlin' or 'UTC', got {value!r}"
                ) from None
        return value

    @field_validator("experiment")
    @classmethod
    def _experiment_name(cls, value: str) -> str:
        if not value.strip():  # MLflow refuses it only when the run starts
            raise ValueError(f"expected an experiment name, got {value!r}")
        return value

    @field_validator("lock_file")
    @classmethod
    def _lock_is_a_file(cls, value: Path) -> Path:
        if value.is_dir():
            raise ValueError(f"expected the path of a lock file, got the directory {value}")
        return value

    @field_validator("model_name")
    @classmethod
    def _registrable_name(cls, value: str) -> str:
        # MLflow refuses '/' and ':' only at registration, after training; '@' would make
        # models:/NAME@alias ambiguous.
        bad = [c for c in "/:@" if c in value]
        if not value.strip() or value.strip() in (".", "..") or bad:
            raise ValueError(
                f"expected a registered model name without '/', ':' or '@', got {value!r}"
            )
        return value

    @field_validator("forecast_log_spill_dir")
    @classmethod
    def _directory(cls, value: Path | None) -> Path | None:
        # Fail at startup, not after a retrain has ingested and trained for an hour.
        if value is None:
            return value
        existing = next((p for p in (value, *value.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ValueError(f"expected a directory, got the file {existing}")
        return value

    @field_validator("forecast_log", mode="before")
    @classmethod
    def _empty_is_off(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("model", "train", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _configs_build(self) -> PipelineSettings:
        # Fail at startup, not after ingesting data, when an override is wrong.
        self.model_config_obj()
        self.train_config_obj()
        if self.val_length is not None and self.val_length < self.horizon:
            raise ValueError(
                f"val_length: expected at least the horizon ({self.horizon}) so that validation "
                f"has a window to judge epochs on, got {self.val_length}"
            )
        return self

    # -- derived values -------------------------------------------------------------------
    @property
    def resolved_tracking_uri(self) -> str:
        return tracking.resolve_tracking_uri(self.tracking_uri)

    def model_config_obj(self) -> ModelConfig:
        """``ModelConfig`` with this object's overrides applied (validated)."""
        return _build(ModelConfig, self.model, "model")

    def train_config_obj(self) -> TrainConfig:
        """``TrainConfig`` with this object's overrides applied (validated)."""
        return _build(TrainConfig, self.train, "train")

    @property
    def horizon(self) -> int:
        return self.model_config_obj().prediction_length

    @property
    def resolved_val_length(self) -> int:
        return self.val_length or 2 * self.horizon

    @property
    def champion_uri(self) -> str:
        return f"models:/{self.model_name}@champion"

    @property
    def challenger_uri(self) -> str:
        return f"models:/{self.model_name}@challenger"

    # -- loading --------------------------------------------------------------------------
    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> PipelineSettings:
        """Settings from a YAML file, ``.env``, the environment and explicit overrides.

        Raises:
            InvalidConfigError: the YAML file is missing, unreadable or has unknown keys, an
                override is not a setting, or a value is invalid (the message names it).
        """
        path = Path(config_file) if config_file else None
        if path is not None:
            _check_yaml(path, set(cls.model_fields))
        unknown = sorted(set(overrides) - set(cls.model_fields))
        if unknown:
            raise InvalidConfigError(
                f"unknown setting(s) {unknown}; expected some of {sorted(cls.model_fields)}",
                field=unknown[0],
            )
        check_variables(ENV_PREFIX, cls.model_fields, OTHER_VARIABLES)
        token = _yaml_file.set(path)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise InvalidConfigError(_one_line(exc), field=_first_field(exc)) from None
        finally:
            _yaml_file.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources = [init_settings, env_settings, dotenv_settings]
        path = _yaml_file.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return (*sources, file_secret_settings)


def _build(cls: type, overrides: dict[str, Any], section: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"{section}: unknown {cls.__name__} field(s) {unknown}; expected some of {sorted(known)}"
        )
    # Pydantic would read a boolean as 1 in a number field: YAML reads yes, on and true so.
    hints = typing.get_type_hints(cls)
    for name, value in overrides.items():
        if isinstance(value, bool) and "bool" not in str(hints[name]):
            raise ValueError(
                f"{section}: {name}: expected {getattr(hints[name], '__name__', hints[name])}, "
                f"got {value!r} (YAML reads yes, no, on and off as booleans)"
            )
    try:
        # Pydantic coerces strings from the environment ("96" -> 96) and then the dataclass
        # validates itself in __post_init__.
        return TypeAdapter(cls).validate_python(dict(overrides))
    except ValidationError as exc:
        raise ValueError(f"{section}: {_one_line(exc)}") from None


def _check_yaml(path: Path, known: set[str]) -> None:
    if path.is_dir():
        raise InvalidConfigError(
            f"config file {path}: is a directory; expected a YAML file", field="config"
        )
    if not path.is_file():
        raise InvalidConfigError(f"config file {path}: no such file", field="config")
    try:
        content = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise InvalidConfigError(
            f"config file {path}: cannot be read ({exc.strerror})", field="config"
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidConfigError(
            f"config file {path}: not valid YAML: {exc}", field="config"
        ) from None
    if not isinstance(content, dict):
        raise InvalidConfigError(
            f"config file {path}: expected a mapping of settings, got {type(content).__name__}",
            field="config",
        )
    unknown = sorted(set(map(str, content)) - known)
    if unknown:
        raise InvalidConfigError(
            f"config file {path}: unknown setting(s) {unknown}; expected some of {sorted(known)}",
            field=unknown[0],
        )


def _first_field(exc: ValidationError) -> str | None:
    errors = exc.errors()
    return ".".join(map(str, errors[0]["loc"])) if errors and errors[0]["loc"] else None


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(map(str, error["loc"]))
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
