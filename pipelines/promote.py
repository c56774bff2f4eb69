"""Promote: move `champion` to the `challenger` when it is reliably better on recent data.

Champion, challenger and seasonal naive are scored on the same rolling-origin backtest windows
(the last `n_windows` horizons of every series of the given data). ``champion`` moves when
there is none, or when all of these hold:

- the challenger's mean per-series metric beats the champion's by the relative margin;
- the improvement is unlikely to be noise: a one-sided paired test over the errors of each
  series in each window (Wilcoxon signed-rank by default, or a sign test) gives p < alpha.
  Pairs are (series, window) rather than series so that a few series with several windows
  can still show a difference; windows of one series are not independent, so the p-value is
  optimistic when there are few series. With so few pairs that no outcome could reach alpha
  (n pairs give p >= 2^-n: 3 windows of one series never reach 0.05), the test is skipped
  and the margin decides, saying so, rather than no challenger ever replacing the champion;
- the challenger beats seasonal naive (unless that is switched off).

Two equally good models (same data and configuration, another seed) then swap the alias only
when the test errs, about alpha of the time at most (measured: ``benchmarks.promotion``).
The decision, every score, the test's statistic and p-value and the reason are recorded as
tags of the challenger version either way; a promoted version also records which version it
replaced, which is what ``rollback`` goes back to.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from scipy import stats

from forecaster.backtest import backtest
from forecaster.baselines import SeasonalNaive
from forecaster.errors import ForecasterInputError
from pipelines import tracking
from pipelines.errors import ModelNotFoundError, NoChallengerError
from pipelines.registry import (
    CHALLENGER,
    CHAMPION,
    ModelRef,
    load_version,
    resolve_model,
)

if TYPE_CHECKING:
    from pipelines.settings import PipelineSettings

logger = logging.getLogger(__name__)

# Version tags
DECISION, REASON = "promotion.decision", "promotion.reason"
PREVIOUS_CHAMPION = "promotion.previous_champion"

PairedTestName = Literal["wilcoxon", "sign"]


@dataclass(frozen=True)
class PairedTest:
    """One-sided paired test that the challenger's per-series errors are the lower ones."""

    name: PairedTestName
    statistic: float  # Wilcoxon's W, or the number of pairs the challenger wins (sign test)
    p_value: float
    n_pairs: int  # (series, window) pairs scored by both models


@dataclass(frozen=True)
class Verdict:
    """What the scores say, before anything is recorded."""

    promoted: bool
    reason: str
    challenger_score: float
    champion_score: float | None
    baseline_score: float
    test: PairedTest | None


@dataclass(frozen=True)
class PromotionDecision:
    """What promotion decided, and the scores it decided on."""

    promoted: bool
    reason: str
    metric: str
    challenger: ModelRef
    champion: ModelRef | None  # the champion before the decision
    challenger_score: float | None = None
    champion_score: float | None = None
    baseline_score: float | None = None
    test: PairedTest | None = None

    @property
    def champion_version(self) -> str | None:
        """The version `champion` points at after the decision."""
        if self.promoted:
            return self.challenger.version
        return self.champion.version if self.champion else None


def window_scores(
    model,
    frame: pd.DataFrame,
    horizon: int,
    metric: str,
    n_windows: int,
    context_length: int | None = None,
) -> pd.Series:
    """``metric`` of each series of ``frame`` in each of its last ``n_windows`` horizons (those
    whose ``context_length`` holds an observed value, see ``backtest``)."""
    result = backtest(
        model, frame, n_windows=n_windows, horizon=horizon, context_length=context_length
    )
    return result.by_window(metric)


def paired_test(
    challenger: pd.Series, champion: pd.Series, test: PairedTestName = "wilcoxon"
) -> PairedTest:
    """Is the challenger's error lower, pair by pair (same index)? Ties carry no vote."""
    both = pd.concat([challenger, champion], axis=1, join="inner").dropna()
    diff = both.iloc[:, 0].to_numpy() - both.iloc[:, 1].to_numpy()
    diff = diff[diff != 0]
    if diff.size == 0:
        return PairedTest(test, 0.0, 1.0, len(both))
    if test == "wilcoxon":
        result = stats.wilcoxon(diff, alternative="less")
        return PairedTest(test, float(result.statistic), float(result.pvalue), len(both))
    wins = int((diff < 0).sum())
    result = stats.binomtest(wins, diff.size, 0.5, alternative="greater")
    return PairedTest(test, float(wins), float(result.pvalue), len(both))


