"""The patch Transformer encoder-decoder.

    past_values, past_observed_mask --InstanceScaler--> x (B, L), 0 where unobserved
    x --fill gaps (seasonal), impute left padding--> --linear start--> draft (B, H)
    x, mask --left-pad to N * P, patch--> (B, N, 2P) --embed (+covariates, +position)--> Encoder
    draft --patch--> (B, M, P) --embed (+query, +covariates, +position)--> Decoder(causal self-attn,
        cross-attn to the encoder) --point head--> correction (B, H)
                                   --naive head--> weights w (B, M, K) of the K naive
                                                   forecasts, >= 0, summing to <= 1
    mean = draft + sum_k w_k * (naive_k - draft) + correction

Design, measured on validation windows (README, design section):
- a token is one seasonal cycle of P steps (24 for hourly data), tokens do not overlap and the
  last context token ends at the forecast origin, so token n and horizon token m line up with
  the cycle and attention compares like with like (a day with a day);
- channel independence: every series is its own batch row and shares all weights;
- the decoder reads a draft: the linear start's forecast of its horizon patch. Its causal
  self-attention sees the drafts of earlier horizon patches, its cross-attention the context
  patches, and it outputs a correction of its draft. The linear start is ridge-fitted before
  training and the correction head starts at zero, so training begins at the best linear
  forecast (DLinear's) and keeps it unless validation says otherwise;
- the linear start is one map for every series; the naive head lets each horizon token blend
  its draft with the simple benchmark forecasts of its own context (the mean, the last value,
  the last season, the last week of sub-daily data, the drift: `naive_forecast_maps`; the
  drift read from the first observation where the history is shorter than its span:
  `observed_drift`), so the decoder picks per series what one shared map cannot (a random
  walk's last value, a cycle's last season, an hourly series' week, a short history's
  trend). The blend is convex, so it never extrapolates beyond them (unbounded weights did
  on M3 Other's declining series). Its weights are gates that start at zero, on the draft,
  and open at the learning rate's pace (a softmax starting on the draft barely left it
  within ETTh1's few epochs);
- one normalisation, the mask-aware InstanceScaler: padding and missing steps are invisible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from forecaster.config import HISTORY_EDGES, N_HISTORY_BANDS, ModelConfig
from forecaster.layers import Decoder, Dropout, Encoder, sinusoidal_positional_encoding
from forecaster.outputs import ModelOutput
from forecaster.scaling import InstanceScaler, InstanceStats

# The drift forecast's slope is read over this many horizons: long enough to average out noise,
# short enough to follow a trend that changes (1, 2 and 8 were tried: docs/model-choices.md).
DRIFT_HORIZONS = 4
# With naive_blend="softmax", the naive head's initial logit of each naive forecast against the
# draft's 0: the blend starts within 0.05 % of the draft per naive forecast (e ** -8).
NAIVE_START_LOGIT = -8.0


@dataclass
class ModelAttention:
    """Per-layer attention weights of one forward pass (B batch, heads, N, M tokens)."""

    encoder: list[torch.Tensor]  # (B, heads, N, N)
    decoder_self: list[torch.Tensor]  # (B, heads, M, M)
    cross: list[torch.Tensor]  # (B, heads, M, N)


@dataclass
class NormalizedOutput:
    """What the forward pass returns: forecasts in the scaler's units (what the loss reads)."""

    mean: torch.Tensor  # (B, H)
    quantiles: torch.Tensor | None  # (B, H, Q)
    draft: torch.Tensor  # (B, H) the linear start's forecast (zeros without one)
    stats: InstanceStats  # each row's location and scale, (B, 1) each
    # (B, H) the last value with drift that `drift_weight` blends the point forecast towards;
    # None in training mode, where no blend applies.
    drift: torch.Tensor | None = None

    def denormalize(self) -> ModelOutput:
        """The forecasts in the input's units and dtype."""
        quantiles = None
        if self.quantiles is not None:
            quantiles = InstanceScaler.denormalize(self.quantiles, self.stats)
        return ModelOutput(InstanceScaler.denormalize(self.mean, self.stats), quantiles)


