"""GLA, H3, Mamba and TSSA: every fast form against its plain reference, forward and backward
(the scans, Mamba's selective scan and the linear scan: test_mixers_scan.py).

Tolerances: fp64 comparisons use atol 1e-10 (the forms differ only in summation order, so
they agree to ~1e-14); fp32 ones use 1e-3 as fla's GLA tests do for chunk vs recurrent
(fp32 roundoff of cumulative log-gates of size ~300 is ~3e-5 relative, well inside).
Shapes are awkward on purpose: L = 1, L not a multiple of the chunk, batch and heads > 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from seqmix import mixers
from seqmix.kernels.fft_conv import causal_fft_conv
from seqmix.kernels.gla_chunked import gla_chunk, gla_chunk_hierarchical, gla_chunk_reference
from seqmix.kernels.s4d import s4d_kernel_from_parameters
from seqmix.mixers.gla import gla_recurrent_reference
from seqmix.mixers.h3 import causal_conv_reference, s4d_kernel, s4d_kernel_reference
from seqmix.mixers.mamba import (
    selective_scan_chunked,
)
from seqmix.mixers.tssa import tssa_membership, tssa_reference
from seqmix.models.lm import CausalLM, LMConfig
from seqmix.study.settings import TrainSettings
from seqmix.train.step import make_optimizer
from tests.conftest import OutputSizes
from tests.helpers import F64, assert_close_fwd_bwd, grads, scan_inputs

# ----------------------------------------------------------------------------- GLA (Yang et al. 2024)


def gla_inputs(B, H, L, Dk, Dv, gate: str, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, L, Dk, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, L, Dv, generator=g, dtype=dtype)
    if gate == "fla":  # the layer's gate: logsigmoid(·) / 16
        log_alpha = (
            torch.nn.functional.logsigmoid(torch.randn(B, H, L, Dk, generator=g, dtype=dtype)) / 16
        )
    elif gate == "strong":  # down to -5 per step: -320 over a 64-token chunk
        log_alpha = -5 * torch.rand(B, H, L, Dk, generator=g, dtype=dtype)
    else:  # no decay: plain unnormalised linear attention
        log_alpha = torch.zeros(B, H, L, Dk, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, log_alpha)]


GLA_SHAPES = [  # B, H, L, Dk, Dv, chunk
    (1, 1, 1, 3, 2, 64),  # one token
    (2, 3, 37, 5, 4, 16),  # partial last chunk, one sub-chunk per chunk
    (2, 2, 150, 4, 6, 64),  # several chunks of 4 sub-chunks, partial tail
    (1, 2, 70, 3, 3, 24),  # chunk not a multiple of 16: sub-chunks of gcd(24, 16) = 8
]


@pytest.mark.parametrize("gate", ["fla", "strong", "none"])
@pytest.mark.parametrize("B,H,L,Dk,Dv,C", GLA_SHAPES)
def test_gla_chunk_equals_recurrent_fp64(B, H, L, Dk, Dv, C, gate):
    inputs = gla_inputs(B, H, L, Dk, Dv, gate)
    ref = gla_recurrent_reference(*inputs)
    out = gla_chunk_reference(*inputs, chunk_size=C)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


@pytest.mark.parametrize("gate", ["fla", "strong"])
def test_gla_chunk_equals_recurrent_fp32(gate):
    inputs = gla_inputs(2, 2, 150, 8, 8, gate, dtype=torch.float32)
    ref = gla_recurrent_reference(*inputs)
    out = gla_chunk_reference(*inputs, chunk_size=64)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-3, rtol=1e-3)


HIERARCHICAL_SHAPES = [  # B, H, L, Dk, Dv, chunk (a power of two)
    (1, 1, 1, 3, 2, 64),  # one token: no level, no carry
    (2, 3, 37, 5, 4, 16),  # partial last chunk
    (2, 2, 150, 4, 6, 64),  # several chunks, partial tail
    (1, 2, 70, 3, 3, 8),  # 9 chunks: the carry scan runs over several
    (1, 1, 5, 2, 2, 1),  # chunks of one token: carry only
]


@pytest.mark.parametrize("gate", ["fla", "strong", "none"])
@pytest.mark.parametrize("B,H,L,Dk,Dv,C", HIERARCHICAL_SHAPES)
def test_gla_hierarchical_equals_recurrent_fp64(B, H, L, Dk, Dv, C, gate):
    inputs = gla_inputs(B, H, L, Dk, Dv, gate)
    ref = gla_recurrent_reference(*inputs)
    out = gla_chunk_hierarchical(*inputs, chunk_size=C)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


def test_gla_hierarchical_strong_decay_fp32_and_mixer_dispatch():
    # log α down to -5 per step: finite in fp32 (every factor it forms is exp(≤ 0)).
    inputs = gla_inputs(2, 2, 150, 8, 8, "strong", dtype=torch.float32)
    out = gla_chunk_hierarchical(*inputs, chunk_size=64)
    ref = gla_recurrent_reference(*inputs)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-3, rtol=1e-3)
    # The mixer takes the hierarchical form for a power-of-two chunk, the secondary-chunk
    # form otherwise; both give the recurrent reference.
    x = torch.randn(2, 21, 16, dtype=F64)
    for C in (8, 6):
        torch.manual_seed(0)
        m = mixers.build("gla", 16, n_heads=2, chunk_size=C).to(F64)
        q, k, v, log_alpha, _ = m._qkvg(x)
        torch.testing.assert_close(m.core(q, k, v, log_alpha), gla_recurrent_reference(q, k, v, log_alpha),
                                   atol=1e-10, rtol=0)


@pytest.mark.parametrize("C", [8, 24])
def test_gla_chunk_takes_either_form_and_equals_recurrent(C):
    # The mixer's CPU path: the hierarchical form at a power-of-two chunk, the secondary-chunk
    # form otherwise; forward and backward, a partial last chunk.
    inputs = gla_inputs(2, 2, 53, 3, 5, "strong")
    assert_close_fwd_bwd(gla_chunk(*inputs, C), gla_recurrent_reference(*inputs), inputs, atol=1e-10)


def test_gla_without_decay_is_unnormalised_linear_attention():
    # log α = 0 (the kernel engineer's gate-free case): o = tril(q kᵀ) v, an independent
    # closed form for both functions.
    q, k, v, log_alpha = gla_inputs(2, 2, 45, 4, 3, "none")
    dense = (q @ k.transpose(-1, -2)).tril() @ v
    torch.testing.assert_close(
        gla_recurrent_reference(q, k, v, log_alpha), dense, atol=1e-10, rtol=0
    )
    torch.testing.assert_close(
        gla_chunk_reference(q, k, v, log_alpha, 16), dense, atol=1e-10, rtol=0
    )


def test_gla_strong_decay_stays_finite_in_fp32():
    # log α = -5 on every step and feature: a 64-token chunk spans exp(-320), far below fp32.
    # A form that divides by the cumulative gate would give inf/NaN here.
    q, k, v, _ = gla_inputs(1, 2, 200, 4, 4, "none", dtype=torch.float32)
    log_alpha = torch.full_like(q, -5.0).requires_grad_()
    out = gla_chunk_reference(q, k, v, log_alpha, 64)
    g = grads(out, [q, k, v, log_alpha])
    assert torch.isfinite(out).all() and all(torch.isfinite(t).all() for t in g)
    exact = gla_recurrent_reference(*(t.detach().double() for t in (q, k, v, log_alpha)))
    torch.testing.assert_close(out.double(), exact, atol=1e-4, rtol=1e-4)


def test_gla_mixer_shapes_and_gate_range():
    m = mixers.build("gla", 32, n_heads=4).to(F64)
    x = torch.randn(2, 9, 32, dtype=F64)
    q, k, v, log_alpha, gate = m._qkvg(x)
    assert q.shape == k.shape == log_alpha.shape == (2, 4, 9, 4)  # d_k = d/2 split in 4 heads
    assert v.shape == (2, 4, 9, 8) and gate.shape == (2, 9, 4, 8)
    assert (log_alpha <= 0).all()
    # α = σ(·)^{1/16}: with the zero-initialised gate bias the gates start near 1.
    alpha = log_alpha.exp()
    assert alpha.min() > 0.5 and alpha.max() < 1


# ----------------------------------------------------------------------------- H3 (Fu et al. 2023)


@pytest.mark.parametrize("L", [1, 2, 17])
def test_fft_conv_equals_direct_sum(L):
    g = torch.Generator().manual_seed(L)
    u = torch.randn(2, 3, 4, L, generator=g, dtype=F64)
    kernel = torch.randn(4, L, generator=g, dtype=F64)
    torch.testing.assert_close(
        causal_fft_conv(u, kernel), causal_conv_reference(u, kernel), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("L", [1, 2, 17])
def test_fft_conv_backward_and_skip_equal_direct_sum(L):
    # The hand-written backward (two causal correlations) and the lag-0 skip folded into the
    # kernel's transform, with the kernel broadcast over batch and one inner dim (as H3's).
    g = torch.Generator().manual_seed(L)
    u = torch.randn(2, 3, 4, L, generator=g, dtype=F64).requires_grad_()
    kernel = torch.randn(3, 1, L, generator=g, dtype=F64).requires_grad_()
    skip = torch.randn(3, 1, generator=g, dtype=F64).requires_grad_()
    fast = causal_fft_conv(u, kernel, skip)
    ref = causal_conv_reference(u, kernel, skip)
    assert_close_fwd_bwd(fast, ref, [u, kernel, skip], atol=1e-12)


@pytest.mark.parametrize("L", [1, 2, 10, 37, 64])
def test_s4d_kernel_from_parameters_equals_the_composition(L):
    # One autograd node with its backward written out = autograd through diag_ssm and
    # s4d_kernel (s4d_kernel_reference), at parameters moved off their initialisation
    # (every term nonzero).
    torch.manual_seed(L)
    m = mixers.build("h3", 6, d_state=8, head_dim=2).to(F64)
    params = [m.log_dt, m.log_A_real, m.A_imag, m.B, m.C]
    with torch.no_grad():
        for p in params:
            p.add_(0.3 * torch.randn_like(p))
    fast, ref = s4d_kernel_from_parameters(*params, L), s4d_kernel_reference(*params, L)
    assert_close_fwd_bwd(fast, ref, params, atol=1e-12, grad_atol=1e-10)
    if L == 10:
        assert torch.autograd.gradcheck(lambda *t: s4d_kernel_from_parameters(*t, L), tuple(params))


@pytest.mark.parametrize("L", [1, 2, 10, 37, 64])
def test_s4d_kernel_is_the_impulse_response(L):
    # κ_l = 2 Re Σ_n coef_n dA_n^l: run the recurrence x_t = dA x_{t-1} + coef δ_t0.
    m = mixers.build("h3", 6, d_state=8, head_dim=2).to(F64)
    dA, coef = m._diag_ssm()
    assert (dA.abs() < 1).all(), "bilinear discretisation of Re A < 0 is stable"
    x, impulse = coef, []
    for _ in range(L):
        impulse.append(2 * x.real.sum(-1))
        x = dA * x
    torch.testing.assert_close(
        s4d_kernel(dA, coef, L), torch.stack(impulse, -1), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize(
    "d,d_state,head_dim,L",
    [
        (8, 4, 1, 1),  # one token
        (8, 4, 2, 13),  # L > N: the shift filter is zero-padded
        (12, 16, 3, 9),  # L < N: the shift filter is truncated
        (8, 64, 4, 40),  # the default state size
    ],
)
def test_h3_fft_forward_equals_recurrence(d, d_state, head_dim, L):
    torch.manual_seed(0)
    m = mixers.build("h3", d, d_state=d_state, head_dim=head_dim).to(F64)
    x = torch.randn(2, L, d, dtype=F64, requires_grad=True)
    params = [x, *m.parameters()]
    fast, ref = m(x), m.forward_recurrent(x)
    assert_close_fwd_bwd(fast, ref, params, atol=1e-10)


def test_h3_fp32_forward_matches_fp64_recurrence():
    torch.manual_seed(1)
    m = mixers.build("h3", 16, d_state=16, head_dim=2)
    x = torch.randn(2, 100, 16)
    ref = m.to(F64).forward_recurrent(x.to(F64)).float()
    torch.testing.assert_close(m.float()(x), ref, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- TSSA (Wu et al. 2025)


def tssa_inputs(B=2, H=3, L=11, p=4, L_max=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(B, H, L, p, generator=g, dtype=F64)
    temp = 0.5 + torch.rand(H, generator=g, dtype=F64)
    denom_bias = 0.3 * torch.randn(H, L_max, 1, generator=g, dtype=F64)
    return w, temp, denom_bias


def test_causal_tssa_equals_per_position_definition():
    # The causal form written position by position with explicit sums over s ≤ t (no cumsum).
    w, temp, b = tssa_inputs()
    B, H, L, p = w.shape
    y = torch.empty_like(w)
    Pi = torch.empty(B, H, L, dtype=F64)
    for t in range(L):
        w_sq_past = w[:, :, : t + 1] ** 2
        w_norm = w[:, :, t] ** 2 / w_sq_past.sum(2).clamp_min(1e-12) + b[:, t]
        Pi[:, :, t] = torch.softmax(temp * w_norm.sum(-1), dim=1)
    for t in range(L):
        pi = Pi[:, :, : t + 1]
        dots = (pi[..., None] * w[:, :, : t + 1] ** 2).sum(2) / (pi.sum(-1, keepdim=True) + 1e-8)
        y[:, :, t] = -Pi[:, :, t, None] * w[:, :, t] / (1 + dots)
    torch.testing.assert_close(tssa_reference(w, temp, b, causal=True), y, atol=1e-12, rtol=0)


def test_noncausal_tssa_equals_vision_definition_and_is_permutation_equivariant():
    w, temp, _ = tssa_inputs()
    # Non-causal: Π from w normalised over tokens, π̃ = Π / Σ Π, dots = Σ_j π̃_j w_j².
    Pi = torch.softmax(temp[:, None] * ((w / w.norm(dim=2, keepdim=True)) ** 2).sum(-1), dim=1)
    dots = ((Pi / (Pi.sum(-1, keepdim=True) + 1e-8))[..., None] * w**2).sum(2, keepdim=True)
    expected = -Pi[..., None] * w / (1 + dots)
    y = tssa_reference(w, temp, None, causal=False)
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=0)
    perm = torch.randperm(w.shape[2], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        tssa_reference(w[:, :, perm], temp, None, causal=False), y[:, :, perm]
    )


def test_causal_and_noncausal_memberships_agree_at_the_last_token():
    # The causal form's prefix sums of w² at t = L are the squared column norms the
    # non-causal form normalises by.
    w, temp, b = tssa_inputs()
    causal = tssa_membership(w, temp, torch.zeros_like(b), causal=True)
    full = tssa_membership(w, temp, None, causal=False)
    torch.testing.assert_close(causal[..., -1], full[..., -1], atol=1e-12, rtol=0)


def test_tssa_needs_max_len_when_causal():
    with pytest.raises(ValueError, match="max_len"):
        mixers.build("tssa", 8, causal=True, n_heads=2)
    m = mixers.build("tssa", 8, causal=True, max_len=6, n_heads=2)
    with pytest.raises(ValueError, match="exceeds TSSA's max_len 6"):
        m(torch.randn(1, 7, 8))
    noncausal = mixers.build("tssa", 8, causal=False, n_heads=2)  # no position table needed
    assert noncausal.denom_bias is None and noncausal(torch.randn(2, 20, 8)).shape == (2, 20, 8)


@pytest.mark.parametrize("causal", [True, False])
def test_tssa_compression_term_bounds_the_exact_coding_rate(causal):
    # ToST §3: R_c^var ≥ R_c, because logdet(I + M) ≤ Σ_i log(1 + M_ii) for M ⪰ 0, with the
    # same Π and scale d / (n_k ε²); and it is the stated per-head formula.
    torch.manual_seed(0)
    d, H, L, eps = 12, 3, 10, 0.5
    m = mixers.build("tssa", d, causal=causal, max_len=L, n_heads=H).to(F64)
    x = torch.randn(2, L, d, dtype=F64)
    R = m.compression_term(x, eps=eps)
    assert R.shape == (2, H) and (R > 0).all()
    w = m._heads(x)  # (B, H, L, p)
    Pi = tssa_membership(w, m.temp, m.denom_bias, causal)
    n_k = Pi.sum(-1)
    cov = torch.einsum("bhl,bhlp,bhlq->bhpq", Pi, w, w) / n_k[..., None, None]
    exact = 0.5 * n_k / L * torch.logdet(torch.eye(d // H, dtype=F64) + d / eps**2 * cov)
    assert (R >= exact - 1e-12).all()
    manual = 0.5 * n_k / L * torch.log1p(d / eps**2 * torch.diagonal(cov, dim1=-2, dim2=-1)).sum(-1)
    torch.testing.assert_close(R, manual, atol=0, rtol=1e-7)  # the code's n_k + 1e-8 guard


# ----------------------------------------------------------------------------- all four


def lm(arch: str, **options) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(
        LMConfig(
            arch=arch, vocab_size=50, max_len=32, d_model=32, n_layers=2, mixer_options=options
        )
    )


def test_reference_initialisations_survive_the_lm_init():
    # The LM's GPT-2 init rewrites every Linear; reset_mixer_parameters must restore these.
    mamba = lm("mamba").blocks[0].mixer
    N, R = mamba.options.d_state, mamba.dt_rank
    torch.testing.assert_close(
        mamba.A_log, torch.log(torch.arange(1.0, N + 1)).expand(mamba.d_inner, N)
    )
    assert (mamba.D == 1).all()
    dt = torch.nn.functional.softplus(mamba.dt_proj.bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    w = mamba.dt_proj.weight
    assert w.abs().max() <= R**-0.5 and w.std() > 0.1 * R**-0.5  # U(±R^-1/2), not N(0, 0.02)
    # mamba_ssm leaves the mixer's other linear maps at nn.Linear's init, U(±fan_in^-1/2):
    # std fan_in^-1/2 / √3, which at fan_in 32 and 64 is 0.10 and 0.072, not 0.02.
    for linear in (mamba.in_proj, mamba.x_proj):
        bound = linear.in_features**-0.5
        assert linear.weight.abs().max() <= bound
        assert abs(linear.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3)

    h3 = lm("h3").blocks[0].mixer
    M = h3.options.d_state // 2
    torch.testing.assert_close(
        h3.A_imag, math.pi * torch.arange(M, dtype=torch.float32).expand(h3.n_heads, M)
    )
    torch.testing.assert_close(h3.log_A_real.exp(), torch.full_like(h3.log_A_real, 0.5))
    assert (h3.log_dt.exp() >= 1e-3 * 0.999).all() and (h3.log_dt.exp() <= 0.1 * 1.001).all()

    tssa = lm("tssa").blocks[0].mixer
    assert (tssa.temp == 1).all() and (tssa.denom_bias == 0).all()
    assert tssa.denom_bias.shape == (tssa.n_heads, 32, 1)

    gla = lm("gla").blocks[0].mixer
    assert (gla.gk_proj[1].bias == 0).all() and (gla.g_norm.weight == 1).all()


@pytest.mark.parametrize(
    "arch,excluded",
    [
        ("mamba", ["A_log", "D"]),
        ("tssa", ["temp", "denom_bias"]),
        ("h3", ["log_dt", "log_A_real", "A_imag", "B"]),
    ],
)
def test_no_weight_decay_parameters_are_excluded(arch, excluded):
    model = lm(arch)
    opt = make_optimizer(model, TrainSettings(weight_decay=0.1, lr=1e-3, betas=(0.9, 0.95)))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    mixer = model.blocks[0].mixer
    assert set(mixer.no_weight_decay()) == set(excluded)
    for name in excluded:
        assert id(getattr(mixer, name)) not in decayed, f"{arch}.{name} is weight-decayed"


@pytest.mark.parametrize("arch", ["gla", "h3", "mamba", "tssa"])
def test_flops_grow_linearly(arch):
    m = mixers.build(arch, 64, max_len=8192)
    f1, f2 = m.flops(2048), m.flops(4096)
    assert f1 > 0
    # Doubling L at most doubles the cost, up to H3's log factor (log2(8192)/log2(4096)).
    assert 1.9 < f2 / f1 < 2.2, f"{arch}: flops ratio {f2 / f1:.3f} is not linear in L"


# ------------------------------------------------- chunk loops: backward work linear in L


def _gla_case(fn):
    def run(L):
        q, k, v, log_alpha = gla_inputs(1, 2, L, 4, 4, "fla", dtype=torch.float32)
        return fn(q, k, v, log_alpha, 8), (q, k, v, log_alpha)
    return run


def _scan_case(L):
    inputs, _ = scan_inputs(1, 4, 4, L, dtype=torch.float32)
    return selective_scan_chunked(*inputs, chunk_size=8), inputs


def _favor_case(L):
    from seqmix.mixers import performer as perf

    g = torch.Generator().manual_seed(0)
    omega = perf.gaussian_orthogonal_random_matrix(6, 4, g).float()
    q, k, v = (torch.randn(1, 2, L, 4, generator=g, requires_grad=True) for _ in range(3))
    out = perf.causal_favor_attention(perf.query_features(q, omega, 1e-4), *perf.key_features(k, omega), v, 1e-4, 8)
    return out, (q, k, v)


@pytest.mark.parametrize("case", [
    _gla_case(gla_chunk_reference), _gla_case(gla_chunk_hierarchical), _scan_case, _favor_case,
], ids=["gla_chunk_reference", "gla_chunk_hierarchical", "selective_scan_chunked", "causal_favor_attention"])
def test_chunk_loop_backward_work_grows_linearly(case):
    # Indexing one chunk of a large tensor per loop step (x[:, :, n]) makes autograd
    # zero-fill a gradient of the full size at every step: O(L²/C) backward work. Count the
    # elements written in backward at L and 4L (many chunks of 8 either way).
    work = []
    for L in (256, 1024):
        out, inputs = case(L)
        with OutputSizes() as probe:
            torch.autograd.grad(out.sum(), inputs)
        work.append(probe.total)
    assert work[1] < 4.5 * work[0], f"backward work grew {work[1] / work[0]:.1f}x for 4x the length"
