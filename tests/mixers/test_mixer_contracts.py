"""Contracts between a mixer's parts that the per-mixer property tests (test_mixers.py) do
not reach: the non-causal form (the SNLI encoders) under gradcheck, ``scores`` equal to
the weights the forward applies, and Grassmann's per-layer offset schedule as the blocks
of a model build it."""

from __future__ import annotations

import pytest
import torch

from seqmix import mixers
from seqmix.mixers.base import HeadProjections
from seqmix.models.lm import CausalLM, LMConfig
from tests.conftest import tiny_mixer

D = 8


def noncausal_forms() -> list[str]:
    """Mixers with both forms: test_mixers.py gradchecks their causal one only."""
    return [n for n in mixers.names()
            if mixers.mixer_class(n).supports_noncausal and mixers.mixer_class(n).supports_causal]


@pytest.mark.parametrize("name", noncausal_forms())
def test_gradcheck_of_the_noncausal_form(name):
    m = tiny_mixer(name, causal=False, max_len=5)
    x = torch.randn(1, 5, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), eps=1e-6, atol=1e-5)


def test_the_noncausal_form_reads_the_future():
    # What makes it an encoder: an output at t changes when a later input changes (within
    # the reach of a bounded mixer: Grassmann's tiny offsets go 3 tokens either way).
    for name in noncausal_forms():
        m = tiny_mixer(name, causal=False)
        x = torch.randn(1, 9, D, dtype=torch.float64)
        later = x.clone()
        later[:, 3:] += 1.0
        assert not torch.allclose(m(x)[:, :3], m(later)[:, :3]), name


# --- scores: the weights the forward applies ----------------------------------------------------


def attention_with_scores() -> list[str]:
    return [n for n in mixers.names()
            if mixers.mixer_class(n).has_scores and issubclass(mixers.mixer_class(n), HeadProjections)]


def test_every_attention_style_mixer_with_scores_is_checked():
    assert {"softmax", "linear", "performer", "sliding_window", "bigbird"} <= set(attention_with_scores())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", attention_with_scores())
def test_scores_are_the_weights_the_forward_applies(name, causal):
    # out_proj(P V) with P = scores normalised per row must be the forward itself: the rows
    # the sparsity analysis measures are the rows the model uses. (Linear attention's ε in
    # its denominator is set to 0 so that the identity is exact.)
    overrides = {"eps": 0.0} if name == "linear" else {}
    m = tiny_mixer(name, causal=causal, **overrides)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    s = m.scores(x)
    P = s / s.sum(-1, keepdim=True)
    v = m._split(m.v_proj(x))
    B, H, L, Dh = v.shape
    expected = m.out_proj((P @ v).transpose(1, 2).reshape(B, L, H * Dh))
    torch.testing.assert_close(m(x), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_crate_scores_are_the_weights_of_its_tied_attention(causal):
    m = tiny_mixer("crate", causal=causal)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    s = m.scores(x)
    w = m._w(x)  # CRATE's Q = K = V
    B, H, L, Dh = w.shape
    expected = m.to_out(((s / s.sum(-1, keepdim=True)) @ w).transpose(1, 2).reshape(B, L, H * Dh))
    torch.testing.assert_close(m(x), expected, atol=1e-12, rtol=0)


def test_softmax_scores_are_its_attention_probabilities():
    # The exp of the scaled logits, up to the per-row max: normalised, exactly softmax.
    m = tiny_mixer("softmax", causal=True)
    x = torch.randn(1, 7, D, dtype=torch.float64)
    q, k, _ = m._heads(x)
    logits = (q @ k.transpose(-1, -2) / (m.d_head ** 0.5)).masked_fill(
        ~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    s = m.scores(x)
    torch.testing.assert_close(s / s.sum(-1, keepdim=True), torch.softmax(logits, -1), atol=1e-14, rtol=0)
    assert bool((s.amax(-1) == 1.0).all())  # exp(logit - row max): the largest weight is 1


# --- Grassmann's offset schedule through the model's blocks --------------------------------------


def dependence(model: CausalLM, L: int = 12) -> set[int]:
    """Which lags s = t - t' the stack's output at t reads, from its Jacobian (fp64):
    {t - t' : ∂h_out[t] / ∂h_in[t'] ≠ 0 for some t}."""
    model = model.double().eval()
    h = torch.randn(L, model.cfg.d_model, dtype=torch.float64)

    def stack(x):
        for block in model.blocks:
            x = block(x[None])[0]
        return x

    J = torch.autograd.functional.jacobian(stack, h).abs().sum(dim=(1, 3))  # (L, L)
    return {t - s for t in range(L) for s in range(L) if J[t, s] > 1e-12}


def grassmann_lm(n_layers: int, **options) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(LMConfig(arch="grassmann", vocab_size=20, max_len=12, d_model=D, n_layers=n_layers,
                             dropout=0.0, mixer_options={"rank": 4, **options}))


def test_per_layer_schedule_gives_each_layer_its_own_offset():
    model = grassmann_lm(3, offsets=(1, 3, 5), schedule="per_layer")
    assert [b.mixer.options.offsets for b in model.blocks] == [(1,), (3,), (5,)]
    # Layer ℓ pairs t with t - offsets[ℓ] only: the stack reads the lags that are sums of
    # one choice per layer from {0, 1} + {0, 3} + {0, 5}; lag 2 = 1 + 1 needs a repeated
    # offset, which only the "all" schedule has.
    assert dependence(model) == {0, 1, 3, 4, 5, 6, 8, 9}
    assert [b.mixer.reach() for b in model.blocks] == [1, 3, 5]


def test_all_schedule_gives_every_layer_every_offset():
    model = grassmann_lm(2, offsets=(1, 3), schedule="all")
    assert [b.mixer.options.offsets for b in model.blocks] == [(1, 3), (1, 3)]
    assert dependence(model) == {0, 1, 2, 3, 4, 6}
