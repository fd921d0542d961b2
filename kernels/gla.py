"""Chunked gated linear attention, forward and backward (Yang et al. 2024, arXiv:2312.06635).

The specification is ``seqmix.mixers.gla.gla_recurrent_reference``: per (batch, head),

    S_t = Diag(exp(log α_t)) S_{t-1} + k_tᵀ v_t,     o_t = q_t S_t

with q, k, log α: (B, H, L, Dk), v: (B, H, L, Dv), q already scaled, log α ≤ 0. Plain
(causal) linear attention is the gate-free case log α = 0.

Chunkwise form (chunk C = ``chunk_size``, g = cumsum of log α *from the chunk start*, so
g ≤ 0 and non-increasing inside a chunk; h_n = the state entering chunk n):

    h_{n+1} = exp(g_last) ⊙ h_n + (k ⊙ exp(g_last - g))ᵀ v                    (_fwd_h_kernel)
    A_ts    = Σ_d q_td k_sd exp(g_td - g_sd),  s ≤ t in the chunk              (_fwd_A_kernel)
    o       = (q ⊙ exp(g)) h_n + A v                                           (_fwd_o_kernel)

Every exponent is ≤ 0, so strong decays underflow to 0 instead of overflowing. A is formed
in sub-chunks of ``SUBCHUNK`` rows ("secondary chunking", fla ``chunk.py``; the same
algorithm in PyTorch is ``seqmix.kernels.gla_chunked.gla_chunk_reference``): between
sub-chunks the decay is split at a reference row r with g_t ≤ g_r ≤ g_s, so exp(g_t - g_r)
and exp(g_r - g_s) are both ≤ 1 and the block is one matmul; inside a diagonal sub-chunk
exp(g_t - g_s) is formed pairwise in log space.

Backward (everything recomputed from q, k, v, log α; D_n = dLoss/dh_{n+1}):

    D_{n-1} = exp(g_last) ⊙ D_n + (q ⊙ exp(g))ᵀ do                           (_bwd_dh_kernel)
    dA_ts   = do_t · v_s, s ≤ t                                                (_bwd_dA_kernel)
    dv      = Aᵀ do + (k ⊙ exp(g_last - g)) D_n                                (_bwd_dv_kernel)
    dq_t    = exp(g_t) ⊙ (do_t h_nᵀ) + Σ_{s≤t} dA_ts exp(g_t - g_s) ⊙ k_s      (_bwd_dqk_kernel)
    dk_s    = exp(g_last - g_s) ⊙ (v_s D_nᵀ) + Σ_{t≥s} dA_ts exp(g_t - g_s) ⊙ q_t
    d log α_r = Σ_{t ≥ r} (q_t ⊙ dq_t - k_t ⊙ dk_t)    (G_t = Σ_{r≤t} log α_r enters only
                through exp(G_t - G_s): +q dq for t as query, -k dk as key)  (_revcumsum_kernel)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqmix.kernels._common import (
    check_same_device,
    compute_dtype,
    dot_precision,
    interpreted,
    next_pow2,
)
from seqmix.kernels.gla_chunked import (
    SUBCHUNK,  # rows of a secondary chunk; also tl.dot's minimum tile
)


@triton.jit
def _cumsum_kernel(la_ptr, g_ptr, L, K, BT: tl.constexpr, BK: tl.constexpr):
    i_t, i_k, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)
    kk = i_k * BK + tl.arange(0, BK)
    m = (t < L)[:, None] & (kk < K)[None, :]
    ptr = bh * L * K + t[:, None] * K + kk[None, :]
    la = tl.load(la_ptr + ptr, mask=m, other=0.0).to(tl.float32)
    tl.store(g_ptr + ptr, tl.cumsum(la, axis=0), mask=m)


@triton.jit
def _fwd_h_kernel(
    k_ptr, v_ptr, g_ptr, h_ptr, L, K, V, NT,
    PRECISION: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_k, i_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    kk = i_k * BK + tl.arange(0, BK)
    vv = i_v * BV + tl.arange(0, BV)
    km, vm = kk < K, vv < V
    h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(NT):
        tl.store(h_ptr + ((bh * NT + i_t) * K + kk[:, None]) * V + vv[None, :], h,
                 mask=km[:, None] & vm[None, :])
        t = i_t * BT + tl.arange(0, BT)
        tm = t < L
        last = tl.minimum(i_t * BT + BT, L) - 1
        mk = tm[:, None] & km[None, :]
        k = tl.load(k_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mk, other=0.0)
        v = tl.load(v_ptr + bh * L * V + t[:, None] * V + vv[None, :],
                    mask=tm[:, None] & vm[None, :], other=0.0)
        g = tl.load(g_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mk, other=0.0)
        g_last = tl.load(g_ptr + bh * L * K + last * K + kk, mask=km, other=0.0)
        k_dec = k.to(tl.float32) * tl.exp(tl.where(mk, g_last[None, :] - g, 0.0))  # Γ ≤ 1
        h = h * tl.exp(g_last)[:, None] + tl.dot(tl.trans(k_dec.to(v.dtype)), v,
                                                  input_precision=PRECISION)


@triton.jit
def _fwd_A_kernel(
    q_ptr, k_ptr, g_ptr, a_ptr, L, K,
    BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr, BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_t, i_i, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    row0 = i_t * BT + i_i * BC
    t = row0 + tl.arange(0, BC)  # query rows of this sub-chunk
    tm = t < L
    r = tl.minimum(row0, L - 1)  # reference row: g_t ≤ g_r ≤ g_s for t in I, s in J < I
    base = bh * L * K
    for j in range(NC):
        s = i_t * BT + j * BC + tl.arange(0, BC)  # key rows of sub-chunk j
        sm = s < L
        acc = tl.zeros([BC, BC], dtype=tl.float32)
        if j < i_i:
            for k0 in range(0, K, BK):
                kk = k0 + tl.arange(0, BK)
                km = kk < K
                mq, ms = tm[:, None] & km[None, :], sm[:, None] & km[None, :]
                q = tl.load(q_ptr + base + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
                gq = tl.load(g_ptr + base + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
                k = tl.load(k_ptr + base + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                gk = tl.load(g_ptr + base + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                gr = tl.load(g_ptr + base + r * K + kk, mask=km, other=0.0)
                q_rel = q.to(tl.float32) * tl.exp(tl.where(mq, gq - gr[None, :], 0.0))
                k_rel = k.to(tl.float32) * tl.exp(tl.where(ms, gr[None, :] - gk, 0.0))
                acc += tl.dot(q_rel.to(q.dtype), tl.trans(k_rel.to(k.dtype)),
                              input_precision=PRECISION)
        elif j == i_i:
            causal = (tl.arange(0, BC)[:, None] >= tl.arange(0, BC)[None, :])[:, :, None]
            # both rows real: a padded row has g = 0, and exp(0 - g_s) could overflow
            valid = (tm[:, None] & tm[None, :])[:, :, None]
            for k0 in range(0, K, BK):
                kk = k0 + tl.arange(0, BK)
                km = kk < K
                mq = tm[:, None] & km[None, :]
                q = tl.load(q_ptr + base + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
                k = tl.load(k_ptr + base + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
                g = tl.load(g_ptr + base + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
                diff = g[:, None, :] - g[None, :, :]  # g_t - g_s: (BC, BC, BK)
                decay = tl.exp(tl.where(causal & valid, diff, float("-inf")))
                prod = q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :] * decay
                acc += tl.sum(prod, axis=2)
        # zeros above the diagonal sub-chunk keep A a plain lower-triangular matrix
        tl.store(a_ptr + bh * L * BT + t[:, None] * BT + (j * BC + tl.arange(0, BC))[None, :],
                 acc, mask=tm[:, None])


@triton.jit
def _fwd_o_kernel(
    q_ptr, v_ptr, g_ptr, h_ptr, a_ptr, o_ptr, L, K, V, NT,
    PRECISION: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v, i_t, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)
    tm = t < L
    vv = i_v * BV + tl.arange(0, BV)
    vm = vv < V
    mv = tm[:, None] & vm[None, :]
    v = tl.load(v_ptr + bh * L * V + t[:, None] * V + vv[None, :], mask=mv, other=0.0)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for k0 in range(0, K, BK):  # inter-chunk: (q ⊙ exp(g)) h_n
        kk = k0 + tl.arange(0, BK)
        km = kk < K
        mq = tm[:, None] & km[None, :]
        q = tl.load(q_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
        g = tl.load(g_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
        h = tl.load(h_ptr + ((bh * NT + i_t) * K + kk[:, None]) * V + vv[None, :],
                    mask=km[:, None] & vm[None, :], other=0.0)
        q_dec = q.to(tl.float32) * tl.exp(g)
        acc += tl.dot(q_dec.to(v.dtype), h.to(v.dtype), input_precision=PRECISION)
    a = tl.load(a_ptr + bh * L * BT + t[:, None] * BT + tl.arange(0, BT)[None, :],
                mask=tm[:, None], other=0.0)
    acc += tl.dot(a.to(v.dtype), v, input_precision=PRECISION)  # intra-chunk: A v
    tl.store(o_ptr + bh * L * V + t[:, None] * V + vv[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=mv)


@triton.jit
def _bwd_dh_kernel(
    q_ptr, do_ptr, g_ptr, dh_ptr, L, K, V, NT,
    PRECISION: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_k, i_v, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    kk = i_k * BK + tl.arange(0, BK)
    vv = i_v * BV + tl.arange(0, BV)
    km, vm = kk < K, vv < V
    dh = tl.zeros([BK, BV], dtype=tl.float32)
    for i in range(NT):
        i_t = NT - 1 - i
        # D_{i_t}: gradient w.r.t. the state leaving chunk i_t
        tl.store(dh_ptr + ((bh * NT + i_t) * K + kk[:, None]) * V + vv[None, :], dh,
                 mask=km[:, None] & vm[None, :])
        t = i_t * BT + tl.arange(0, BT)
        tm = t < L
        last = tl.minimum(i_t * BT + BT, L) - 1
        mq = tm[:, None] & km[None, :]
        q = tl.load(q_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
        g = tl.load(g_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mq, other=0.0)
        do = tl.load(do_ptr + bh * L * V + t[:, None] * V + vv[None, :],
                     mask=tm[:, None] & vm[None, :], other=0.0)
        g_last = tl.load(g_ptr + bh * L * K + last * K + kk, mask=km, other=0.0)
        q_dec = q.to(tl.float32) * tl.exp(g)
        dh = dh * tl.exp(g_last)[:, None] + tl.dot(tl.trans(q_dec.to(do.dtype)), do,
                                                    input_precision=PRECISION)


@triton.jit
def _bwd_dA_kernel(
    do_ptr, v_ptr, da_ptr, L, V,
    PRECISION: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
):
    i_t, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)
    tm = t < L
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for v0 in range(0, V, BV):
        vv = v0 + tl.arange(0, BV)
        m = tm[:, None] & (vv < V)[None, :]
        do = tl.load(do_ptr + bh * L * V + t[:, None] * V + vv[None, :], mask=m, other=0.0)
        v = tl.load(v_ptr + bh * L * V + t[:, None] * V + vv[None, :], mask=m, other=0.0)
        acc += tl.dot(do, tl.trans(v), input_precision=PRECISION)
    causal = tl.arange(0, BT)[:, None] >= tl.arange(0, BT)[None, :]
    tl.store(da_ptr + bh * L * BT + t[:, None] * BT + tl.arange(0, BT)[None, :],
             tl.where(causal, acc, 0.0), mask=tm[:, None])


@triton.jit
def _bwd_dv_kernel(
    k_ptr, g_ptr, a_ptr, do_ptr, dh_ptr, dv_ptr, L, K, V, NT,
    PRECISION: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v, i_t, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    t = i_t * BT + tl.arange(0, BT)
    tm = t < L
    vv = i_v * BV + tl.arange(0, BV)
    vm = vv < V
    mv = tm[:, None] & vm[None, :]
    do = tl.load(do_ptr + bh * L * V + t[:, None] * V + vv[None, :], mask=mv, other=0.0)
    a = tl.load(a_ptr + bh * L * BT + t[:, None] * BT + tl.arange(0, BT)[None, :],
                mask=tm[:, None], other=0.0)
    acc = tl.dot(tl.trans(a.to(do.dtype)), do, input_precision=PRECISION)  # Aᵀ do
    last = tl.minimum(i_t * BT + BT, L) - 1
    for k0 in range(0, K, BK):  # (k ⊙ exp(g_last - g)) D_n
        kk = k0 + tl.arange(0, BK)
        km = kk < K
        mk = tm[:, None] & km[None, :]
        k = tl.load(k_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mk, other=0.0)
        g = tl.load(g_ptr + bh * L * K + t[:, None] * K + kk[None, :], mask=mk, other=0.0)
        g_last = tl.load(g_ptr + bh * L * K + last * K + kk, mask=km, other=0.0)
        dh = tl.load(dh_ptr + ((bh * NT + i_t) * K + kk[:, None]) * V + vv[None, :],
                     mask=km[:, None] & vm[None, :], other=0.0)
        k_dec = k.to(tl.float32) * tl.exp(tl.where(mk, g_last[None, :] - g, 0.0))
        acc += tl.dot(k_dec.to(do.dtype), dh.to(do.dtype), input_precision=PRECISION)
    tl.store(dv_ptr + bh * L * V + t[:, None] * V + vv[None, :], acc.to(dv_ptr.dtype.element_ty),
             mask=mv)


@triton.jit
def _bwd_dqk_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, h_ptr, do_ptr, dh_ptr, da_ptr, dq_ptr, dk_ptr, dg_ptr,
    L, K, V, NT,
    PRECISION: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_t, i_i, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    row0 = i_t * BT + i_i * BC
    t = row0 + tl.arange(0, BC)  # this program's rows (queries for dq, keys for dk)
    tm = t < L
    last = tl.minimum(i_t * BT + BT, L) - 1
    r_q = tl.minimum(row0, L - 1)  # reference for dq: g_t ≤ g_r ≤ g_s, s in earlier sub-chunks
    r_k = tl.minimum(row0 + BC - 1, L - 1)  # reference for dk: g_t' ≤ g_r ≤ g_s, t' later
    base_k, base_v, base_a = bh * L * K, bh * L * V, bh * L * BT
    # s ≤ t, both rows real (a padded row has g = 0, and exp(0 - g_s) could overflow)
    causal = ((tl.arange(0, BC)[:, None] >= tl.arange(0, BC)[None, :]) & tm[:, None] & tm[None, :])[:, :, None]
    da_diag = tl.load(da_ptr + base_a + t[:, None] * BT + (i_i * BC + tl.arange(0, BC))[None, :],
                      mask=tm[:, None], other=0.0)  # (BC, BC): dA_ts, t and s in this sub-chunk
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        km = kk < K
        mk = tm[:, None] & km[None, :]
        q = tl.load(q_ptr + base_k + t[:, None] * K + kk[None, :], mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + base_k + t[:, None] * K + kk[None, :], mask=mk, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + base_k + t[:, None] * K + kk[None, :], mask=mk, other=0.0)
        g_last = tl.load(g_ptr + base_k + last * K + kk, mask=km, other=0.0)
        # inter-chunk: dq = exp(g) ⊙ do h_nᵀ,  dk = exp(g_last - g) ⊙ v D_nᵀ
        dq_in = tl.zeros([BC, BK], dtype=tl.float32)
        dk_in = tl.zeros([BC, BK], dtype=tl.float32)
        for v0 in range(0, V, BV):
            vv = v0 + tl.arange(0, BV)
            vm = vv < V
            mv = tm[:, None] & vm[None, :]
            do = tl.load(do_ptr + base_v + t[:, None] * V + vv[None, :], mask=mv, other=0.0)
            v = tl.load(v_ptr + base_v + t[:, None] * V + vv[None, :], mask=mv, other=0.0)
            hv = ((bh * NT + i_t) * K + kk[None, :]) * V + vv[:, None]  # (BV, BK): transposed
            mh = vm[:, None] & km[None, :]
            h_t = tl.load(h_ptr + hv, mask=mh, other=0.0)
            dh_t = tl.load(dh_ptr + hv, mask=mh, other=0.0)
            dq_in += tl.dot(do, h_t.to(do.dtype), input_precision=PRECISION)
            dk_in += tl.dot(v, dh_t.to(v.dtype), input_precision=PRECISION)
        dq = dq_in * tl.exp(g)
        dk = dk_in * tl.exp(tl.where(mk, g_last[None, :] - g, 0.0))
        # intra-chunk, earlier sub-chunks j < i (dq) and later ones j > i (dk)
        g_rq = tl.load(g_ptr + base_k + r_q * K + kk, mask=km, other=0.0)
        g_rk = tl.load(g_ptr + base_k + r_k * K + kk, mask=km, other=0.0)
        dq_off = tl.zeros([BC, BK], dtype=tl.float32)
        dk_off = tl.zeros([BC, BK], dtype=tl.float32)
        for j in range(NC):
            s = i_t * BT + j * BC + tl.arange(0, BC)
            sm = s < L
            ms = sm[:, None] & km[None, :]
            if j < i_i:
                k_j = tl.load(k_ptr + base_k + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                g_j = tl.load(g_ptr + base_k + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                da = tl.load(da_ptr + base_a + t[:, None] * BT + (j * BC + tl.arange(0, BC))[None, :],
                             mask=tm[:, None], other=0.0)  # dA[t, s]
                k_rel = k_j.to(tl.float32) * tl.exp(tl.where(ms, g_rq[None, :] - g_j, 0.0))
                dq_off += tl.dot(da, k_rel, input_precision=PRECISION)
            elif j > i_i:
                q_j = tl.load(q_ptr + base_k + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                g_j = tl.load(g_ptr + base_k + s[:, None] * K + kk[None, :], mask=ms, other=0.0)
                da = tl.load(da_ptr + base_a + s[:, None] * BT + (i_i * BC + tl.arange(0, BC))[None, :],
                             mask=sm[:, None], other=0.0)  # dA[s (query), t (key)]
                q_rel = q_j.to(tl.float32) * tl.exp(tl.where(ms, g_j - g_rk[None, :], 0.0))
                dk_off += tl.dot(tl.trans(da), q_rel, input_precision=PRECISION)
        dq += dq_off * tl.exp(tl.where(mk, g - g_rq[None, :], 0.0))
        dk += dk_off * tl.exp(tl.where(mk, g_rk[None, :] - g, 0.0))
        # diagonal sub-chunk, pairwise in log space: X_ts = dA_ts exp(g_t - g_s), s ≤ t
        decay = tl.exp(tl.where(causal, g[:, None, :] - g[None, :, :], float("-inf")))
        x = da_diag[:, :, None] * decay  # (BC_t, BC_s, BK)
        dq += tl.sum(x * k[None, :, :], axis=1)
        dk += tl.sum(x * q[:, None, :], axis=0)
        out = base_k + t[:, None] * K + kk[None, :]
        tl.store(dq_ptr + out, dq.to(dq_ptr.dtype.element_ty), mask=mk)
        tl.store(dk_ptr + out, dk.to(dk_ptr.dtype.element_ty), mask=mk)
        tl.store(dg_ptr + out, q * dq - k * dk, mask=mk)


@triton.jit
def _revcumsum_kernel(x_ptr, y_ptr, L, K, NT, BT: tl.constexpr, BK: tl.constexpr):
    """y_t = Σ_{t' ≥ t} x_t' along the whole sequence (carry across chunks, last to first)."""
    i_k, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    kk = i_k * BK + tl.arange(0, BK)
    km = kk < K
    carry = tl.zeros([BK], dtype=tl.float32)
    for i in range(NT):
        i_t = NT - 1 - i
        t = i_t * BT + tl.arange(0, BT)
        m = (t < L)[:, None] & km[None, :]
        ptr = bh * L * K + t[:, None] * K + kk[None, :]
        x = tl.load(x_ptr + ptr, mask=m, other=0.0)
        tot = tl.sum(x, axis=0)
        y = tot[None, :] - tl.cumsum(x, axis=0) + x + carry[None, :]
        tl.store(y_ptr + ptr, y.to(y_ptr.dtype.element_ty), mask=m)
        carry += tot


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------


def _blocks(K: int, V: int) -> dict[str, int]:
    """Tile sizes: H100-sized on CUDA; 16 under the interpreter so tests cross tile edges."""
    if interpreted(_fwd_o_kernel):
        return {"bk": 16, "bv": 16, "bk_intra": 16, "warps": 4}
    return {
        "bk": min(64, next_pow2(K, 16)),
        "bv": min(64, next_pow2(V, 16)),
        "bk_intra": min(32, next_pow2(K, 16)),
        "warps": 4,
    }


def _check(q, k, v, log_alpha, chunk_size):
    if q.dim() != 4 or k.shape != q.shape or log_alpha.shape != q.shape:
        raise ValueError(
            f"chunk_gla expects q, k, log_alpha of one shape (B, H, L, Dk); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(log_alpha.shape)}"
        )
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (B, H, L, Dv) matching q's (B, H, L); got {tuple(v.shape)}")
    if chunk_size < SUBCHUNK or chunk_size & (chunk_size - 1):
        raise ValueError(
            f"chunk_gla needs chunk_size a power of two ≥ {SUBCHUNK} (Triton tiles), got "
            f"{chunk_size}; use 16, 32, 64 or 128"
        )


class ChunkGLA(torch.autograd.Function):
    @staticmethod
    def _states(q, k, v, g, BT, blk, prec):
        """g (chunk-local cumsum), h_n for every chunk, and the intra-chunk matrix A."""
        B, H, L, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(L, BT)
        h = torch.empty(B * H, NT, K, V, device=q.device, dtype=torch.float32)
        _fwd_h_kernel[(triton.cdiv(K, blk["bk"]), triton.cdiv(V, blk["bv"]), B * H)](
            k, v, g, h, L, K, V, NT,
            PRECISION=prec, BT=BT, BK=blk["bk"], BV=blk["bv"], num_warps=blk["warps"],
        )
        A = torch.empty(B * H, L, BT, device=q.device, dtype=torch.float32)
        _fwd_A_kernel[(NT, BT // SUBCHUNK, B * H)](
            q, k, g, A, L, K,
            BT=BT, BC=SUBCHUNK, NC=BT // SUBCHUNK, BK=blk["bk_intra"], PRECISION=prec,
            num_warps=blk["warps"],
        )
        return h, A

    @staticmethod
    def _cumsum(log_alpha, BT, blk):
        B, H, L, K = log_alpha.shape
        g = torch.empty(B, H, L, K, device=log_alpha.device, dtype=torch.float32)
        _cumsum_kernel[(triton.cdiv(L, BT), triton.cdiv(K, blk["bk"]), B * H)](
            log_alpha, g, L, K, BT=BT, BK=blk["bk"], num_warps=blk["warps"],
        )
        return g

    @staticmethod
    def forward(ctx, q, k, v, log_alpha, chunk_size):
        check_same_device(_fwd_o_kernel, q, k, v, log_alpha)
        q, k, v, log_alpha = (t.contiguous() for t in (q, k, v, log_alpha))
        B, H, L, K = q.shape
        V = v.shape[-1]
        BT, NT = chunk_size, triton.cdiv(L, chunk_size)
        blk = _blocks(K, V)
        prec = dot_precision(compute_dtype(v))
        g = ChunkGLA._cumsum(log_alpha, BT, blk)
        h, A = ChunkGLA._states(q, k, v, g, BT, blk, prec)
        o = torch.empty_like(v)
        _fwd_o_kernel[(triton.cdiv(V, blk["bv"]), NT, B * H)](
            q, v, g, h, A, o, L, K, V, NT,
            PRECISION=prec, BT=BT, BK=blk["bk"], BV=blk["bv"], num_warps=blk["warps"],
        )
        ctx.save_for_backward(q, k, v, log_alpha)
        ctx.chunk_size = chunk_size
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, log_alpha = ctx.saved_tensors
        BT = ctx.chunk_size
        B, H, L, K = q.shape
        V = v.shape[-1]
        NT, NC = triton.cdiv(L, BT), BT // SUBCHUNK
        blk = _blocks(K, V)
        prec = dot_precision(compute_dtype(v))
        do = do.contiguous().to(v.dtype)
        g = ChunkGLA._cumsum(log_alpha, BT, blk)
        h, A = ChunkGLA._states(q, k, v, g, BT, blk, prec)
        dh = torch.empty_like(h)
        _bwd_dh_kernel[(triton.cdiv(K, blk["bk"]), triton.cdiv(V, blk["bv"]), B * H)](
            q, do, g, dh, L, K, V, NT,
            PRECISION=prec, BT=BT, BK=blk["bk"], BV=blk["bv"], num_warps=blk["warps"],
        )
        dA = torch.empty(B * H, L, BT, device=q.device, dtype=torch.float32)
        _bwd_dA_kernel[(NT, B * H)](
            do, v, dA, L, V, PRECISION=prec, BT=BT, BV=blk["bv"], num_warps=blk["warps"],
        )
        dv = torch.empty_like(v)
        _bwd_dv_kernel[(triton.cdiv(V, blk["bv"]), NT, B * H)](
            k, g, A, do, dh, dv, L, K, V, NT,
            PRECISION=prec, BT=BT, BK=blk["bk"], BV=blk["bv"], num_warps=blk["warps"],
        )
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        dg = torch.empty(B, H, L, K, device=q.device, dtype=torch.float32)
        _bwd_dqk_kernel[(NT, NC, B * H)](
            q, k, v, g, h, do, dh, dA, dq, dk, dg, L, K, V, NT,
            PRECISION=prec, BT=BT, BC=SUBCHUNK, NC=NC, BK=blk["bk_intra"], BV=blk["bv"],
            num_warps=blk["warps"],
        )
        dla = torch.empty_like(log_alpha)
        _revcumsum_kernel[(triton.cdiv(K, blk["bk"]), B * H)](
            dg, dla, L, K, NT, BT=BT, BK=blk["bk"], num_warps=blk["warps"],
        )
        return dq, dk, dv, dla, None


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_alpha: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked GLA; equals ``gla_recurrent_reference(q, k, v, log_alpha)``.

    q, k, log_alpha: (B, H, L, Dk); v: (B, H, L, Dv); q already scaled; log_alpha ≤ 0
    (log_alpha = 0 is causal linear attention). chunk_size: a power of two ≥ 16.
    Returns o: (B, H, L, Dv) in v's dtype.
    """
    _check(q, k, v, log_alpha, chunk_size)
    return ChunkGLA.apply(q, k, v, log_alpha, int(chunk_size))
