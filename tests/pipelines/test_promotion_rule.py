"""The promotion rule on paired scores: margin, paired test, seasonal naive."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pipelines.promote import decide, paired_test


def _scores(values) -> pd.Series:
    return pd.Series(values, index=[f"s{i}" for i in range(len(values))], dtype=float)


@pytest.fixture()
def champion() -> pd.Series:
    return _scores(np.random.default_rng(0).uniform(0.8, 1.2, 60))


def test_a_consistent_improvement_is_promoted_with_its_p_value(champion):
    verdict = decide(champion * 0.9, champion, champion * 2, metric="mase", margin=0.02)
    assert verdict.promoted
    assert verdict.test.p_value < 1e-6 and verdict.test.n_pairs == 60
    assert verdict.challenger_score == pytest.approx(0.9 * verdict.champion_score)


def test_noise_around_the_champion_is_not_promoted(champion):
    """Same quality, other seed: per-series differences symmetric around zero."""
    rng = np.random.default_rng(1)
    promoted = 0
    for _ in range(200):
        other = champion * np.exp(rng.normal(0, 0.05, len(champion)))
        promoted += decide(other, champion, champion * 2, metric="mase").promoted
    assert promoted / 200 <= 0.1  # the test's level is 0.05 one-sided


def test_a_better_mean_driven_by_one_series_is_not_significant(champion):
    challenger = champion.copy()
    challenger.iloc[:30] *= 1.01  # slightly worse on half the series
    challenger.iloc[30] *= 0.01  # far better on one
    verdict = decide(challenger, champion, champion * 2, metric="mae")
    assert verdict.challenger_score < verdict.champion_score
    assert not verdict.promoted and "not significant" in verdict.reason


def test_margin_and_baseline_still_apply(champion):
    small = decide(champion * 0.99, champion, champion * 2, metric="mae", margin=0.05)
    assert not small.promoted and "margin" in small.reason
    behind_naive = decide(champion * 0.5, champion, champion * 0.4, metric="mae")
    assert not behind_naive.promoted and "seasonal naive" in behind_naive.reason


@pytest.mark.parametrize("name", ["wilcoxon", "sign"])
def test_too_few_pairs_for_the_test_leave_the_decision_to_the_margin(name):
    """Three windows of one series give p >= 1/8 whatever the errors: a champion worse than
    seasonal naive could never be replaced. Five pairs can reach 1/32 and are tested."""
    champion = _scores([1.3, 1.2, 1.4])
    verdict = decide(champion * 0.7, champion, champion, metric="mase", test=name)
    assert verdict.promoted, verdict.reason
    assert "too few to reach 0.05: the margin decides" in verdict.reason
    assert "significantly" not in verdict.reason
    assert not decide(champion * 1.01, champion, champion * 2, metric="mase", test=name).promoted
    five = _scores([1.3, 1.2, 1.4, 1.1, 1.0])
    mixed = five * np.array([0.5, 0.5, 0.5, 0.5, 1.2])  # better on average, not every time
    verdict = decide(mixed, five, five * 2, metric="mase", test=name)
    assert not verdict.promoted and "not significant" in verdict.reason


def test_a_tie_is_not_promoted_with_the_test_off(champion):
    """With promotion_alpha = 1 an identical model was promoted as "significantly better" on
    every retrain."""
    tie = decide(champion, champion, champion * 2, metric="mase", alpha=1.0)
    assert not tie.promoted and "test off" in tie.reason
    better = decide(champion * 0.999, champion, champion * 2, metric="mase", alpha=1.0)
    assert better.promoted and "significantly" not in better.reason


def test_the_first_version_is_promoted_with_naive_in_the_reason(champion):
    verdict = decide(champion, None, champion * 0.5, metric="mae")
    assert verdict.promoted and "seasonal naive" in verdict.reason and verdict.test is None


@pytest.mark.parametrize("name", ["wilcoxon", "sign"])
def test_paired_test_pairs_by_series_id_and_ignores_missing(name):
    challenger = _scores([1.0, 2.0, 3.0, np.nan])
    champion = pd.Series([3.5, 1.5, 2.5, 4.5], index=["s2", "s1", "s0", "s3"])
    result = paired_test(challenger, champion, name)
    assert result.n_pairs == 3  # s3 has no challenger score
    # By id the differences are s0 -1.5, s1 +0.5, s2 -0.5 (by position: -2.5, +0.5, +0.5).
    by_id = np.array([-1.5, 0.5, -0.5])
    reference = (
        stats.wilcoxon(by_id, alternative="less")
        if name == "wilcoxon"
        else stats.binomtest(2, 3, 0.5, alternative="greater")
    )
    statistic = reference.statistic if name == "wilcoxon" else 2
    assert (result.statistic, result.p_value) == pytest.approx((statistic, reference.pvalue))
    ties = paired_test(challenger, challenger, name)
    assert ties.p_value == 1.0


def test_every_score_is_read_on_the_pairs_all_models_scored(champion):
    """A model leaves out a window whose context it cannot read; seasonal naive scored that
    hard window alone made the model look three times better than it was."""
    hard = pd.Series([50.0], index=["outage"])
    verdict = decide(champion, None, pd.concat([champion * 1.5, hard]), metric="mase")
    assert verdict.baseline_score == pytest.approx(1.5 * verdict.challenger_score)
    with_champion = decide(champion * 0.9, pd.concat([champion, hard]), champion, metric="mase")
    assert with_champion.champion_score == pytest.approx(champion.mean())


def test_a_challenger_without_a_finite_score_is_never_promoted(champion):
    """A first version whose backtest is all NaN must not become champion by default."""
    nan = champion * np.nan
    first = decide(nan, None, champion, metric="mase")
    assert not first.promoted and "mase is nan" in first.reason
    against = decide(nan, champion, champion * 2, metric="mase")
    assert not against.promoted and "mase is nan" in against.reason


@pytest.mark.parametrize("name", ["wilcoxon", "sign"])
def test_an_alpha_no_outcome_can_get_below_leaves_the_decision_to_the_margin(name):
    """3 pairs give p >= 1/8: at promotion_alpha = 0.125 no test could ever pass."""
    champion = _scores([1.3, 1.2, 1.4])
    verdict = decide(champion * 0.7, champion, champion * 2, metric="mase", alpha=0.125, test=name)
    assert verdict.promoted, verdict.reason
    assert "too few to reach 0.125" in verdict.reason


def test_the_sign_test_gives_ties_no_vote(champion):
    """Better on 6 series, identical on 54: 6 wins of 6 votes, p = 1/64."""
    challenger = champion.copy()
    challenger.iloc[:6] *= 0.9
    result = paired_test(challenger, champion, "sign")
    assert result.statistic == 6 and result.n_pairs == 60
    assert result.p_value == pytest.approx(1 / 64)
    verdict = decide(challenger, champion, champion * 2, metric="mase", test="sign")
    assert verdict.promoted, verdict.reason


def test_promote_with_settings_passes_every_promotion_setting(tmp_path, monkeypatch):
    from pipelines import promote as promote_module
    from tests.pipelines.pipeline_helpers import make_settings

    seen = {}
    monkeypatch.setattr(promote_module, "promote", lambda frame, **kwargs: seen.update(kwargs))
    settings = make_settings(
        tmp_path,
        promotion_metric="mae",
        promotion_margin=0.07,
        promotion_alpha=0.2,
        promotion_test="sign",
        backtest_windows=5,
        require_beats_baseline=False,
    )
    promote_module.promote_with_settings(settings, pd.DataFrame(), version="7")
    assert seen == {
        "model_name": settings.model_name,
        "version": "7",
        "metric": "mae",
        "margin": 0.07,
        "alpha": 0.2,
        "test": "sign",
        "n_windows": 5,
        "require_beats_baseline": False,
        "tracking_uri": settings.resolved_tracking_uri,
    }


def test_the_margin_is_inclusive_and_the_levels_strict():
    """Exactly at the margin is better enough; a p-value equal to alpha is not below it; an
    alpha of exactly 2^-n cannot be reached by n pairs, so the margin decides."""
    champion = _scores([1.0] * 8)
    at_margin = decide(champion * 0.5, champion, champion * 2, metric="mase", margin=0.5)
    assert at_margin.promoted, at_margin.reason
    assert at_margin.challenger_score == 0.5 and "<= 0.5," in at_margin.reason
    past_it = decide(
        champion * 0.5, champion, champion * 2, metric="mase", margin=np.nextafter(0.5, 1)
    )
    assert not past_it.promoted and "by the margin" in past_it.reason

    # Sign test, 5 wins of 6 votes: p = 7/64, and 2^-6 lies below any alpha near it.
    six = _scores([1.0] * 6)
    mixed = six * np.array([0.5, 0.5, 0.5, 0.5, 0.5, 1.1])
    p = paired_test(mixed, six, "sign").p_value
    assert p == pytest.approx(7 / 64)
    at_p = decide(mixed, six, six * 2, metric="mase", alpha=p, test="sign")
    assert not at_p.promoted and "not significant" in at_p.reason
    above_p = decide(mixed, six, six * 2, metric="mase", alpha=np.nextafter(p, 1), test="sign")
    assert above_p.promoted and "significantly better" in above_p.reason

    five = _scores([1.0] * 5)  # every pair won: p = 2^-5, the least 5 pairs can give
    at_bound = decide(five * 0.5, five, five * 2, metric="mase", alpha=2.0**-5, test="sign")
    assert at_bound.promoted and "the margin decides" in at_bound.reason
    above = decide(
        five * 0.5, five, five * 2, metric="mase", alpha=np.nextafter(2.0**-5, 1), test="sign"
    )
    assert above.promoted and "significantly better" in above.reason
