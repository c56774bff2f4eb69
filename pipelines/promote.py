"""Promote: move `champion` to the `challenger` when it is better on the most recent data.

Both are scored on the same holdout window: the last horizon of every series of the given
data, forecast from the points before it, beside seasonal naive. ``champion`` moves when
there is none, or when the challenger beats it by the configured relative margin on the
configured metric and also beats seasonal naive. The decision and its reason are recorded
as tags of the challenger version either way; a promoted version also records which version
it replaced, which is what ``rollback`` goes back to.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd

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

logger = logging.getLogger(__name__)

# Version tags
DECISION, REASON = "promotion.decision", "promotion.reason"
PREVIOUS_CHAMPION = "promotion.previous_champion"


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

    @property
    def champion_version(self) -> str | None:
        """The version `champion` points at after the decision."""
        if self.promoted:
            return self.challenger.version
        return self.champion.version if self.champion else None


def score(model, frame: pd.DataFrame, horizon: int, metric: str) -> float:
    """``metric`` of ``model`` on the last ``horizon`` points of every series of ``frame``."""
    return float(backtest(model, frame, n_windows=1, horizon=horizon).metrics[metric])


def promote(
    frame: pd.DataFrame,
    *,
    model_name: str,
    metric: str = "mase",
    margin: float = 0.0,
    require_beats_baseline: bool = True,
    tracking_uri: str | None = None,
    device: str | None = "cpu",
) -> PromotionDecision:
    """Compare ``@challenger`` with ``@champion`` on ``frame``'s holdout window and decide.

    Raises:
        NoChallengerError: no version carries the ``challenger`` alias.
        ForecasterInputError: ``frame`` cannot be scored by the challenger (too short, ...).
    """
    try:
        challenger = resolve_model(f"models:/{model_name}@{CHALLENGER}", tracking_uri=tracking_uri)
    except ModelNotFoundError as exc:
        raise NoChallengerError(
            f"nothing to promote: registered model {model_name}@{CHALLENGER} not found; "
            "run `forecaster train` or `forecaster retrain` first",
            model_uri=exc.model_uri,
        ) from None
    try:
        champion = resolve_model(f"models:/{model_name}@{CHAMPION}", tracking_uri=tracking_uri)
    except ModelNotFoundError:
        champion = None

    def decide(promoted: bool, reason: str, **scores: float | None) -> PromotionDecision:
        return _record(
            PromotionDecision(promoted, reason, metric, challenger, champion, **scores),
            tracking_uri,
        )

    if champion is not None and champion.version == challenger.version:
        return decide(False, f"version {challenger.version} is already {CHAMPION}")

    challenger_model = load_version(challenger, tracking_uri=tracking_uri, device=device)
    horizon = challenger_model.max_horizon
    champion_model = None
    champion_problem = None
    if champion is not None:
        try:
            champion_model = load_version(champion, tracking_uri=tracking_uri, device=device)
            horizon = min(horizon, champion_model.max_horizon)
        except (ModelNotFoundError, ValueError, OSError) as exc:
            champion_problem = f"champion version {champion.version} cannot be loaded: {exc}"

    challenger_score = score(challenger_model, frame, horizon, metric)
    naive = SeasonalNaive(horizon=horizon, quantiles=challenger_model.quantiles).fit(frame)
    baseline_score = score(naive, frame, horizon, metric)
    champion_score = None
    if champion_model is not None:
        try:
            champion_score = score(champion_model, frame, horizon, metric)
        except ForecasterInputError as exc:
            # e.g. the data's frequency changed, or its context is longer than the data holds.
            champion_problem = (
                f"champion version {champion.version} cannot forecast this data: {exc}"
            )
    scores = {
        "challenger_score": challenger_score,
        "champion_score": champion_score,
        "baseline_score": baseline_score,
    }
    window = f"{metric} over the last {horizon} points of each series"
    beats_naive = challenger_score < baseline_score or not require_beats_baseline
    naive_text = f"seasonal naive {baseline_score:.4g}"

    if not math.isfinite(challenger_score):
        return decide(False, f"challenger {metric} is {challenger_score} ({window})", **scores)
    if champion is None:
        return decide(
            True,
            f"no {CHAMPION} yet; challenger {window}: {challenger_score:.4g}, {naive_text}",
            **scores,
        )
    if champion_problem is not None:
        if not beats_naive:
            return decide(
                False,
                f"{champion_problem}; and the challenger ({challenger_score:.4g}) does not beat {naive_text} ({window})",
                **scores,
            )
        return decide(
            True,
            f"{champion_problem}; challenger {challenger_score:.4g} beats {naive_text} ({window})",
            **scores,
        )
    threshold = champion_score * (1.0 - margin)
    comparison = (
        f"challenger {challenger_score:.4g} vs champion v{champion.version} {champion_score:.4g}"
        f" (needs <= {threshold:.4g}, margin {margin:.1%}), {naive_text}; {window}"
    )
    if not challenger_score <= threshold:
        return decide(
            False, f"challenger not better than champion by the margin: {comparison}", **scores
        )
    if not beats_naive:
        return decide(False, f"challenger does not beat seasonal naive: {comparison}", **scores)
    return decide(
        True, f"challenger better than champion and seasonal naive: {comparison}", **scores
    )


def _record(decision: PromotionDecision, tracking_uri: str | None) -> PromotionDecision:
    """Tag the challenger with the decision, then (if promoted) move `champion`: the alias
    moves last, so a failure before it leaves the champion as it was."""
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
    if decision.champion is not None:
        tags["promotion.compared_with"] = decision.champion.version
    if decision.promoted and decision.champion is not None:
        tags[PREVIOUS_CHAMPION] = decision.champion.version
    with tracking.tracking_errors(tracking_uri):
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, value)
        if decision.promoted:
            client.set_registered_model_alias(name, CHAMPION, version)
    logger.info(
        "%s version %s: %s",
        "promoted" if decision.promoted else "did not promote",
        version,
        decision.reason,
    )
    return decision
