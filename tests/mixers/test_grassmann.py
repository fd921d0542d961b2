"""The Causal Grassmann mixer: Plücker geometry and the paper's parameter counts."""

from __future__ import annotations

import itertools

import pytest
import torch

from seqmix.mixers.grassmann import CausalGrassmann, grassmann_mix_reference, pair_indices, plucker
from seqmix.models.budget import count_params
from seqmix.models.lm import CausalLM, LMConfig


def coord(p: torch.Tensor, r: int) -> dict:
    i, j = pair_indices(r)
    return {(int(a), int(b)): p[..., n] for n, (a, b) in enumerate(zip(i, j))}


def test_plucker_relations_hold():
    torch.manual_seed(0)
    r = 7
    a, b = torch.randn(50, r, dtype=torch.float64), torch.randn(50, r, dtype=torch.float64)
    p = coord(plucker(a, b), r)
    worst = 0.0
    for i, j, k, l in itertools.combinations(range(r), 4):
        rel = p[i, j] * p[k, l] - p[i, k] * p[j, l] + p[i, l] * p[j, k]
        worst = max(worst, rel.abs().max().item())
    assert worst < 1e-10


def test_plucker_identities():
    torch.manual_seed(1)
    u, v = torch.randn(20, 6, dtype=torch.float64), torch.randn(20, 6, dtype=torch.float64)
    torch.testing.assert_close(plucker(u, v), -plucker(v, u))
    assert plucker(u, u).abs().max() == 0
    lagrange = (u * u).sum(-1) * (v * v).sum(-1) - (u * v).sum(-1) ** 2
    torch.testing.assert_close((plucker(u, v) ** 2).sum(-1), lagrange)
    # The span, not the basis: adding a multiple of u to v leaves p unchanged.
    torch.testing.assert_close(plucker(u, v + 2.5 * u), plucker(u, v))
    assert plucker(u, v).shape[-1] == 6 * 5 // 2


@pytest.mark.parametrize("layers,expected,out_proj", [
    (6, 13_001_920, True), (12, 18_156_928, True), (6, 12_607_168, False),
])
def test_paper_parameter_counts(layers, expected, out_proj):
    # Zhang 2025, arXiv:2512.19428, §4.1 and Tables 1-2: V=30,522, d=256, 128 positions, tied embeddings, r=32
    # (the counts are reconciled in the report's Architectures section, paper/sections/architectures.tex).
    with torch.device("meta"):
        m = CausalLM(LMConfig(arch="grassmann", vocab_size=30522, max_len=128, n_layers=layers,
                              mixer_options={"out_proj": out_proj}))
    assert count_params(m) == expected


@pytest.mark.parametrize("layers,expected", [(6, 12_585_472), (12, 17_324_032)])
def test_transformer_baseline_parameter_counts(layers, expected):
    with torch.device("meta"):
        m = CausalLM(LMConfig(arch="softmax", vocab_size=30522, max_len=128, n_layers=layers))
    assert count_params(m) == expected


def test_mix_averages_valid_offsets_and_is_zero_at_the_start():
    torch.manual_seed(2)
    z = torch.randn(1, 6, 4, dtype=torch.float64)
    w, b = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    g = grassmann_mix_reference(z, w, b, (1, 2), normalize=False)
    assert g[0, 0].abs().max() == 0  # no earlier token: g_0 = 0, not the bias
    manual = (plucker(z[0, 3], z[0, 2]) + plucker(z[0, 3], z[0, 1])) / 2
    torch.testing.assert_close(g[0, 3], w @ manual + b)


def test_per_layer_schedule_gives_each_layer_one_offset():
    opts = {"offsets": (1, 1, 2, 2, 4, 4), "schedule": "per_layer"}
    got = [CausalGrassmann.options_for_layer(opts, i)["offsets"] for i in range(8)]
    assert got == [(1,), (1,), (2,), (2,), (4,), (4,), (1,), (1,)]


@pytest.mark.parametrize("degenerate", [False, True])
@pytest.mark.parametrize("L,offsets,normalize", [
    (1, (1, 2), True), (7, (1, 2, 4, 8), True), (9, (1, 1, 3), True), (6, (2, 3, -1, -2), True),
    (8, (1, 2, 4), False), (5, (5, 6), True),
])
def test_collapsed_form_equals_the_reference_forward_and_backward(L, offsets, normalize, degenerate):
    from seqmix.mixers.grassmann import grassmann_mix_collapsed

    torch.manual_seed(L)
    r, d = 5, 3
    z = torch.randn(2, L, r, dtype=torch.float64)
    if degenerate:
        z[0, min(2, L - 1)] = 0.0  # a zero state: its planes are degenerate
        if L > 3:
            z[1, 3] = 2.5 * z[1, 2]  # parallel neighbours: ‖p‖ = 0, clamped at ε
    w = torch.randn(d, r * (r - 1) // 2, dtype=torch.float64)
    b = torch.randn(d, dtype=torch.float64)
    inputs = [t.clone().requires_grad_() for t in (z, w, b)]
    ref = grassmann_mix_reference(*inputs, offsets, normalize, 1e-6)
    fast_inputs = [t.clone().requires_grad_() for t in (z, w, b)]
    fast = grassmann_mix_collapsed(*fast_inputs, offsets, normalize, 1e-6)
    # Degenerate pairs (‖p‖ below ε) divide rounding noise by ε = 1e-6 in both forms, so
    # 1e-16 becomes ~1e-9 there; elsewhere the two agree to rounding.
    tol = 1e-8 if degenerate else 1e-12
    torch.testing.assert_close(fast, ref, atol=tol, rtol=tol)
    g = torch.randn_like(ref)
    grads = [torch.autograd.grad(out, ins, g, allow_unused=True) for out, ins in ((ref, inputs), (fast, fast_inputs))]
    for x, y, t in zip(*grads, inputs):
        x = torch.zeros_like(t) if x is None else x
        y = torch.zeros_like(t) if y is None else y
        torch.testing.assert_close(y, x, atol=tol * 10, rtol=tol * 10)


def test_a_grassmann_stack_reads_exactly_its_summed_offsets_back():
    # Reach is measured, not only stated: the output at t must change when the input at
    # t - reach changes and must not when the input at t - reach - 1 does.
    from seqmix.models.blocks import stack_reach
    from seqmix.models.lm import CausalLM, LMConfig

    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch="grassmann", vocab_size=30, max_len=40, d_model=16, n_layers=2,
                              dropout=0.0, mixer_options={"rank": 4, "offsets": [1, 3]})).double().eval()
    reach = stack_reach(model.blocks)
    assert reach == 6
    idx = torch.randint(0, 30, (1, 40))
    t = 30
    base = model(idx)[0, t]
    for back, changes in ((reach, True), (reach + 1, False)):
        moved = idx.clone()
        moved[0, t - back] = (moved[0, t - back] + 1) % 30
        assert (model(moved)[0, t] - base).abs().max().item() > 1e-9 if changes else torch.equal(model(moved)[0, t], base)
    attention = CausalLM(LMConfig(arch="softmax", vocab_size=30, max_len=40, d_model=16, n_layers=2))
    assert stack_reach(attention.blocks) is None
