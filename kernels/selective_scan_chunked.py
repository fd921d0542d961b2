"""Mamba's selective scan by chunks, in plain PyTorch with a hand-written backward: the fast
form of ``seqmix.mixers.mamba.selective_scan_reference`` (the spec, one Python step per
token) where neither the Triton scan (CUDA tensors, ``seqmix.kernels.selective_scan``) nor
the fused C++ loop (CPU tensors, ``seqmix.kernels.selective_scan_cpu``) runs. The mixer's
``selective_scan_chunked`` takes the reference's arguments (layout, the D skip and the SiLU(z)
gate) and calls ``selective_scan_chunked`` here; tests/mixers/test_mixers_scan.py compares the
two forward and backward.

The recurrence h_t = a_t h_{t-1} + b_t is cut into chunks of C tokens and one Python loop over
the C positions advances every chunk at once, first from zero (each chunk's final state),
then, once those are carried across chunks by ``seqmix.kernels.linear_scan.scan``, from each
chunk's true incoming state, writing h and y. So there are 2C + O(L/C²) vectorised steps
instead of L, each on one cache-sized slab (chunks × batch × N × D), and only decays
a ∈ (0, 1] are ever multiplied, so nothing overflows however strong the decay (no
exp(-Σ Δ A) factor as in a cumulative-sum form). The backward runs the adjoint
λ_t = C_t gy_tᵀ + a_{t+1} λ_{t+1} the same way in reverse and accumulates the gradients of x,
Δ, A, B and C inside its loop; only exp(Δ A) and h are kept from the forward. Time and
memory O(L D N): linear in L, the (L, B, N, D) states materialised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from seqmix.kernels.linear_scan import scan


def selective_scan_chunked(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                           C: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """y_t = C_t · h_t, h_t = exp(Δ_t A) ⊙ h_{t-1} + B_t x_tᵀ, time-major: x, Δ (L, Bt, D);
    A (D, N); B, C (L, Bt, N) -> y (L, Bt, D) (x is Δ ⊙ u: the mixer's wrapper forms it)."""
    return _SelectiveScan.apply(x, delta, A, B, C, chunk_size)


def _chunked(t: torch.Tensor, C: int) -> torch.Tensor:
    """(L, ...) -> (C, n_chunks, ...) contiguous, zero-padded to a multiple of C: row j holds
    position j of every chunk, so each step of the loops below reads one contiguous slab."""
    pad = (-t.shape[0]) % C
    t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) if pad else t
    return t.reshape(-1, C, *t.shape[1:]).transpose(0, 1).contiguous()


def _unchunked(t: torch.Tensor, L: int) -> torch.Tensor:
    return t.transpose(0, 1).flatten(0, 1)[:L]


LOG2_E = 1.0 / math.log(2.0)


