"""Online inference: requests become long frames, concurrent requests share one `predict` call.

Everything here runs in the inference thread (never on the event loop): building the frames,
the model call, slicing each request's rows back out, and encoding each response body.

Merging requests into one call on the concatenated long frame keeps the core's validation
rules the only ones: each request is validated there, once. When one request in a merged batch
is bad, the core names its (prefixed) series; that request alone is re-run to raise the error
with the caller's own series id, and the others are predicted without it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from forecaster.data import quantile_column
from forecaster.errors import ForecasterInputError, SeriesTooShortError
from service.errors import InvalidInputError
from service.model_manager import ServedModel
from service.schemas import ForecastRequest

# Separates a request's index from a series id in the merged frame; ids cannot contain it
# because JSON callers would have to send a control character on purpose.
_SEP = "\x1f"
_CORE_FIELD = {"y": "values", "ds": "timestamps", "unique_id": "id", "freq": "freq"}


@dataclass(frozen=True)
class ItemForecast:
    """One request's share of a merged forecast: S series, H steps."""

    model: ServedModel
    series_ids: list[str]
    timestamps: np.ndarray  # (S, H) datetime64[ns]
    mean: np.ndarray  # (S, H)
    quantiles: dict[float, np.ndarray]  # q -> (S, H)
    parts: FrameParts  # the request's own frame (for attention)


Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class FrameParts:
    """A request's long frame as numpy columns: merging many requests costs one DataFrame."""

    history: Columns
    future: Columns | None = None

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        future = None if self.future is None else pd.DataFrame(self.future)
        return pd.DataFrame(self.history), future


@dataclass
class OnlineItem:
    """One online request waiting for the model.

    `build` turns the request into its frame's columns in the inference thread;
    `render` turns the forecast into the response body there too.
    """

    model: ServedModel
    horizon: int
    quantiles: tuple[float, ...]
    n_series: int
    build: Callable[[], FrameParts]
    render: Callable[[ItemForecast], bytes]
    enqueued_at: float = 0.0


class ForecastNotFiniteError(InvalidInputError):
    """The history's magnitude overflows the model's float32 arithmetic."""


# -- request -> frames -------------------------------------------------------------------------


def _naive_utc(t: datetime) -> datetime:
    # As the core does for frames: aware timestamps are converted to UTC, then made naive.
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo is not None else t


def _timestamps(series: Any) -> pd.DatetimeIndex:
    if series.timestamps is not None:
        return pd.DatetimeIndex([_naive_utc(t) for t in series.timestamps])
    return pd.date_range(_naive_utc(series.start), periods=len(series.values), freq=series.freq)


def _frame_error(exc: Exception, index: int, series_id: str, field: str) -> InvalidInputError:
    return InvalidInputError(
        f"series {series_id!r} (series[{index}].{field}): {exc}",
        field=f"series[{index}].{field}",
        series_id=series_id,
    )


