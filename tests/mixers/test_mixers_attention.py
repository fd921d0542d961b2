"""Mixer-specific tests for softmax, linear, performer, sliding_window, bigbird, linformer and
crate (the generic properties live in tests/mixers/test_mixers.py).

Fast path == reference: fp64, forward at 1e-12 and input gradients at 1e-10 (the two paths
add the same terms in a different order, so they agree to rounding; a wrong mask, a missed
chunk or a wrong rescale shows up at O(1)). Shapes are awkward on purpose: L = 1, L not a
multiple of the chunk/window/block, batch and heads > 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from seqmix import mixers
from seqmix.mixers import bigbird as bb
from seqmix.mixers import linear as lin
from seqmix.mixers import performer as perf
from seqmix.mixers import sliding_window as sw
from seqmix.models.blocks import Block
from seqmix.models.lm import CausalLM, LMConfig
from tests.conftest import OutputSizes
from tests.helpers import F64
from tests.helpers import assert_same_fwd_bwd as same_fwd_bwd


def rand(*shape, scale=1.0, positive=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=F64) if positive else torch.randn(*shape, generator=g, dtype=F64)
    return (t * scale).requires_grad_()


def assert_same_fwd_bwd(fast, ref, inputs):
    """At this module's fp64 tolerances (its docstring)."""
    same_fwd_bwd(fast, ref, inputs, atol=1e-12, grad_atol=1e-10)


