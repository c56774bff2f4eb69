import pytest
import torch
from torch import nn

from forecaster.layers import Dropout, Encoder


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_its_share_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    dropout = Dropout(p).train()
    x = torch.ones(1_000_003)  # not a multiple of the four draws per 64 bits
    y = dropout(x)
    dropped = (y == 0).double().mean().item()
    # 1,000,003 Bernoulli draws: the standard error of the share is below 0.0005.
    assert dropped == pytest.approx(p, abs=0.002)
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p)), rtol=1e-4)
    assert y.mean().item() == pytest.approx(1.0, abs=0.005)


def test_dropout_masks_are_independent_across_elements_and_calls():
    torch.manual_seed(0)
    dropout = Dropout(0.5).train()
    first, second = (dropout(torch.ones(4, 100_000)) == 0 for _ in range(2))
    # Neighbours come from one 64-bit draw: they must still be independent.
    together = (first[:, :-1] & first[:, 1:]).double().mean().item()
    assert together == pytest.approx(0.25, abs=0.005)
    assert (first & second).double().mean().item() == pytest.approx(0.25, abs=0.005)


def test_dropout_is_reproducible_under_a_seed_and_its_gradient_is_its_mask():
    x = torch.randn(3, 7, 5, requires_grad=True)
    dropout = Dropout(0.3).train()
    torch.manual_seed(1)
    y = dropout(x)
    torch.manual_seed(1)
    assert torch.equal(dropout(x), y)
    y.sum().backward()
    expected = torch.where(y != 0, 1 / (1 - 0.3), 0.0)
    assert torch.allclose(x.grad, expected, rtol=1e-4)


def test_dropout_is_the_identity_in_eval_mode_and_at_rate_zero():
    x = torch.randn(8, 16)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_dropout_keeps_the_dtype_and_is_an_nn_dropout():
    dropout = Dropout(0.1).train()
    assert isinstance(dropout, nn.Dropout)
    assert dropout(torch.randn(4, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_dropout_on_cpu_draws_its_mask_from_16_bit_integers():
    """The CPU path is the one that runs (torch's kernel took a quarter of a training step):
    its rate is a whole number of 2^-16, so 0.1 keeps 1 - 6554 / 65536 and scales by that."""
    torch.manual_seed(0)
    y = Dropout(0.1).train()(torch.ones(10_000))
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - 6554 / 2**16)), rtol=0, atol=0)


def test_the_encoder_reads_the_context_both_ways():
    """Bidirectional self-attention: the first context token's features change with the last
    token, as the last token's do with the first (the decoder alone is causal)."""
    torch.manual_seed(0)
    encoder = Encoder(2, 16, 2, 32, dropout=0.0, attention_dropout=0.0).eval()
    x = torch.randn(1, 5, 16)
    base = encoder(x).hidden
    for changed, read in ((4, 0), (0, 4)):
        moved = x.clone()
        moved[:, changed] += torch.randn(16)
        assert not torch.allclose(encoder(moved).hidden[:, read], base[:, read])
