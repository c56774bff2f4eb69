"""Online inference: each request is validated alone, then requests share one forward pass.

Everything here runs in the inference thread (never on the event loop): building a request's
columns, the core's validation of that request alone (`Forecaster.prepare`), one forward pass
over the concatenated tensors of every valid request (`Forecaster.forecast`), cutting each
request's forecast back out, and encoding each response body. A request that fails
validation fails alone; series ids are carried as given, never rewritten.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import pydantic_core

from forecaster.data import quantile_column
from forecaster.errors import ForecasterInputError, SeriesTooShortError
from forecaster.forecaster import ModelInputs
from forecaster.outputs import ForecastArrays
from forecaster.time_axis import (
    is_integer_axis,
    parse_freq,
    parse_timestamps,
    read_datetimes,
    regular_range,
    steps_after,
)
from forecaster.validation import series_codes
from service.errors import InvalidInputError
from service.model_manager import ServedModel
from service.schemas import ForecastRequest, SeriesIn

_CORE_FIELD = {"y": "values", "ds": "timestamps", "unique_id": "id", "freq": "freq"}

Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class FrameParts:
    """A request's long frame as numpy columns (history, and future covariates if any)."""

    history: Columns
    future: Columns | None = None

    def series(self) -> tuple[list[str], np.ndarray]:
        """The series ids in order of first appearance and the rows of each (none without a
        `unique_id` column: the core's validation names what is missing)."""
        if "unique_id" not in self.history:
            return [], np.zeros(0, dtype=np.int64)
        _, codes, uniques = series_codes(self.history["unique_id"])
        return list(uniques), np.bincount(codes, minlength=len(uniques))

    def callers_ids(self) -> dict[str, Any] | None:
        """Each series' id as the caller gave it (an integer from JSON or a CSV), by the text
        the core names it by; None when every id is text already."""
        given = self.history.get("unique_id")
        if given is None or pd.api.types.infer_dtype(given, skipna=False) == "string":
            return None
        _, codes, uniques = series_codes(given)
        first = np.unique(codes, return_index=True)[1]  # codes number ids by first appearance
        return dict(zip(uniques, pd.Series(given).iloc[first].tolist(), strict=True))

    def split(self, max_series: int) -> list[FrameParts]:
        """The same rows in parts of at most `max_series` series each, in series order."""
        if "unique_id" not in self.history:
            return [self]
        _, codes, uniques = series_codes(self.history["unique_id"])
        if len(uniques) <= max_series:
            return [self]
        future_codes = None
        if self.future is not None:
            future_codes = uniques.get_indexer(series_codes(self.future["unique_id"])[0])
        parts = []
        for first in range(0, len(uniques), max_series):
            rows = (codes >= first) & (codes < first + max_series)
            future = None
            if self.future is not None:
                keep = (future_codes >= first) & (future_codes < first + max_series)
                future = {name: column[keep] for name, column in self.future.items()}
            parts.append(FrameParts({n: c[rows] for n, c in self.history.items()}, future))
        return parts

    @staticmethod
    def concat(parts: Sequence[FrameParts]) -> FrameParts:
        def cat(columns: list[Columns]) -> Columns:
            return {name: np.concatenate([c[name] for c in columns]) for name in columns[0]}

        future = None if parts[0].future is None else cat([p.future for p in parts])
        return FrameParts(cat([p.history for p in parts]), future)


@dataclass(frozen=True)
class ItemForecast:
    """One request's forecast: S series, H steps, its quantile levels."""

    model: ServedModel
    arrays: ForecastArrays
    parts: FrameParts  # the request's own columns (for attention and the forecast log)

    @property
    def series_ids(self) -> list[str]:
        return [str(s) for s in self.arrays.series_ids]

    @property
    def timestamps(self) -> np.ndarray:  # (S, H) datetime64[ns]
        return self.arrays.timestamps

    @property
    def mean(self) -> np.ndarray:  # (S, H)
        return self.arrays.mean

    @property
    def glitches(self) -> np.ndarray:  # (S,) object: each series' readings read as glitches
        return self.arrays.glitches

    @property
    def quantiles(self) -> dict[float, np.ndarray]:  # level -> (S, H)
        return {q: self.arrays.quantiles[:, :, k] for k, q in enumerate(self.arrays.levels)}

    @staticmethod
    def concat(chunks: Sequence[ItemForecast]) -> ItemForecast:
        """The forecasts of a request that was split into chunks, in order."""
        if len(chunks) == 1:
            return chunks[0]
        arrays = ForecastArrays.concat([c.arrays for c in chunks])
        return ItemForecast(chunks[0].model, arrays, FrameParts.concat([c.parts for c in chunks]))