def with_weights(m: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """x and every weight of ``m``: the inputs whose gradients a comparison checks."""
    return [x.requires_grad_(), *m.parameters()]


# --------------------------------------------------------------------------------- softmax


def written_out_attention(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ / √d_head) v, the causal mask as -inf above the diagonal: (B, H, L, Dh)."""
    L = q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        logits = logits.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(logits, dim=-1) @ v


def heads_of(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, L, D = t.shape
    return t.view(B, L, n_heads, D // n_heads).transpose(1, 2)


def merged(y: torch.Tensor) -> torch.Tensor:
    B, H, L, Dh = y.shape
    return y.transpose(1, 2).reshape(B, L, H * Dh)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 7, 16])
def test_softmax_sdpa_equals_written_out_attention(causal, L):
    """The mixer's fast path (scaled_dot_product_attention) against the attention written out
    here on its own projections, forward and backward (the input and every weight); and the
    plain reference beside it in the module (its ``step`` uses it) against the same."""
    from seqmix.mixers.softmax import attention_reference

    torch.manual_seed(L)
    m = mixers.build("softmax", 12, causal=causal, n_heads=3).to(F64)

    def written_out(x, *weights):
        q, k, v = (heads_of(proj(x), 3) for proj in (m.q_proj, m.k_proj, m.v_proj))
        return m.out_proj(merged(written_out_attention(q, k, v, causal)))

    assert_same_fwd_bwd(lambda x, *w: m(x), written_out, with_weights(m, torch.randn(2, L, 12, dtype=F64)))
    q, k, v = (rand(2, 3, L, 4, seed=s) for s in range(3))
    assert_same_fwd_bwd(lambda *t: attention_reference(*t, causal), lambda *t: written_out_attention(*t, causal),
                        (q, k, v))


# ---------------------------------------------------------------------------------- linear


@pytest.mark.parametrize("L", [1, 5, 13])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_linear_chunked_equals_dense_reference(L, chunk):
    q, k = rand(2, 3, L, 4, positive=True, seed=1), rand(2, 3, L, 4, positive=True, seed=2)
    v = rand(2, 3, L, 5, seed=3)  # d_v != d_k
    assert_same_fwd_bwd(
        lambda *t: lin.causal_linear_attention(*t, eps=1e-6, chunk_size=chunk),
        lambda *t: lin.linear_attention_reference(*t, causal=True), (q, k, v),
    )
    assert_same_fwd_bwd(
        lambda *t: lin.noncausal_linear_attention(*t, eps=1e-6),
        lambda *t: lin.linear_attention_reference(*t, causal=False), (q, k, v),
    )


def test_linear_scores_are_a_kernel_of_the_two_tokens_alone():
    """s[t, j] = φ(q_t)·φ(k_j) (Katharopoulos et al. 2020): a pair's score reads tokens t and j
    only, is positive for every past pair (φ = elu + 1 > 0) and zero for every future one.
    Scores normalised over the row, or shifted by a row maximum as softmax's are, move when a
    third token moves. (That the rows, normalised, are the weights the forward applies is
    tests/mixers/test_mixer_contracts.py's.)"""
    m = mixers.build("linear", 8, n_heads=2, chunk_size=4).to(F64)
    x = torch.randn(1, 9, 8, dtype=F64)
    moved = x.clone()
    moved[:, 4] = 3 * torch.randn(8, dtype=F64)
    s, s_moved = m.scores(x), m.scores(moved)
    rest = torch.tensor([t for t in range(9) if t != 4])
    torch.testing.assert_close(s_moved[..., rest, :][..., rest], s[..., rest, :][..., rest], atol=1e-12, rtol=0)
    assert not torch.allclose(s_moved[..., 4, :4], s[..., 4, :4]) and not torch.allclose(s_moved[..., 5:, 4], s[..., 5:, 4])
    past = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (s[..., past] > 0).all() and (s[..., ~past] == 0).all()


# ------------------------------------------------------------------------------- performer


def favor_inputs(L, m=7, d=4, scale=3.0, seed=0):
    omega = perf.gaussian_orthogonal_random_matrix(m, d, torch.Generator().manual_seed(seed))
    q, k = rand(2, 3, L, d, scale=scale, seed=seed + 1), rand(2, 3, L, d, scale=scale, seed=seed + 2)
    return omega, q, k, rand(2, 3, L, 5, seed=seed + 3)


@pytest.mark.parametrize("L", [1, 5, 13])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_performer_chunked_equals_dense_reference(L, chunk):
    # scale 3: projections of tens, so the running max of the keys moves inside chunks.
    omega, q, k, v = favor_inputs(L)

    def run(q, k, v, fast):
        phi_q = perf.query_features(q, omega, 1e-4)
        if fast:
            return perf.causal_favor_attention(phi_q, *perf.key_features(k, omega), v, 1e-4, chunk)
        k_proj, k_logf = perf.favor_projections(k, omega)
        return perf.favor_attention_reference(phi_q, k_logf, k_proj, v, True, 1e-4)

    def run_stacked(q, k, v):  # the mixer's features: q and k in one pass, φ(q) unscaled
        phi_q, k_hat, mu = perf.favor_features(q, k, omega, 1e-4)
        return perf.causal_favor_attention(phi_q, k_hat, mu, v, 1e-4, chunk)

    assert_same_fwd_bwd(lambda *t: run(*t, True), lambda *t: run(*t, False), (q, k, v))
    assert_same_fwd_bwd(run_stacked, lambda *t: run(*t, False), (q, k, v))


@pytest.mark.parametrize("causal", [True, False])
def test_performer_mixer_matches_reference_and_scores(causal):
    m = mixers.build("performer", 8, causal=causal, n_heads=2, chunk_size=4, feature_seed=3).to(F64)
    x = torch.randn(2, 11, 8, dtype=F64) * 3
    phi_q, k_logf, k_proj, v = m._favor_inputs(x)
    y_ref = perf.favor_attention_reference(phi_q, k_logf, k_proj, v, causal, m.options.eps)
    torch.testing.assert_close(m(x), m.out_proj(y_ref.transpose(1, 2).reshape(2, 11, 8)), atol=1e-12, rtol=0)
    # scores are the weights the forward normalises
    s = m.scores(x)
    torch.testing.assert_close((s @ v) / s.sum(-1, keepdim=True), y_ref, atol=1e-12, rtol=0)


def test_performer_stabiliser_is_causal_and_stable():
    """A huge later key must not change earlier outputs (the reference's global key max
    would, through eps), and fp32 must stay finite where exp(ωᵀk) overflows."""
    m = mixers.build("performer", 8, n_heads=2, chunk_size=4, feature_seed=0).to(F64).eval()
    x = torch.randn(1, 10, 8, dtype=F64)
    x2 = x.clone()
    x2[:, 6:] *= 200.0
    torch.testing.assert_close(m(x2)[:, :6], m(x)[:, :6], atol=1e-12, rtol=0)
    m32 = mixers.build("performer", 8, n_heads=2, chunk_size=4, feature_seed=0).eval()
    y = m32(x2.float() * 5)
    assert torch.isfinite(y).all()


def test_performer_features_are_orthogonal_blocks_with_chi_norms():
    d, m = 8, 20
    w = perf.gaussian_orthogonal_random_matrix(m, d, torch.Generator().manual_seed(0))
    for start in range(0, m, d):  # rows within a block are orthogonal
        block = w[start : start + d]
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(gram.diagonal()), torch.zeros_like(gram), atol=1e-12, rtol=0)
    # chi norms: E‖ω‖² = d; over 4000 rows the mean is within ±5 standard errors
    big = perf.gaussian_orthogonal_random_matrix(4000, d, torch.Generator().manual_seed(1))
    sq = (big**2).sum(-1)
    assert abs(sq.mean().item() - d) < 5 * math.sqrt(2 * d / 4000)


def test_performer_estimator_approaches_softmax_attention():
    """FAVOR+ with m features estimates the attention weights softmax(q kᵀ/√d); the error
    must fall as m grows. Measured as ‖Â − A‖ / ‖U − A‖ (U = uniform weights), averaged over
    4 draws; with these seeds it is 0.36, 0.13, 0.04 for m = 256, 4096, 32768. Wrong features
    plateau instead: rows of norm √d instead of chi norms at 0.17, no −‖u‖²/2 at 0.5, no
    d^(-1/4) normaliser at 2.2 (all measured), so the bounds below catch each of them."""
    d, L = 8, 24
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, L, d, generator=g, dtype=F64) * 0.5
    k = torch.randn(1, 1, L, d, generator=g, dtype=F64) * 0.5
    exact = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    uniform = torch.full_like(exact, 1.0 / L)
    eye = torch.eye(L, dtype=F64).expand(1, 1, L, L)  # v = I: the output is the weights

    def error(m):
        errs = []
        for draw in range(4):
            omega = perf.gaussian_orthogonal_random_matrix(m, d, torch.Generator().manual_seed(100 + draw))
            phi_q = perf.query_features(q, omega, 0.0)
            k_proj, k_logf = perf.favor_projections(k, omega)
            weights = perf.favor_attention_reference(phi_q, k_logf, k_proj, eye, False, 0.0)
            errs.append(((weights - exact).norm() / (uniform - exact).norm()).item())
        return sum(errs) / len(errs)

    e256, e4096, e32768 = error(256), error(4096), error(32768)
    assert e32768 < e4096 < e256
    assert e32768 < e256 / 4, (e256, e32768)
    assert e32768 < 0.08, e32768


