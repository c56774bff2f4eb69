"""The patch Transformer encoder-decoder.

    past_values --RevIN--> patches --embed(+covariates, +position)--> Encoder --> memory
    horizon queries (+future covariates) --> Decoder(causal self-attn, cross-attn) --> heads

Design, after PatchTST (Nie et al., 2023) and CATS (Lu et al., 2024):
- a token is a patch of P consecutive steps (stride S), so attention costs (L/S)^2, not L^2;
- channel independence: every series (or variable of a multivariate series) is its own batch
  row and shares all weights;
- RevIN normalises each window and restores the scale at the output;
- the decoder's inputs are learned per-position queries plus the known-future covariates of
  their horizon patch; all M = H / P_dec horizon tokens are decoded in one pass, with causal
  self-attention so horizon token t only reads tokens <= t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from forecaster.config import ModelConfig
from forecaster.layers import Decoder, Encoder, sinusoidal_positional_encoding
from forecaster.outputs import ModelOutput
from forecaster.scaling import InstanceStats, RevIN


@dataclass
class ModelAttention:
    """Per-layer attention weights of one forward pass (B batch, heads, N, M tokens)."""

    encoder: list[torch.Tensor]  # (B, heads, N, N)
    decoder_self: list[torch.Tensor]  # (B, heads, M, M)
    cross: list[torch.Tensor]  # (B, heads, M, N)


class PatchTransformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        c = config
        n_cov = c.n_covariates
        self.revin = RevIN() if c.revin else None
        self.patch_embedding = nn.Linear(c.patch_length, c.d_model)
        self.past_covariate_embedding = (
            nn.Linear(c.patch_length * n_cov, c.d_model) if n_cov else None
        )
        self.register_buffer(
            "positional_encoding",
            sinusoidal_positional_encoding(c.n_patches, c.d_model),
            persistent=False,
        )
        self.horizon_queries = nn.Parameter(torch.randn(c.n_horizon_tokens, c.d_model) * 0.02)
        self.future_covariate_embedding = (
            nn.Linear(c.decoder_patch_length * n_cov, c.d_model) if n_cov else None
        )
        self.embedding_dropout = nn.Dropout(c.dropout)
        self.encoder = Encoder(
            c.n_encoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.attention_dropout
        )
        self.decoder = Decoder(
            c.n_decoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.attention_dropout
        )
        self.point_head = nn.Linear(c.d_model, c.decoder_patch_length)
        self.linear_skip = (
            nn.Linear(c.context_length, c.prediction_length) if c.linear_skip else None
        )
        n_q = len(c.quantiles)
        self.quantile_head = nn.Linear(c.d_model, c.decoder_patch_length * n_q) if n_q else None

    @torch.no_grad()
    def fit_linear_skip(
        self,
        past_values: torch.Tensor,
        future_values: torch.Tensor,
        val_past_values: torch.Tensor | None = None,
        val_future_values: torch.Tensor | None = None,
        ridges: tuple[float, ...] = (1e-2, 1e-3, 1e-1, 1.0),
    ) -> float:
        """Start from the least-squares linear forecast: ridge-fit the skip, zero the heads.

        past_values (W, L) and future_values (W, H) are training windows in the series' scale;
        they are normalised as the forward pass normalises them. The ridge strength is chosen
        on the validation windows when given (the first of `ridges`, 1e-2, otherwise): long horizons
        want far more shrinkage than short ones. Returns the ridge chosen. The Transformer then
        begins at the best linear fit (DLinear's) and learns only what it misses.
        """
        assert self.linear_skip is not None, "config.linear_skip is off"
        design, target, _ = self._linear_problem(past_values, future_values)
        gram = design.T @ design
        moment = design.T @ target
        eye = torch.eye(design.shape[1], dtype=torch.float64)
        validation = None
        if val_past_values is not None:
            validation = self._linear_problem(val_past_values, val_future_values)
        best_error, ridge, solution = math.inf, ridges[0], None
        for candidate in ridges if validation is not None else ridges[:1]:
            fitted = torch.linalg.solve(gram + candidate * len(design) * eye, moment)  # (L + 1, H)
            error = 0.0
            if validation is not None:
                val_design, _, stats = validation
                # Scored in the series' scale, as early stopping scores the whole model.
                forecast = (val_design @ fitted) * stats.std.double() + stats.mean.double()
                error = float(torch.mean((forecast - val_future_values.double()) ** 2))
            if error < best_error or solution is None:
                best_error, ridge, solution = error, candidate, fitted
        self.linear_skip.weight.copy_(solution[:-1].T)
        self.linear_skip.bias.copy_(solution[-1])
        nn.init.zeros_(self.point_head.weight)
        nn.init.zeros_(self.point_head.bias)
        if self.quantile_head is not None:
            # Start the intervals at the linear fit's residual quantiles, not at zero width.
            residuals = (target - design @ solution).flatten()  # (W * H,)
            residuals = residuals[torch.randperm(len(residuals))[:1_000_000]]
            levels = torch.tensor(self.config.quantiles, dtype=torch.float64)
            offsets = torch.quantile(residuals, levels).float()  # (Q,)
            nn.init.zeros_(self.quantile_head.weight)
            # The head's outputs are laid out (P_dec, Q), quantile fastest.
            self.quantile_head.bias.copy_(offsets.repeat(self.config.decoder_patch_length))
        return ridge

    def _linear_problem(
        self, past_values: torch.Tensor, future_values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, InstanceStats | None]:
        """Design (W, L + 1) with a bias column and target (W, H), both as the skip sees them."""
        if self.revin is not None:
            normalized, stats = self.revin.normalize(past_values)
            target = (future_values - stats.mean) / stats.std * self.revin.weight + self.revin.bias
        else:
            normalized, target, stats = (
                past_values,
                future_values,
                InstanceStats(torch.zeros(len(past_values), 1), torch.ones(len(past_values), 1)),
            )
        design = torch.cat([normalized, torch.ones_like(normalized[:, :1])], dim=1)
        return design.double(), target.double(), stats

    def _patch(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) -> (B, N, P * C): end-pad by repeating the last step S times, then unfold."""
        c = self.config
        x = torch.cat([x, x[:, -1:].expand(-1, c.patch_stride, -1)], dim=1)  # (B, L + S, C)
        patches = x.unfold(1, c.patch_length, c.patch_stride)  # (B, N, C, P)
        return patches.flatten(2)  # (B, N, C * P)

    def _horizon_patches(self, future_covariates: torch.Tensor) -> torch.Tensor:
        """(B, H, F) -> (B, M, P_dec * F), padding the horizon to M * P_dec with its last step."""
        c = self.config
        pad = c.n_horizon_tokens * c.decoder_patch_length - future_covariates.shape[1]
        if pad:
            future_covariates = torch.cat(
                [future_covariates, future_covariates[:, -1:].expand(-1, pad, -1)], dim=1
            )
        batch = future_covariates.shape[0]
        # (B, M * P_dec, F) -> (B, M, P_dec * F)
        return future_covariates.reshape(batch, c.n_horizon_tokens, -1)

    def forward(
        self,
        past_values: torch.Tensor,
        past_covariates: torch.Tensor | None = None,
        future_covariates: torch.Tensor | None = None,
        future_queries: torch.Tensor | None = None,
        return_attention: bool = False,
    ) -> tuple[ModelOutput, ModelAttention | None]:
        """Forecast the next H steps of each row.

        Args:
            past_values: (B, L) history, in the series' (scaled) space.
            past_covariates: (B, L, F) covariates over the history; F = config.n_covariates.
            future_covariates: (B, H, F) the same covariates over the horizon.
            future_queries: (B, M, D) decoder inputs overriding the learned queries (used by the
                causality test to perturb one horizon token).
            return_attention: also return every layer's attention weights.

        Returns:
            ModelOutput with mean (B, H) and quantiles (B, H, Q), and the attention or None.
        """
        c = self.config
        batch = past_values.shape[0]
        stats = None
        if self.revin is not None:
            past_values, stats = self.revin.normalize(past_values)

        tokens = self.patch_embedding(self._patch(past_values.unsqueeze(-1)))  # (B, N, D)
        if self.past_covariate_embedding is not None:
            assert past_covariates is not None and future_covariates is not None, (
                "covariates required"
            )
            tokens = tokens + self.past_covariate_embedding(self._patch(past_covariates))
        tokens = self.embedding_dropout(tokens + self.positional_encoding)
        encoded = self.encoder(tokens, return_weights=return_attention)

        queries = (
            self.horizon_queries.expand(batch, -1, -1) if future_queries is None else future_queries
        )
        if self.future_covariate_embedding is not None:
            queries = queries + self.future_covariate_embedding(
                self._horizon_patches(future_covariates)
            )
        decoded = self.decoder(
            self.embedding_dropout(queries), encoded.hidden, return_weights=return_attention
        )

        h = c.prediction_length
        # (B, M, P_dec) -> (B, M * P_dec) -> (B, H)
        mean = self.point_head(decoded.hidden).reshape(batch, -1)[:, :h]
        if self.linear_skip is not None:
            skip = self.linear_skip(past_values)  # (B, H), from the normalised context
            mean = mean + skip
        quantiles = None
        if self.quantile_head is not None:
            # (B, M, P_dec * Q) -> (B, M * P_dec, Q) -> (B, H, Q)
            quantiles = self.quantile_head(decoded.hidden).reshape(batch, -1, len(c.quantiles))[
                :, :h
            ]
            if self.linear_skip is not None:
                quantiles = quantiles + skip.unsqueeze(-1)
            # Sorting keeps quantiles from crossing without constraining what the head learns.
            quantiles = quantiles.sort(dim=-1).values
        if stats is not None:
            mean = self.revin.denormalize(mean, stats)
            if quantiles is not None:
                quantiles = self.revin.denormalize(quantiles, stats)
        if c.loss == "pinball":
            mean = quantiles[..., c.quantiles.index(0.5)]

        attention = None
        if return_attention:
            attention = ModelAttention(
                encoded.self_attention, decoded.self_attention, decoded.cross_attention
            )
        return ModelOutput(mean=mean, quantiles=quantiles), attention


def pinball_loss(
    quantile_predictions: torch.Tensor, target: torch.Tensor, quantiles: torch.Tensor
) -> torch.Tensor:
    """Mean quantile loss. quantile_predictions (B, H, Q), target (B, H), quantiles (Q,)."""
    error = target.unsqueeze(-1) - quantile_predictions  # (B, H, Q)
    return torch.maximum(quantiles * error, (quantiles - 1) * error).mean()


def point_loss(output: ModelOutput, target: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Loss of the point forecast under config.loss (pinball: the median's absolute error / 2)."""
    if config.loss == "mse":
        return F.mse_loss(output.mean, target)
    if config.loss == "huber":
        return F.huber_loss(output.mean, target, delta=1.0)
    loss = F.l1_loss(output.mean, target)
    return loss / 2 if config.loss == "pinball" else loss


def forecast_loss(output: ModelOutput, target: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """The training objective: point loss (config.loss) plus weighted pinball on the quantiles."""
    if output.quantiles is None:
        return point_loss(output, target, config)
    q = torch.tensor(config.quantiles, device=target.device, dtype=output.quantiles.dtype)
    if config.loss == "pinball":
        return pinball_loss(output.quantiles, target, q)
    return point_loss(output, target, config) + config.quantile_loss_weight * pinball_loss(
        output.quantiles, target, q
    )