@dataclass
class OnlineItem:
    """One online request (or one chunk of a large one) waiting for the model.

    `build` turns it into columns in the inference thread; `render`, when given, turns the
    forecast into the response body there too (otherwise the `ItemForecast` is returned).
    """

    model: ServedModel
    horizon: int
    quantiles: tuple[float, ...]
    n_series: int
    build: Callable[[], FrameParts]
    render: Callable[[ItemForecast], bytes] | None = None
    enqueued_at: float = 0.0
    # Set once forecast; logged only when the request is answered with it (`run_online`).
    forecast: ItemForecast | None = None


class ForecastNotFiniteError(InvalidInputError):
    """The history's magnitude overflows the model's float32 arithmetic."""


# -- request -> columns ------------------------------------------------------------------------


def _series_error(exc: Exception, index: int, series_id: str, field: str) -> InvalidInputError:
    return InvalidInputError(
        f"series {series_id!r} (series[{index}].{field}): {exc}",
        field=f"series[{index}].{field}",
        series_id=series_id,
    )


def _unknown_covariates(
    unknown: list[str], covariates: Sequence[str], index: int, series_id: str
) -> InvalidInputError:
    where = f"series {series_id!r} (series[{index}].covariates)"
    if not covariates:
        return InvalidInputError(
            f"{where}: the model has no covariates; got {unknown}",
            field=f"series[{index}].covariates",
            series_id=series_id,
        )
    return InvalidInputError(
        f"{where}: the model has no covariates {unknown}; its covariates are {list(covariates)}",
        field=f"series[{index}].covariates.{unknown[0]}",
        series_id=series_id,
    )


def request_frames(
    series: Sequence[SeriesIn],
    covariates: Sequence[str],
    horizon: int,
    model_freq: str,
    wall_clock: bool,
    first_index: int = 0,
    max_horizon: int | None = None,
) -> FrameParts:
    """The history columns and, for models with covariates, the future covariate columns.

    Timestamps go through the time axis (aware ones read on their wall clock or in UTC as the
    model reads them, `Forecaster.wall_clock`; the nanosecond range checked);
    future covariates are stamped with the steps after each series' end on the model's
    frequency, which the core checks the history against. `first_index` is the position of
    `series[0]` in the request (for error messages about a chunk of a large request). A
    series may give covariates past `horizon`, up to `max_horizon` steps, as the library
    reads them.
    """
    longest = horizon if max_horizon is None else max(horizon, max_horizon)
    integers = is_integer_axis(model_freq)
    ids: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    values: list[np.ndarray] = []
    cov_past: dict[str, list[np.ndarray]] = {c: [] for c in covariates}
    cov_future: dict[str, list[np.ndarray]] = {c: [] for c in covariates}
    steps_ahead: list[int] = []  # per series, the steps its future covariates cover
    for i, s in enumerate(series, start=first_index):
        n = len(s.values)
        if n == 0:  # a series without rows never reaches the frame the core validates
            raise SeriesTooShortError(
                f"series {s.id!r} has no values, expected at least 1 observed value",
                series_id=s.id,
                field="y",
            )
        try:
            if s.timestamps is not None and (integers or _are_steps(s.timestamps)):
                # integer steps, and the model's kind of ds checked, as in a frame's column
                ds = parse_timestamps(np.array(s.timestamps), column="timestamps", freq=model_freq)
            elif s.timestamps is not None:
                ds, _ = read_datetimes(s.timestamps, wall_clock=wall_clock)
            else:
                ds = regular_range(s.start, n, s.freq, roll_forward=False, wall_clock=wall_clock)
        except ForecasterInputError as exc:
            field = "timestamps"
            if s.timestamps is None:
                field = "freq" if exc.field == "freq" else "start"
            raise _series_error(exc, i, s.id, field) from None
        if s.freq is not None and parse_freq(s.freq) != parse_freq(model_freq):
            # daily values on an hourly model's grid would read as hours with gaps between
            raise InvalidInputError(
                f"series {s.id!r} (series[{i}].freq): expected the model's frequency "
                f"{model_freq!r}, got {s.freq!r}",
                field=f"series[{i}].freq",
                series_id=s.id,
            )
        ids.append(np.full(n, s.id, dtype=object))
        stamps.append(ds)
        values.append(np.array(s.values, dtype=np.float64))  # None becomes NaN: the core says
        unknown = [name for name in s.covariates or () if name not in covariates]
        if unknown:
            raise _unknown_covariates(unknown, covariates, i, s.id)
        if not covariates:
            continue
        given = s.covariates or {}
        missing = [c for c in covariates if c not in given]
        if missing:
            raise InvalidInputError(
                f"series {s.id!r} (series[{i}].covariates): the model needs covariates "
                f"{list(covariates)}; missing {missing}",
                field=f"series[{i}].covariates.{missing[0]}",
                series_id=s.id,
            )
        # Each covariate's own length is checked, so the error names the one out of range (or
        # the first that differs from the others), not always the first covariate.
        ahead = len(given[covariates[0]]) - n
        for name in covariates:
            column = given[name]
            if not horizon <= len(column) - n <= longest or len(column) - n != ahead:
                expected = (
                    f"{n + horizon}"
                    if longest == horizon
                    else (f"{n + horizon} to {n + longest}, the same for every covariate")
                )
                raise InvalidInputError(
                    f"series {s.id!r} (series[{i}].covariates.{name}): expected {expected} "
                    f"values ({n} history + {horizon} horizon"
                    + ("" if longest == horizon else f", up to the model's {longest}")
                    + f"), got {len(column)}",
                    field=f"series[{i}].covariates.{name}",
                    series_id=s.id,
                )
            arr = np.array(column, dtype=np.float64)
            cov_past[name].append(arr[:n])
            cov_future[name].append(arr[n:])
        steps_ahead.append(ahead)
    history = {
        "unique_id": np.concatenate(ids),
        "ds": np.concatenate(stamps),
        "y": np.concatenate(values),
        **{name: np.concatenate(parts) for name, parts in cov_past.items()},
    }
    future = None
    if covariates:
        last = np.array([st[-1] for st in stamps], dtype="datetime64[ns]")
        try:
            future_ds = steps_after(last, model_freq, max(steps_ahead))  # (S, longest given)
        except ForecasterInputError as exc:
            raise InvalidInputError(f"series: {exc}", field="series") from None
        given_steps = np.arange(future_ds.shape[1])[None, :] < np.array(steps_ahead)[:, None]
        future = {
            "unique_id": np.repeat(np.array([s.id for s in series], dtype=object), steps_ahead),
            "ds": future_ds[given_steps],  # row by row: each series' own steps
            **{name: np.concatenate(parts) for name, parts in cov_future.items()},
        }
    return FrameParts(history, future)