def fill_gaps(x: torch.Tensor, observed: torch.Tensor, season: int = 1) -> torch.Tensor:
    """(B, L) -> (B, L): what the linear start reads at unobserved steps.

    A step inside a gap takes the latest observed value at the same phase of the season (the
    value one cycle earlier, or two...), else the latest observed value before it (the same
    rule with season 1); the left padding before a row's first observation stays as it is (0,
    the row's mean: a lag before the series began has no neighbour to copy).
    On M4 Hourly holdout windows the seasonal guess beat the last value and the mean for
    scattered missing points and for day-long outages alike (README, design).
    """
    batch, length = x.shape
    pad = (-length) % season
    # (B, L) -> (B, C, S): one row per cycle, aligned so the last cycle ends at step L - 1
    cycles = F.pad(x, (pad, 0)).reshape(batch, -1, season)
    seen = F.pad(observed, (pad, 0)).reshape(batch, -1, season)
    index = torch.arange(cycles.shape[1], device=x.device)[None, :, None].expand_as(cycles)
    same_phase = torch.where(seen, index, torch.full_like(index, -1)).cummax(dim=1).values
    fallback = fill_gaps(x, observed) if season > 1 else x
    fallback = F.pad(fallback, (pad, 0)).reshape(batch, -1, season)
    filled = torch.where(same_phase >= 0, cycles.gather(1, same_phase.clamp(min=0)), fallback)
    return filled.reshape(batch, -1)[:, pad:]  # (B, C * S) -> (B, L)