def _mean(scores: pd.Series) -> float:
    values = scores.to_numpy(dtype=np.float64)
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def decide(
    challenger: pd.Series,
    champion: pd.Series | None,
    baseline: pd.Series,
    *,
    metric: str,
    margin: float = 0.0,
    alpha: float = 0.05,
    test: PairedTestName = "wilcoxon",
    require_beats_baseline: bool = True,
    window: str = "",
) -> Verdict:
    """The promotion rule on paired scores (lower is better); ``champion=None``: none yet.

    Every score is read on the (series, window) pairs all of them scored: a model leaves out
    the windows whose context it cannot read, and another model's context may be longer."""
    common = challenger.index.intersection(baseline.index)
    if champion is not None:
        common = common.intersection(champion.index)
        champion = champion.loc[common]
    challenger, baseline = challenger.loc[common], baseline.loc[common]
    challenger_score, baseline_score = _mean(challenger), _mean(baseline)
    champion_score = None if champion is None else _mean(champion)
    beats_naive = challenger_score < baseline_score or not require_beats_baseline
    naive_text = f"seasonal naive {baseline_score:.4g}"

    def verdict(promoted: bool, reason: str, paired: PairedTest | None = None) -> Verdict:
        return Verdict(promoted, reason, challenger_score, champion_score, baseline_score, paired)

    if not math.isfinite(challenger_score):
        return verdict(False, f"challenger {metric} is {challenger_score} ({window})")
    if champion is None:  # something must serve; the comparison with naive is in the reason
        return verdict(
            True, f"no {CHAMPION} yet; challenger {window}: {challenger_score:.4g}, {naive_text}"
        )
    paired = paired_test(challenger, champion, test)
    threshold = champion_score * (1.0 - margin)
    # The smallest p-value either test gives n pairs is 2^-n (every pair won, the largest
    # differences included); below that, no improvement could ever pass.
    testable = alpha < 1.0 and 2.0**-paired.n_pairs < alpha
    if testable:
        needs = f"needs < {alpha:g}"
    elif alpha < 1.0:
        needs = f"too few to reach {alpha:g}: the margin decides"
    else:
        needs = "test off: promotion_alpha = 1"
    comparison = (
        f"challenger {challenger_score:.4g} vs champion {champion_score:.4g} (needs < "
        f"{champion_score:.4g} and <= {threshold:.4g}, margin {margin:.1%}); {test} p = "
        f"{paired.p_value:.3g} over {paired.n_pairs} series x windows ({needs}); {naive_text}; "
        f"{window}"
    )
    if not (challenger_score < champion_score and challenger_score <= threshold):
        return verdict(
            False, f"challenger not better than champion by the margin: {comparison}", paired
        )
    if testable and not paired.p_value < alpha:
        return verdict(False, f"improvement not significant (could be noise): {comparison}", paired)
    if not beats_naive:
        return verdict(False, f"challenger does not beat seasonal naive: {comparison}", paired)
    better = "significantly better" if testable else "better"
    return verdict(True, f"challenger {better} than champion: {comparison}", paired)


def promote_with_settings(
    settings: PipelineSettings, frame: pd.DataFrame, version: str | None = None
) -> PromotionDecision:
    """``promote`` with the metric, margin, test and thresholds ``settings`` configure."""
    return promote(
        frame,
        model_name=settings.model_name,
        version=version,
        metric=settings.promotion_metric,
        margin=settings.promotion_margin,
        alpha=settings.promotion_alpha,
        test=settings.promotion_test,
        n_windows=settings.backtest_windows,
        require_beats_baseline=settings.require_beats_baseline,
        tracking_uri=settings.resolved_tracking_uri,
    )


