"""Fused Causal Grassmann mixing (Zhang 2025, arXiv:2512.19428, §3.2): z -> g without the Plücker tensor.

The specification is ``seqmix.mixers.grassmann.grassmann_mix_reference`` with positive
offsets: g_t = W · mean_{Δ valid} p̂(z_t, z_{t-Δ}) + b, zero where no offset is valid.

Why it can be fused this far: the Plücker map p(a, b)_ij = a_i b_j - a_j b_i is *bilinear*,
so the mean over offsets collapses onto one vector before any Plücker feature exists:

    p̄_t = Σ_k s_tk p(z_t, z_{t-Δk}) = p(z_t, c_t),    c_t = Σ_k s_tk z_{t-Δk}        (1)
    s_tk = [t ≥ Δk] / (count_t · max(‖p(z_t, z_{t-Δk})‖, ε))      (1/count_t unnormalised)

so a position costs one Plücker vector of C = r(r-1)/2 numbers, not one per offset, and
nothing of size L × offsets × C is ever written. ‖p(a, b)‖ needs no Plücker vector either:
‖p(a, b)‖ = ‖a‖·‖b - (a·b/‖a‖²) a‖ (Lagrange's identity in its Gram-Schmidt form, which
avoids the cancellation in ‖a‖²‖b‖² - (a·b)²).

Forward, two kernels:
  _prep_kernel   per token: s (N, M), rn = 1/‖p‖ where unclamped (N, M), c (N, r)   [fp32]
  _fwd_kernel    per (token tile, d tile): p̄ tile by tile over C in registers, acc += p̄ Wᵀ
Backward, three kernels (dp̄_t = Wᵀ dg_t; Ḡ_t its r×r antisymmetric matrix):
  _bwd_gbar_kernel  w_t = Ḡ_t z_t, y_t = Ḡ_t c_t; dp̄ is produced directly as the r×r
                    matrix by a matmul with the antisymmetrised weight, never stored
  _bwd_dz_kernel    dz from closed forms (below); z_t gets gradient as the "current"
                    vector of t and as the "past" vector of every t+Δ (gathered, no atomics)
  _bwd_dw_kernel    dW = Σ_t dg_tᵀ p̄_t (p̄ recomputed from z, c), db = Σ_{valid t} dg_t,
                    per-split partials summed afterwards (deterministic)

Backward closed forms (G(x) = antisymmetric matrix of x, a = z_t, b_k = z_{t-Δk}):
  through (1) with s fixed:  dz_t += Ḡ_t c_t,  dz_{t-Δk} += -s_tk Ḡ_t z_t,  ds_tk = -w_t·b_k
  through s_tk = 1/(count ‖p_k‖):  dp_k = -β_tk p_k,  β_tk = s_tk rn_tk² ds_tk, and with
  G(p(a, b)) = a bᵀ - b aᵀ:  dz_t += -β (a‖b‖² - b(a·b)),  dz_{t-Δk} += β (a(a·b) - b‖a‖²).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensor

from seqmix.kernels._common import (
    check_same_device,
    compute_dtype,
    dot_precision,
    interpreted,
    next_pow2,
    sm_count,
)

# ---------------------------------------------------------------------------------------
# Kernels. Tokens are flattened: n = b·L + t over N = B·L rows; z, c, w, y are (N, R).
# ---------------------------------------------------------------------------------------


@triton.jit
def _prep_kernel(
    z_ptr, off_ptr, s_ptr, rn_ptr, c_ptr,
    N, L, M, eps,
    R: tl.constexpr, R_PAD: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = n % L
    nmask = n < N
    cols = tl.arange(0, R_PAD)
    rmask = cols < R
    a = tl.load(z_ptr + n[:, None] * R + cols[None, :], mask=nmask[:, None] & rmask[None, :],
                other=0.0).to(tl.float32)  # (BLOCK_N, R_PAD)
    # |W_t|: offsets (with multiplicity) that reach back inside the sequence
    count = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(M):
        delta = tl.load(off_ptr + k)
        count += (t >= delta).to(tl.float32)
    inv_count = 1.0 / tl.maximum(count, 1.0)
    aa = tl.sum(a * a, axis=1)
    c = tl.zeros([BLOCK_N, R_PAD], dtype=tl.float32)
    for k in range(M):
        delta = tl.load(off_ptr + k)
        valid = nmask & (t >= delta)
        b = tl.load(z_ptr + (n - delta)[:, None] * R + cols[None, :],
                    mask=valid[:, None] & rmask[None, :], other=0.0).to(tl.float32)
        if NORMALIZE:
            # ‖p(a, b)‖ = ‖a‖ ‖b⊥‖ with b⊥ = b - (a·b/‖a‖²) a  (normalised Plücker coordinates p̂ = p / max(‖p‖, ε))
            lam = tl.sum(a * b, axis=1) / tl.maximum(aa, 1e-30)
            b_perp = b - lam[:, None] * a
            nrm = tl.sqrt(aa) * tl.sqrt(tl.sum(b_perp * b_perp, axis=1))
            n_clamped = tl.maximum(nrm, eps)
            s = tl.where(valid, inv_count / n_clamped, 0.0)
            # the clamp blocks the gradient through the norm where ‖p‖ < ε
            rn = tl.where(valid & (nrm >= eps), 1.0 / n_clamped, 0.0)
        else:
            s = tl.where(valid, inv_count, 0.0)
            rn = tl.zeros([BLOCK_N], dtype=tl.float32)
        tl.store(s_ptr + n * M + k, s, mask=nmask)
        tl.store(rn_ptr + n * M + k, rn, mask=nmask)
        c += s[:, None] * b
    tl.store(c_ptr + n[:, None] * R + cols[None, :], c, mask=nmask[:, None] & rmask[None, :])


@triton.jit
def _plucker_tile(z_ptr, c_ptr, n, nmask, pi, pj, cmask, R: tl.constexpr):
    """p̄ = p(z_n, c_n) for a tile of tokens × a tile of pair indices (i, j): (BLOCK_N, BLOCK_C)."""
    m2 = nmask[:, None] & cmask[None, :]
    rows = n[:, None] * R
    a_i = tl.load(z_ptr + rows + pi[None, :], mask=m2, other=0.0).to(tl.float32)
    a_j = tl.load(z_ptr + rows + pj[None, :], mask=m2, other=0.0).to(tl.float32)
    c_i = tl.load(c_ptr + rows + pi[None, :], mask=m2, other=0.0)
    c_j = tl.load(c_ptr + rows + pj[None, :], mask=m2, other=0.0)
    return a_i * c_j - a_j * c_i


@triton.jit
def _fwd_kernel(
    z_ptr, c_ptr, pi_ptr, pj_ptr, w_ptr, bias_ptr, g_ptr,
    N, L, D, C, delta_min,
    R: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    dd = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    nmask = n < N
    dmask = dd < D
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        cmask = cc < C
        pi = tl.load(pi_ptr + cc, mask=cmask, other=0)
        pj = tl.load(pj_ptr + cc, mask=cmask, other=0)
        pbar = _plucker_tile(z_ptr, c_ptr, n, nmask, pi, pj, cmask, R)  # (BLOCK_N, BLOCK_C)
        w = tl.load(w_ptr + dd[None, :] * C + cc[:, None],
                    mask=cmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_C, BLOCK_D) = Wᵀ
        acc += tl.dot(pbar.to(w.dtype), w, input_precision=PRECISION)  # the projection back: W_plü p̄
    if HAS_BIAS:
        # b_plü only where some offset is valid (t ≥ min Δ); g_t = 0 otherwise
        bias = tl.load(bias_ptr + dd, mask=dmask, other=0.0).to(tl.float32)
        has_pair = ((n % L) >= delta_min).to(tl.float32)
        acc += has_pair[:, None] * bias[None, :]
    tl.store(g_ptr + n[:, None] * D + dd[None, :], acc.to(g_ptr.dtype.element_ty),
             mask=nmask[:, None] & dmask[None, :])


@triton.jit
def _bwd_gbar_kernel(
    dg_ptr, wa_ptr, z_ptr, c_ptr, w_out_ptr, y_out_ptr,
    N, D,
    R: tl.constexpr, R_PAD: tl.constexpr, BI: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    cols = tl.arange(0, R_PAD)
    m2 = nmask[:, None] & (cols < R)[None, :]
    a = tl.load(z_ptr + n[:, None] * R + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    cv = tl.load(c_ptr + n[:, None] * R + cols[None, :], mask=m2, other=0.0)
    q = tl.arange(0, BI * R_PAD)  # flattened (row within the block, column j)
    for i0 in range(0, R_PAD, BI):
        # Ḡ rows i0..i0+BI: dg (BLOCK_N, D) @ W_anti[:, rows, :] (D, BI·R_PAD)
        acc = tl.zeros([BLOCK_N, BI * R_PAD], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + tl.arange(0, BLOCK_D)
            dmask = dd < D
            dg = tl.load(dg_ptr + n[:, None] * D + dd[None, :],
                         mask=nmask[:, None] & dmask[None, :], other=0.0)
            wa = tl.load(wa_ptr + dd[:, None] * (R_PAD * R_PAD) + (i0 * R_PAD + q)[None, :],
                         mask=dmask[:, None], other=0.0)
            acc += tl.dot(dg.to(wa.dtype), wa, input_precision=PRECISION)
        g3 = tl.reshape(acc, [BLOCK_N, BI, R_PAD])  # Ḡ_t[i0:i0+BI, :]
        w_blk = tl.sum(g3 * a[:, None, :], axis=2)  # (Ḡ z_t) rows i0..i0+BI
        y_blk = tl.sum(g3 * cv[:, None, :], axis=2)  # (Ḡ c_t)
        rows = i0 + tl.arange(0, BI)
        om = nmask[:, None] & (rows < R)[None, :]
        tl.store(w_out_ptr + n[:, None] * R + rows[None, :], w_blk, mask=om)
        tl.store(y_out_ptr + n[:, None] * R + rows[None, :], y_blk, mask=om)


@triton.jit
def _bwd_dz_kernel(
    z_ptr, w_ptr, y_ptr, s_ptr, rn_ptr, off_ptr, dz_ptr,
    N, L, M,
    R: tl.constexpr, R_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = n % L
    nmask = n < N
    cols = tl.arange(0, R_PAD)
    rmask = cols < R
    m2 = nmask[:, None] & rmask[None, :]
    a = tl.load(z_ptr + n[:, None] * R + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    w_t = tl.load(w_ptr + n[:, None] * R + cols[None, :], mask=m2, other=0.0)
    dz = tl.load(y_ptr + n[:, None] * R + cols[None, :], mask=m2, other=0.0)  # Ḡ_t c_t
    for k in range(M):
        delta = tl.load(off_ptr + k)
        # z_t as the current vector of the pair (t, t-Δ)
        v1 = nmask & (t >= delta)
        b = tl.load(z_ptr + (n - delta)[:, None] * R + cols[None, :],
                    mask=v1[:, None] & rmask[None, :], other=0.0).to(tl.float32)
        s1 = tl.load(s_ptr + n * M + k, mask=v1, other=0.0)
        rn1 = tl.load(rn_ptr + n * M + k, mask=v1, other=0.0)
        beta1 = -s1 * rn1 * rn1 * tl.sum(w_t * b, axis=1)
        bb = tl.sum(b * b, axis=1)
        ab = tl.sum(a * b, axis=1)
        dz -= beta1[:, None] * (a * bb[:, None] - b * ab[:, None])
        # z_t as the past vector of the pair (t+Δ, t)
        v2 = nmask & (t + delta < L)
        n2 = n + delta
        a2 = tl.load(z_ptr + n2[:, None] * R + cols[None, :],
                     mask=v2[:, None] & rmask[None, :], other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + n2[:, None] * R + cols[None, :],
                     mask=v2[:, None] & rmask[None, :], other=0.0)
        s2 = tl.load(s_ptr + n2 * M + k, mask=v2, other=0.0)
        rn2 = tl.load(rn_ptr + n2 * M + k, mask=v2, other=0.0)
        beta2 = -s2 * rn2 * rn2 * tl.sum(w2 * a, axis=1)
        a2a2 = tl.sum(a2 * a2, axis=1)
        aa2 = tl.sum(a * a2, axis=1)
        dz += -s2[:, None] * w2 + beta2[:, None] * (a2 * aa2[:, None] - a * a2a2[:, None])
    tl.store(dz_ptr + n[:, None] * R + cols[None, :], dz.to(dz_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _bwd_dw_kernel(
    z_ptr, c_ptr, pi_ptr, pj_ptr, dg_ptr, dw_ptr, db_ptr,
    N, L, D, C, delta_min,
    R: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_d, pid_c, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_split = tl.num_programs(2)
    dd = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    cc = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    dmask = dd < D
    cmask = cc < C
    pi = tl.load(pi_ptr + cc, mask=cmask, other=0)
    pj = tl.load(pj_ptr + cc, mask=cmask, other=0)
    acc = tl.zeros([BLOCK_D, BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(pid_s * BLOCK_N, N, n_split * BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < N
        pbar = _plucker_tile(z_ptr, c_ptr, n, nmask, pi, pj, cmask, R)  # (BLOCK_N, BLOCK_C)
        dg = tl.load(dg_ptr + n[:, None] * D + dd[None, :],
                     mask=nmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        acc += tl.dot(tl.trans(dg.to(DOT_DTYPE)), pbar.to(DOT_DTYPE), input_precision=PRECISION)
        if HAS_BIAS:
            has_pair = ((n % L) >= delta_min).to(tl.float32)
            db += tl.sum(dg.to(tl.float32) * has_pair[:, None], axis=0)
    base = pid_s * D * C
    tl.store(dw_ptr + base + dd[:, None] * C + cc[None, :], acc,
             mask=dmask[:, None] & cmask[None, :])
    if HAS_BIAS:
        if pid_c == 0:
            tl.store(db_ptr + pid_s * D + dd, db, mask=dmask)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------

_PAIR_CACHE: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
_OFFSET_CACHE: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}
_TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _cached(cache: dict, key, make):
    """``cache[key]``, made by ``make()`` the first time. Small index tensors live on the
    device once: a copy from the host while a CUDA graph is being captured (a compiled step's
    first replayed call) is not allowed, so the step's eager first call fills the cache.
    Fake tensors (compile tracing, the compile check's recording) are never kept."""
    if key not in cache:
        made = make()
        if any(isinstance(t, FakeTensor) for t in (made if isinstance(made, tuple) else (made,))):
            return made
        cache[key] = made
    return cache[key]


def _pairs(r: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(i, j), i < j, row-major: the reference's ``pair_indices`` as int32 on ``device``."""
    def make():
        iu = torch.triu_indices(r, r, offset=1)
        return iu[0].to(device, torch.int32).contiguous(), iu[1].to(device, torch.int32).contiguous()
    return _cached(_PAIR_CACHE, (r, str(device)), make)


def _offsets(offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The offsets as an int32 tensor on ``device``."""
    return _cached(_OFFSET_CACHE, (offsets, str(device)),
                   lambda: torch.tensor(offsets, dtype=torch.int32, device=device))


def _blocks(D: int, R_PAD: int) -> dict[str, int]:
    """Tile sizes: H100-sized on CUDA; 16 under the interpreter so tests cross tile edges."""
    small = interpreted(_fwd_kernel)
    bi = max(1, min(R_PAD, (16 if small else 128) // R_PAD))
    if bi * R_PAD < 16:  # tl.dot needs every dimension ≥ 16
        bi = 16 // R_PAD
    return {
        "n": 16 if small else 64,
        # the backward's (BLOCK_N, BI·R_PAD) accumulator is reshaped to 3-D: 8 warps at 64 rows
        # keep it in registers while halving the L2 re-reads of W_anti against 32 rows
        "n_bwd": 16 if small else 64,
        "warps_bwd": 4 if small else 8,
        "d": 16 if small else min(128, next_pow2(D, 16)),
        "d_bwd": 16 if small else 64,
        "c": 16 if small else 64,
        "bi": bi,
        "warps": 4,
    }


def _antisymmetric_weight(weight: torch.Tensor, r: int, R_PAD: int, dtype: torch.dtype):
    """W_anti (D, R_PAD, R_PAD): W_anti[:, i, j] = W[:, c(i,j)] = -W_anti[:, j, i], zero pad.

    dg @ W_anti.view(D, R_PAD²) is dp̄ laid out as the antisymmetric matrix Ḡ (p_ij = -p_ji).
    """
    i, j = _pairs(r, weight.device)
    wa = weight.new_zeros(weight.shape[0], R_PAD, R_PAD, dtype=dtype)
    w = weight.to(dtype)
    wa[:, i.long(), j.long()] = w
    wa[:, j.long(), i.long()] = -w
    return wa


def _check(z, weight, bias, offsets):
    if z.dim() != 3:
        raise ValueError(f"grassmann_mix expects z of shape (B, L, r), got {tuple(z.shape)}")
    r = z.shape[-1]
    if r < 2:
        raise ValueError(f"grassmann_mix needs rank r ≥ 2, got {r}")
    C = r * (r - 1) // 2
    if weight.dim() != 2 or weight.shape[1] != C:
        raise ValueError(f"weight must be (d, r(r-1)/2) = (d, {C}), got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    if not offsets or min(offsets) < 1:
        raise ValueError(
            f"the fused kernel handles the causal case only (offsets ≥ 1), got {tuple(offsets)}; "
            "use seqmix.mixers.grassmann.grassmann_mix_reference for signed offsets"
        )


# The forward and the backward are ``torch.library`` custom ops with their fake (shape) impls
# and autograd registered, so that torch.compile (``train.compile``) traces one opaque node
# each, with no graph break, and a CUDA graph captures their launches: the compiled step
# replays them with the rest of the step.


@torch.library.custom_op("seqmix::grassmann_fwd", mutates_args=())
def _forward(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, offsets: list[int],
             normalize: bool, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """g (B, L, D) in z's dtype, and what the backward reads: c (N, r), s and rn (N, M), fp32."""
    B, L, r = z.shape
    D, C = weight.shape
    dev = check_same_device(_fwd_kernel, z, weight, bias)
    N, M = B * L, len(offsets)
    R_PAD = next_pow2(r, 4)
    blk = _blocks(D, R_PAD)
    cdt = compute_dtype(z)
    z = z.contiguous()
    off = _offsets(tuple(offsets), dev)
    pi, pj = _pairs(r, dev)

    s = torch.empty(N, M, device=dev, dtype=torch.float32)
    rn = torch.empty_like(s)
    c = torch.empty(N, r, device=dev, dtype=torch.float32)
    _prep_kernel[(triton.cdiv(N, blk["n"]),)](
        z, off, s, rn, c, N, L, M, float(eps),
        R=r, R_PAD=R_PAD, NORMALIZE=bool(normalize), BLOCK_N=blk["n"], num_warps=blk["warps"],
    )
    w_dot = weight.to(cdt).contiguous()
    g = torch.empty(B, L, D, device=dev, dtype=z.dtype)
    grid = (triton.cdiv(N, blk["n"]), triton.cdiv(D, blk["d"]))
    _fwd_kernel[grid](
        z, c, pi, pj, w_dot, bias if bias is not None else w_dot, g,
        N, L, D, C, min(offsets),
        R=r, HAS_BIAS=bias is not None, PRECISION=dot_precision(cdt),
        BLOCK_N=blk["n"], BLOCK_D=blk["d"], BLOCK_C=blk["c"], num_warps=blk["warps"],
    )
    return g, c, s, rn


@_forward.register_fake
def _(z, weight, bias, offsets, normalize, eps):
    B, L, r = z.shape
    f32 = torch.float32
    return (z.new_empty(B, L, weight.shape[0]), z.new_empty(B * L, r, dtype=f32),
            z.new_empty(B * L, len(offsets), dtype=f32), z.new_empty(B * L, len(offsets), dtype=f32))


@torch.library.custom_op("seqmix::grassmann_bwd", mutates_args=())
def _backward(dg: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, c: torch.Tensor, s: torch.Tensor,
              rn: torch.Tensor, offsets: list[int], has_bias: bool, need_dz: bool,
              need_dw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dz in z's dtype, dW in W's dtype, db (D,) fp32; each empty where not needed."""
    B, L, r = z.shape
    D, C = weight.shape
    N, M = B * L, len(offsets)
    dev = z.device
    R_PAD = next_pow2(r, 4)
    blk = _blocks(D, R_PAD)
    cdt = compute_dtype(z)
    prec = dot_precision(cdt)
    z = z.contiguous()
    dg = dg.contiguous().to(z.dtype)
    off = _offsets(tuple(offsets), dev)
    pi, pj = _pairs(r, dev)
    dz, dweight, dbias = z.new_empty(0), weight.new_empty(0), weight.new_empty(0, dtype=torch.float32)

    if need_dz:
        wa = _antisymmetric_weight(weight, r, R_PAD, cdt)
        w_buf = torch.empty(N, r, device=dev, dtype=torch.float32)
        y_buf = torch.empty_like(w_buf)
        _bwd_gbar_kernel[(triton.cdiv(N, blk["n_bwd"]),)](
            dg, wa, z, c, w_buf, y_buf, N, D,
            R=r, R_PAD=R_PAD, BI=blk["bi"], PRECISION=prec,
            BLOCK_N=blk["n_bwd"], BLOCK_D=blk["d_bwd"], num_warps=blk["warps_bwd"],
        )
        dz = torch.empty_like(z)
        _bwd_dz_kernel[(triton.cdiv(N, blk["n"]),)](
            z, w_buf, y_buf, s, rn, off, dz, N, L, M,
            R=r, R_PAD=R_PAD, BLOCK_N=blk["n"], num_warps=blk["warps"],
        )

    if need_dw:
        bd, bc, bn = blk["d_bwd"], blk["c"], blk["n"]
        tiles = triton.cdiv(D, bd) * triton.cdiv(C, bc)
        split = max(1, min(triton.cdiv(N, bn), triton.cdiv(4 * sm_count(dev), tiles)))
        dw_part = torch.empty(split, D, C, device=dev, dtype=torch.float32)
        db_part = torch.empty(split, D, device=dev, dtype=torch.float32)
        _bwd_dw_kernel[(triton.cdiv(D, bd), triton.cdiv(C, bc), split)](
            z, c, pi, pj, dg, dw_part, db_part, N, L, D, C, min(offsets),
            R=r, HAS_BIAS=has_bias, PRECISION=prec, DOT_DTYPE=_TL_DTYPE[cdt],
            BLOCK_N=bn, BLOCK_D=bd, BLOCK_C=bc, num_warps=blk["warps"],
        )
        dweight = dw_part.sum(0).to(weight.dtype)
        if has_bias:
            dbias = db_part.sum(0)
    return dz, dweight, dbias


@_backward.register_fake
def _(dg, z, weight, c, s, rn, offsets, has_bias, need_dz, need_dw):
    D = weight.shape[0]
    return (z.new_empty(z.shape if need_dz else (0,)), weight.new_empty(weight.shape if need_dw else (0,)),
            weight.new_empty((D,) if need_dw and has_bias else (0,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    z, weight, bias, offsets, _normalize, _eps = inputs
    _g, c, s, rn = output
    ctx.save_for_backward(z, weight, c, s, rn)
    ctx.offsets, ctx.bias_dtype = offsets, None if bias is None else bias.dtype


def _autograd_backward(ctx, dg, _dc, _ds, _drn):
    z, weight, c, s, rn = ctx.saved_tensors
    has_bias = ctx.bias_dtype is not None
    need_dz, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or (has_bias and ctx.needs_input_grad[2])
    dz, dweight, dbias = _backward(dg, z, weight, c, s, rn, ctx.offsets, has_bias, need_dz, need_dw)
    return (dz if need_dz else None, dweight if need_dw else None,
            dbias.to(ctx.bias_dtype) if need_dw and has_bias else None, None, None, None)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _vmap_forward(info, in_dims, z, weight, bias, offsets, normalize, eps):
    """The op under torch.func.vmap (a pack of seeds, seqmix.train.pack: every member its own
    weights): one call per member, stacked. The members' weights differ, so they cannot fold
    into the batch dimension of one call; autograd records each call's own backward."""
    def members(x, dim):  # unbind: one stack in the backward, not one select_backward per member
        return [x] * info.batch_size if x is None or dim is None else x.unbind(dim)

    calls = [_forward(*args, offsets, normalize, eps)
             for args in zip(members(z, in_dims[0]), members(weight, in_dims[1]), members(bias, in_dims[2]))]
    return tuple(torch.stack(parts) for parts in zip(*calls)), (0, 0, 0, 0)


_forward.register_vmap(_vmap_forward)


def grassmann_mix(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    offsets: tuple[int, ...],
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Fused causal Grassmann mixing; equals ``grassmann_mix_reference`` for offsets ≥ 1.

    z: (B, L, r); weight: (d, r(r-1)/2); bias: (d,) or None; offsets: positive ints
    (duplicates count twice, offsets ≥ L are never valid). Returns g: (B, L, d) in z's dtype.
    """
    offsets = [int(o) for o in offsets]
    _check(z, weight, bias, offsets)
    return _forward(z, weight, bias, offsets, bool(normalize), float(eps))[0]