def request_frames(
    request: ForecastRequest, covariates: Sequence[str], horizon: int, model_freq: str | None
) -> FrameParts:
    """The history columns and, for models with covariates, the future covariate columns.

    The future covariate timestamps follow the series' own frequency when it can be read from
    the request, otherwise the model's (a history of one or two points, or one with gaps).
    """
    ids: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    values: list[np.ndarray] = []
    cov_past: dict[str, list[np.ndarray]] = {c: [] for c in covariates}
    future_ids: list[np.ndarray] = []
    future_stamps: list[np.ndarray] = []
    cov_future: dict[str, list[np.ndarray]] = {c: [] for c in covariates}
    for i, s in enumerate(request.series):
        n = len(s.values)
        if n == 0:  # a series without rows never reaches the frame the core validates
            raise SeriesTooShortError(
                f"series {s.id!r} has no values, expected at least 1 observed value",
                series_id=s.id,
                field="y",
            )
        try:
            ds = _timestamps(s)
        except (ValueError, TypeError, OverflowError) as exc:
            raise _frame_error(
                exc, i, s.id, "freq" if s.timestamps is None else "timestamps"
            ) from None
        ids.append(np.full(n, s.id, dtype=object))
        stamps.append(ds.to_numpy(dtype="datetime64[ns]"))
        values.append(np.array(s.values, dtype=np.float64))  # None becomes NaN: the core says
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
        for name in covariates:
            column = given[name]
            if len(column) != n + horizon:
                raise InvalidInputError(
                    f"series {s.id!r} (series[{i}].covariates.{name}): expected "
                    f"{n + horizon} values ({n} history + {horizon} horizon), got {len(column)}",
                    field=f"series[{i}].covariates.{name}",
                    series_id=s.id,
                )
            arr = np.array(column, dtype=np.float64)
            cov_past[name].append(arr[:n])
            cov_future[name].append(arr[n:])
        try:
            future_ds = pd.date_range(
                ds[-1], periods=horizon + 1, freq=_freq_of(s, ds, model_freq)
            )[1:]
        except (ValueError, TypeError) as exc:
            raise _frame_error(exc, i, s.id, "timestamps") from None
        future_ids.append(np.full(horizon, s.id, dtype=object))
        future_stamps.append(future_ds.to_numpy(dtype="datetime64[ns]"))
    history = {
        "unique_id": np.concatenate(ids),
        "ds": np.concatenate(stamps),
        "y": np.concatenate(values),
        **{name: np.concatenate(parts) for name, parts in cov_past.items()},
    }
    future = None
    if covariates:
        future = {
            "unique_id": np.concatenate(future_ids),
            "ds": np.concatenate(future_stamps),
            **{name: np.concatenate(parts) for name, parts in cov_future.items()},
        }
    return FrameParts(history, future)


def frame_parts(history: pd.DataFrame, future: pd.DataFrame | None = None) -> FrameParts:
    """The columns of frames a caller sent as frames (MLflow's formats)."""
    return FrameParts(
        {str(c): history[c].to_numpy() for c in history.columns},
        None if future is None else {str(c): future[c].to_numpy() for c in future.columns},
    )


def _freq_of(series: Any, ds: pd.DatetimeIndex, model_freq: str | None) -> str:
    if series.freq is not None:
        return series.freq
    inferred = (pd.infer_freq(ds) if len(ds) >= 3 else None) or model_freq
    if inferred is None:
        raise ValueError("cannot infer the frequency for the future covariate timestamps")
    return inferred


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


# -- merged prediction ---------------------------------------------------------------------------


def predict_items(
    items: list[OnlineItem], on_forecast: Callable[[ItemForecast], None] | None = None
) -> list[bytes | Exception]:
    """Forecast every item, merging those that can share one `predict` call.

    `on_forecast` sees each successful forecast before it is rendered (the forecast log).
    """
    results: list[bytes | Exception] = [b""] * len(items)
    built: dict[int, FrameParts] = {}
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for k, item in enumerate(items):
        try:
            built[k] = item.build()
        except Exception as exc:  # bad request content, reported to that request only
            results[k] = exc
            continue
        forecaster = item.model.forecaster
        # Future covariates are checked against the requested horizon, so models that take
        # them merge only requests of the same horizon; columns must line up to concatenate.
        key_horizon = item.horizon if forecaster.model_config.covariates else None
        parts = built[k]
        key = (
            id(forecaster),
            key_horizon,
            _layout(parts.history),
            None if parts.future is None else _layout(parts.future),
        )
        groups[key].append(k)
    for members in groups.values():
        forecasts = _predict_group([items[k] for k in members], [built[k] for k in members])
        for k, forecast in zip(members, forecasts, strict=True):
            if isinstance(forecast, Exception):
                results[k] = forecast
                continue
            if on_forecast is not None:
                on_forecast(forecast)
            try:
                results[k] = items[k].render(forecast)
            except Exception as exc:
                results[k] = exc
    return results


def _layout(columns: Columns) -> tuple[tuple[str, str], ...]:
    return tuple((name, arr.dtype.str) for name, arr in columns.items())


