"""Mamba's selective scan in Triton, forward and backward (Gu & Dao 2023, arXiv:2312.00752).

The specification is ``seqmix.mixers.mamba.selective_scan_reference(u, δ, A, B, C, D, z)``
(mamba_ssm's ``selective_scan_ref``): per batch b, channel d and state n,

    a_t = exp(Δ_t A_dn),   h_t = a_t h_{t-1} + B_tn Δ_t u_t,   h_{-1} = 0
    y_t = Σ_n C_tn h_t + D_d u_t,   out_t = y_t · SiLU(z_t)       (D and z optional)

One program per (channel block of BD, batch) walks the sequence in chunks of BT tokens with
the (BT, BD, N) slab of the chunk in registers: the recurrence inside a chunk is one
``tl.associative_scan`` over time of the pairs (a_t, B_t x_t) (x = Δ u) with the composition
(a1, b1)·(a2, b2) = (a1 a2, a2 b1 + b2), and the state leaving the chunk is carried to the
next. Every input is read once per pass, in coalesced (BT, BD) and (BT, N) tiles of the
time-major layout (Bt, L, ·) the mixer produces; only a_t ∈ (0, 1] are multiplied, so no
decay overflows.

Memory (as mamba_ssm's CUDA scan, §3.3 of the paper): the forward keeps only the state
entering every chunk (``checkpoints``, (Bt, L/BT, D, N) fp32, N/BT of u's size), never the
(Bt, L, D, N) states. The backward recomputes them chunk by chunk, last chunk first, from
those checkpoints, and runs the adjoint λ_t = ∂loss/∂h_t by a reverse scan in the same slab:

    λ_t = C_t g_t + a_{t+1} λ_{t+1}            (g = ∂loss/∂y, through the gate)
    ∂x_t = Σ_n B_tn λ_t,   ∂B_tn = Σ_d λ_t x_t,   ∂C_tn = Σ_d g_t h_t
    q_t = λ_t a_t h_{t-1} = λ_t (h_t − B_t x_t)   (mamba_ssm's form: no h_{t-1} kept)
    ∂Δ_t = u_t ∂x_t + Σ_n q_t A,   ∂u_t = Δ_t ∂x_t + D g_t,   ∂A = Σ_t q_t Δ_t
    ∂D = Σ_t g_t u_t,   ∂z_t = ∂out_t · y_t · SiLU'(z_t)

∂B, ∂C (sums over channels), ∂A and ∂D (sums over the batch) are written per channel block
or per sequence and added up by PyTorch: deterministic, no atomics. Arithmetic is fp32
whatever the input dtype (bf16 under autocast), as in the reference; outputs and gradients
are returned in their inputs' dtypes.

Both halves are ``torch.library`` custom ops with their autograd registered (as
``selective_scan_cpu``), so FakeTensorMode and torch.compile see one opaque op each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seqmix.kernels._common import check_same_device, interpreted, next_pow2


@triton.jit
def _compose(a1, b1, a2, b2):
    """h ↦ a1 h + b1, then h ↦ a2 h + b2 (earlier in scan order first)."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _row(x, rows, r):
    """Row ``r`` of a (BT, ·, ·) tile (a masked sum: registers cannot be indexed)."""
    return tl.sum(tl.where((rows == r)[:, None, None], x, 0.0), axis=0)


