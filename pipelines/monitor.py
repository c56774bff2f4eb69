"""Monitor: score what deployed versions forecast against what has been observed since.

Reads the forecast log (``pipelines.forecast_log``), joins it with the actuals of the
ingested data on series and timestamp, and computes per version the realised MAE, MASE
(scaled like the backtest's: by each series' in-sample seasonal-naive MAE before its first
scored forecast) and the coverage of the logged interval. The champion is *degraded* when its
realised MASE exceeds its backtest MASE (the ``backtest.mase`` version tag) by more than
``degradation_tolerance``, over at least ``degradation_min_points`` scored points.

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from forecaster.metrics import coded_mase_scales
from forecaster.plotting import plot_metric_over_time
from forecaster.time_axis import season_length
from forecaster.validation import ID, TARGET, TIME
from pipelines.forecast_log import empty_log, read_log
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
    first_ds: pd.Timestamp
    last_ds: pd.Timestamp

    def as_tags(self) -> dict[str, str]:
        values = {
            "mae": f"{self.mae:.6g}",
            "mase": f"{self.mase:.6g}",
            "coverage": f"{self.coverage:.6g}",
            "level": f"{self.level:.6g}",
            "points": str(self.points),
            "series": str(self.series),
            "until": self.last_ds.isoformat(),
        }
        return {REALISED_PREFIX + k: v for k, v in values.items()}


@dataclass(frozen=True)
class Realised:
    """Every version's realised accuracy and the scored rows behind it."""

    versions: dict[str, VersionAccuracy]
    scored: pd.DataFrame  # log rows with their actual `y` and row-wise `scaled_error`


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