def impute_left_padding(
    x: torch.Tensor,
    observed: torch.Tensor,
    factor: torch.Tensor,
    selected: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, L) gap-filled context -> (B, L) with the steps before each row's first observation
    replaced by their linear regression on the steps after it.

    `factor` (L + 1, L + 1) is the lower Cholesky factor C of the ridge Gram matrix G of the
    linear start's design, ordered intercept first, then the lags from the newest to the
    oldest. In that order a row's observed steps are a leading block, and C's leading block is
    their own factor, so e = C^-1 d read up to the block depends on the observed steps alone
    and C (e cut to the block) is their regression, G_mo G_oo^-1 d_o, on the missing ones. A
    map w solving the normal equations G w = b then forecasts such a row as the ridge fit on
    its observed lags alone does (G_oo w_o + G_om w_m = b_o): a series shorter than the
    context gets the draft of a linear start fitted for its length, where reading the padding
    as the mean moved the draft (M4 Hourly, one point short: docs/model-choices.md). Rows
    without padding, without any observation, or outside `selected` (B,) bool are returned as
    they are.
    """
    batch, length = x.shape
    first = observed.to(torch.int8).argmax(dim=1)  # (B,) index of the first observed step
    padded = (first > 0) & observed.any(dim=1)
    if selected is not None:
        padded = padded & selected
    # Every row is solved once one is padded: no data-dependent shapes, which torch.compile
    # would break its graph at. The early exit keeps complete batches free in eager mode.
    if not torch.compiler.is_compiling() and not padded.any():
        return x
    design = torch.cat([torch.ones_like(x[:, :1]), x.flip(-1)], dim=1)  # (B, 1 + L)
    # e^T = d^T C^-T, one row per window
    innovations = torch.linalg.solve_triangular(factor.T, design, upper=True, left=False)
    kept = torch.arange(length + 1, device=x.device) <= (length - first)[:, None]
    regressed = (innovations * kept) @ factor.T  # (B, 1 + L)
    imputed = regressed[:, 1:].flip(-1)  # (B, L), oldest first again
    before = torch.arange(length, device=x.device) < first[:, None]  # (B, L)
    return torch.where(padded[:, None] & before, imputed, x)


def naive_forecast_maps(
    context_length: int, prediction_length: int, season_length: int, long_season_length: int = 1
) -> dict[str, torch.Tensor]:
    """The simple benchmark forecasts (Hyndman and Athanasopoulos, FPP3 5.2) as maps (L + 1, H)
    from the gap-filled normalised context, intercept last: what the ridge shrinks the linear
    start towards, and what the naive head blends the draft with. The context's mean
    (zero in normalised units), its last value, its last season when the data has one, its last
    long season (a week of sub-daily data, `long_season_length`) when the context holds one,
    and its last value with drift, the mean step over the last DRIFT_HORIZONS horizons (whole
    seasons, so that a season's swing is not read as a trend) when the context holds them.

    A strong ridge towards the mean pulls a trending series back to its past level; towards the
    last value it forecasts what the naive forecast does (M3 Yearly holdout, linear start
    alone: OWA 1.42 against 0.92), and with drift it follows the trend (0.911; M1 Yearly 0.778
    against 0.850 without it; docs/model-choices.md)."""
    steps = torch.arange(prediction_length)
    maps = {"mean": torch.zeros(context_length + 1, prediction_length, dtype=torch.float64)}

    def last_cycle(cycle: int) -> torch.Tensor:
        """Each horizon step forecast by the same step of the context's last `cycle` steps."""
        repeated = maps["mean"].clone()
        repeated[context_length - cycle + steps % cycle, steps] = 1.0
        return repeated

    last = last_cycle(1)
    maps["last value"] = last
    if 1 < season_length <= context_length:
        maps["last season"] = last_cycle(season_length)
    if season_length < long_season_length <= context_length:
        maps["last long season"] = last_cycle(long_season_length)
    span = drift_span(context_length, prediction_length, season_length)
    if span is not None:
        drift = last.clone()  # x[L-1] + (h + 1) * (x[L-1] - x[L-1-span]) / span
        slope = (steps + 1).double() / span  # (H,) steps ahead per step of the span
        drift[context_length - 1] += slope
        drift[context_length - 1 - span] -= slope
        maps[f"drift over {span} steps"] = drift
    return maps


def drift_span(context_length: int, prediction_length: int, season_length: int) -> int | None:
    """Steps the drift forecast reads its slope over: DRIFT_HORIZONS horizons in whole seasons,
    or None when the context does not hold them."""
    span = -(-DRIFT_HORIZONS * prediction_length // season_length) * season_length
    return span if span < context_length else None


def steps_seen(past_observed_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool -> (B,) int64: the steps from each row's first observation to the end of
    its context, that step included; 0 for a row with no observation."""
    length = past_observed_mask.shape[1]
    first = past_observed_mask.int().argmax(dim=1)  # (B,) index of the first observed step
    return torch.where(past_observed_mask.any(dim=1), length - first, 0)


def history_band(past_observed_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool -> (B,) int64: the band of HISTORY_EDGES of each row's history, 0 when it
    has observed at most L/32 steps since its first observation (or none), N_HISTORY_BANDS - 1
    when more than L/2."""
    length = past_observed_mask.shape[1]
    seen = steps_seen(past_observed_mask)
    # Compared with Python numbers: no tensor built on the device per forward pass.
    return sum((seen > edge * length).long() for edge in HISTORY_EDGES)


def observed_drift(
    filled: torch.Tensor, past_observed_mask: torch.Tensor, span: int, horizon: int
) -> torch.Tensor:
    """(B, L) gap-filled context -> (B, H) its last value with drift, the slope read over
    `span` steps or, where the row has observed fewer, from its first observation: the naive
    head's drift forecast. Read over the span, a short history's slope runs from the left
    padding (the row's mean) and comes out a fraction of the trend (M3 Yearly, a median of 13
    points and a span of 24: docs/model-choices.md). One observed step gives the last value."""
    length = filled.shape[1]
    back = (steps_seen(past_observed_mask) - 1).clamp(min=0, max=span)  # (B,)
    start = filled.gather(1, (length - 1 - back).unsqueeze(1))  # (B, 1)
    last = filled[:, -1:]  # (B, 1)
    slope = (last - start) / back.clamp(min=1).unsqueeze(1).to(filled.dtype)  # (B, 1)
    ahead = torch.arange(1, horizon + 1, device=filled.device, dtype=filled.dtype)  # (H,)
    return last + slope * ahead  # (B, H)


class PatchTransformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        p, d = c.patch, c.d_model
        self.scaler = InstanceScaler(
            (c.season_length or 1) if c.short_history_band_unit == "level" else 1
        )
        # A patch is P values and their P observed flags: the model knows what is padding.
        self.patch_embedding = nn.Linear(2 * p, d)
        n_cov = c.n_covariates
        self.covariate_embedding = nn.Linear(p * n_cov, d) if n_cov else None
        # One time axis: context tokens at positions 0..N-1, horizon tokens right after them.
        positions = sinusoidal_positional_encoding(c.n_patches + c.n_horizon_tokens, d)
        self.register_buffer("positional_encoding", positions, persistent=False)
        self.horizon_queries = nn.Parameter(torch.randn(c.n_horizon_tokens, d) * 0.02)
        self.draft_embedding = nn.Linear(p, d)
        self.embedding_dropout = Dropout(c.dropout)
        self.encoder = Encoder(
            c.n_encoder_layers, d, c.n_heads, c.d_ff, c.dropout, c.attention_dropout
        )
        self.decoder = Decoder(
            c.n_decoder_layers,
            d,
            c.n_heads,
            c.d_ff,
            c.dropout,
            c.attention_dropout,
            c.horizon_dropout,
        )
        self.point_head = nn.Linear(d, p)
        nn.init.zeros_(self.point_head.weight)
        nn.init.zeros_(self.point_head.bias)
        self.linear_start = (
            nn.Linear(c.context_length, c.prediction_length) if c.linear_start else None
        )
        # The Cholesky factor of the linear start's ridge Gram matrix, lags ordered intercept
        # first then newest to oldest (see impute_left_padding); installed by train_model once
        # training ends, and saved with the weights. The identity (training's) reads the left
        # padding as 0, the row's mean.
        self.register_buffer("padding_factor", torch.eye(c.context_length + 1))
        # Per band of history (see history_band), whether a forecast imputes its left padding
        # with padding_factor or reads it as the mean; chosen on the validation windows by
        # train_model (see forecaster.training.choose_padding_imputation), saved with the weights.
        self.register_buffer("padding_imputed", torch.zeros(N_HISTORY_BANDS, dtype=torch.bool))
        self.naive_head = None
        # With `observed_drift`, the naive head's drift forecast is read from each row's
        # observed history (observed_drift), not from its map: its index among the maps, span.
        self.drift_slot: tuple[int, int] | None = None
        if self.linear_start is not None and c.naive_head:
            season = c.season_length or 1
            maps = naive_forecast_maps(
                c.context_length, c.prediction_length, season, c.long_season_length or 1
            )
            span = drift_span(c.context_length, c.prediction_length, season)
            if c.observed_drift and span is not None:
                self.drift_slot = (list(maps).index(f"drift over {span} steps"), span)
            # (K, L + 1, H), rebuilt from the config: not saved with the weights.
            self.register_buffer(
                "naive_maps", torch.stack(list(maps.values())).float(), persistent=False
            )
            # Per horizon token, a gate per naive forecast, or with "softmax" the logits of
            # the draft (first) and of each naive forecast.
            softmax = c.naive_blend == "softmax"
            self.naive_head = nn.Linear(d, int(softmax) + len(maps))
            nn.init.zeros_(self.naive_head.weight)
            nn.init.zeros_(self.naive_head.bias)
            if softmax:
                with torch.no_grad():
                    self.naive_head.bias[1:] = NAIVE_START_LOGIT
        n_q = len(c.quantiles)
        self.quantile_head = nn.Linear(d, p * n_q) if n_q else None
        # At forecast time the point forecast moves this share of the way to the drift
        # forecast (the last value with the observed history's mean step over the drift span,
        # or the whole context where it holds no span): a combination with the simplest
        # trend method, chosen on the validation windows by train_model (see
        # forecaster.training.choose_drift_weight) and saved with the weights. Training
        # leaves it at 0 and never applies it: the network learns to forecast, not to undo
        # the blend.
        self.register_buffer("drift_weight", torch.zeros(()))
        self.blend_span = (
            drift_span(c.context_length, c.prediction_length, c.season_length or 1)
            or c.context_length - 1
        )
        # Widens (> 1) or narrows the quantiles' offsets from the point forecast, one factor
        # per band of history (see history_band). Training leaves it at 1 and then calibrates
        # it on the validation windows (see forecaster.training.calibrate_intervals); saved
        # with the weights.
        self.register_buffer("interval_scale", torch.ones(N_HISTORY_BANDS))

    # -- shapes ---------------------------------------------------------------------------
    def _context_patches(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) -> (B, N, P * C): left-pad with zeros to N * P steps, cut into N patches."""
        c = self.config
        pad = c.n_patches * c.patch - c.context_length
        x = F.pad(x, (0, 0, pad, 0))  # (B, N * P, C)
        return x.reshape(x.shape[0], c.n_patches, -1)  # (B, N, P * C)

    def _horizon_patches(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, C) -> (B, M, P * C): right-pad with the last step to M * P steps, cut."""
        c = self.config
        pad = c.n_horizon_tokens * c.patch - c.prediction_length
        if pad:
            x = torch.cat([x, x[:, -1:].expand(-1, pad, -1)], dim=1)  # (B, M * P, C)
        return x.reshape(x.shape[0], c.n_horizon_tokens, -1)  # (B, M, P * C)

    def linear_start_input(self, x: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        """(B, L) normalised context -> (B, L) with its gaps filled and, in the bands of
        history of `padding_imputed`, its left padding imputed by `padding_factor`, as the
        linear start reads it (training reads the padding as 0)."""
        # season_length is None only in a model saved before the field existed: last value.
        filled = fill_gaps(x, observed, self.config.season_length or 1)
        # Without imputation (in training, or in no band) skip the triangular solves. A
        # compiled model reads the bands' choice from the tensors instead: the check is a
        # host read that would break its graph.
        if self.training or not (torch.compiler.is_compiling() or self.imputes_padding()):
            return filled
        selected = self.padding_imputed[history_band(observed)]  # (B,)
        factor = self.padding_factor.to(filled.dtype)
        return impute_left_padding(filled, observed, factor, selected)

    def imputes_padding(self) -> bool:
        """Whether some band of history imputes its padding with a fitted factor (not the
        identity, which reads the padding as the mean)."""
        factor = self.padding_factor
        fitted = factor.count_nonzero() != len(factor) or (factor.diagonal() != 1).any()
        return bool(fitted and self.padding_imputed.any())

    def _naive_weights(self, outputs: torch.Tensor) -> torch.Tensor:
        """(B, M, K or 1 + K) naive head outputs -> (B, M, K) weights of the naive forecasts,
        each >= 0, summing to at most 1."""
        if self.config.naive_blend == "softmax":
            return outputs.softmax(dim=-1)[..., 1:]  # the draft's weight is the rest
        # clamp, unlike relu, passes the gradient at 0: the gates can open from their start.
        gates = outputs.clamp(min=0)
        return gates / gates.sum(dim=-1, keepdim=True).clamp(min=1)

    # -- forward --------------------------------------------------------------------------
    def forward(
        self,
        past_values: torch.Tensor,
        past_observed_mask: torch.Tensor,
        past_covariates: torch.Tensor | None = None,
        future_covariates: torch.Tensor | None = None,
        return_attention: bool = False,
    ) -> tuple[NormalizedOutput, ModelAttention | None]:
        """Forecast the next H steps of each row.

        Args:
            past_values: (B, L) history (float64 keeps the precision of large values); any
                value where the mask is False is ignored.
            past_observed_mask: (B, L) bool, True where the value was observed.
            past_covariates: (B, L, F) covariates over the history; F = config.n_covariates.
            future_covariates: (B, H, F) the same covariates over the horizon.
            return_attention: also return every layer's attention weights.

        Returns:
            NormalizedOutput with mean (B, H) and quantiles (B, H, Q) in the scaler's units
            (`.denormalize()` maps them back), and the attention or None.
        """
        c = self.config
        batch = past_values.shape[0]
        dtype = self.patch_embedding.weight.dtype
        x, stats = self.scaler(past_values, past_observed_mask, dtype)  # (B, L)
        observed = past_observed_mask.to(dtype)

        if self.linear_start is not None:
            filled = self.linear_start_input(x, past_observed_mask)  # (B, L)
            draft = self.linear_start(filled)  # (B, H)
        else:
            draft = x.new_zeros(batch, c.prediction_length)

        tokens = self.patch_embedding(
            self._context_patches(torch.stack([x, observed], dim=-1))
        )  # (B, N, D)
        key_mask = self._context_patches(past_observed_mask.unsqueeze(-1)).any(dim=-1)  # (B, N)
        queries = (
            self.draft_embedding(self._horizon_patches(draft.unsqueeze(-1))) + self.horizon_queries
        )  # (B, M, D)
        if self.covariate_embedding is not None:
            assert past_covariates is not None and future_covariates is not None, (
                "covariates required"
            )
            # Covariates of padded steps are zeroed, so padding stays invisible.
            past_covariates = past_covariates.to(dtype) * observed.unsqueeze(-1)
            tokens = tokens + self.covariate_embedding(self._context_patches(past_covariates))
            queries = queries + self.covariate_embedding(
                self._horizon_patches(future_covariates.to(dtype))
            )
        n = c.n_patches
        tokens = self.embedding_dropout(tokens + self.positional_encoding[:n])
        # No dropout on the queries: they carry the draft the decoder corrects.
        queries = queries + self.positional_encoding[n:]
        encoded = self.encoder(tokens, key_mask, return_weights=return_attention)
        decoded = self.decoder(queries, encoded.hidden, key_mask, return_weights=return_attention)

        h = c.prediction_length
        # (B, M, P) -> (B, M * P) -> (B, H)
        correction = self.point_head(decoded.hidden).reshape(batch, -1)[:, :h]
        if self.naive_head is None:
            mean = draft + correction
        else:  # the draft blended with the naive forecasts of the context
            maps = self.naive_maps.to(filled.dtype)
            naive = torch.einsum("bl,klh->bkh", filled, maps[:, :-1]) + maps[:, -1]  # (B, K, H)
            if self.drift_slot is not None:
                k, span = self.drift_slot
                drifted = observed_drift(filled, past_observed_mask, span, h).unsqueeze(1)
                naive = torch.cat([naive[:, :k], drifted, naive[:, k + 1 :]], dim=1)  # (B, K, H)
            weights = self._naive_weights(self.naive_head(decoded.hidden))  # (B, M, K)
            # (B, M, K) -> (B, M * P, K) -> (B, H, K): one weight per token
            weights = weights.repeat_interleave(c.patch, dim=1)[:, :h]
            # Weights >= 0 summing to at most 1, the draft taking the rest: a convex blend.
            blend = torch.einsum("bhk,bkh->bh", weights, naive - draft.unsqueeze(1))
            mean = correction + draft + blend
        drift = None
        if not self.training:
            if self.linear_start is None:
                filled = fill_gaps(x, past_observed_mask, c.season_length or 1)
            drift = observed_drift(filled, past_observed_mask, self.blend_span, h)  # (B, H)
            # Exactly `mean` at weight 0 (torch.lerp: start + weight * (end - start)).
            mean = torch.lerp(mean, drift.to(mean.dtype), self.drift_weight.to(mean.dtype))
        quantiles = None
        if self.quantile_head is not None:
            # The intervals are offsets around the point forecast, read from the decoder's
            # features without letting the pinball loss move the point forecast.
            offsets = self.quantile_head(decoded.hidden.detach())
            # (B, M, P * Q) -> (B, M * P, Q) -> (B, H, Q)
            offsets = offsets.reshape(batch, -1, len(c.quantiles))[:, :h]
            scale = self.interval_scale[history_band(past_observed_mask)]  # (B,)
            scale = scale.to(stats.band_unit.dtype) * stats.band_unit.squeeze(-1)
            offsets = offsets * scale.to(offsets.dtype)[:, None, None]
            # Sorting keeps quantiles from crossing without constraining what the head learns.
            quantiles = (mean.detach().unsqueeze(-1) + offsets).sort(dim=-1).values

        attention = None
        if return_attention:
            attention = ModelAttention(
                encoded.self_attention, decoded.self_attention, decoded.cross_attention
            )
        return NormalizedOutput(mean, quantiles, draft, stats, drift), attention


def pinball_loss(
    quantile_predictions: torch.Tensor,
    target: torch.Tensor,
    quantiles: torch.Tensor,
    weight: torch.Tensor,
) -> torch.Tensor:
    """Weighted mean quantile loss. predictions (B, H, Q), target and weight (B, H), levels (Q,)."""
    error = target.unsqueeze(-1) - quantile_predictions  # (B, H, Q)
    loss = torch.maximum(quantiles * error, (quantiles - 1) * error).mean(dim=-1)  # (B, H)
    return (loss * weight).sum() / weight.sum().clamp(min=1e-12)


def point_loss_per_step(error: torch.Tensor, loss: str) -> torch.Tensor:
    """(B, H) errors -> (B, H) point losses."""
    if loss == "mse":
        return error**2
    if loss == "huber":
        return F.huber_loss(error, torch.zeros_like(error), reduction="none", delta=1.0)
    return error.abs()


def point_loss(error: torch.Tensor, weight: torch.Tensor, loss: str) -> torch.Tensor:
    """Weighted mean of the point loss of `error` (B, H); weight (B, H) is 0 where unobserved."""
    per_step = point_loss_per_step(error, loss)
    return (per_step * weight).sum() / weight.sum().clamp(min=1e-12)
