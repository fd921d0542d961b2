"""Token Statistics Self-Attention (ToST), causal and non-causal, forward and backward.

The specification is ``seqmix.mixers.tssa.tssa_reference(w, temp, denom_bias, causal)``
(the official code's causal and non-causal forms, see there); w: (B, H, L, p), per head,
before c_proj.

Causal, prefix sums over s ≤ t, per head k and feature c:
    A_t = max(Σ w_s², 1e-12);  Π_t = softmax_k(temp_k (Σ_c w_t²/A_t + p·b_{k,t}))
    M_t = Σ Π_s w_s²;  Z_t = Σ Π_s + 1e-8;  y_t = -Π_t w_t / (1 + M_t/Z_t)
Non-causal, sums over all tokens:
    n_c = max(‖w_{:,c}‖, 1e-12);  Π_t = softmax_k(temp_k Σ_c w_t²/n_c²)
    M = Σ_t Π_t w_t²;  Z = Σ_t Π_t + 1e-8;  y_t = -Π_t w_t / (1 + M/Z)

Every quantity couples the heads of one token (softmax over heads) and the tokens of one
sequence (prefix or total sums), and costs O(1) per element, so the kernels are
memory-bound scans: one program per sequence walks its tokens in blocks of BT with all
heads and features of a block in registers as one (H, BT, p) tile and the running sums as
carries. Nothing of size L × L exists.

Backward (R = 1/(1 + M/Z), E = Π w dy R² = dLoss/d(M/Z)):
  causal: dM_t = E_t/Z_t, dZ_t = -Σ_c E_t M_t/Z_t²; their suffix sums RM_s, RZ_s give
    dΠ_s = -Σ_c dy w R + Σ_c w_s² RM_s + RZ_s, then the softmax and temp, and
    dA_t = -F_t w_t²/A_t² (F = temp·dlogit; zero where the clamp is active), whose suffix
    sum RA_s closes dw = -Π dy R + 2w(Π RM + F/A + RA). One reverse pass over the blocks,
    the forward's prefix sums at each block start are saved by the forward (exact, no
    subtraction of suffixes from totals).
  non-causal: the same with totals in place of suffix sums, plus the gradient through the
    column norm; passes over the sequence: totals, then Σ E, then Σ F w², then dw.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqmix.kernels._common import check_same_device, interpreted, next_pow2


@triton.jit
def _load_block(ptr, base, t0, H, L, P, H_PAD: tl.constexpr, BT: tl.constexpr, P_PAD: tl.constexpr):
    """One (H_PAD, BT, P_PAD) tile of a (B, H, L, P) tensor, zero outside; plus its masks."""
    hh = tl.arange(0, H_PAD)[:, None, None]
    t = t0 + tl.arange(0, BT)[None, :, None]
    cc = tl.arange(0, P_PAD)[None, None, :]
    tok = (hh < H) & (t < L)  # (H_PAD, BT, 1)
    m = tok & (cc < P)
    x = tl.load(ptr + base + (hh * L + t) * P + cc, mask=m, other=0.0).to(tl.float32)
    return x, m, tok, hh, t, cc


@triton.jit
def _softmax_heads(logit, tok, hh, H):
    """Π = softmax over heads (axis 0) of (H_PAD, BT, 1) logits; 0 on padded heads/tokens."""
    logit = tl.where(hh < H, logit, float("-inf"))
    e = tl.exp(logit - tl.max(logit, axis=0, keep_dims=True))
    pi = e / tl.sum(e, axis=0, keep_dims=True)
    return tl.where(tok, pi, 0.0)


@triton.jit
def _token_cumsum(x, cc, P_PAD: tl.constexpr, REVERSE: tl.constexpr):
    """Prefix (or suffix) sums over tokens (axis 1) of a per-(head, token) (H_PAD, BT, 1)
    value, scanned as a full (H_PAD, BT, P_PAD) tile and read back from column 0 (exact: the
    other columns add zeros). Triton 3.6 fails to lower a scan of the thin tile at some
    shapes (ScanOpToLLVM.cpp assertion, issue 24); the full tile's scan lowers everywhere."""
    full = x + tl.zeros([1, 1, P_PAD], dtype=tl.float32)
    scanned = tl.cumsum(full, axis=1, reverse=REVERSE)
    return tl.sum(tl.where(cc == 0, scanned, 0.0), axis=2, keep_dims=True)


