"""The request rules every route applies: one parser per parameter, one set of limits.

`/v1/forecast`, `/invocations` and batch jobs parse `horizon` and `quantiles` with the
functions here, check them against the served model with the core's own checks, and count
series and history lengths against the same settings, so one bad value gets one answer (a
422 naming the field) whatever the route. A JSON body's value is read as JSON (a horizon is an
integer, quantiles a list of numbers, as MLflow's scoring server requires too); a query
string's or a form field's as text ("24", "0.1,0.9").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from service.errors import InvalidInputError, LimitExceededError
from service.model_manager import ServedModel
from service.settings import ServiceSettings


def parse_horizon(value: Any, *, json: bool = False) -> int | None:
    """An integer >= 1 from text (``"24"``, ``24.0``: a query string, a form field) or, with
    `json`, a JSON integer only (``24``), as `/v1/forecast`'s schema and MLflow's scoring server
    require of a JSON body; None when absent."""
    if value is None or (value == "" and not json):
        return None
    number = None
    if json:
        if isinstance(value, int) and not isinstance(value, bool):
            number = float(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or not number.is_integer() or number < 1:
        raise InvalidInputError(
            f"horizon: expected a positive integer, got {value!r}", field="horizon"
        )
    return int(number)


def parse_quantiles(value: Any, *, json: bool = False) -> list[float] | None:
    """Distinct levels strictly between 0 and 1, from a list, a number or ``"0.1,0.9"`` (text);
    with `json`, from a JSON list of numbers only, as `/v1/forecast`'s schema requires."""
    if value is None or (value == "" and not json):
        return None
    if json and (
        not isinstance(value, list)
        or any(isinstance(v, bool) or not isinstance(v, int | float) for v in value)
    ):
        items: list[Any] = [None]
    elif isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        items = [None]
    levels = []
    for item in items:
        level = None
        if isinstance(item, int | float | str) and not isinstance(item, bool):
            try:
                level = float(item)
            except ValueError:
                level = None
        if level is None or not 0.0 < level < 1.0:
            shape = "a list" if json else "a list, or text such as 0.1,0.9"
            raise InvalidInputError(
                f"quantiles: expected numbers strictly between 0 and 1 ({shape}), got {value!r}",
                field="quantiles",
            )
        levels.append(level)
    if len(set(levels)) != len(levels):
        raise InvalidInputError(
            f"quantiles: expected distinct levels, got {value!r}", field="quantiles"
        )
    return levels


def resolve(
    served: ServedModel, horizon: int | None, quantiles: Sequence[float] | None
) -> tuple[int, tuple[float, ...]]:
    """The horizon and quantile levels to answer with, checked against the served model."""
    forecaster = served.forecaster
    return forecaster.check_horizon(horizon), forecaster.check_quantiles(quantiles)


def check_limits(
    series_ids: Sequence[str],
    lengths: Sequence[int],
    settings: ServiceSettings,
    *,
    attention: bool = False,
    field: str = "series",
    values_field: str = "values",
) -> None:
    """Series per request and history points per series within the configured limits.

    ``series_ids`` and ``lengths`` describe each series of the request, in request order.
    """
    n = len(series_ids)
    limit, setting = settings.max_series_per_request, "max_series_per_request"
    if attention:
        limit, setting = settings.max_attention_series, "max_attention_series"
    if n > limit:
        raise LimitExceededError(
            f"{field}: {n} series in one request, the limit is {limit} (setting {setting})"
            + ("; use a batch job" if not attention else " when include_attention is set"),
            field=field,
        )
    for i, (sid, length) in enumerate(zip(series_ids, lengths, strict=True)):
        if length > settings.max_history_length:
            raise LimitExceededError(
                f"series {sid!r} ({field}[{i}].{values_field}): {length} history points, the "
                "limit is "
                f"{settings.max_history_length} (setting max_history_length); the model reads "
                "only the most recent ones, so send fewer",
                field=f"{field}[{i}].{values_field}",
                series_id=str(sid),
            )
