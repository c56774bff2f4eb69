"""Monitor: score what deployed versions forecast against what has been observed since.

Reads the forecast log (``pipelines.forecast_log``), joins it with the actuals of the
ingested data on series and timestamp, and computes per version the realised MAE, MASE
(scaled like the backtest's: by each series' in-sample seasonal-naive MAE before its first
scored forecast) and the coverage of the logged interval. The champion is *degraded* when its
realised MASE exceeds its backtest MASE (the ``backtest.mase`` version tag) by more than
``degradation_tolerance``, over at least ``degradation_min_points`` scored points.

The log is read and scored in parts of whole series (``PART_ROWS`` rows), and only sums per
version and series are kept between parts: a retrain's memory follows a part and its data,
not the log it reads (benchmarks.forecast_log).

Logged to the run: ``realised/v<N>/<metric>`` per version and ``realised/champion/<metric>``
(the UI charts these across runs), the plot ``monitoring/realised_accuracy.png`` (realised
MASE by forecast origin, one line per version), the per-version table, and the
``monitoring.*`` run tags. Each version scored gets ``realised.*`` tags, which the service
exports as a Prometheus gauge.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from forecaster.metrics import coded_mase_scales
from forecaster.plotting import plot_metric_over_time
from forecaster.time_axis import is_integer_time, season_length, time_label, time_point
from forecaster.validation import ID, TARGET, TIME
from pipelines.forecast_log import TEXT_COLUMNS, CodedLog, read_log_parts
from pipelines.ingest import IngestResult
from pipelines.registry import CHAMPION

logger = logging.getLogger(__name__)

# Version tags written here (and read by the service).
REALISED_PREFIX = "realised."
BACKTEST_MASE = "backtest.mase"
# The backtest's MASE at each step ahead, comma-separated (3 digits: 720 steps fit a tag).
BACKTEST_MASE_BY_STEP = "backtest.mase_by_step"
# At most this many points on the plot's time axis; more origins are binned by day.
_MAX_PLOT_ORIGINS = 60
# The log is scored in parts of about this many rows, whole series each (under 1 GB of
# memory a part; benchmarks.forecast_log): a retrain's memory then stays flat in the log's
# size, and smaller parts bought no speed.
PART_ROWS = 1_000_000


@dataclass(frozen=True)
class VersionAccuracy:
    """Realised accuracy of one version's logged forecasts."""

    version: str
    mae: float
    mase: float  # mean over series of each series' MASE; NaN when no series has a scale
    coverage: float  # share of actuals inside the logged interval; NaN without intervals
    level: float  # the interval's nominal coverage (0.8 for q0.1..q0.9); NaN without
    points: int  # forecast steps scored
    series: int
    first_ds: pd.Timestamp | int  # an int for integer ds (`time_axis.time_point`)
    last_ds: pd.Timestamp | int

    def as_tags(self) -> dict[str, str]:
        values = {
            "mae": f"{self.mae:.6g}",
            "mase": f"{self.mase:.6g}",
            "coverage": f"{self.coverage:.6g}",
            "level": f"{self.level:.6g}",
            "points": str(self.points),
            "series": str(self.series),
            "until": time_label(self.last_ds),
        }
        return {REALISED_PREFIX + k: v for k, v in values.items()}


@dataclass(frozen=True)
class Realised:
    """Every version's realised accuracy, and the sums behind its plot and comparisons."""

    versions: dict[str, VersionAccuracy]
    # Per version and origin, the sum and count of the scaled errors that are not NaN: what
    # the plot of realised MASE by origin is drawn from.
    by_origin: pd.DataFrame  # columns model_version, origin, scaled, n
    # The backtest MASE at the steps each version given one was logged at, averaged the way
    # its realised MASE is (`score`'s by_step); a version absent: none known.
    at_steps: dict[str, float] = field(default_factory=dict)
    log_rows: int = 0  # logged forecast rows read
    scored_rows: int = 0  # of which an actual was observed