def frame_parts(history: pd.DataFrame, future: pd.DataFrame | None = None) -> FrameParts:
    """The columns of frames a caller sent as frames (MLflow's formats)."""
    for frame in (history, future):
        if frame is None:
            continue
        repeated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
        if repeated:
            raise InvalidInputError(
                f"columns {repeated} appear more than once; expected each exactly once",
                field=repeated[0],
            )
    return FrameParts(
        {str(c): history[c].to_numpy() for c in history.columns},
        None if future is None else {str(c): future[c].to_numpy() for c in future.columns},
    )


def name_request_field(exc: ForecasterInputError, request: ForecastRequest) -> None:
    """Point a core error at the request field: `y` of series 'a' becomes series[2].values."""
    field = exc.field
    index = None
    if exc.series_id is not None:
        index = next((i for i, s in enumerate(request.series) if s.id == exc.series_id), None)
    if field in ("horizon", "quantiles"):
        exc.request_field = field
        return
    name = _CORE_FIELD.get(field or "", f"covariates.{field}" if field else None)
    if name == "timestamps" and index is not None and request.series[index].timestamps is None:
        name = "start"
    prefix = f"series[{index}]" if index is not None else "series"
    exc.request_field = f"{prefix}.{name}" if name else prefix


# -- validated alone, forecast together ------------------------------------------------------


def predict_items(items: list[OnlineItem]) -> list[bytes | ItemForecast | Exception]:
    """Forecast every item: each validated alone, all of one model in one forward pass.

    Each successful forecast is kept on its item (`OnlineItem.forecast`) for the forecast
    log, which takes it once the request is answered.
    """
    results: list[bytes | ItemForecast | Exception] = [b""] * len(items)
    built: dict[int, tuple[FrameParts, ModelInputs]] = {}
    groups: dict[int, list[int]] = defaultdict(list)
    for k, item in enumerate(items):
        try:
            parts = item.build()
            inputs = item.model.forecaster.prepare(parts.history, parts.future, item.horizon)
        except Exception as exc:  # this request's content: reported to it alone
            results[k] = exc
            continue
        built[k] = (parts, inputs)
        groups[id(item.model.forecaster)].append(k)
    for members in groups.values():
        forecaster = items[members[0]].model.forecaster
        try:
            arrays = forecaster.forecast(ModelInputs.concat([built[k][1] for k in members]))
        except Exception as exc:  # the model itself failed: every request of the pass
            for k in members:
                results[k] = exc
            continue
        start = 0
        for k in members:
            item, (parts, inputs) = items[k], built[k]
            rows = arrays.rows(slice(start, start + len(inputs)))
            start += len(inputs)
            try:
                forecast = _item_forecast(item, rows, parts)
                results[k] = item.render(forecast) if item.render is not None else forecast
                item.forecast = forecast
            except Exception as exc:
                results[k] = exc
    return results


