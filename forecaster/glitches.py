"""Glitches: single readings far from their neighbours, read as unobserved before forecasting.

The instance scaler's mean and standard deviation are not robust: one reading ten times too
high a series in the context takes M4 Hourly's holdout OWA from 0.451 to 1.472 (0.458 with
this rule). A Hampel rule finds such a step: it lies further than `threshold` robust
deviations (1.4826 times the median absolute deviation, over a centred window of
`GLITCH_WINDOW` steps) from a reference of what it should be. It is then masked, as a NaN
would be, so the mask that carries gaps makes it invisible. Two references are asked in turn:

- the level: the median of the centred window of `GLITCH_WINDOW` steps, a reading far from
  the level around it;
- then, with the level's glitches removed, the cycle: the median of the same step in the
  `SEASONS_AROUND` seasons before and after it (of the `SEASONS_AROUND` steps before and after
  it where the data has no season), a reading `seasonal_factor` times as far out from what
  the cycle makes of it. A drop to zero inside a strong daily cycle lies within the swing the
  cycle makes over a window, so only this reference finds it, as it finds a zero near the
  ends of a short trending series, where the cut window lags the trend. Asked second, it does
  not read a glitch the level found into the cycle, which would make the same step a season
  away look like one (docs/model-choices.md, Glitches).

Then, among the rest, a reading of exactly zero is a glitch where zero is far out of the
series' range: the other readings of its window all lie on the side of zero its level does,
at least `zero_ratio` of the level away from it and `ZERO_QUANTA` steps of the data's
resolution (the smallest gap between two of those readings). A meter or a feed that drops out
sends a zero, and a zero inside a strong cycle or at the end of a short trending series lies
within the spread the two references above measure; counts of a few units are never read so,
because their zeros are a few quanta from their other readings.

Only an isolated step is a glitch: its neighbours are observed, not outlying themselves (by
the same reference) and apart from it (it lies further from each than half its deviation), so
a level shift (two outlying steps in a row or more) is never masked, nor a day that differs
from the days around it as a whole. A step with one neighbour
only (the last step of a context, a series' first, a step beside a gap) has half the
evidence: the other side cannot tell a spike from the start of a shift, so it must lie
`EDGE_FACTOR` times as far out. A jump in the last reading alone is kept unless it is that
extreme; left unmasked, a reading ten times too high there ruins the forecast. Where the
median absolute deviation is 0 (a flat stretch, intermittent counts, a cycle repeated exactly)
nothing is masked: any move off it would otherwise be one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

# Steps in the centred window of the level and of the robust deviation (a day of hourly data,
# two years of monthly); measured on M4 Hourly against 49 (docs/model-choices.md).
GLITCH_WINDOW = 25
# Seasons before and after a step whose same step makes its seasonal reference.
SEASONS_AROUND = 3
# How much further out than `threshold` a step with one neighbour must lie (see above).
EDGE_FACTOR = 2.0
# Steps (rows times their width) whose glitches are found at once (see _blocks).
_STEPS_AT_ONCE = 1 << 18
# How many steps of the data's resolution the other readings of a zero's window must lie from
# zero for the zero to be a glitch (Poisson counts of mean 5 have none so; docs/model-choices.md).
ZERO_QUANTA = 10.0
# Windows below which the rolling median is left to `torch.nanmedian`: a few hundred small
# tensor operations cost more than it does on one context (`_median_by_network`).
_NETWORK_MIN_WINDOWS = 4096
# Windows the network reads at once (see _median_by_network).
_NETWORK_BLOCK_WINDOWS = 8192
# Median absolute deviation to standard deviation for normal data.
_MAD_TO_STD = 1.4826


def _rolling_nanmedian(values: torch.Tensor, window: int) -> torch.Tensor:
    """Median of the non-NaN values of a centred window at each step: (B, L) -> (B, L).

    NaN where the window holds none. The window is cut at the row's ends; where it holds an
    even count, the lower of the two middle values (as `torch.nanmedian`).
    """
    half = window // 2
    padded = F.pad(values, (half, half), value=float("nan"))  # (B, L + 2 * half)
    windows = padded.unfold(1, window, 1)  # (B, L, W)
    inner = values.shape[1] - 2 * half  # windows that lie wholly inside the row
    if window % 2 == 0 or inner < 1 or values.shape[0] * inner < _NETWORK_MIN_WINDOWS:
        return windows.nanmedian(dim=-1).values
    # The network gives what nanmedian does, to the bit (it only compares and moves values),
    # at less than half its time on the CPU, but reads a NaN as a value: the windows cut at
    # the ends and those holding a NaN are left to nanmedian.
    missing = values.isnan()
    filled = torch.where(missing, 0.0, values)  # any value: these windows are redone below
    medians = torch.empty_like(values)
    medians[:, half : half + inner] = _median_by_network(filled.unfold(1, window, 1))
    for ends in (slice(0, half), slice(half + inner, None)):
        medians[:, ends] = windows[:, ends].nanmedian(dim=-1).values
    gaps = F.pad(missing.cumsum(dim=1), (1, 0))  # (B, L + 1) NaNs before each step
    rows, steps = ((gaps[:, window:] - gaps[:, :-window]) > 0).nonzero(as_tuple=True)
    if len(rows):
        medians[rows, steps + half] = windows[rows, steps + half].nanmedian(dim=-1).values
    return medians


@functools.cache
def _median_network(size: int) -> tuple[tuple[int, int], ...]:
    """The compare-exchanges (low, high) of Batcher's odd-even merge sort of `size` values
    that its middle output depends on (113 of 140 for 25): applied in order, each leaving the
    smaller value at `low`, they leave the median of an odd `size` at `size // 2`."""
    n = 1 << (size - 1).bit_length()  # the network sorts a power of two
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    # Inputs past `size` read as +inf: they stay where they are, so their exchanges do nothing.
    pairs = [(low, high) for low, high in pairs if high < size]
    needed, kept = {size // 2}, []
    for low, high in reversed(pairs):
        if low in needed or high in needed:
            kept.append((low, high))
            needed |= {low, high}
    return tuple(reversed(kept))


def _median_by_network(windows: torch.Tensor) -> torch.Tensor:
    """(B, N, W) windows holding no NaN, W odd -> (B, N) medians."""
    network = _median_network(windows.shape[-1])
    medians = windows.new_empty(windows.shape[:-1])
    # A few rows at a time: the network's intermediate columns then stay in the CPU's cache.
    rows = max(1, _NETWORK_BLOCK_WINDOWS // windows.shape[1])
    for begin in range(0, windows.shape[0], rows):
        columns = list(windows[begin : begin + rows].unbind(dim=-1))  # W views (b, N)
        for low, high in network:
            smaller = torch.minimum(columns[low], columns[high])
            columns[high] = torch.maximum(columns[low], columns[high])
            columns[low] = smaller
        medians[begin : begin + rows] = columns[windows.shape[-1] // 2]
    return medians


def _seasonal_reference(values: torch.Tensor, season: int) -> torch.Tensor:
    """Median of the non-NaN values `season`, 2 * `season`, ... steps before and after each
    step, the step itself left out: (B, L) -> (B, L), NaN where there is none."""
    shifts = [k * season for k in range(1, SEASONS_AROUND + 1)]
    length = values.shape[1]
    nan = float("nan")
    around = [F.pad(values[:, s:], (0, s), value=nan) for s in shifts if s < length]  # x[t + s]
    around += [F.pad(values[:, :-s], (s, 0), value=nan) for s in shifts if s < length]  # x[t - s]
    if not around:
        return torch.full_like(values, nan)
    # nanquantile, not nanmedian: with an even count it averages the two middle values
    # instead of taking the lower, which would favour glitches that lie low.
    return torch.stack(around, dim=-1).nanquantile(0.5, dim=-1)  # (B, L)


def _isolated_outliers(
    x: torch.Tensor, observed: torch.Tensor, reference: torch.Tensor, threshold: float
) -> torch.Tensor:
    """Steps of `x` (NaN where unobserved) further than `threshold` robust deviations from
    `reference`, both of whose neighbours are observed, not so far out and apart from the step;
    with one neighbour only, `EDGE_FACTOR` times as far out: (B, L) bool.

    A neighbour is apart when the step lies further from it than half the step's deviation. A
    neighbour judged against its own reference can look ordinary beside the first step of a
    shift: a window cut at the row's end holds as many steps before the shift as after, so the
    median flips from the old level to the new between the two (an hourly +60 shift held over
    the last 12 steps had its first step masked)."""
    deviation = (x - reference).abs()  # NaN where unobserved or without a reference
    spread = _MAD_TO_STD * _rolling_nanmedian(deviation, GLITCH_WINDOW)
    outlying = (deviation > threshold * spread) & (spread > 0)  # False wherever NaN
    far_out = (deviation > EDGE_FACTOR * threshold * spread) & (spread > 0)
    # Each step's neighbours, the row's ends continued by unobserved steps.
    ordinary = F.pad(observed & ~outlying, (1, 1))  # (B, L + 2)
    missing = F.pad(~observed, (1, 1), value=True)  # (B, L + 2)
    beside = F.pad(x, (1, 1), value=float("nan"))  # (B, L + 2)
    apart = [(x - beside[:, k : k + x.shape[1]]).abs() > deviation / 2 for k in (0, 2)]
    left_ok, right_ok = ordinary[:, :-2] & apart[0], ordinary[:, 2:] & apart[1]
    one_sided = (left_ok & missing[:, 2:]) | (missing[:, :-2] & right_ok)
    return (outlying & left_ok & right_ok) | (far_out & one_sided)


def _isolated_zeros(values: torch.Tensor, observed: torch.Tensor, ratio: float) -> torch.Tensor:
    """Observed exact zeros of `values` (B, L) far out of their window's range (see the module's
    docstring), both of whose neighbours are observed; with one neighbour only, the other
    readings must lie twice as far (`EDGE_FACTOR`) from zero: (B, L) bool."""
    found = torch.zeros_like(observed)
    # Rows are read alone: only those holding a zero are read at all (most hold none).
    holding = (observed & (values == 0)).any(dim=1)
    if holding.any():
        found[holding] = _isolated_zeros_of(values[holding], observed[holding], ratio)
    return found


def _isolated_zeros_of(values: torch.Tensor, observed: torch.Tensor, ratio: float) -> torch.Tensor:
    """`_isolated_zeros` of rows (B, L) that hold a zero."""
    nan, inf = float("nan"), float("inf")
    level = _rolling_nanmedian(torch.where(observed, values, nan), GLITCH_WINDOW)  # (B, L)
    sign = torch.sign(level)  # 0 (never a glitch) where the level is 0 or unknown
    half = GLITCH_WINDOW // 2
    side = torch.where(observed, values * sign, inf)  # readings on the level's side: > 0
    window = F.pad(side, (half, half), value=inf).unfold(1, GLITCH_WINDOW, 1).clone()  # (B, L, W)
    window[:, :, half] = inf  # the step itself left out
    nearest = window.amin(dim=-1)  # the other readings' closest approach to zero; inf: none
    zero = observed & (values == 0) & (sign != 0) & torch.isfinite(nearest)
    far = zero & (nearest > ratio * level.abs())
    rows, steps = far.nonzero(as_tuple=True)
    if len(rows):
        # The data's resolution at each candidate: the smallest gap between its window's
        # other readings (none when they are all equal).
        gaps = window[rows, steps].sort(dim=-1).values.diff(dim=-1)  # (n, W - 1)
        gaps = torch.where(torch.isfinite(gaps) & (gaps > 0), gaps, inf).amin(dim=-1)
        quantum = torch.where(torch.isfinite(gaps), gaps, 0.0)
        far[rows, steps] = nearest[rows, steps] >= ZERO_QUANTA * quantum
    farther = far & (nearest > min(1.0, EDGE_FACTOR * ratio) * level.abs())
    beside = F.pad(observed, (1, 1))  # (B, L + 2): each step's neighbours, none beyond the ends
    left, right = beside[:, :-2], beside[:, 2:]
    return (far & left & right) | (farther & (left ^ right))


def glitch_mask(
    values: torch.Tensor,
    observed: torch.Tensor,
    threshold: float,
    season: int = 1,
    seasonal_factor: float | None = None,
    zero_ratio: float | None = None,
) -> torch.Tensor:
    """The isolated glitches of each row: (B, L) values and observed mask -> (B, L) bool.

    A step is a glitch when it is observed and an isolated outlier (`_isolated_outliers`)
    against the median of its window, or, among the steps that leaves, `seasonal_factor` times
    `threshold` against the same step of the seasons around it (`season` steps a cycle; 1
    where the data has none; None: the level alone), or, among the rest, a zero far out of its
    window's range (`_isolated_zeros`; None: no such test). Masked values may be anything, NaN
    included.
    """
    nan = torch.full_like(values, float("nan"))
    x = torch.where(observed, values, nan)
    found = _isolated_outliers(x, observed, _rolling_nanmedian(x, GLITCH_WINDOW), threshold)
    if seasonal_factor is not None:
        kept = observed & ~found
        x = torch.where(kept, values, nan)
        reference = _seasonal_reference(x, season)
        found = found | _isolated_outliers(x, kept, reference, seasonal_factor * threshold)
    if zero_ratio is not None:
        found = found | _isolated_zeros(values, observed & ~found, zero_ratio)
    return found


def _blocks(widths: np.ndarray) -> Iterator[np.ndarray]:
    """Indices of rows of similar width (R,) -> blocks of them, narrowest first, each of one
    row or of at most `_STEPS_AT_ONCE` steps (its rows times its widest): the windows' medians
    then hold 25 times as many float64 values, 50 MB."""
    order = np.argsort(widths, kind="stable")
    begin = 0
    while begin < len(order):
        end = begin + 1
        while end < len(order) and (end - begin + 1) * widths[order[end]] <= _STEPS_AT_ONCE:
            end += 1
        yield order[begin:end]
        begin = end


def mask_glitches(
    values: torch.Tensor,
    observed: torch.Tensor,
    threshold: float | None,
    season: int = 1,
    seasonal_factor: float | None = None,
    zero_ratio: float | None = None,
) -> torch.Tensor:
    """`observed` (B, L) with the glitches of `values` (B, L) masked (`glitch_mask`); as is
    when `threshold` is None.

    Each row is read from its first observed step on, beside rows of similar width: the rule
    reads what lies before a row's start as unobserved, which its left padding is, so the
    padding need not be read at all (38 % of the contexts of a catalogue of monthly series,
    most of them shorter than the context: README, Many series).
    """
    if threshold is None or values.shape[1] < 3:
        return observed
    length = values.shape[1]
    first = observed.to(torch.int8).argmax(dim=1)  # (B,) first observed step; 0 if none
    widths = torch.where(observed.any(dim=1), length - first, 0).cpu().numpy()  # (B,)
    glitches = torch.zeros_like(observed)
    for block in _blocks(widths):
        width = int(widths[block[-1]])
        if width == 0:
            continue
        rows, steps = torch.from_numpy(block).to(observed.device), slice(length - width, None)
        glitches[rows, steps] = glitch_mask(
            values[rows, steps],
            observed[rows, steps],
            threshold,
            season,
            seasonal_factor,
            zero_ratio,
        )
    return observed & ~glitches


def series_glitches(
    values: np.ndarray,
    offsets: np.ndarray,
    threshold: float | None,
    season: int = 1,
    seasonal_factor: float | None = None,
    zero_ratio: float | None = None,
) -> np.ndarray:
    """The glitches (`glitch_mask`) of whole series laid end to end: (T,) values, NaN where
    unobserved, with series `k` at `offsets[k]:offsets[k + 1]` -> (T,) bool; none when
    `threshold` is None.

    Each series is read alone, as a row of its own: the rule's windows stop at its ends.
    """
    found = np.zeros(len(values), dtype=bool)
    if threshold is None:
        return found
    lengths = np.diff(offsets)
    for block in _blocks(lengths):
        # Series of similar length share a block, padded on the right to the longest: padding
        # is unobserved, which is what the rule reads beyond a row's ends anyway.
        width = int(lengths[block].max())
        if width < 3:
            continue
        steps = offsets[block][:, None] + np.arange(width)  # (b, W) positions in `values`
        inside = np.arange(width) < lengths[block][:, None]  # (b, W)
        rows = torch.from_numpy(np.where(inside, values[np.where(inside, steps, 0)], np.nan))
        observed = ~rows.isnan()
        glitches = glitch_mask(rows, observed, threshold, season, seasonal_factor, zero_ratio)
        glitches = glitches.numpy()
        found[steps[glitches]] = True  # padding is never a glitch: it is unobserved
    return found


__all__ = [
    "GLITCH_WINDOW",
    "SEASONS_AROUND",
    "ZERO_QUANTA",
    "glitch_mask",
    "mask_glitches",
    "series_glitches",
]