@triton.jit
def _fwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, y_ptr, ckpt_ptr,
    L, DIM, N, NT,
    su_b, su_l, sd_b, sd_l, sB_b, sB_l, sC_b, sC_l, sz_b, sz_l,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, SAVE: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
):
    i_d, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    dd = i_d * BD + tl.arange(0, BD)
    nn = tl.arange(0, BN)
    rows = tl.arange(0, BT)
    dm, nm = dd < DIM, nn < N
    dn = dd[:, None] * N + nn[None, :]
    A = tl.load(A_ptr + dn, mask=dm[:, None] & nm[None, :], other=0.0)  # padded: a = 1, h = 0
    if HAS_D:
        Dv = tl.load(D_ptr + dd, mask=dm, other=0.0)
    h = tl.zeros([BD, BN], dtype=tl.float32)
    for i_t in range(NT):
        if SAVE:  # the state entering this chunk, for the backward
            tl.store(ckpt_ptr + (b * NT + i_t) * DIM * N + dn, h, mask=dm[:, None] & nm[None, :])
        t = i_t * BT + rows
        tm = t < L
        md, mn = tm[:, None] & dm[None, :], tm[:, None] & nm[None, :]
        u = tl.load(u_ptr + b * su_b + t[:, None] * su_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * sd_b + t[:, None] * sd_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
        Bt = tl.load(B_ptr + b * sB_b + t[:, None] * sB_l + nn[None, :], mask=mn, other=0.0).to(tl.float32)
        Ct = tl.load(C_ptr + b * sC_b + t[:, None] * sC_l + nn[None, :], mask=mn, other=0.0).to(tl.float32)
        a = tl.exp(dt[:, :, None] * A[None, :, :])  # (BT, BD, BN); padded rows: Δ = 0, a = 1
        bx = (dt * u)[:, :, None] * Bt[:, None, :]
        a_cum, b_cum = tl.associative_scan((a, bx), 0, _compose)
        hs = a_cum * h[None, :, :] + b_cum  # h_t for the chunk's rows
        y = tl.sum(hs * Ct[:, None, :], axis=2)  # (BT, BD)
        if HAS_D:
            y += u * Dv[None, :]
        if HAS_Z:
            z = tl.load(z_ptr + b * sz_b + t[:, None] * sz_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
            y = y * z * tl.sigmoid(z)
        tl.store(y_ptr + (b * L + t[:, None]) * DIM + dd[None, :], y.to(y_ptr.dtype.element_ty), mask=md)
        h = _row(hs, rows, BT - 1)  # padded rows repeat the last real state


@triton.jit
def _bwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, gy_ptr, ckpt_ptr,
    du_ptr, ddt_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dz_ptr,
    L, DIM, N, NT, ND,
    su_b, su_l, sd_b, sd_l, sB_b, sB_l, sC_b, sC_l, sz_b, sz_l,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
):
    i_d, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    dd = i_d * BD + tl.arange(0, BD)
    nn = tl.arange(0, BN)
    rows = tl.arange(0, BT)
    dm, nm = dd < DIM, nn < N
    dn = dd[:, None] * N + nn[None, :]
    mdn = dm[:, None] & nm[None, :]
    A = tl.load(A_ptr + dn, mask=mdn, other=0.0)
    if HAS_D:
        Dv = tl.load(D_ptr + dd, mask=dm, other=0.0)
    lam_next = tl.zeros([BD, BN], dtype=tl.float32)  # λ at the first row of the next chunk
    dA = tl.zeros([BD, BN], dtype=tl.float32)
    dD = tl.zeros([BD], dtype=tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        t = i_t * BT + rows
        tm = t < L
        md, mn = tm[:, None] & dm[None, :], tm[:, None] & nm[None, :]
        u = tl.load(u_ptr + b * su_b + t[:, None] * su_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * sd_b + t[:, None] * sd_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
        Bt = tl.load(B_ptr + b * sB_b + t[:, None] * sB_l + nn[None, :], mask=mn, other=0.0).to(tl.float32)
        Ct = tl.load(C_ptr + b * sC_b + t[:, None] * sC_l + nn[None, :], mask=mn, other=0.0).to(tl.float32)
        gy = tl.load(gy_ptr + (b * L + t[:, None]) * DIM + dd[None, :], mask=md, other=0.0).to(tl.float32)
        # the chunk's states again, from the checkpoint the forward left
        h0 = tl.load(ckpt_ptr + (b * NT + i_t) * DIM * N + dn, mask=mdn, other=0.0)
        a = tl.exp(dt[:, :, None] * A[None, :, :])
        x = dt * u
        bx = x[:, :, None] * Bt[:, None, :]
        a_cum, b_cum = tl.associative_scan((a, bx), 0, _compose)
        hs = a_cum * h0[None, :, :] + b_cum
        if HAS_Z:  # through the gate: g = ∂loss/∂y before it
            z = tl.load(z_ptr + b * sz_b + t[:, None] * sz_l + dd[None, :], mask=md, other=0.0).to(tl.float32)
            y = tl.sum(hs * Ct[:, None, :], axis=2)
            if HAS_D:
                y += u * Dv[None, :]
            sz = tl.sigmoid(z)
            tl.store(dz_ptr + (b * L + t[:, None]) * DIM + dd[None, :],
                     (gy * y * sz * (1.0 + z * (1.0 - sz))).to(dz_ptr.dtype.element_ty), mask=md)
            gy = gy * z * sz
        # the adjoint, last row first: λ_t = C_t g_t + a_{t+1} λ_{t+1}
        t1 = t + 1
        dt1 = tl.load(dt_ptr + b * sd_b + t1[:, None] * sd_l + dd[None, :],
                      mask=(t1 < L)[:, None] & dm[None, :], other=0.0).to(tl.float32)
        a_next = tl.exp(dt1[:, :, None] * A[None, :, :])
        g = gy[:, :, None] * Ct[:, None, :]
        l_cum, g_cum = tl.associative_scan((a_next, g), 0, _compose, reverse=True)
        lam = g_cum + l_cum * lam_next[None, :, :]
        lam_next = _row(lam, rows, 0)
        dx = tl.sum(lam * Bt[:, None, :], axis=2)  # (BT, BD)
        q = lam * (hs - bx)  # λ_t a_t h_{t-1}
        ddt = dx * u + tl.sum(q * A[None, :, :], axis=2)
        du = dx * dt
        if HAS_D:
            du += gy * Dv[None, :]
            dD += tl.sum(gy * u, axis=0)
        dA += tl.sum(q * dt[:, :, None], axis=0)
        tl.store(du_ptr + (b * L + t[:, None]) * DIM + dd[None, :], du.to(du_ptr.dtype.element_ty), mask=md)
        tl.store(ddt_ptr + (b * L + t[:, None]) * DIM + dd[None, :], ddt.to(ddt_ptr.dtype.element_ty), mask=md)
        # this channel block's share of ∂B and ∂C: (Bt, ND, L, N), summed over blocks outside
        part = ((b * ND + i_d) * L + t[:, None]) * N + nn[None, :]
        tl.store(dB_ptr + part, tl.sum(lam * x[:, :, None], axis=1), mask=mn)
        tl.store(dC_ptr + part, tl.sum(hs * gy[:, :, None], axis=1), mask=mn)
    tl.store(dA_ptr + b * DIM * N + dn, dA, mask=mdn)  # per sequence: (Bt, D, N)
    if HAS_D:
        tl.store(dD_ptr + b * DIM + dd, dD, mask=dm)


# ---------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------


def blocks(n_state: int) -> dict[str, int]:
    """Tile sizes. On a GPU: chunks of 16 tokens and as many channels as keep the
    (BT, BD, N) slab at 4,096 fp32 values (BD 16 at N 16), 4 warps forward, 8 backward
    (it holds about twice the slabs). Under the interpreter: 8 tokens × 4 channels, so that
    the tests' small shapes cross chunk and channel-block edges."""
    BN = next_pow2(n_state)
    if interpreted(_fwd_kernel):
        return {"BT": 8, "BD": 4, "BN": BN, "fwd_warps": 1, "bwd_warps": 1}
    BT = 16
    BD = max(4, min(64, 4096 // (BT * BN)))
    return {"BT": BT, "BD": BD, "BN": BN, "fwd_warps": 4, "bwd_warps": 8}


def _time_major(t: torch.Tensor) -> torch.Tensor:
    """(Bt, F, L) -> the (Bt, L, F) view, copied only where features are not contiguous."""
    t = t.transpose(1, 2)
    return t if t.stride(2) == 1 else t.contiguous()


def _rows(t: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if t is None else (t.stride(0), t.stride(1))


@torch.library.custom_op("seqmix::selective_scan_triton_fwd", mutates_args=())
def _forward(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor | None, z: torch.Tensor | None, save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Time-major inputs (Bt, L, ·), unit feature stride; A (D, N) and D fp32 contiguous.
    Returns y (Bt, L, D) contiguous in u's dtype and the chunk checkpoints (empty unless save)."""
    Bt, L, DIM = u.shape
    N = A.shape[1]
    blk = blocks(N)
    NT = triton.cdiv(L, blk["BT"])
    y = torch.empty(Bt, L, DIM, device=u.device, dtype=u.dtype)
    ckpt = torch.empty((Bt, NT, DIM, N) if save else (0,), device=u.device, dtype=torch.float32)
    _fwd_kernel[(triton.cdiv(DIM, blk["BD"]), Bt)](
        u, delta, A, B, C, D if D is not None else A, z if z is not None else u, y, ckpt,
        L, DIM, N, NT, *_rows(u), *_rows(delta), *_rows(B), *_rows(C), *_rows(z),
        HAS_D=D is not None, HAS_Z=z is not None, SAVE=save,
        BT=blk["BT"], BD=blk["BD"], BN=blk["BN"], num_warps=blk["fwd_warps"],
    )
    return y, ckpt


@_forward.register_fake
def _(u, delta, A, B, C, D, z, save):
    Bt, L, DIM = u.shape
    NT = -(-L // blocks(A.shape[1])["BT"])
    shape = (Bt, NT, DIM, A.shape[1]) if save else (0,)
    return u.new_empty(Bt, L, DIM), u.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("seqmix::selective_scan_triton_bwd", mutates_args=())
def _backward(gy: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
              ckpt: torch.Tensor) -> list[torch.Tensor]:
    """[∂u, ∂Δ, ∂z] (Bt, L, D) in their inputs' dtypes (∂z empty without z) and the fp32 sums
    [∂A (D, N), ∂B, ∂C (Bt, L, N), ∂D (D,)] (∂D empty without D)."""
    Bt, L, DIM = u.shape
    N = A.shape[1]
    blk = blocks(N)
    NT, ND = triton.cdiv(L, blk["BT"]), triton.cdiv(DIM, blk["BD"])
    new = lambda *shape, dtype=torch.float32: torch.empty(shape, device=u.device, dtype=dtype)  # noqa: E731
    du, ddelta = new(Bt, L, DIM, dtype=u.dtype), new(Bt, L, DIM, dtype=delta.dtype)
    dz = new(Bt, L, DIM, dtype=z.dtype) if z is not None else new(0)
    dA, dD = new(Bt, DIM, N), new(Bt, DIM)
    dB, dC = new(Bt, ND, L, N), new(Bt, ND, L, N)
    _bwd_kernel[(ND, Bt)](
        u, delta, A, B, C, D if D is not None else A, z if z is not None else u, gy, ckpt,
        du, ddelta, dA, dB, dC, dD, dz,
        L, DIM, N, NT, ND, *_rows(u), *_rows(delta), *_rows(B), *_rows(C), *_rows(z),
        HAS_D=D is not None, HAS_Z=z is not None,
        BT=blk["BT"], BD=blk["BD"], BN=blk["BN"], num_warps=blk["bwd_warps"],
    )
    return [du, ddelta, dz, dA.sum(0), dB.sum(1), dC.sum(1), dD.sum(0) if D is not None else new(0)]


@_backward.register_fake
def _(gy, u, delta, A, B, C, D, z, ckpt):
    Bt, L, DIM = u.shape
    N = A.shape[1]
    f32 = torch.float32
    return [u.new_empty(Bt, L, DIM), delta.new_empty(Bt, L, DIM),
            z.new_empty(Bt, L, DIM) if z is not None else u.new_empty(0),
            u.new_empty(DIM, N, dtype=f32), u.new_empty(Bt, L, N, dtype=f32), u.new_empty(Bt, L, N, dtype=f32),
            u.new_empty(DIM, dtype=f32) if D is not None else u.new_empty(0)]


def _setup_context(ctx, inputs, output):
    u, delta, A, B, C, D, z, _save = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, z, output[1])
    ctx.has_D, ctx.has_z = D is not None, z is not None


def _autograd_backward(ctx, gy, _g_ckpt):
    u, delta, A, B, C, D, z, ckpt = ctx.saved_tensors
    du, ddelta, dz, dA, dB, dC, dD = _backward(gy.contiguous(), u, delta, A, B, C, D, z, ckpt)
    return (du, ddelta, dA, dB.to(B.dtype), dC.to(C.dtype), dD if ctx.has_D else None,
            dz if ctx.has_z else None, None)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> torch.Tensor:
    """``selective_scan_reference(u, delta, A, B, C, D, z)`` by the Triton kernels.

    u, delta (Δ > 0, after bias and softplus), z: (Bt, D, L); A: (D, N); B, C: (Bt, N, L);
    D: (D,). Views of time-major (Bt, L, ·) tensors are read in place. Returns (Bt, D, L) in
    u's dtype (a view of a time-major tensor). CUDA tensors, or any under TRITON_INTERPRET=1.
    """
    check_same_device(_fwd_kernel, u, delta, A, B, C, D, z)
    Bt, DIM, L = u.shape
    N = A.shape[-1]
    for name, t, shape in (("delta", delta, (Bt, DIM, L)), ("A", A, (DIM, N)), ("B", B, (Bt, N, L)),
                           ("C", C, (Bt, N, L)), ("D", D, (DIM,)), ("z", z, (Bt, DIM, L))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"selective_scan: {name} must be {shape} for u {tuple(u.shape)}, got {tuple(t.shape)}")
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (u, delta, A, B, C, D, z))
    f32 = lambda t: None if t is None else t.float().contiguous()  # noqa: E731  (parameters: small)
    y, _ = _forward(_time_major(u), _time_major(delta), f32(A), _time_major(B), _time_major(C), f32(D),
                    None if z is None else _time_major(z), save)
    return y.transpose(1, 2)
