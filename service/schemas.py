"""Request and response bodies (pydantic v2). Limits that depend on settings are checked in
the routes; what a schema can say on its own (types, shapes, ranges) is said here."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)


def _check_quantiles(value: list[float] | None) -> list[float] | None:
    if value is not None and len(set(value)) != len(value):
        raise ValueError(f"quantiles must be distinct, got {value}")
    return value


# The two kinds of time a series may give: timestamps, or integer steps for a model fitted on
# integer ds. Tagged unions, so that a bad value is reported once, by the kind it was read as,
# and the tags, which are no field of the request, are left out of error locations.
UNION_TAGS = ("datetimes", "steps")


def _time_kind(value: Any) -> str:
    """The union branch a time value takes: steps for an int (JSON true is none), or a list
    whose first item is one; timestamps otherwise."""
    first = value[0] if isinstance(value, list) and value else value
    return "steps" if isinstance(first, int) and not isinstance(first, bool) else "datetimes"


Timestamps = Annotated[
    Annotated[list[datetime], Tag("datetimes")] | Annotated[list[int], Tag("steps")],
    Discriminator(_time_kind),
]
Start = Annotated[
    Annotated[datetime, Tag("datetimes")] | Annotated[int, Tag("steps")],
    Discriminator(_time_kind),
]


# Strict: JSON true is not a quantile level nor a horizon (pydantic's lax mode reads it as 1).
Quantiles = Annotated[
    list[Annotated[float, Field(gt=0.0, lt=1.0, strict=True)]] | None,
    AfterValidator(_check_quantiles),
    Field(None, description="Subset of the model's quantiles; default all of them."),
]

# -- online forecasts -----------------------------------------------------------------------


class SeriesIn(BaseModel):
    """Recent history of one series: `timestamps`, or `start` + `freq`, with its `values`."""

    # The schema states the rule `_timestamps_or_start` enforces, so clients and fuzzers built
    # from it form a valid series: the two branches exclude each other, as the validator does.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["timestamps"],
                    "properties": {
                        "timestamps": {"type": "array"},
                        "start": {"type": "null"},
                        "freq": {"type": "null"},
                    },
                },
                {
                    "required": ["start", "freq"],
                    "properties": {
                        "start": {"type": ["string", "integer"]},
                        "freq": {"type": "string"},
                        "timestamps": {"type": "null"},
                    },
                },
            ]
        },
    )

    id: str = Field(min_length=1, max_length=256, description="Series identifier.")
    values: list[float | None] = Field(
        description="Observed values, oldest first; null is a missing value (masked, like a gap)."
    )
    timestamps: Timestamps | None = Field(
        None,
        description="One ISO 8601 timestamp per value, or one integer step per value for a "
        "model fitted on integer ds (its freq 'ns', '7ns': steps of 1, 7). Give these or "
        "start + freq. With offsets, they are read on their local clock for a model of daily "
        "or coarser steps, in UTC for a shorter one; the forecast's timestamps are naive, "
        "read the same way.",
    )
    start: Start | None = Field(
        None,
        description="Timestamp of the first value (an integer step for a model fitted on "
        "integer ds); with an offset, read on its local clock for a freq of whole days or "
        "coarser, in UTC for a shorter one.",
    )
    freq: str | None = Field(
        None,
        max_length=32,
        description="The model's frequency as a pandas offset alias ('h', '60min', 'D', ...), "
        "or the step of a model fitted on integer ds ('5' or '5ns'); another frequency is "
        "refused.",
    )
    covariates: dict[str, list[float | None]] | None = Field(
        None,
        description="Known-future covariates of the model, by name: one value per history "
        "step followed by one per forecast step (len(values) + horizon in all), or more, up "
        "to the model's full horizon, which the model reads too; past the values given, "
        "each covariate holds its last value.",
    )

    @model_validator(mode="after")
    def _timestamps_or_start(self) -> SeriesIn:
        if self.timestamps is not None:
            if self.start is not None or self.freq is not None:
                raise ValueError("give either timestamps, or start and freq, not both")
            if len(self.timestamps) != len(self.values):
                raise ValueError(
                    f"timestamps and values must have the same length, got "
                    f"{len(self.timestamps)} timestamps and {len(self.values)} values"
                )
        elif self.start is None or self.freq is None:
            raise ValueError("timestamps, or both start and freq, are required")
        return self


class ForecastRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "horizon": 3,
                    "quantiles": [0.1, 0.9],
                    "series": [
                        {
                            "id": "sensor-1",
                            "start": "2024-01-01T00:00:00",
                            "freq": "h",
                            "values": [1.0, 1.2, 0.9, 1.1],
                        }
                    ],
                }
            ]
        },
    )

    horizon: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="Steps to forecast; at most the model's; default all of them.",
    )
    quantiles: Quantiles
    series: list[SeriesIn] = Field(min_length=1)
    include_attention: bool = Field(
        False, description="Add the attention weights behind each forecast."
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> ForecastRequest:
        seen: set[str] = set()
        for i, s in enumerate(self.series):
            if s.id in seen:
                raise ValueError(f"series[{i}].id: {s.id!r} appears more than once")
            seen.add(s.id)
        return self


class ErrorResponse(BaseModel):
    """The body of every error of the service's own routes (MLflow's `/invocations` answers
    in MLflow's shape)."""

    model_config = ConfigDict(extra="allow")  # a 500 adds its request_id

    detail: str = Field(description="What is wrong, naming the field and the series.")
    error: str = Field(description="The kind, for programs: invalid_input, not_found, ...")
    field: str | None = Field(description="The request field at fault, e.g. series[2].values.")
    series_id: str | None = Field(description="The series at fault, when there is one.")


