"""The request rules every route applies: one parser per parameter, one set of limits.

`/v1/forecast`, `/invocations` and batch jobs parse `horizon` and `quantiles` with the
functions here, check them against the served model with the core's own checks, and count
series and history lengths against the same settings, so one bad value gets one answer (a
422 naming the field) whatever the route.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from service.errors import InvalidInputError, LimitExceededError
from service.model_manager import ServedModel
from service.settings import ServiceSettings


def parse_horizon(value: Any) -> int | None:
    """An integer >= 1 from JSON or text (``"24"``, ``24``, ``24.0``); None when absent."""
    if value is None or value == "":
        return None
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
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


def parse_quantiles(value: Any) -> list[float] | None:
    """Distinct levels strictly between 0 and 1, from a JSON list, a number or ``"0.1,0.9"``."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
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
            raise InvalidInputError(
                f"quantiles: expected numbers strictly between 0 and 1 (a list, or text such "
                f"as 0.1,0.9), got {value!r}",
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