class _SelectiveScan(torch.autograd.Function):
    """y_t = C_t · h_t, h_t = exp(Δ_t A) ⊙ h_{t-1} + B_t x_tᵀ (states (N, D)), h_{-1} = 0.

    x, Δ: (L, Bt, D); A: (D, N); B, C: (L, Bt, N) -> y: (L, Bt, D). The sequence is cut
    into chunks of C tokens and one Python loop runs over the C positions, advancing every
    chunk at once: first chunks 0..n-2 from zero (their final states), then, after those
    are carried across chunks by ``scan``, every chunk from its true incoming state,
    writing h and y. Every step touches one (chunks, Bt, N, D) slab rather than all of L.
    The only full-size tensors are exp(Δ A) and h, kept for the backward, which runs the
    adjoint λ_t = C_t gy_tᵀ + a_{t+1} ⊙ λ_{t+1} the same way in reverse and accumulates
    every gradient inside its loop. States are (N, D) so that the contractions over N and
    D are matrix products. O(L·Bt·D·N) time and memory."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, chunk_size):
        L = x.shape[0]
        Cc = min(chunk_size, L)
        x, delta, B, C = (_chunked(t, Cc) for t in (x, delta, B, C))
        At = A.t()  # (N, D)
        # exp(Δ A) as 2^(Δ · A log2 e): equal up to a relative |Δ A|·2⁻²³ in fp32 (the
        # rounding of the scaled exponent); torch's exp2 ran 2-3× faster than its exp on the
        # CPU measured (AVX-512, one thread: 0.6-1.0 vs 2.2 ns per element). In place: one
        # full-size buffer, not two. Zero padding past L gives a = 1.
        a = (delta[..., None, :] * (At * LOG2_E)).exp2_()  # (Cc, n, Bt, N, D)
        decay = torch.exp(delta.sum(0)[..., None, :] * At)  # product of a over each chunk
        n = x.shape[1]
        # The state entering each chunk. Only chunks 0..n-2 pass a state on, so only they
        # are run from zero (none when the sequence is one chunk).
        s = x.new_zeros(*x.shape[1:-1], *At.shape)
        if n > 1:
            h = torch.zeros_like(s[:-1])
            for j in range(Cc):  # chunks 0..n-2 from zero: their final states
                h.mul_(a[j][:-1]).addcmul_(B[j, :-1][..., :, None], x[j, :-1][..., None, :])
            s[1:] = scan(decay[:-1], h, chunk_size)
        H, y = x.new_empty(Cc, *s.shape), torch.empty_like(x)
        h = s
        for j in range(Cc):  # every chunk from its true incoming state
            torch.mul(h, a[j], out=H[j]).addcmul_(B[j][..., :, None], x[j][..., None, :])
            h = H[j]
            torch.matmul(C[j][..., None, :], h, out=y[j][..., None, :])
        ctx.save_for_backward(x, delta, At, B, C, a, H, s, decay)
        ctx.length, ctx.chunk_size = L, chunk_size
        return _unchunked(y, L)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, delta, At, B, C, a, H, s, decay = ctx.saved_tensors
        Cc, n = H.shape[:2]
        gy = _chunked(gy, Cc)
        # The adjoint entering each chunk from the right. Only chunks 1..n-1 pass one on,
        # so only they are run from zero (none when the sequence is one chunk).
        lam = torch.zeros_like(s)
        if n > 1:
            tail = torch.zeros_like(s[1:])
            for j in reversed(range(Cc)):  # chunks 1..n-1 from zero: λ at their first position
                if j < Cc - 1:
                    tail.mul_(a[j + 1][1:])
                tail.addcmul_(C[j, 1:][..., :, None], gy[j, 1:][..., None, :])
            # in_k = decay_{k+1} in_{k+1} + a_0 λ_0 of chunk k+1, carried right to left.
            carried = a[0][1:] * tail
            lam[:-1] = scan(decay[1:].flip(0), carried.flip(0), ctx.chunk_size).flip(0)
        grads = _scan_gradients(lam, gy, x, delta, At, B, C, a, H, s)
        return (*(_unchunked(g, ctx.length) for g in grads[:2]), grads[2],
                *(_unchunked(g, ctx.length) for g in grads[3:]), None)


def _scan_gradients(lam, gy, x, delta, At, B, C, a, H, s):
    """The reverse loop of ``_SelectiveScan.backward``: λ from the true incoming adjoints
    ``lam``, and per position the gradients of x, Δ, A, B and C (chunked layout)."""
    Cc = H.shape[0]
    dx, ddelta = torch.empty_like(x), torch.empty_like(delta)
    dB, dC = torch.empty_like(B), torch.empty_like(C)
    q, dA_acc = torch.empty_like(lam), torch.zeros_like(lam)  # ∂/∂(Δ A) at one step, Σ_j of it ⊙ Δ_j
    for j in reversed(range(Cc)):
        if j < Cc - 1:
            lam.mul_(a[j + 1])
        lam.addcmul_(C[j][..., :, None], gy[j][..., None, :])  # λ_j
        # Contractions over d as row vector @ stateᵀ: the (N, D) @ (D, 1) form ran 6-7× slower
        # in torch's CPU bmm (measured: 137 vs 20 µs at 64 × (16, 128), one thread).
        torch.matmul(gy[j][..., None, :], H[j].mT, out=dC[j][..., None, :])  # Σ_d gy_d h_nd
        torch.matmul(B[j][..., None, :], lam, out=dx[j][..., None, :])  # Σ_n B_n λ_nd
        torch.matmul(x[j][..., None, :], lam.mT, out=dB[j][..., None, :])  # Σ_d λ_nd x_d
        torch.mul(lam, a[j], out=q).mul_(H[j - 1] if j else s)  # λ ⊙ a ⊙ h_{j-1}
        torch.sum(q * At, dim=-2, out=ddelta[j])
        dA_acc.addcmul_(q, delta[j][..., None, :])
    return dx, ddelta, dA_acc.sum((0, 1)).t(), dB, dC