@triton.jit
def _causal_fwd_kernel(
    w_ptr, temp_ptr, bias_ptr, y_ptr, ca_ptr, cm_ptr, cz_ptr,
    H, L, P, LMAX, NB,
    HAS_BIAS: tl.constexpr, H_PAD: tl.constexpr, P_PAD: tl.constexpr, BT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * H * L * P
    hs = tl.arange(0, H_PAD)
    temp = tl.load(temp_ptr + hs, mask=hs < H, other=0.0).to(tl.float32)[:, None, None]
    carry_a = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)  # Σ w²
    carry_m = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)  # Σ Π w²
    carry_z = tl.zeros([H_PAD, 1, 1], dtype=tl.float32)  # Σ Π
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        # the prefix sums entering this block, for the backward
        cbase = (b * NB + blk) * H
        tl.store(ca_ptr + (cbase + hh) * P + cc, carry_a, mask=(hh < H) & (cc < P))
        tl.store(cm_ptr + (cbase + hh) * P + cc, carry_m, mask=(hh < H) & (cc < P))
        tl.store(cz_ptr + cbase + hh, carry_z, mask=hh < H)
        w2 = w * w
        A = tl.maximum(tl.cumsum(w2, axis=1) + carry_a, 1e-12)
        s = tl.sum(w2 / A, axis=2, keep_dims=True)  # Σ_c w²/A: (H_PAD, BT, 1)
        if HAS_BIAS:
            s += P * tl.load(bias_ptr + hh * LMAX + t, mask=tok, other=0.0).to(tl.float32)
        pi = _softmax_heads(temp * s, tok, hh, H)
        M = tl.cumsum(pi * w2, axis=1) + carry_m
        Z = _token_cumsum(pi, cc, P_PAD, False) + carry_z + 1e-8
        y = -pi * w / (1.0 + M / Z)
        tl.store(y_ptr + base + (hh * L + t) * P + cc, y.to(y_ptr.dtype.element_ty), mask=m)
        carry_a += tl.sum(w2, axis=1, keep_dims=True)
        carry_m += tl.sum(pi * w2, axis=1, keep_dims=True)
        carry_z += tl.sum(pi, axis=1, keep_dims=True)