def test_performer_redraws_only_in_training_and_reproducibly():
    m = mixers.build("performer", 8, n_heads=2, redraw_interval=2, feature_seed=5)
    x = torch.randn(1, 4, 8)
    first = m.omega.clone()
    m.eval()
    for _ in range(5):
        m(x)
    assert torch.equal(m.omega, first), "eval must never redraw"
    m.train()
    m(x)
    m(x)
    assert torch.equal(m.omega, first)  # calls 0, 1: no redraw yet
    m(x)  # call 2: the first redraw
    assert not torch.equal(m.omega, first)
    # A model restored from this state redraws exactly as this one does.
    m2 = mixers.build("performer", 8, n_heads=2, redraw_interval=2, feature_seed=99)
    m2.load_state_dict(m.state_dict())
    m2.train()
    for _ in range(2):
        m(x)
        m2(x)
    assert torch.equal(m.omega, m2.omega)
    never = mixers.build("performer", 8, n_heads=2, redraw_interval=0, feature_seed=5).train()
    for _ in range(3):
        never(x)
    assert torch.equal(never.omega, first)


def test_performer_default_features_follow_the_global_seed():
    torch.manual_seed(0)
    a, b = mixers.build("performer", 16), mixers.build("performer", 16)
    torch.manual_seed(0)
    a2 = mixers.build("performer", 16)
    assert not torch.equal(a.omega, b.omega), "two layers must not share their features"
    assert torch.equal(a.omega, a2.omega)
    assert a.omega.shape == (int(4 * math.log(4)), 4)  # m = int(d_head ln d_head), d_head = 4


