"""Glitches: single readings far from their neighbours, read as unobserved before forecasting.

The instance scaler's mean and standard deviation are not robust: one reading ten times too
high a series in the context takes M4 Hourly's holdout OWA from 0.451 to 1.472 (0.465 with
this rule). A Hampel rule finds such a step: it lies further than `threshold` robust
deviations (1.4826 times the median absolute deviation) from the median of a centred window
of `GLITCH_WINDOW` steps. It is then masked, as a NaN would be, so the mask that carries gaps
makes it invisible.

Only an isolated step is a glitch: its neighbours are observed and not outlying themselves,
so a level shift (two outlying steps in a row or more) is never masked. A step with one
neighbour only (the last step of a context, a series' first, a step beside a gap) has half
the evidence: the other side cannot tell a spike from the start of a shift, so it must lie
`EDGE_FACTOR` times as far out. A jump in the last reading alone is kept unless it is that
extreme; left unmasked, a reading ten times too high there ruins the forecast. Where the
median absolute deviation is 0 (a flat stretch, intermittent counts) nothing is masked: any
move off a flat line would otherwise be one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Steps in the centred window (a day of hourly data, two years of monthly); measured on M4
# Hourly against 49 (docs/model-choices.md).
GLITCH_WINDOW = 25
# How much further out than `threshold` a step with one neighbour must lie (see above).
EDGE_FACTOR = 2.0
# Rows whose glitches are found at once (memory, see mask_glitches).
_ROWS_AT_ONCE = 1024
# Median absolute deviation to standard deviation for normal data.
_MAD_TO_STD = 1.4826


def _rolling_nanmedian(values: torch.Tensor, window: int) -> torch.Tensor:
    """Median of the non-NaN values of a centred window at each step: (B, L) -> (B, L).

    NaN where the window holds none. The window is cut at the row's ends.
    """
    half = window // 2
    padded = F.pad(values, (half, half), value=float("nan"))  # (B, L + 2 * half)
    windows = padded.unfold(1, window, 1)  # (B, L, W)
    return windows.nanmedian(dim=-1).values


def glitch_mask(values: torch.Tensor, observed: torch.Tensor, threshold: float) -> torch.Tensor:
    """The isolated glitches of each row: (B, L) values and observed mask -> (B, L) bool.

    A step is a glitch when it is observed, further than `threshold` robust deviations from
    its window's median, and both its neighbours are observed and within that distance of
    theirs; with one neighbour only, it must lie `EDGE_FACTOR` times as far out (module
    docstring). Masked values may be anything, NaN included.
    """
    x = torch.where(observed, values, torch.full_like(values, float("nan")))
    deviation = (x - _rolling_nanmedian(x, GLITCH_WINDOW)).abs()  # NaN where unobserved
    spread = _MAD_TO_STD * _rolling_nanmedian(deviation, GLITCH_WINDOW)
    outlying = (deviation > threshold * spread) & (spread > 0)  # False wherever NaN
    far_out = (deviation > EDGE_FACTOR * threshold * spread) & (spread > 0)
    # Each step's neighbours, the row's ends continued by unobserved steps.
    ordinary = F.pad(observed & ~outlying, (1, 1))  # (B, L + 2)
    missing = F.pad(~observed, (1, 1), value=True)  # (B, L + 2)
    left_ok, right_ok = ordinary[:, :-2], ordinary[:, 2:]
    one_sided = (left_ok & missing[:, 2:]) | (missing[:, :-2] & right_ok)
    return (outlying & left_ok & right_ok) | (far_out & one_sided)


def mask_glitches(
    values: torch.Tensor, observed: torch.Tensor, threshold: float | None
) -> torch.Tensor:
    """`observed` (B, L) with the glitches of `values` (B, L) masked; as is when None."""
    if threshold is None or values.shape[1] < 3:
        return observed
    # The windows' medians hold (rows, L, GLITCH_WINDOW) values: 10,000 series of 336 steps
    # would take 670 MB at once, a block of rows 70 MB.
    glitches = torch.cat(
        [
            glitch_mask(values[k : k + _ROWS_AT_ONCE], observed[k : k + _ROWS_AT_ONCE], threshold)
            for k in range(0, len(values), _ROWS_AT_ONCE)
        ]
        or [torch.zeros_like(observed)]
    )
    return observed & ~glitches


__all__ = ["GLITCH_WINDOW", "glitch_mask", "mask_glitches"]