class ModelInfo(BaseModel):
    name: str
    version: str
    alias: str | None = None
    run_id: str | None = None


class AttentionOut(BaseModel):
    """Attention weights for one series, rounded to 4 decimals; each list holds one array per
    layer, indexed [head][query token][key token]. Encoder token i covers context steps
    [i * patch_stride, i * patch_stride + patch_length) from `context_start`, which is null when
    the padded context reaches before 1677-09-21, where timestamps end (yearly data)."""

    context_start: str | None
    patch_length: int
    patch_stride: int
    encoder: list[list[list[list[float]]]]
    decoder_self: list[list[list[list[float]]]]
    cross: list[list[list[list[float]]]]


class SeriesForecast(BaseModel):
    id: str
    # integer steps for a model fitted on integer ds
    timestamps: list[str] | list[int]
    mean: list[float]
    quantiles: dict[str, list[float]] = Field(
        description="Forecast per quantile, keyed by the quantile as text, e.g. '0.1'."
    )
    glitches: list[str] | list[int] = Field(
        default_factory=list,
        description=(
            "Timestamps of readings the model ignored as glitches: each lay far from its "
            "neighbours (the model's glitch_threshold robust deviations from the median of its "
            "25-step window, or from the same step of the seasons around it) while both "
            "neighbours did not. Send a reading as null to have it ignored yourself."
        ),
    )
    attention: AttentionOut | None = None


class ForecastResponse(BaseModel):
    model: ModelInfo
    horizon: int
    quantiles: list[float]
    forecasts: list[SeriesForecast]


# -- models -----------------------------------------------------------------------------------


class LoadedModelOut(BaseModel):
    name: str
    version: str
    alias: str | None
    run_id: str | None
    source_uri: str | None
    metrics: dict[str, float]
    loaded_at: datetime
    freq: str | None
    context_length: int
    max_horizon: int
    quantiles: list[float]
    covariates: list[str]
    device: str


class RefusedVersionOut(BaseModel):
    version: str
    error: str
    at: datetime


class ModelsResponse(BaseModel):
    model_uri: str
    ready: bool
    loaded: LoadedModelOut | None
    last_check_at: datetime | None
    last_check_error: str | None
    refused: list[RefusedVersionOut]
    checking: bool


class ReloadResponse(BaseModel):
    outcome: Literal["loaded", "unchanged", "refused", "unavailable", "in_progress"]
    message: str
    models: ModelsResponse


# -- batch jobs -------------------------------------------------------------------------------

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FileFormat = Literal["csv", "parquet"]


class BatchJobFromPath(BaseModel):
    """A batch job over a file already under the service's input directory."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=4096, description="Relative to the input dir.")
    horizon: int | None = Field(None, ge=1, strict=True)
    quantiles: Quantiles
    output_format: FileFormat | None = Field(None, description="Default: the input's format.")


class JobError(BaseModel):
    error: str
    detail: str
    field: str | None = None
    series_id: str | None = None


class BatchJobOut(BaseModel):
    id: str
    status: JobStatus
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    input_format: FileFormat
    output_format: FileFormat
    horizon: int | None
    quantiles: list[float] | None
    progress: float = Field(description="Share of input rows processed, 0 to 1.")
    rows_total: int | None
    rows_done: int
    series_done: int
    series_failed: int = Field(
        description="Series left out of the result for bad input (the rows without a "
        "unique_id count as one); reasons at errors_url."
    )
    glitches: int = Field(
        description="Readings the forecasts did not use because the model read them as "
        "glitches (far from their neighbours); listed at glitches_url once the job succeeded."
    )
    model: ModelInfo | None
    attempts: int
    error: JobError | None
    result_url: str | None
    errors_url: str | None
    glitches_url: str | None


class BatchJobList(BaseModel):
    jobs: list[BatchJobOut]


# -- health ---------------------------------------------------------------------------------


class HealthOut(BaseModel):
    status: str
    detail: str | None = None
    model: ModelInfo | None = None


def as_info(name: str, version: str, alias: str | None, run_id: str | None) -> dict[str, Any]:
    return {"name": name, "version": str(version), "alias": alias, "run_id": run_id}