@dataclass(frozen=True)
class MonitorResult:
    """What the monitoring step found and decided about the champion."""

    realised: Realised
    champion_version: str | None
    backtest_mase: float | None  # the champion's, from its version tag
    degraded: bool
    reason: str
    log_rows: int = 0
    versions: list[str] = field(default_factory=list)

    @property
    def champion(self) -> VersionAccuracy | None:
        if self.champion_version is None:
            return None
        return self.realised.versions.get(self.champion_version)


def score(
    log: pd.DataFrame,
    actuals: pd.DataFrame,
    season: int,
    by_step: Mapping[str, Sequence[float]] | None = None,
) -> Realised:
    """Join logged forecasts with observed values and score each version.

    Args:
        log: rows of ``read_log``.
        actuals: long frame (``unique_id``, ``ds``, ``y``); missing ``y`` is not scored.
        season: MASE's seasonal lag.
        by_step: per version, its backtest MASE at each step ahead, to be averaged over the
            steps its scored rows were logged at (``Realised.at_steps``).
    """
    text = {}
    for column in TEXT_COLUMNS:
        codes, values = pd.factorize(log[column].astype("str"), sort=True)
        text[column] = (codes.astype(np.int32), values.to_numpy(dtype=str))
    rows = log.assign(**{c: codes for c, (codes, _) in text.items()})
    coded = CodedLog(rows, *(values for _, values in text.values()))
    return score_parts([coded] if len(log) else [], actuals, season, by_step)


def score_parts(
    parts: Iterable[CodedLog],
    actuals: pd.DataFrame,
    season: int,
    by_step: Mapping[str, Sequence[float]] | None = None,
) -> Realised:
    """`score` over the log read in parts of whole series (``read_log_parts``): what is kept
    between parts is sums per version and series, so memory follows the part, not the log."""
    history = _History(actuals, season)
    tallies, ids, to_actual = [], None, np.empty(0, dtype=np.intp)
    for part in parts:
        if part.series is not ids:  # parts of one read share their ids: looked up once
            ids, to_actual = part.series, history.series.get_indexer(part.series)
        tallies.append(_tally(part, to_actual, history, by_step or {}))
    return _realised(tallies, integers=is_integer_time(actuals[TIME]))