def _item_forecast(item: OnlineItem, rows: ForecastArrays, parts: FrameParts) -> ItemForecast:
    selected = rows.select(item.horizon, item.quantiles)
    bad = ~np.isfinite(selected.mean).all(axis=1) | ~np.isfinite(selected.quantiles).all(
        axis=(1, 2)
    )
    if bad.any():
        sid = str(selected.series_ids[int(np.argmax(bad))])
        raise ForecastNotFiniteError(
            f"series {sid!r}: the forecast is not finite; its values are too large in "
            "magnitude for the model's float32 arithmetic (rescale the series)",
            field="values",
            series_id=sid,
        )
    return ItemForecast(item.model, selected, parts)


# -- responses -------------------------------------------------------------------------------


def _are_steps(timestamps: Sequence[datetime | int]) -> bool:
    """Whether a series' timestamps are integer steps (the schema gives all of one kind)."""
    return bool(timestamps) and isinstance(timestamps[0], int)


def _times(values: np.ndarray, freq: str) -> list[str] | list[int]:
    """Datetime64 `values` as a response gives them: integer steps for a model fitted on
    integer ds (`time_axis.is_integer_axis`), else ISO 8601 text (`_iso`)."""
    return values.view(np.int64).tolist() if is_integer_axis(freq) else _iso(values)


def _iso(values: np.ndarray) -> list[str]:
    """ISO 8601 text of datetime64 `values`: to the second when they all fall on one, else
    to the nanosecond they carry (a 500 ms series' steps must not collapse onto seconds)."""
    if (values.astype("datetime64[s]") == values).all():
        return np.datetime_as_string(values, unit="s").tolist()
    return [t.isoformat() for t in pd.DatetimeIndex(values)]


# Attention weights are in [0, 1]; four decimals are finer than any plot of them shows and
# halve the maps' JSON against full float precision (default model, one series: 46 -> 22 kB).
ATTENTION_DECIMALS = 4


def _weights(layer: np.ndarray) -> list:
    return np.round(layer.astype(np.float64), ATTENTION_DECIMALS).tolist()


def render_forecast(forecast: ItemForecast, horizon: int, include_attention: bool) -> bytes:
    """The `POST /v1/forecast` response body, encoded."""
    attention = None
    if include_attention:
        parts = forecast.parts
        maps = forecast.model.forecaster.attention(parts.history, parts.future, horizon)
        attention = {
            str(sid): {
                "context_start": maps.context_starts[s],
                "patch_length": maps.patch_length,
                "patch_stride": maps.patch_stride,
                "encoder": [_weights(layer[s]) for layer in maps.encoder],
                "decoder_self": [_weights(layer[s]) for layer in maps.decoder_self],
                "cross": [_weights(layer[s]) for layer in maps.cross],
            }
            for s, sid in enumerate(maps.series_ids)
        }
    forecasts = []
    freq = forecast.model.forecaster.freq
    for s, sid in enumerate(forecast.series_ids):
        entry: dict[str, Any] = {
            "id": sid,
            "timestamps": _times(forecast.timestamps[s], freq),
            "mean": forecast.mean[s].tolist(),
            "quantiles": {f"{q:g}": arr[s].tolist() for q, arr in forecast.quantiles.items()},
            "glitches": _times(forecast.glitches[s], freq),
        }
        if attention is not None:
            entry["attention"] = attention.get(sid)
        forecasts.append(entry)
    body = {
        "model": forecast.model.identity.info(),
        "horizon": horizon,
        "quantiles": list(forecast.quantiles),
        "forecasts": forecasts,
    }
    return pydantic_core.to_json(body)


def render_mlflow(forecast: ItemForecast, ids: Mapping[str, Any] | None = None) -> bytes:
    """`{"predictions": [records]}` as MLflow's scoring server writes the long frame
    (`predictions_to_json`), encoded by pydantic-core (Rust) instead of MLflow's Python
    encoder: the same JSON values, five times faster. Forecasts are finite (checked above).
    `ids` maps the core's text ids back to the caller's (`FrameParts.callers_ids`)."""
    s, h = forecast.mean.shape
    series_ids = forecast.series_ids if ids is None else [ids[i] for i in forecast.series_ids]
    columns: dict[str, list[Any]] = {
        "unique_id": np.repeat(np.asarray(series_ids, dtype=object), h).tolist(),
        "ds": _times(forecast.timestamps.reshape(s * h), forecast.model.forecaster.freq),
        "mean": forecast.mean.reshape(s * h).tolist(),
    }
    for q, arr in forecast.quantiles.items():
        columns[quantile_column(q)] = arr.reshape(s * h).tolist()
    keys = list(columns)
    records = [dict(zip(keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    return pydantic_core.to_json({"predictions": records})