# -------------------------------------------------------------------------- sliding window


def test_sliding_window_mask_exact():
    causal = sw.sliding_window_mask(6, window=2, n_global=1, causal=True).int()
    assert causal.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 1, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ]
    # non-causal, window 2 = one key on each side; global token 0 attends everywhere
    full = sw.sliding_window_mask(6, window=2, n_global=1, causal=False).int()
    assert full.tolist() == [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 0, 1, 1, 1, 0],
        [1, 0, 0, 1, 1, 1],
        [1, 0, 0, 0, 1, 1],
    ]
    # two global tokens, causal: token 1 (global) sees 0..1; later tokens see both globals
    two = sw.sliding_window_mask(5, window=1, n_global=2, causal=True).int()
    assert two.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 5, 13])
@pytest.mark.parametrize("window,n_global", [(1, 0), (3, 1), (4, 3), (20, 1)])
def test_sliding_window_banded_equals_dense(causal, L, window, n_global):
    q, k, v = (rand(2, 3, L, 4, seed=s) for s in range(3))
    assert_same_fwd_bwd(
        lambda *t: sw.banded_attention(*t, window, n_global, causal),
        lambda *t: sw.sliding_window_reference(*t, window, n_global, causal), (q, k, v),
    )
    counts = sw.pattern_row_counts(L, window, n_global, causal)
    assert torch.equal(counts, sw.sliding_window_mask(L, window, n_global, causal).sum(-1))


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_global_projections(causal):
    m = mixers.build("sliding_window", 8, causal=causal, n_heads=2, window=2, n_global=3,
                     global_projections=True).to(F64)
    x = torch.randn(2, 9, 8, dtype=F64)
    torch.testing.assert_close(m(x), m.forward_reference(x), atol=1e-12, rtol=0)
    s = m.scores(x)
    assert torch.equal(s > 0, sw.sliding_window_mask(9, 2, 3, causal).expand_as(s))
    if causal:  # n_global > window: the global rows' past lies outside the window cache
        state, outs = m.init_state(2, x.device, F64), []
        for t in range(9):
            y_t, state = m.step(x[:, t], state)
            outs.append(y_t)
        torch.testing.assert_close(torch.stack(outs, 1), m(x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window_mixer_dense_and_banded_paths_equal_reference(causal):
    # window 2, one global token: the dense SDPA path up to L = 4·(2w + g) = 20, banded above.
    m = mixers.build("sliding_window", 8, causal=causal, n_heads=2, window=2, n_global=1).to(F64)
    for L in (7, 20, 21, 33):
        x = torch.randn(2, L, 8, dtype=F64, requires_grad=True)
        assert_same_fwd_bwd(m, m.forward_reference, (x,))


# --------------------------------------------------------------------------------- bigbird


def test_bigbird_mask_exact_without_random_blocks():
    table = bb.key_block_table(4, n_global=1, n_random=0, causal=True, seed=0)
    assert table.tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2], [0, 2, 3]]
    mask = bb.bigbird_mask(7, 2, table, n_global=1, causal=True).int()  # blocks {0,1} {2,3} {4,5} {6}
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1, 1, 1],  # block 3: global 0, window 2..3, not block 1
    ]
    full = bb.key_block_table(4, n_global=1, n_random=0, causal=False, seed=0)
    assert full.tolist() == [[0, 1, -1, -1], [0, 1, 2, -1], [0, 1, 2, 3], [0, 2, 3, -1]]