def promote(
    frame: pd.DataFrame,
    *,
    model_name: str,
    version: str | None = None,
    metric: str = "mase",
    margin: float = 0.0,
    alpha: float = 0.05,
    test: PairedTestName = "wilcoxon",
    n_windows: int = 3,
    require_beats_baseline: bool = True,
    tracking_uri: str | None = None,
    device: str | None = "cpu",
) -> PromotionDecision:
    """Compare ``@challenger`` (or ``version``: retrain names the version it registered,
    which another run may have replaced as challenger meanwhile) with ``@champion`` on
    ``frame``'s backtest windows and decide.

    Raises:
        NoChallengerError: no version carries the ``challenger`` alias (or is ``version``).
        ForecasterInputError: ``frame`` cannot be scored by the challenger (too short, ...).
    """
    named = f"{model_name}/{version}" if version is not None else f"{model_name}@{CHALLENGER}"
    try:
        challenger = resolve_model(f"models:/{named}", tracking_uri=tracking_uri)
    except ModelNotFoundError as exc:
        raise NoChallengerError(
            f"nothing to promote: registered model {named} not found; "
            "run `forecaster train` or `forecaster retrain` first",
            model_uri=exc.model_uri,
        ) from None
    try:
        champion = resolve_model(f"models:/{model_name}@{CHAMPION}", tracking_uri=tracking_uri)
    except ModelNotFoundError:
        champion = None

    def record(
        verdict: Verdict | None, promoted: bool = False, reason: str = ""
    ) -> PromotionDecision:
        if verdict is not None:
            promoted, reason = verdict.promoted, verdict.reason
        scores = (
            {}
            if verdict is None
            else {
                "challenger_score": verdict.challenger_score,
                "champion_score": verdict.champion_score,
                "baseline_score": verdict.baseline_score,
                "test": verdict.test,
            }
        )
        return _record(
            PromotionDecision(promoted, reason, metric, challenger, champion, **scores),
            tracking_uri,
        )

    if champion is not None and champion.version == challenger.version:
        # A retried step: the record of the promotion that made it champion stays as it is.
        reason = f"version {challenger.version} is already {CHAMPION}"
        logger.info("did not promote version %s: %s", challenger.version, reason)
        return PromotionDecision(False, reason, metric, challenger, champion)

    challenger_model = load_version(challenger, tracking_uri=tracking_uri, device=device)
    horizon = challenger_model.max_horizon
    champion_model = None
    champion_problem = None
    if champion is not None:
        try:
            champion_model = load_version(champion, tracking_uri=tracking_uri, device=device)
            horizon = min(horizon, champion_model.max_horizon)
        except (ModelNotFoundError, OSError) as exc:  # deleted, unreadable or unloadable
            champion_problem = f"champion version {champion.version} cannot be loaded: {exc}"

    challenger_scores = window_scores(challenger_model, frame, horizon, metric, n_windows)
    naive = SeasonalNaive(
        season_length=challenger_model.season_length,
        horizon=horizon,
        quantiles=challenger_model.quantiles,
    ).fit(frame)
    baseline_scores = window_scores(
        naive, frame, horizon, metric, n_windows, challenger_model.context_length
    )
    champion_scores = None
    if champion_model is not None:
        try:
            champion_scores = window_scores(champion_model, frame, horizon, metric, n_windows)
        except ForecasterInputError as exc:
            # e.g. the data's frequency changed, or its context is longer than the data holds.
            champion_problem = (
                f"champion version {champion.version} cannot forecast this data: {exc}"
            )
    window = f"{metric} over the last {n_windows} x {horizon} points of each series"
    verdict = decide(
        challenger_scores,
        champion_scores,
        baseline_scores,
        metric=metric,
        margin=margin,
        alpha=alpha,
        test=test,
        require_beats_baseline=require_beats_baseline,
        window=window,
    )
    if champion_problem is not None:  # judged against seasonal naive alone, as with no champion
        verdict = dataclasses.replace(verdict, reason=f"{champion_problem}; {verdict.reason}")
    return record(verdict)


def _record(decision: PromotionDecision, tracking_uri: str | None) -> PromotionDecision:
    """Tag the challenger with the scores, (if promoted) move `champion`, then tag the
    decision: a failure before the alias leaves the champion as it was."""
    client = tracking.client(tracking_uri)
    name, version = decision.challenger.name, decision.challenger.version
    tags = {
        DECISION: "promoted" if decision.promoted else "rejected",
        REASON: decision.reason[:5000],
        "promotion.metric": decision.metric,
        "promotion.decided_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    for key in ("challenger_score", "champion_score", "baseline_score"):
        value = getattr(decision, key)
        if value is not None:
            tags[f"promotion.{key}"] = f"{value:.6g}"
    if decision.test is not None:
        tags["promotion.test"] = decision.test.name
        tags["promotion.test_statistic"] = f"{decision.test.statistic:.6g}"
        tags["promotion.p_value"] = f"{decision.test.p_value:.6g}"
        tags["promotion.test_pairs"] = str(decision.test.n_pairs)
    if decision.champion is not None:
        tags["promotion.compared_with"] = decision.champion.version
    if decision.promoted and decision.champion is not None:
        tags[PREVIOUS_CHAMPION] = decision.champion.version
    # The decision goes last, after the alias: a run stopped in between leaves a version
    # with its scores and no decision, never one that says "promoted" and is not champion.
    verdict = tags.pop(DECISION)
    with tracking.tracking_errors(tracking_uri):
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, value)
        if decision.promoted:
            client.set_registered_model_alias(name, CHAMPION, version)
        client.set_model_version_tag(name, version, DECISION, verdict)
    logger.info(
        "%s version %s: %s",
        "promoted" if decision.promoted else "did not promote",
        version,
        decision.reason,
    )
    return decision