@triton.jit
def _causal_bwd_kernel(
    w_ptr, dy_ptr, temp_ptr, bias_ptr, ca_ptr, cm_ptr, cz_ptr, dw_ptr, dtemp_ptr, dbias_ptr,
    H, L, P, LMAX, NB,
    HAS_BIAS: tl.constexpr, H_PAD: tl.constexpr, P_PAD: tl.constexpr, BT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * H * L * P
    hs = tl.arange(0, H_PAD)
    temp = tl.load(temp_ptr + hs, mask=hs < H, other=0.0).to(tl.float32)[:, None, None]
    carry_rm = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)  # Σ_{t > block} dM_t
    carry_ra = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)  # Σ_{t > block} dA_t
    carry_rz = tl.zeros([H_PAD, 1, 1], dtype=tl.float32)  # Σ_{t > block} dZ_t
    dtemp = tl.zeros([H_PAD, 1, 1], dtype=tl.float32)
    for i in range(NB):
        blk = NB - 1 - i
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        dy, _, _, _, _, _ = _load_block(dy_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        cbase = (b * NB + blk) * H
        hc = (hh < H) & (cc < P)
        # forward, recomputed from the saved prefix sums at the block start
        w2 = w * w
        a_raw = tl.cumsum(w2, axis=1) + tl.load(ca_ptr + (cbase + hh) * P + cc, mask=hc, other=0.0)
        A = tl.maximum(a_raw, 1e-12)
        s = tl.sum(w2 / A, axis=2, keep_dims=True)
        if HAS_BIAS:
            s += P * tl.load(bias_ptr + hh * LMAX + t, mask=tok, other=0.0).to(tl.float32)
        pi = _softmax_heads(temp * s, tok, hh, H)
        M = tl.cumsum(pi * w2, axis=1) + tl.load(cm_ptr + (cbase + hh) * P + cc, mask=hc, other=0.0)
        Z = _token_cumsum(pi, cc, P_PAD, False) + tl.load(cz_ptr + cbase + hh, mask=hh < H, other=0.0) + 1e-8
        R = 1.0 / (1.0 + M / Z)
        # y = -Π w R
        dpi = -tl.sum(dy * w * R, axis=2, keep_dims=True)
        E = pi * w * dy * R * R  # dLoss/d(M/Z)
        dM = E / Z
        dZ = -tl.sum(E * M, axis=2, keep_dims=True) / (Z * Z)
        RM = tl.cumsum(dM, axis=1, reverse=True) + carry_rm  # Σ_{t ≥ s} dM_t
        RZ = _token_cumsum(dZ, cc, P_PAD, True) + carry_rz
        dpi += tl.sum(w2 * RM, axis=2, keep_dims=True) + RZ
        # softmax over heads, then logit = temp · s
        dlogit = pi * (dpi - tl.sum(pi * dpi, axis=0, keep_dims=True))
        dlogit = tl.where(tok, dlogit, 0.0)
        dtemp += tl.sum(dlogit * s, axis=1, keep_dims=True)
        F = dlogit * temp  # dLoss/d(Σ_c w²/A + p·b), per token and head
        if HAS_BIAS:
            tl.store(dbias_ptr + (b * H + hh) * L + t, F * P, mask=tok)
        dA = tl.where(a_raw >= 1e-12, -F * w2 / (A * A), 0.0)
        RA = tl.cumsum(dA, axis=1, reverse=True) + carry_ra
        dw = -pi * dy * R + 2.0 * w * (pi * RM + F / A + RA)
        tl.store(dw_ptr + base + (hh * L + t) * P + cc, dw.to(dw_ptr.dtype.element_ty), mask=m)
        carry_rm += tl.sum(dM, axis=1, keep_dims=True)
        carry_rz += tl.sum(dZ, axis=1, keep_dims=True)
        carry_ra += tl.sum(dA, axis=1, keep_dims=True)
    tl.store(dtemp_ptr + b * H + hs, tl.reshape(dtemp, [H_PAD]), mask=hs < H)


@triton.jit
def _noncausal_stats(w_ptr, temp, base, H, L, P, NB,
                     H_PAD: tl.constexpr, P_PAD: tl.constexpr, BT: tl.constexpr):
    """The sequence totals: 1/n_c² (column norms, clamped), M = Σ Π w², Z = Σ Π + 1e-8."""
    colsq = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        colsq += tl.sum(w * w, axis=1, keep_dims=True)
    nrm = tl.maximum(tl.sqrt(colsq), 1e-12)  # F.normalize's clamp
    inv2 = 1.0 / (nrm * nrm)
    M = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)
    Z = tl.zeros([H_PAD, 1, 1], dtype=tl.float32)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        pi = _softmax_heads(temp * tl.sum(w * w * inv2, axis=2, keep_dims=True), tok, hh, H)
        M += tl.sum(pi * w * w, axis=1, keep_dims=True)
        Z += tl.sum(pi, axis=1, keep_dims=True)
    return colsq, inv2, M, Z + 1e-8