def test_bigbird_random_blocks():
    N, g, r = 12, 1, 3
    causal = bb.key_block_table(N, g, r, causal=True, seed=7)
    for beta in range(N):
        row = [c for c in causal[beta].tolist() if c >= 0]
        assert len(row) == len(set(row)), "no key block twice"
        rand_blocks = row[len([c for c in row if c < g or c in (beta - 1, beta)]):]
        n_candidates = max(0, beta - 1 - g)
        assert len(rand_blocks) == min(r, n_candidates)
        assert all(g <= c < beta - 1 for c in rand_blocks), "random blocks come before the window"
    # a block's random blocks depend on (seed, block) only, not on the sequence length
    assert torch.equal(bb.key_block_table(7, g, r, True, 7), causal[:7])
    assert torch.equal(bb.key_block_table(N, g, r, True, 7), causal)
    assert not torch.equal(bb.key_block_table(N, g, r, True, 8), causal)
    # per-block draws are independent: the picks (as positions among the candidates) vary
    draws = {tuple(torch.randperm(30, generator=torch.Generator().manual_seed(bb.sub_seed(7, b)))[:r].tolist())
             for b in range(50)}
    assert len(draws) > 45
    full = bb.key_block_table(N, g, r, causal=False, seed=7)
    for beta in range(1, N):
        row = [c for c in full[beta].tolist() if c >= 0]
        window = {c for c in (beta - 1, beta, beta + 1) if 0 <= c < N}
        extra = set(row) - window - set(range(g))
        assert len(extra) == r, "non-causal: 3 random blocks from anywhere else"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 5, 13])
