"""GLA's chunkwise forms in PyTorch (Yang et al., ICML 2024, arXiv:2312.06635; fla
``chunk.py``): the CPU path of the GLA mixer (``gla_chunk``), differentiated by autograd. The
specification they equal is ``seqmix.mixers.gla.gla_recurrent_reference``
(tests/mixers/test_mixers_recurrent.py). They sit beside the Triton kernel (``seqmix.kernels.gla``),
whose algorithm ``gla_chunk_reference`` is, with the same secondary chunks (``SUBCHUNK``, which
the kernel imports from here); no Triton here, so a CPU machine imports it without triton.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from seqmix.kernels.linear_scan import linear_scan

# Rows of a secondary chunk inside a chunk (fla uses 16; tl.dot's minimum tile): the Triton
# kernel's, and the sub-chunk gcd(C, 16) of ``gla_chunk_reference``.
SUBCHUNK = 16


def _masked_exp(exponent: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(exponent) where ``keep``, exactly 0 elsewhere (masked before exp, so no inf)."""
    return exponent.masked_fill(~keep, float("-inf")).exp()


def gla_chunk_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, chunk_size: int = 64
) -> torch.Tensor:
    """The chunkwise-parallel form of ``gla_recurrent_reference`` (Yang et al. 2024), secondary
    chunking inside (fla ``chunk.py``): no exp(+Σ log α) is formed, so strong decays underflow
    to 0 instead of overflowing. ``chunk_size`` is C; any L works (the tail chunk is padded
    with zeros and log α = 0); half-precision inputs are computed in fp32 and cast back."""
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = v.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, log_alpha = (t.float() for t in (q, k, v, log_alpha))
    C = chunk_size
    c = math.gcd(C, SUBCHUNK)  # sub-chunk length
    pad = (-L) % C
    if pad:
        q, k, v, log_alpha = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_alpha))
    N, Ns = (L + pad) // C, C // c

    q, k, log_alpha = (t.reshape(B, H, N, C, Dk) for t in (q, k, log_alpha))
    v = v.reshape(B, H, N, C, Dv)
    g = log_alpha.cumsum(dim=-2)  # log b_t / b_{chunk start}: ≤ 0, non-increasing in t
    g_last = g[..., -1:, :]  # log γ_n: (B, H, N, 1, Dk)

    # Inter-chunk: S_[n] = γ_n S_[n-1] + (K ⊙ Γ)ᵀ V with Γ_t = b_end / b_t ≤ 1.
    U = (k * (g_last - g).exp()).transpose(-1, -2) @ v  # (B, H, N, Dk, Dv)
    decay = g_last.squeeze(-2).exp()[..., None]  # γ_n: (B, H, N, Dk, 1)
    S = q.new_zeros(B, H, Dk, Dv)
    S_before = []  # the state entering chunk n
    # unbind, not decay[:, :, n] in the loop: indexing one chunk per step makes autograd
    # zero-fill a gradient of the full (B, H, N, ...) size at every step, O(N²) backward.
    for decay_n, U_n in zip(decay.unbind(2), U.unbind(2)):  # L / C steps on (Dk, Dv) states
        S_before.append(S)
        S = decay_n * S + U_n
    o = (q * g.exp()) @ torch.stack(S_before, dim=2)  # (Q ⊙ Λ) S_[n-1]: (B, H, N, C, Dv)

    # Intra-chunk, secondary chunking: sub-chunks of c tokens.
    qs, ks, gs = (t.reshape(B, H, N, Ns, c, Dk) for t in (q, k, g))
    vs = v.reshape(B, H, N, Ns, c, Dv)
    # Diagonal sub-chunks: A_ij = Σ_d q_i k_j exp(g_i - g_j), j ≤ i, pairwise in log space.
    tril = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    pair_decay = _masked_exp(gs[..., :, None, :] - gs[..., None, :, :], tril[..., None])
    A = (qs[..., :, None, :] * ks[..., None, :, :] * pair_decay).sum(-1)  # (B, H, N, Ns, c, c)
    o_intra = A @ vs  # (B, H, N, Ns, c, Dv)
    if Ns > 1:
        # Off-diagonal sub-chunks I > J: exp(g_i - g_j) = exp(g_i - r_I) · exp(r_I - g_j) with
        # r_I = g at the last token of sub-chunk I-1, so both factors are ≤ 1.
        r = gs[..., :-1, -1:, :]  # (B, H, N, Ns-1, 1, Dk): references of query sub-chunks 1..Ns-1
        q_rel = qs[..., 1:, :, :] * (gs[..., 1:, :, :] - r).exp()  # (B, H, N, Ns-1, c, Dk)
        earlier = torch.ones(Ns - 1, Ns, dtype=torch.bool, device=q.device).tril()  # J ≤ I-1
        k_rel = ks[..., None, :, :, :] * _masked_exp(
            r[..., None, :, :] - gs[..., None, :, :, :], earlier[:, :, None, None]
        )  # (B, H, N, Ns-1, Ns, c, Dk): key sub-chunk J seen from query sub-chunk I
        A_off = q_rel[..., :, None, :, :] @ k_rel.transpose(-1, -2)  # (B, H, N, Ns-1, Ns, c, c)
        o_off = torch.einsum("bhnijxy,bhnjyv->bhnixv", A_off, vs)
        o_intra = torch.cat([o_intra[..., :1, :, :], o_intra[..., 1:, :, :] + o_off], dim=-3)
    o = o + o_intra.reshape(B, H, N, C, Dv)
    return o.reshape(B, H, N * C, Dv)[:, :, :L].to(out_dtype)