def score(log: pd.DataFrame, actuals: pd.DataFrame, season: int) -> Realised:
    """Join logged forecasts with observed values and score each version.

    Args:
        log: rows of ``read_log``.
        actuals: long frame (``unique_id``, ``ds``, ``y``); missing ``y`` is not scored.
        season: MASE's seasonal lag.
    """
    # Series as integer codes from here on: joins and groupings over tens of millions of
    # logged rows on text ids took minutes (benchmarks.forecast_log). Missing values stay
    # rows: a row is a step for the seasonal differences of the scale.
    codes, series = pd.factorize(actuals[ID].astype("str"))
    times = actuals[TIME].to_numpy(dtype="datetime64[ns]")
    values = actuals[TARGET].to_numpy(np.float64)
    observed = ~np.isnan(values)
    # The join on the keys alone, then the log's rows taken once: merging the log itself
    # held a second and a third copy of it (benchmarks.forecast_log).
    truth = pd.DataFrame({"_series": codes[observed], TIME: times[observed]})
    log_times = log[TIME].to_numpy(dtype="datetime64[ns]")
    keys = pd.DataFrame(
        {"_series": series.get_indexer(log[ID].astype("str")), TIME: log_times}  # -1: none
    )
    pairs = keys.reset_index(names="_row").merge(
        truth.reset_index(names="_actual"), on=["_series", TIME], how="inner"
    )  # in the log's order (an inner merge keeps the left keys' order)
    taken = pairs["_row"].to_numpy()
    scored = log.take(taken).reset_index(drop=True)
    scored = scored.assign(**{ID: scored[ID].astype("str"), TIME: log_times[taken]})
    scored[TARGET] = values[observed][pairs["_actual"].to_numpy()]
    if not len(scored):
        return Realised({}, scored.assign(scaled_error=pd.Series(dtype="float64")))
    scored_codes = pairs["_series"].to_numpy()
    del keys, pairs, truth, taken
    # Each version's series scaled by the history before that version's own first forecast,
    # seasonally (as its backtest MASE is): another version's rows must not move its verdict.
    # Forecasts too early for the data to hold a season of history before them (a feed that
    # keeps its last days, and a champion that has served longer) are not scaled: the first
    # one after such a history starts the scored stretch. Left unscaled, every series' MASE
    # was undefined and read as "not degraded", whatever the errors.
    order = np.argsort(codes, kind="stable")  # each series' rows as given
    hist_codes, hist_times, hist_values = codes[order], times[order], values[order]
    starts = np.flatnonzero(np.r_[True, hist_codes[1:] != hist_codes[:-1]])
    lengths = np.diff(np.append(starts, len(order)))
    earliest = np.full(len(series), np.datetime64("NaT"), dtype="datetime64[ns]")
    long_enough = (lengths > season + 1) & (hist_codes[starts] >= 0)  # -1: a missing id
    earliest[hist_codes[starts[long_enough]]] = hist_times[starts[long_enough] + season + 1]
    scored_times = scored[TIME].to_numpy(dtype="datetime64[ns]")
    scalable = scored_times >= earliest[scored_codes]  # NaT: never
    # The scale reads each series in time order (a row is a step of validated frames).
    by_time = np.lexsort((hist_times, hist_codes))
    hist_codes, hist_times, hist_values = (
        a[by_time] for a in (hist_codes, hist_times, hist_values)
    )
    scale = np.full(len(scored), np.nan)
    versions = pd.factorize(scored["model_version"])[0]
    for version in np.unique(versions[scalable]):
        rows_of = np.flatnonzero(scalable & (versions == version))
        scale[rows_of] = coded_mase_scales(
            scored_codes[rows_of],
            scored_times[rows_of],
            hist_codes,
            hist_times,
            hist_values,
            len(series),
            season,
            seasonal_only=True,
        )
    scored = scored.assign(scaled_error=np.abs(scored[TARGET] - scored["mean"]) / scale)
    inside = (scored[TARGET] >= scored["lower"]) & (scored[TARGET] <= scored["upper"])
    has_interval = scored["lower"].notna() & scored["upper"].notna()
    versions = {}
    for version, group in scored.groupby("model_version", sort=True):
        mase_values = group.groupby(ID, sort=False)["scaled_error"].mean().to_numpy()
        with_interval = has_interval[group.index]
        # Coverage of one nominal level, the one most rows were logged with: bands of other
        # levels (a client asking for 0.5-0.9) would blend into a figure of no level.
        levels = group["level"][with_interval]
        level = float(levels.mode().max()) if len(levels) else math.nan
        nominal = with_interval & (group["level"] == level)
        versions[str(version)] = VersionAccuracy(
            version=str(version),
            mae=float(np.mean(np.abs(group[TARGET] - group["mean"]))),
            mase=float(np.nanmean(mase_values)) if np.isfinite(mase_values).any() else math.nan,
            coverage=float(inside[group.index][nominal].mean()) if nominal.any() else math.nan,
            level=level,
            points=len(group),
            series=int(group[ID].nunique()),
            first_ds=pd.Timestamp(group[TIME].min()),
            last_ds=pd.Timestamp(group[TIME].max()),
        )
    return Realised(versions, scored)


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
) -> MonitorResult:
    """Score the forecast log against ``data``, log it to ``run_id``, tag the versions.

    A missing or empty log is not an error: nothing has been forecast yet.
    """
    started = time.perf_counter()
    log = read_log(log_dir, model_name=model_name) if log_dir is not None else empty_log()
    if log_dir is not None and not Path(log_dir).is_dir():
        # Before the service's first start this is expected; after it, a wrong path would
        # read as a healthy champion for good.
        logger.warning(
            "forecast log %s does not exist: nothing scored (the service's FORECAST_LOG_DIR "
            "and this forecast_log must name the same directory)",
            log_dir,
        )
    realised = score(log, data.frame, season_length(data.freq))
    if len(log) and not len(realised.scored):
        logger.warning(
            "none of the %d logged forecast row(s) matches an observed value in the data "
            "(other series ids, or timestamps it does not reach yet): nothing scored",
            len(log),
        )
    champion, backtest_mase, by_step = _champion(client, model_name)
    basis = "backtest"
    if champion in realised.versions and by_step:
        # Errors grow with the step: traffic asking for the first steps alone is held to the
        # backtest's accuracy at those steps, not to its mean over the whole horizon.
        at_steps = _at_logged_steps(realised.scored, champion, by_step)
        if at_steps is not None:
            backtest_mase, basis = at_steps, "backtest at the logged steps"
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
        log_rows=len(log),
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
    logger.info("scored %d logged forecast rows in %.1fs", len(log), time.perf_counter() - started)
    return result


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


def _at_logged_steps(
    scored: pd.DataFrame, version: str, by_step: tuple[float, ...]
) -> float | None:
    """The backtest MASE of the steps `version`'s scored rows were logged at, averaged the way
    the realised MASE is (per series, then over the series, over the rows that have a scale);
    None when none is known."""
    # A row without a scale (too little history before it) is not in the realised MASE, so
    # its step must not weigh in what that MASE is compared with.
    rows = scored[(scored["model_version"] == version) & np.isfinite(scored["scaled_error"])]
    steps = rows["step"].to_numpy(dtype=np.int64)
    known = (steps >= 1) & (steps <= len(by_step))
    expected = np.full(len(rows), np.nan)
    expected[known] = np.asarray(by_step, dtype=np.float64)[steps[known] - 1]
    per_series = pd.Series(expected).groupby(rows[ID].to_numpy()).mean()
    value = float(per_series.mean())
    return value if math.isfinite(value) else None


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
            _by_origin(result.realised.scored),
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


def _by_origin(scored: pd.DataFrame) -> pd.DataFrame:
    """Mean scaled error per version and origin (by day when there are many origins)."""
    origin = scored["origin"]
    if origin.nunique() > _MAX_PLOT_ORIGINS:
        origin = origin.dt.floor("D")
    grouped = (
        scored.assign(time=origin, group="v" + scored["model_version"].astype(str))
        .groupby(["group", "time"], sort=True)["scaled_error"]
        .mean()
    )
    return grouped.rename("value").reset_index()