def _predict_group(
    items: list[OnlineItem], parts: list[FrameParts]
) -> list[ItemForecast | Exception]:
    forecaster = items[0].model.forecaster
    horizon = max(item.horizon for item in items)
    out: list[ItemForecast | Exception | None] = [None] * len(items)
    pending = list(range(len(items)))
    while pending:
        merged = len(pending) > 1
        history, counts = _merge([parts[k].history for k in pending], pending if merged else None)
        future = None
        if parts[pending[0]].future is not None:
            future, _ = _merge([parts[k].future for k in pending], pending if merged else None)
        try:
            forecast = forecaster.predict(history, horizon=horizon, future_df=future)
        except ForecasterInputError as exc:
            culprit = _culprit(exc, pending) if merged else pending[0]
            if culprit is None:
                # The core could not say which series; run each request alone to find out.
                for k in pending:
                    out[k] = _predict_alone(items[k], parts[k], horizon)
                break
            out[culprit] = (
                exc if not merged else _alone_error(items[culprit], parts[culprit], horizon)
            )
            pending.remove(culprit)
            continue
        _split(forecast, horizon, items, pending, parts, out, counts)
        break
    return [o if o is not None else RuntimeError("no forecast produced") for o in out]


def _merge(columns: list[Any], prefixes: list[int] | None) -> tuple[pd.DataFrame, list[int] | None]:
    """One frame from several requests' columns, and the number of series of each.

    Series ids get their request's index as a prefix, so two requests may both send a series
    called "a"; the ids are compared as text, as the core compares them.
    """
    if prefixes is None:
        return pd.DataFrame(columns[0]), None
    merged: dict[str, np.ndarray] = {}
    counts: list[int] = []
    for name in columns[0]:
        if name == "unique_id":
            renamed = []
            for k, cols in zip(prefixes, columns, strict=True):
                codes, uniques = pd.factorize(cols[name], use_na_sentinel=False)
                text = [f"{k}{_SEP}{u}" for u in uniques]
                counts.append(len(set(text)))
                renamed.append(np.asarray(text, dtype=object)[codes])
            merged[name] = np.concatenate(renamed)
        else:
            merged[name] = np.concatenate([cols[name] for cols in columns])
    return pd.DataFrame(merged), counts


def _culprit(exc: ForecasterInputError, pending: list[int]) -> int | None:
    if exc.series_id is None or _SEP not in str(exc.series_id):
        return None
    head = str(exc.series_id).split(_SEP, 1)[0]
    try:
        k = int(head)
    except ValueError:
        return None
    return k if k in pending else None


def _alone_error(item: OnlineItem, parts: FrameParts, horizon: int) -> Exception:
    result = _predict_alone(item, parts, horizon)
    if isinstance(result, Exception):
        return result
    return RuntimeError("request failed in a merged batch but not alone")


def _predict_alone(item: OnlineItem, parts: FrameParts, horizon: int) -> ItemForecast | Exception:
    out: list[ItemForecast | Exception | None] = [None]
    history, future = parts.frames()
    try:
        forecast = item.model.forecaster.predict(history, horizon=horizon, future_df=future)
    except ForecasterInputError as exc:
        return exc
    _split(forecast, horizon, [item], [0], [parts], out, None)
    assert out[0] is not None
    return out[0]


