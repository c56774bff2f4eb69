"""Attention against PyTorch's reference implementations."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from forecaster.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention

ATOL = 1e-5


def _qkv(shape_prefix: tuple[int, ...], n_queries: int = 5, n_keys: int = 7, dim: int = 8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*shape_prefix, n_queries, dim, generator=g)
    k = torch.randn(*shape_prefix, n_keys, dim, generator=g)
    v = torch.randn(*shape_prefix, n_keys, dim, generator=g)
    return q, k, v


def _padding_mask(shape_prefix: tuple[int, ...], n_queries: int, n_keys: int) -> torch.Tensor:
    """Random "may attend" mask with at least one key per query."""
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(*shape_prefix, n_queries, n_keys, generator=g) > 0.4
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize("prefix", [(), (3,), (2, 3)], ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_explicit_fused_and_torch_agree(prefix, causal, masked):
    n = 6  # square so that causal masking is meaningful for every query
    q, k, v = _qkv(prefix, n, n)
    mask = _padding_mask(prefix, n, n) if masked else None
    explicit, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, return_weights=True
    )
    fused = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)

    reference_mask = mask
    if causal:
        tri = torch.ones(n, n, dtype=torch.bool).tril()
        reference_mask = tri if mask is None else mask & tri
    if q.dim() == 2:
        reference = F.scaled_dot_product_attention(
            q[None],
            k[None],
            v[None],
            attn_mask=None if reference_mask is None else reference_mask[None],
        )[0]
    else:
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_mask)

    torch.testing.assert_close(explicit, reference, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused, reference, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=ATOL, rtol=0)
    if reference_mask is not None:
        assert torch.all(weights[~reference_mask.expand_as(weights)] == 0)


def test_causal_query_sees_only_past_keys():
    q, k, v = _qkv((2,), 5, 5)
    _, weights = scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    upper = torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1)
    assert torch.all(weights[:, upper] == 0)
    assert torch.all(weights[:, ~upper] > 0)


def test_causal_mask_is_lower_triangular():
    assert causal_mask(3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
    assert causal_mask(2, 3).tolist() == [[True, False, False], [True, True, False]]


def test_fully_masked_row_gives_zero_output_and_weights_without_nan():
    q, k, v = _qkv((2,), 3, 4)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1] = False  # query 1 of batch 0 may attend to nothing
    q.requires_grad_(True)
    for return_weights in (False, True):
        result = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=return_weights)
        output = result[0] if return_weights else result
        assert not torch.isnan(output).any()
        assert torch.all(output[0, 1] == 0)
        if return_weights:
            assert torch.all(result[1][0, 1] == 0)
        output.sum().backward()
        assert not torch.isnan(q.grad).any()
        q.grad = None


def test_non_boolean_mask_is_rejected():
    q, k, v = _qkv((), 2, 2)
    with pytest.raises(TypeError, match="boolean"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(2, 2))


def _copy_from_torch(ours: MultiHeadAttention, reference: nn.MultiheadAttention) -> None:
    d = ours.d_model
    w, b = reference.in_proj_weight, reference.in_proj_bias
    with torch.no_grad():
        for i, proj in enumerate((ours.query_proj, ours.key_proj, ours.value_proj)):
            proj.weight.copy_(w[i * d : (i + 1) * d])
            proj.bias.copy_(b[i * d : (i + 1) * d])
        ours.output_proj.weight.copy_(reference.out_proj.weight)
        ours.output_proj.bias.copy_(reference.out_proj.bias)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_multi_head_attention_matches_torch(causal, masked, cross):
    torch.manual_seed(0)
    d_model, n_heads, batch, n_q = 16, 4, 3, 6
    n_k = 8 if cross else n_q
    ours = MultiHeadAttention(d_model, n_heads).eval()
    reference = nn.MultiheadAttention(d_model, n_heads, batch_first=True).eval()
    _copy_from_torch(ours, reference)
    query = torch.randn(batch, n_q, d_model)
    memory = torch.randn(batch, n_k, d_model) if cross else query

    mask = _padding_mask((batch,), n_q, n_k) if masked else None
    allowed = mask
    if causal:
        tri = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        allowed = tri.expand(batch, n_q, n_k) if mask is None else mask & tri
    # torch's boolean attn_mask means "may NOT attend", per head as (B * heads, Lq, Lk).
    torch_mask = None if allowed is None else (~allowed).repeat_interleave(n_heads, dim=0)

    expected, expected_weights = reference(
        query, memory, memory, attn_mask=torch_mask, need_weights=True, average_attn_weights=False
    )
    output, weights = ours(query, memory, memory, mask=mask, causal=causal, return_weights=True)
    fused = ours(query, memory, memory, mask=mask, causal=causal)
    torch.testing.assert_close(output, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=0)


def test_sinusoidal_positional_encoding_formula():
    from forecaster.layers import sinusoidal_positional_encoding

    table = sinusoidal_positional_encoding(10, 6)
    pos, i = 7, 1
    assert table.shape == (10, 6)
    assert table[pos, 2 * i].item() == pytest.approx(
        torch.sin(torch.tensor(pos / 10000 ** (2 * i / 6))).item(), abs=1e-6
    )
    assert table[pos, 2 * i + 1].item() == pytest.approx(
        torch.cos(torch.tensor(pos / 10000 ** (2 * i / 6))).item(), abs=1e-6
    )