class _History:
    """The actuals, sorted once for every part's join and seasonal scale."""

    def __init__(self, actuals: pd.DataFrame, season: int):
        # Series as integer codes from here on: joins and groupings over tens of millions of
        # logged rows on text ids took minutes (benchmarks.forecast_log). Missing values stay
        # rows: a row is a step for the seasonal differences of the scale.
        codes, self.series = pd.factorize(actuals[ID].astype("str"))
        times = actuals[TIME].to_numpy(dtype="datetime64[ns]")
        values = actuals[TARGET].to_numpy(np.float64)
        valid = (codes >= 0) & ~np.isnat(times)  # other rows can be neither joined nor scaled
        if not valid.all():
            codes, times, values = codes[valid], times[valid], values[valid]
        order = np.lexsort((times, codes))  # each series in time order
        # Kept for every part, so kept small: 28 bytes an actual row.
        self.codes = codes[order].astype(np.int32)
        self.times, self.values = times[order], values[order]
        del codes, times, values, order
        self.season = season
        n = len(self.series)
        self.bounds = np.searchsorted(self.codes, np.arange(n + 1))  # series c: [c], [c + 1]
        # The join's key, a series and a time as one integer, in the rows' order (by series,
        # then time): the series times the number of distinct times, plus its time's rank.
        self.instants = np.unique(self.times)
        self.keys = self.codes.astype(np.int64) * len(self.instants)
        self.keys += np.searchsorted(self.instants, self.times)
        # Forecasts too early for the data to hold a season of history before them (a feed
        # that keeps its last days, and a champion that has served longer) are not scaled:
        # the first one after such a history starts the scored stretch. Left unscaled, every
        # series' MASE was undefined and read as "not degraded", whatever the errors.
        lengths = np.diff(self.bounds)
        long_enough = np.flatnonzero(lengths > season + 1)
        self.earliest = np.full(n + 1, np.datetime64("NaT"), dtype="datetime64[ns]")  # -1: NaT
        self.earliest[long_enough] = self.times[self.bounds[long_enough] + season + 1]

    def find(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        """The row of each (series code, time) with an observed value; -1 where none."""
        rows = np.full(len(codes), -1)
        if not len(self.keys):
            return rows
        ranks = np.searchsorted(self.instants, times)
        known = (codes >= 0) & (ranks < len(self.instants))
        known[known] = self.instants[ranks[known]] == times[known]
        keys = codes[known].astype(np.int64) * len(self.instants) + ranks[known]
        place = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        match = (self.keys[place] == keys) & ~np.isnan(self.values[place])
        rows[np.flatnonzero(known)[match]] = place[match]
        return rows

    def scales(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Each forecast row's seasonal scale from its series' history before the first of
        `codes`' rows of that series."""
        low, high = codes.min(), codes.max()
        rows = slice(self.bounds[low], self.bounds[high + 1])  # only the series asked for
        return coded_mase_scales(
            codes - low,
            times,
            self.codes[rows] - low,
            self.times[rows],
            self.values[rows],
            high - low + 1,
            self.season,
            seasonal_only=True,
        )


_EMPTY_SERIES = pd.DataFrame(
    columns=["model_version", "series", "points", "error", "scaled", "scaled_n", "expected"]
    + ["expected_n", "first_ds", "last_ds"]
)
_EMPTY_LEVELS = pd.DataFrame(columns=["model_version", "level", "n", "inside"])
_EMPTY_ORIGINS = pd.DataFrame(columns=["model_version", "origin", "scaled", "n"])


@dataclass(frozen=True)
class _Tally:
    """One part's sums: per version and series, per version and interval level, per version
    and origin (versions as text)."""

    series: pd.DataFrame
    levels: pd.DataFrame
    origins: pd.DataFrame
    log_rows: int


def _tally(
    part: CodedLog,
    to_actual: np.ndarray,
    history: _History,
    by_step: Mapping[str, Sequence[float]],
) -> _Tally:
    """The sums of one part's rows; `to_actual` maps its series codes to the history's."""
    rows = part.rows
    codes = to_actual[rows[ID].to_numpy()]  # -1: a series with no actuals
    found = history.find(codes, rows[TIME].to_numpy(dtype="datetime64[ns]"))
    hit = np.flatnonzero(found >= 0)
    if not len(hit):
        return _Tally(_EMPTY_SERIES, _EMPTY_LEVELS, _EMPTY_ORIGINS, log_rows=len(rows))
    codes, found = codes[hit], found[hit]
    times = history.times[found]
    versions = rows["model_version"].to_numpy()[hit]
    y = history.values[found]
    error = np.abs(y - rows["mean"].to_numpy(np.float64)[hit])
    # Each version's series scaled by the history before that version's own first forecast,
    # seasonally (as its backtest MASE is): another version's rows must not move its verdict.
    scale = np.full(len(hit), np.nan)
    scalable = times >= history.earliest[codes]  # NaT: never
    for version in np.unique(versions[scalable]):
        of = np.flatnonzero(scalable & (versions == version))
        scale[of] = history.scales(codes[of], times[of])
    lower, upper = (rows[c].to_numpy(np.float64)[hit] for c in ("lower", "upper"))
    steps = rows["step"].to_numpy(np.int64)[hit]
    scored = pd.DataFrame(
        {
            "model_version": versions,
            "series": codes,
            "origin": rows["origin"].to_numpy()[hit],
            TIME: times,
            "error": error,
            "scaled": error / scale,
            "level": rows["level"].to_numpy(np.float64)[hit],
            "inside": (y >= lower) & (y <= upper),
            "has_interval": ~np.isnan(lower) & ~np.isnan(upper),
            "expected": np.nan,
        }
    )
    # The backtest's MASE at each row's step, on the rows the realised MASE counts.
    for version, values in by_step.items():
        code = np.searchsorted(part.versions, version)
        if code == len(part.versions) or part.versions[code] != version:
            continue  # not in this part
        table = np.asarray(values, dtype=np.float64)
        of = (versions == code) & np.isfinite(scored["scaled"].to_numpy()) & (steps >= 1)
        of &= steps <= len(table)
        scored.loc[of, "expected"] = table[steps[of] - 1]
    per_series = scored.groupby(["model_version", "series"], sort=False).agg(
        points=("error", "size"),
        error=("error", "sum"),
        scaled=("scaled", "sum"),
        scaled_n=("scaled", "count"),
        expected=("expected", "sum"),
        expected_n=("expected", "count"),
        first_ds=(TIME, "min"),
        last_ds=(TIME, "max"),
    )
    levels = (
        scored[scored["has_interval"]]
        .groupby(["model_version", "level"], sort=False)
        .agg(n=("inside", "size"), inside=("inside", "sum"))
    )
    origins = scored.groupby(["model_version", "origin"], sort=False).agg(
        scaled=("scaled", "sum"), n=("scaled", "count")
    )
    tallies = [t.reset_index() for t in (per_series, levels, origins)]
    for t in tallies:  # parts share their version codes; text keeps the sums apart anyway
        t["model_version"] = part.versions[t["model_version"].to_numpy()]
    return _Tally(*tallies, log_rows=len(rows))


def _realised(tallies: list[_Tally], integers: bool = False) -> Realised:
    """The tallies summed per version; times as integer steps for integer ds (inside, the
    log and the actuals share the nanosecond axis they are read on)."""
    log_rows = sum(t.log_rows for t in tallies)
    tallies = [t for t in tallies if len(t.series)]  # parts with rows scored
    if not tallies:
        return Realised({}, _EMPTY_ORIGINS, log_rows=log_rows)
    series = pd.concat([t.series for t in tallies], ignore_index=True)  # parts: other series
    levels = pd.concat([t.levels for t in tallies]).groupby(["model_version", "level"]).sum()
    by_origin = (
        pd.concat([t.origins for t in tallies])
        .groupby(["model_version", "origin"], sort=True)
        .sum()
        .reset_index()
    )
    if integers:
        by_origin["origin"] = by_origin["origin"].to_numpy(dtype="datetime64[ns]").view(np.int64)
    versions, at_steps = {}, {}
    for version, group in series.groupby("model_version", sort=True):
        # MASE per series over the rows with a scale, then the mean over the series.
        mase_values = (group["scaled"] / group["scaled_n"].where(group["scaled_n"] > 0)).to_numpy()
        # Coverage of one nominal level, the one most rows were logged with: bands of other
        # levels (a client asking for 0.5-0.9) would blend into a figure of no level.
        coverage = level = math.nan
        if version in levels.index.get_level_values(0):
            counts = levels.loc[version]
            level = float(counts.index[counts["n"] == counts["n"].max()].max())
            coverage = float(counts.loc[level, "inside"] / counts.loc[level, "n"])
        points = int(group["points"].sum())
        versions[str(version)] = VersionAccuracy(
            version=str(version),
            mae=float(group["error"].sum() / points),
            mase=float(np.nanmean(mase_values)) if np.isfinite(mase_values).any() else math.nan,
            coverage=coverage,
            level=level,
            points=points,
            series=len(group),
            first_ds=_point(group["first_ds"].min(), integers),
            last_ds=_point(group["last_ds"].max(), integers),
        )
        known = group["expected_n"] > 0
        if known.any():
            expected = (group["expected"][known] / group["expected_n"][known]).mean()
            if math.isfinite(expected):
                at_steps[str(version)] = float(expected)
    scored_rows = int(series["points"].sum())
    return Realised(versions, by_origin, at_steps, log_rows, scored_rows)


def degradation(
    accuracy: VersionAccuracy | None,
    backtest_mase: float | None,
    *,
    tolerance: float,
    min_points: int,
    basis: str = "backtest",
) -> tuple[bool, str]:
    """Whether the champion's realised MASE is worse than its backtest's by more than
    ``tolerance`` (0.3 = 30 %), and why (or why not); ``basis`` names what the backtest MASE
    is (over the whole horizon, or at the steps logged)."""
    if accuracy is None:
        return False, "no logged forecast of the champion has been observed yet"
    if accuracy.points < min_points:
        return False, (
            f"only {accuracy.points} observed forecast point(s) of version {accuracy.version}; "
            f"degradation is judged from {min_points}"
        )
    if backtest_mase is None or not math.isfinite(backtest_mase):
        return False, f"version {accuracy.version} has no backtest MASE to compare with"
    if not math.isfinite(accuracy.mase):
        return (
            False,
            f"version {accuracy.version}: realised MASE undefined (constant series, or too little history for its seasonal scale)",
        )
    limit = backtest_mase * (1 + tolerance)
    verdict = (
        f"version {accuracy.version}: realised MASE {accuracy.mase:.4f} over {accuracy.points} "
        f"point(s) vs {basis} {backtest_mase:.4f} (limit {limit:.4f} = backtest x "
        f"{1 + tolerance:g})"
    )
    return accuracy.mase > limit, verdict


def monitor(
    data: IngestResult,
    *,
    log_dir: str | Path | None,
    model_name: str,
    tolerance: float,
    min_points: int,
    client: MlflowClient,
    run_id: str,
    spill_dir: str | Path | None = None,
) -> MonitorResult:
    """Score the forecast log against ``data``, log it to ``run_id``, tag the versions.

    A missing or empty log is not an error: nothing has been forecast yet. A log of more than
    ``PART_ROWS`` rows is sorted into temporary files under ``spill_dir`` (`read_log_parts`).
    """
    started = time.perf_counter()
    champion, backtest_mase, by_step = _champion(client, model_name)
    parts = []
    if log_dir is not None:
        parts = read_log_parts(
            log_dir, model_name=model_name, max_rows=PART_ROWS, spill_dir=spill_dir
        )
        if not Path(log_dir).is_dir():
            # Before the service's first start this is expected; after it, a wrong path
            # would read as a healthy champion for good.
            logger.warning(
                "forecast log %s does not exist: nothing scored (the service's "
                "FORECAST_LOG_DIR and this forecast_log must name the same directory)",
                log_dir,
            )
    steps = {champion: by_step} if champion is not None and by_step else {}
    realised = score_parts(parts, data.frame, season_length(data.freq), steps)
    if realised.log_rows and not realised.scored_rows:
        logger.warning(
            "none of the %d logged forecast row(s) matches an observed value in the data "
            "(other series ids, or timestamps it does not reach yet): nothing scored",
            realised.log_rows,
        )
    basis = "backtest"
    if champion in realised.at_steps:
        # Errors grow with the step: traffic asking for the first steps alone is held to the
        # backtest's accuracy at those steps, not to its mean over the whole horizon.
        backtest_mase, basis = realised.at_steps[champion], "backtest at the logged steps"
    degraded, reason = degradation(
        realised.versions.get(champion) if champion else None,
        backtest_mase,
        tolerance=tolerance,
        min_points=min_points,
        basis=basis,
    )
    if champion is None:
        degraded, reason = False, f"{model_name} has no champion yet"
    elif log_dir is None:
        degraded, reason = False, "forecast logging is off (forecast_log is empty): not monitored"
    result = MonitorResult(
        realised,
        champion,
        backtest_mase,
        degraded,
        reason,
        log_rows=realised.log_rows,
        versions=sorted(realised.versions, key=_version_key),
    )
    _log(result, client, run_id, model_name)
    if degraded:
        logger.warning("CHAMPION DEGRADED: %s", reason)
    else:
        logger.info("monitoring: %s", reason)
    for accuracy in realised.versions.values():
        logger.info(
            "realised accuracy of version %s: MAE %.4g, MASE %.4g, coverage %.3g over %d "
            "point(s) of %d series up to %s",
            accuracy.version,
            accuracy.mae,
            accuracy.mase,
            accuracy.coverage,
            accuracy.points,
            accuracy.series,
            accuracy.last_ds,
        )
    logger.info(
        "scored %d logged forecast rows in %.1fs",
        realised.log_rows,
        time.perf_counter() - started,
    )
    return result


def _point(value: Any, integers: bool) -> pd.Timestamp | int:
    return time_point(pd.Timestamp(value).value if integers else value)


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (10**9, version)


def step_tag(values: tuple[float, ...]) -> str:
    """The tag value of a MASE per step (`BACKTEST_MASE_BY_STEP`)."""
    return ",".join(f"{v:.3g}" for v in values)


def _champion(
    client: MlflowClient, model_name: str
) -> tuple[str | None, float | None, tuple[float, ...]]:
    """The champion's version, backtest MASE and backtest MASE by step (empty for a version
    registered before the tag existed)."""
    try:
        version = client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None, None, ()
    raw, steps = version.tags.get(BACKTEST_MASE), version.tags.get(BACKTEST_MASE_BY_STEP, "")
    try:
        backtest = float(raw) if raw is not None else None
        by_step = tuple(float(v) for v in steps.split(",")) if steps else ()
    except ValueError:
        backtest, by_step = None, ()
    return str(version.version), backtest, by_step


def _log(result: MonitorResult, client: MlflowClient, run_id: str, model_name: str) -> None:
    now = int(time.time() * 1000)
    metrics = []
    for version, accuracy in result.realised.versions.items():
        names = {"mae": accuracy.mae, "mase": accuracy.mase, "coverage": accuracy.coverage}
        names["points"] = float(accuracy.points)
        for name, value in names.items():
            if math.isfinite(value):
                metrics.append(Metric(f"realised/v{version}/{name}", float(value), now, 0))
                if version == result.champion_version:
                    metrics.append(Metric(f"realised/champion/{name}", float(value), now, 0))
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    client.set_tag(run_id, "monitoring.degraded", str(result.degraded).lower())
    client.set_tag(run_id, "monitoring.reason", result.reason[:5000])
    if result.champion_version is not None:
        client.set_tag(run_id, "monitoring.champion_version", result.champion_version)
    for version, accuracy in result.realised.versions.items():
        tags = accuracy.as_tags()
        if version == result.champion_version:
            tags[REALISED_PREFIX + "degraded"] = str(result.degraded).lower()
        try:
            for key, value in tags.items():
                client.set_model_version_tag(model_name, version, key, value)
        except MlflowException as exc:  # a deleted version keeps its rows in the log
            logger.info("version %s not tagged: %s", version, exc)
    champion = result.champion_version
    if champion is not None and champion not in result.realised.versions:
        # Not scored this time: an earlier run's verdict would stand as current (and the
        # service would export it); the runs keep the history.
        try:
            stale = client.get_model_version(model_name, champion).tags
            for key in [k for k in stale if k.startswith(REALISED_PREFIX)]:
                client.delete_model_version_tag(model_name, champion, key)
        except MlflowException as exc:
            logger.info("version %s not untagged: %s", champion, exc)
    if not result.realised.versions:
        return
    table = pd.DataFrame([vars(a) for a in result.realised.versions.values()])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "realised_accuracy.png"
        plot_metric_over_time(
            _by_origin(result.realised.by_origin),
            path,
            title="Realised MASE of logged forecasts, by forecast origin",
            ylabel="MASE",
        )
        client.log_artifact(run_id, str(path), "monitoring")
        client.log_table(
            run_id,
            table.astype({"first_ds": str, "last_ds": str}),
            "monitoring/realised_accuracy.json",
        )


def _by_origin(by_origin: pd.DataFrame) -> pd.DataFrame:
    """Mean scaled error per version and origin (by day when there are many origins)."""
    origin = by_origin["origin"]
    if origin.dtype.kind == "M" and origin.nunique() > _MAX_PLOT_ORIGINS:  # steps: as they are
        origin = origin.dt.floor("D")
    sums = (
        by_origin.assign(time=origin, group="v" + by_origin["model_version"].astype(str))
        .groupby(["group", "time"], sort=True)[["scaled", "n"]]
        .sum()
    )
    value = sums["scaled"] / sums["n"].where(sums["n"] > 0)
    return value.rename("value").reset_index()