def _split(
    forecast: pd.DataFrame,
    horizon: int,
    items: list[OnlineItem],
    pending: list[int],
    parts: list[FrameParts],
    out: list[ItemForecast | Exception | None],
    counts: list[int] | None,
) -> None:
    """Cut the merged forecast back into each request's series, horizon and quantiles;
    `counts` holds each pending request's number of series (None: one request, all rows)."""
    forecaster = items[pending[0]].model.forecaster
    n_total = len(forecast) // horizon
    ids = forecast["unique_id"].to_numpy(dtype=object)[::horizon]
    ds = forecast["ds"].to_numpy(dtype="datetime64[ns]").reshape(n_total, horizon)
    mean = forecast["mean"].to_numpy(dtype=np.float64).reshape(n_total, horizon)
    qs = {
        q: forecast[quantile_column(q)].to_numpy(dtype=np.float64).reshape(n_total, horizon)
        for q in forecaster.quantiles
    }
    start = 0
    for k, n in zip(pending, counts or [n_total], strict=True):
        item = items[k]
        rows = slice(start, start + n)
        start += n
        h = item.horizon
        series_ids = [str(s).split(_SEP, 1)[-1] for s in ids[rows]]
        item_mean = mean[rows, :h]
        item_q = {q: qs[_match(q, forecaster.quantiles)][rows, :h] for q in item.quantiles}
        bad = ~np.isfinite(item_mean).all(axis=1)
        for arr in item_q.values():
            bad |= ~np.isfinite(arr).all(axis=1)
        if bad.any():
            sid = series_ids[int(np.argmax(bad))]
            out[k] = ForecastNotFiniteError(
                f"series {sid!r}: the forecast is not finite; its values are too large in "
                "magnitude for the model's float32 arithmetic (rescale the series)",
                field="values",
                series_id=sid,
            )
            continue
        out[k] = ItemForecast(
            model=item.model,
            series_ids=series_ids,
            timestamps=ds[rows, :h],
            mean=item_mean,
            quantiles=item_q,
            parts=parts[k],
        )
    assert start == n_total, f"merged forecast has {n_total} series, requests {start}"


def _match(value: float, options: Sequence[float]) -> float:
    return next(o for o in options if abs(o - float(value)) < 1e-9)


# -- responses -------------------------------------------------------------------------------


def _iso(values: np.ndarray) -> list[str]:
    return np.datetime_as_string(values, unit="s").tolist()


def render_forecast(forecast: ItemForecast, horizon: int, include_attention: bool) -> bytes:
    """The `POST /v1/forecast` response body, encoded."""
    attention = None
    if include_attention:
        maps = forecast.model.forecaster.attention(*forecast.parts.frames())
        attention = {
            str(sid): {
                "context_start": maps.context_starts[s],
                "patch_length": maps.patch_length,
                "patch_stride": maps.patch_stride,
                "encoder": [layer[s].tolist() for layer in maps.encoder],
                "decoder_self": [layer[s].tolist() for layer in maps.decoder_self],
                "cross": [layer[s].tolist() for layer in maps.cross],
            }
            for s, sid in enumerate(maps.series_ids)
        }
    forecasts = []
    for s, sid in enumerate(forecast.series_ids):
        entry: dict[str, Any] = {
            "id": sid,
            "timestamps": _iso(forecast.timestamps[s]),
            "mean": forecast.mean[s].tolist(),
            "quantiles": {f"{q:g}": arr[s].tolist() for q, arr in forecast.quantiles.items()},
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
    return json.dumps(body, separators=(",", ":")).encode()


def render_mlflow(forecast: ItemForecast) -> bytes:
    """`{"predictions": [records]}` exactly as MLflow's scoring server writes the long frame
    (`predictions_to_json`), built with the C JSON encoder instead of MLflow's Python one."""
    s, h = forecast.mean.shape
    stamps = forecast.timestamps.reshape(s * h)
    if (stamps.astype("datetime64[s]") == stamps).all():
        ds = np.datetime_as_string(stamps, unit="s").tolist()
    else:
        ds = [t.isoformat() for t in pd.DatetimeIndex(stamps)]
    columns: dict[str, list[Any]] = {
        "unique_id": np.repeat(np.asarray(forecast.series_ids, dtype=object), h).tolist(),
        "ds": ds,
        "mean": forecast.mean.reshape(s * h).tolist(),
    }
    for q, arr in forecast.quantiles.items():
        columns[quantile_column(q)] = arr.reshape(s * h).tolist()
    keys = list(columns)
    records = [dict(zip(keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]
    return json.dumps({"predictions": records}).encode()