@triton.jit
def _noncausal_fwd_kernel(
    w_ptr, temp_ptr, y_ptr, H, L, P, NB,
    H_PAD: tl.constexpr, P_PAD: tl.constexpr, BT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * H * L * P
    hs = tl.arange(0, H_PAD)
    temp = tl.load(temp_ptr + hs, mask=hs < H, other=0.0).to(tl.float32)[:, None, None]
    colsq, inv2, M, Z = _noncausal_stats(w_ptr, temp, base, H, L, P, NB, H_PAD, P_PAD, BT)
    R = 1.0 / (1.0 + M / Z)  # (H_PAD, 1, P_PAD)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        pi = _softmax_heads(temp * tl.sum(w * w * inv2, axis=2, keep_dims=True), tok, hh, H)
        tl.store(y_ptr + base + (hh * L + t) * P + cc, (-pi * w * R).to(y_ptr.dtype.element_ty),
                 mask=m)


@triton.jit
def _noncausal_bwd_kernel(
    w_ptr, dy_ptr, temp_ptr, dw_ptr, dtemp_ptr, H, L, P, NB,
    H_PAD: tl.constexpr, P_PAD: tl.constexpr, BT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * H * L * P
    hs = tl.arange(0, H_PAD)
    temp = tl.load(temp_ptr + hs, mask=hs < H, other=0.0).to(tl.float32)[:, None, None]
    colsq, inv2, M, Z = _noncausal_stats(w_ptr, temp, base, H, L, P, NB, H_PAD, P_PAD, BT)
    R = 1.0 / (1.0 + M / Z)
    # Σ_t E_t, E = Π w dy R²: gives dM = ΣE/Z and dZ = -Σ_c ΣE M/Z²
    e_sum = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        dy, _, _, _, _, _ = _load_block(dy_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        pi = _softmax_heads(temp * tl.sum(w * w * inv2, axis=2, keep_dims=True), tok, hh, H)
        e_sum += tl.sum(pi * w * dy * R * R, axis=1, keep_dims=True)
    dM = e_sum / Z
    dZ = -tl.sum(e_sum * M, axis=2, keep_dims=True) / (Z * Z)
    # pass over dlogit: dtemp and d(1/n²) = Σ_t F w² (F = temp·dlogit)
    dtemp = tl.zeros([H_PAD, 1, 1], dtype=tl.float32)
    d_inv2 = tl.zeros([H_PAD, 1, P_PAD], dtype=tl.float32)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        dy, _, _, _, _, _ = _load_block(dy_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        s = tl.sum(w * w * inv2, axis=2, keep_dims=True)
        pi = _softmax_heads(temp * s, tok, hh, H)
        dpi = -tl.sum(dy * w * R, axis=2, keep_dims=True) + tl.sum(w * w * dM, axis=2,
                                                                   keep_dims=True) + dZ
        dlogit = tl.where(tok, pi * (dpi - tl.sum(pi * dpi, axis=0, keep_dims=True)), 0.0)
        dtemp += tl.sum(dlogit * s, axis=1, keep_dims=True)
        d_inv2 += tl.sum(dlogit * temp * w * w, axis=1, keep_dims=True)
    # 1/n² = 1/colsq where the clamp is inactive: d colsq = -d_inv2 / colsq²
    d_colsq = tl.where(tl.sqrt(colsq) >= 1e-12, -d_inv2 * inv2 * inv2, 0.0)
    for blk in range(NB):
        w, m, tok, hh, t, cc = _load_block(w_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        dy, _, _, _, _, _ = _load_block(dy_ptr, base, blk * BT, H, L, P, H_PAD, BT, P_PAD)
        s = tl.sum(w * w * inv2, axis=2, keep_dims=True)
        pi = _softmax_heads(temp * s, tok, hh, H)
        dpi = -tl.sum(dy * w * R, axis=2, keep_dims=True) + tl.sum(w * w * dM, axis=2,
                                                                   keep_dims=True) + dZ
        dlogit = tl.where(tok, pi * (dpi - tl.sum(pi * dpi, axis=0, keep_dims=True)), 0.0)
        dw = -pi * dy * R + 2.0 * w * (pi * dM + dlogit * temp * inv2 + d_colsq)
        tl.store(dw_ptr + base + (hh * L + t) * P + cc, dw.to(dw_ptr.dtype.element_ty), mask=m)
    tl.store(dtemp_ptr + b * H + hs, tl.reshape(dtemp, [H_PAD]), mask=hs < H)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------


def _block_t(H_PAD: int, P_PAD: int) -> int:
    """Tokens per block: 16 under the interpreter (tests cross block edges); on a GPU as many
    as keep the (H, BT, p) tile near 8K fp32 values (32 at H=4, p=64)."""
    if interpreted(_causal_fwd_kernel):
        return 16
    return max(16, min(128, 8192 // (H_PAD * P_PAD)))


class TSSA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, temp, denom_bias, causal):
        check_same_device(_causal_fwd_kernel, w, temp, denom_bias if causal else None)
        w = w.contiguous()
        temp = temp.contiguous()
        B, H, L, P = w.shape
        H_PAD, P_PAD = next_pow2(H), next_pow2(P)
        BT = _block_t(H_PAD, P_PAD)
        NB = triton.cdiv(L, BT)
        y = torch.empty_like(w)
        meta = dict(H_PAD=H_PAD, P_PAD=P_PAD, BT=BT, num_warps=4)
        if causal:
            has_bias = denom_bias is not None
            bias = denom_bias.contiguous() if has_bias else temp
            lmax = denom_bias.shape[1] if has_bias else L
            ca = torch.empty(B, NB, H, P, device=w.device, dtype=torch.float32)
            cm = torch.empty_like(ca)
            cz = torch.empty(B, NB, H, device=w.device, dtype=torch.float32)
            _causal_fwd_kernel[(B,)](w, temp, bias, y, ca, cm, cz, H, L, P, lmax, NB,
                                     HAS_BIAS=has_bias, **meta)
            ctx.save_for_backward(w, temp, bias, ca, cm, cz)
            ctx.bias_shape = tuple(denom_bias.shape) if has_bias else None
        else:
            _noncausal_fwd_kernel[(B,)](w, temp, y, H, L, P, NB, **meta)
            ctx.save_for_backward(w, temp)
        ctx.causal = causal
        ctx.meta = meta
        return y

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous().to(ctx.saved_tensors[0].dtype)
        meta = ctx.meta
        if ctx.causal:
            w, temp, bias, ca, cm, cz = ctx.saved_tensors
        else:
            w, temp = ctx.saved_tensors
        B, H, L, P = w.shape
        NB = triton.cdiv(L, meta["BT"])
        dw = torch.empty_like(w)
        dtemp = torch.empty(B, H, device=w.device, dtype=torch.float32)
        dbias = None
        if ctx.causal:
            has_bias = ctx.bias_shape is not None
            lmax = ctx.bias_shape[1] if has_bias else L
            dbias_part = torch.zeros(B, H, L, device=w.device, dtype=torch.float32)
            _causal_bwd_kernel[(B,)](w, dy, temp, bias, ca, cm, cz, dw, dtemp, dbias_part,
                                     H, L, P, lmax, NB, HAS_BIAS=has_bias, **meta)
            if has_bias:
                dbias = torch.zeros(ctx.bias_shape, device=w.device, dtype=bias.dtype)
                dbias[:, :L, 0] = dbias_part.sum(0).to(bias.dtype)
        else:
            _noncausal_bwd_kernel[(B,)](w, dy, temp, dw, dtemp, H, L, P, NB, **meta)
        return dw, dtemp.sum(0).to(temp.dtype), dbias, None


def tssa(
    w: torch.Tensor,
    temp: torch.Tensor,
    denom_bias: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """TSSA per head before c_proj; equals ``seqmix.mixers.tssa.tssa_reference``.

    w: (B, H, L, p); temp: (H,); denom_bias: (H, L_max, 1) with L ≤ L_max, or None (the
    causal form then adds no per-position bias; the non-causal form ignores it).
    Returns y: (B, H, L, p) in w's dtype.
    """
    if w.dim() != 4:
        raise ValueError(f"tssa expects w of shape (B, H, L, p), got {tuple(w.shape)}")
    H, L = w.shape[1], w.shape[2]
    if temp.shape != (H,):
        raise ValueError(f"temp must be ({H},), got {tuple(temp.shape)}")
    if causal and denom_bias is not None and (denom_bias.shape[0] != H or denom_bias.shape[1] < L):
        raise ValueError(
            f"denom_bias must be (H={H}, L_max ≥ {L}, 1), got {tuple(denom_bias.shape)}; build the "
            "mixer with a larger max_len"
        )
    return TSSA.apply(w, temp, denom_bias if causal else None, bool(causal))