@pytest.mark.parametrize("block_size,n_global,n_random", [(1, 1, 1), (2, 1, 3), (3, 2, 1), (4, 0, 2)])
def test_bigbird_block_sparse_equals_dense(causal, L, block_size, n_global, n_random):
    table = bb.key_block_table(-(-L // block_size), n_global, n_random, causal, seed=3)
    mask = bb.bigbird_mask(L, block_size, table, n_global, causal)
    q, k, v = (rand(2, 3, L, 4, seed=s) for s in range(3))
    assert_same_fwd_bwd(
        lambda *t: bb.block_sparse_attention(*t, block_size, table, n_global, causal),
        lambda *t: bb.bigbird_reference(*t, mask), (q, k, v),
    )
    m = mixers.build("bigbird", 8, causal=causal, n_heads=2, block_size=block_size,
                     n_global_blocks=n_global, n_random=n_random, seed=3)
    assert m.pattern_pairs(L) == int(m.mask(L).sum())


@pytest.mark.parametrize("causal", [True, False])
def test_bigbird_mixer_dense_and_gathered_paths_equal_reference(causal):
    # blocks of 2, 1 random, 1 global: K·b = 8 (causal) or 10 keys per query block, so the
    # dense SDPA path runs up to L = 32 (40) and the gathered path above.
    m = mixers.build("bigbird", 8, causal=causal, n_heads=2, block_size=2, n_random=1, seed=0).to(F64)
    for L in (7, 32, 45, 61):
        x = torch.randn(2, L, 8, dtype=F64, requires_grad=True)
        assert_same_fwd_bwd(m, m.forward_reference, (x,))


def test_bigbird_mixer_scores_step_and_checkpointed_pattern():
    m = mixers.build("bigbird", 8, n_heads=2, block_size=3, n_global_blocks=2, n_random=2, seed=1).to(F64)
    x = torch.randn(2, 20, 8, dtype=F64)
    torch.testing.assert_close(m(x), m.forward_reference(x), atol=1e-12, rtol=0)
    s = m.scores(x)
    assert torch.equal(s > 0, m.mask(20).expand_as(s))
    state, outs = m.init_state(2, x.device, F64), []
    for t in range(20):
        y_t, state = m.step(x[:, t], state)
        outs.append(y_t)
    torch.testing.assert_close(torch.stack(outs, 1), m(x), atol=1e-10, rtol=0)
    other = mixers.build("bigbird", 8, n_heads=2, block_size=3, n_global_blocks=2, n_random=2, seed=2).to(F64)
    assert not torch.equal(other.mask(20), m.mask(20))
    other.load_state_dict(m.state_dict())  # the pattern travels with the checkpoint
    assert torch.equal(other.mask(20), m.mask(20))


# ------------------------------------------------------------ linear-cost paths: no L × L


@pytest.mark.parametrize("name,options", [
    ("linear", {"n_heads": 1}),
    ("performer", {"n_heads": 1}),
    ("sliding_window", {"n_heads": 1}),
    ("bigbird", {"n_heads": 1, "seed": 0}),
    ("linformer", {"n_heads": 1, "k": 16}),
])
def test_fast_paths_build_no_quadratic_tensor(name, options):
    L = 1024
    cls = mixers.mixer_class(name)
    m = mixers.build(name, 8, causal=cls.supports_causal, max_len=L, **options)
    x = torch.randn(1, L, 8, requires_grad=True)
    with OutputSizes() as probe:
        m(x).sum().backward()
    assert probe.largest < L * L // 8, f"{name}: a tensor of {probe.largest} elements at L={L}"


# ------------------------------------------------------------------------------- linformer


def test_linformer_refuses_causal_and_needs_max_len():
    with pytest.raises(ValueError, match="no causal form"):
        mixers.build("linformer", 8, causal=True, max_len=16)
    with pytest.raises(ValueError, match="needs max_len"):
        mixers.build("linformer", 8, causal=False)
    m = mixers.build("linformer", 8, causal=False, max_len=6, k=64)
    assert m.k_len == 6 and m.E.shape == (6, 6), "k is capped at max_len"
    with pytest.raises(ValueError, match="max_len=6"):
        m(torch.randn(1, 7, 8))
    assert not m.has_scores and not m.has_step
    shared = mixers.build("linformer", 8, causal=False, max_len=6, share_kv=True)
    assert shared.F is None


def linformer_written_out(m, x: torch.Tensor) -> torch.Tensor:
    """Linformer as its paper writes it (Wang et al. 2020, eq. 7): per head,
    softmax(Q (E K)ᵀ / √d_head) (F V) with E, F ∈ R^{k×n} whole, n = max_len, and K, V padded
    with zero rows from L up to n (a shorter sequence is a padded one)."""
    B, L, D = x.shape
    H, Dh, n = m.n_heads, m.d_head, m.max_len
    padded = lambda t: torch.cat([t, t.new_zeros(B, n - L, D)], dim=1)  # noqa: E731
    Q, K, V = m.q_proj(x), padded(m.k_proj(x)), padded(m.v_proj(x))
    E = m.E
    F = m.E if m.F is None else m.F
    heads = []
    for h in range(H):
        c = slice(h * Dh, (h + 1) * Dh)
        logits = Q[..., c] @ (E @ K[..., c]).transpose(-1, -2) / math.sqrt(Dh)  # (B, L, k)
        heads.append(torch.softmax(logits, dim=-1) @ (F @ V[..., c]))
    return m.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("share_kv", [False, True])
@pytest.mark.parametrize("L", [1, 7, 12])
def test_linformer_equals_the_papers_attention_with_zero_padded_keys(L, share_kv):
    """Forward and backward (the input, the projections, E and F) against the paper's form
    written out above; L < max_len uses the first L columns of E, F."""
    torch.manual_seed(L)
    m = mixers.build("linformer", 8, causal=False, max_len=12, n_heads=2, k=5, share_kv=share_kv).to(F64)
    x = torch.randn(2, L, 8, dtype=F64)
    assert_same_fwd_bwd(lambda x, *w: m(x), lambda x, *w: linformer_written_out(m, x), with_weights(m, x))
    if L > 1:
        later = x.clone()
        later[:, -1] += 1.0
        assert not torch.allclose(m(later)[:, 0], m(x)[:, 0]), "non-causal: the last token reaches the first"


# ----------------------------------------------------------------------------------- crate


def test_ista_formula_by_hand():
    """D = [[1, 2], [0, 1]], x = (1, −1): Dx = (−1, −1), DᵀDx = (−1, −3), Dᵀx = (1, 1);
    x + 0.1·((1, 1) − (−1, −3)) − 0.01 = (1.19, −0.61) → ReLU → (1.19, 0)."""
    from seqmix.mixers.crate import ISTA

    ista = ISTA(2, d_ff=999, dropout=0.5).to(F64)
    with torch.no_grad():
        ista.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    out = ista(torch.tensor([[1.0, -1.0]], dtype=F64))
    torch.testing.assert_close(out, torch.tensor([[1.19, 0.0]], dtype=F64), atol=1e-15, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L,n_heads,dim_head", [(1, 2, None), (7, 2, None), (9, 3, 5), (6, 1, 8)])
def test_crate_sdpa_equals_written_out_mssa(causal, L, n_heads, dim_head):
    """MSSA (Yu et al. 2023): softmax(w wᵀ / √dim_head) w with Q = K = V = w = U x, written out
    here, against the mixer's fast path (SDPA), forward and backward (the input and every
    weight); and the module's plain reference against the same. Heads whose width is not
    d / heads (dim_head 5), and one head as wide as d (no output projection)."""
    torch.manual_seed(L)
    m = mixers.build("crate", 8, causal=causal, n_heads=n_heads, dim_head=dim_head).to(F64)
    assert m.qkv.bias is None, "the tied projection has no bias"
    expected = {"qkv.weight"} | ({"to_out.weight", "to_out.bias"} if (n_heads, dim_head) != (1, 8) else set())
    assert set(dict(m.named_parameters())) == expected

    def written_out(x, *weights):
        w = heads_of(m.qkv(x), n_heads)
        return m.to_out(merged(written_out_attention(w, w, w, causal)))

    x = torch.randn(2, L, 8, dtype=F64)
    assert_same_fwd_bwd(lambda x, *w: m(x), written_out, with_weights(m, x))
    assert_same_fwd_bwd(lambda x, *w: m.forward_reference(x), written_out, with_weights(m, x))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_block_drops_the_residual_around_ista(norm):
    torch.manual_seed(0)
    block = Block("crate", 8, {"n_heads": 2}, d_ff=32, dropout=0.0, block=norm).to(F64).eval()
    h = torch.randn(2, 5, 8, dtype=F64)
    if norm == "post":
        mid = block.norm1(h + block.mixer(h))
        expected = block.norm2(block.ffn(mid))
    else:
        mid = h + block.mixer(block.norm1(h))
        expected = block.ffn(block.norm2(mid))
    torch.testing.assert_close(block(h), expected, atol=1e-14, rtol=0)
    # every other mixer keeps the residual around its feed-forward
    soft = Block("softmax", 8, {"n_heads": 2}, d_ff=32, dropout=0.0, block=norm).to(F64).eval()
    if norm == "post":
        mid = soft.norm1(h + soft.mixer(h))
        expected = soft.norm2(mid + soft.ffn(mid))
    else:
        mid = h + soft.mixer(soft.norm1(h))
        expected = mid + soft.ffn(soft.norm2(mid))
    torch.testing.assert_close(soft(h), expected, atol=1e-14, rtol=0)


def test_ista_dictionary_keeps_kaiming_init_in_the_lm():
    d = 64
    lm = CausalLM(LMConfig(arch="crate", vocab_size=50, max_len=16, d_model=d, n_layers=2,
                           mixer_options={"n_heads": 4}))
    bound = math.sqrt(6 / d)  # kaiming_uniform_, a = 0: U(−√(6/d), √(6/d)), std √(2/d) ≈ 0.18
    for block in lm.blocks:
        D = block.ffn.weight
        assert D.abs().max() <= bound
        assert 0.14 < D.std().item() < 0.22, "D lost its Kaiming-uniform init (GPT-2's is 0.02)"