def gla_chunk_hierarchical(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, chunk_size: int = 64
) -> torch.Tensor:
    """``gla_recurrent_reference`` by chunks whose inside is split in halves: the CPU path.

    Same arguments and result; ``chunk_size`` C must be a power of two. Across chunks the
    state is carried by ``seqmix.kernels.linear_scan.linear_scan`` (no Python loop over chunks).
    Inside a chunk every pair j < i lies in exactly one block of s = C, C/2, …, 2 tokens with
    j in its first half and i in its second; splitting the decay at the end of the first
    half (both factors ≤ 1) makes each level two matrix products on rescaled q and k (the
    secondary chunking of §5.1 applied recursively). Nothing of size C × C × d_k is
    materialised: per head O(L (d_k log C + C + d_v)) work.
    """
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = v.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, log_alpha = (t.float() for t in (q, k, v, log_alpha))
    C = min(chunk_size, 1 << max(L - 1, 0).bit_length())  # a shorter sequence: one chunk
    pad = (-L) % C
    if pad:
        q, k, v, log_alpha = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_alpha))
    Lp = L + pad
    g = log_alpha.reshape(B, H, Lp // C, C, Dk).cumsum(dim=-2).reshape(B, H, Lp, Dk)
    o = (q * k).sum(-1, keepdim=True) * v  # j = i
    s = 2
    while s <= C:  # the second half of every s-block reads its first half
        h, n = s // 2, Lp // s
        # unbind into (first half, second half): one backward that stacks the two gradients,
        # where indexing each half would zero-fill a full-size gradient per index.
        (q_lo, q_hi), (k_lo, _), (v_lo, _), (g_lo, g_hi), (o_lo, o_hi) = (
            t.view(B, H, n, 2, h, t.shape[-1]).unbind(3) for t in (q, k, v, g, o))
        r = g_lo[..., -1:, :]  # g at the last token of the first half
        q_up = q_hi * (g_hi - r).exp()
        k_low = k_lo * (r - g_lo).exp()
        cross = (q_up @ k_low.transpose(-1, -2)) @ v_lo  # (B, H, n, h, Dv)
        o = torch.stack([o_lo, o_hi + cross], dim=3).view(B, H, Lp, Dv)
        s *= 2
    o = o + _gla_across_chunks(q, k, v, g, C)
    return o[:, :, :L].to(out_dtype)


def _gla_across_chunks(q, k, v, g, C: int) -> torch.Tensor:
    """(Q ⊙ Λ) S_[n-1] of every chunk n (zero for the first), S carried by linear_scan."""
    B, H, Lp, Dk = q.shape
    N = Lp // C
    if N == 1:
        return torch.zeros_like(v)
    qc, kc, gc = (t.view(B, H, N, C, Dk) for t in (q, k, g))
    vc = v.view(B, H, N, C, v.shape[-1])
    g_last = gc[..., -1:, :]  # log γ_n
    U = (kc * (g_last - gc).exp()).transpose(-1, -2) @ vc  # (B, H, N, Dk, Dv)
    decay = g_last.transpose(-1, -2).exp().expand_as(U)  # γ_n per key feature
    time_major = lambda t: t[:, :, :-1].permute(2, 0, 1, 3, 4)  # noqa: E731  chunks 0..N-2 first
    S = linear_scan(time_major(decay), time_major(U)).permute(1, 2, 0, 3, 4)  # after chunk n
    S_before = torch.cat([torch.zeros_like(S[:, :, :1]), S], dim=2)
    return ((qc * gc.exp()) @ S_before).view(B, H, Lp, v.shape[-1])


def gla_chunk(q, k, v, log_alpha, C: int) -> torch.Tensor:
    """The PyTorch chunked form: hierarchical when C is a power of two (halves all the way
    down), else one level of chunks."""
    if C & (C - 1) == 0:
        return gla_chunk_hierarchical(q, k, v, log_alpha, C)
    return gla_chunk_reference(q, k, v, log_alpha, C)
