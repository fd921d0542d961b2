"""H3's diagonal SSM kernel (S4D) from its parameters in one autograd node with its backward
written out: the bilinear discretisation and the blocked Vandermonde product of
``seqmix.mixers.h3``, whose composition ``s4d_kernel_reference`` it equals
(tests/mixers/test_mixers_recurrent.py compares them forward and backward).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def vandermonde_blocks(L: int) -> tuple[int, int]:
    """(b, nb): the Vandermonde blocks of lags l < L, l = m·b + j with b = ⌈√L⌉: this
    kernel's and ``seqmix.mixers.h3.s4d_kernel``'s."""
    b = max(1, math.isqrt(max(L - 1, 0)) + 1)
    return b, -(-L // b)


def s4d_kernel_from_parameters(log_dt, log_A_real, A_imag, B, C, L: int) -> torch.Tensor:
    """``seqmix.mixers.h3.s4d_kernel_reference`` (S4D's bilinear discretisation, then its
    kernel) in one autograd node with its backward written out (``_S4DKernel``): the same
    value and gradients, with fewer kernel launches than autograd's backward through a dozen
    complex ops (a GPU step of these small models is bound by launches). log_dt: (H,);
    log_A_real, A_imag: (H, M); B, C: (H, M, 2) real views of complex -> (H, L)."""
    return _S4DKernel.apply(log_dt, log_A_real, A_imag, B, C, L)


class _S4DKernel(torch.autograd.Function):
    """κ_l = 2 Re Σ_n coef_n z_n^l with, per head, Δ = e^{log_dt}, a = -e^{log_A_real} + i A_imag,
    x = Δ a, r = 1/(1 - x/2), z = (1 + x/2) r (bilinear Ā), coef = B C Δ r (C B̄).

    Backward, in PyTorch's convention for complex gradients (∂/∂Re + i ∂/∂Im; holomorphic
    steps give ∂in = conj(d out/d in) ∂out, a real input Re(conj(d out/d in) ∂out)), with
    g = ∂loss/∂κ, P1 = Σ_l g_l z^l and P2 = Σ_l l g_l z^{l-1} (both by the forward's
    Vandermonde blocks): ∂coef = 2 conj(P1), ∂z = 2 conj(coef P2); through dz/dx = r²,
    dcoef/dx = B C Δ r²/2, dcoef/dΔ = B C r, dx/dΔ = a, dx/da = Δ this folds to
    ∂x = 2 conj(X) with X = r coef (r P2 + P1/2), so that
    ∂log_dt = 2 Δ Σ_n Re(a X + B C r P1), ∂log_A_real = -2 Δ e^{log_A_real} Re X,
    ∂A_imag = -2 Δ Im X, ∂B = 2 Δ conj(C r P1), ∂C = 2 Δ conj(B r P1)."""

    @staticmethod
    def forward(ctx, log_dt, log_A_real, A_imag, B, C, L):
        dt = log_dt.exp()[:, None]
        a_re = log_A_real.exp()
        a = torch.complex(-a_re, A_imag)
        half_x = (0.5 * dt) * a
        r = (1 - half_x).reciprocal()
        z = (1 + half_x) * r
        Bc, Cc = torch.view_as_complex(B), torch.view_as_complex(C)
        w = (Bc * Cc) * r
        coef = w * dt
        b, nb = vandermonde_blocks(L)
        log_z = torch.log(z)[..., None]  # (H, M, 1)
        small = torch.exp(log_z * torch.arange(b, device=z.device, dtype=dt.dtype))  # z^j: (H, M, b)
        big = torch.exp(log_z * torch.arange(0, nb * b, b, device=z.device, dtype=dt.dtype))  # z^{m b}
        K = (coef[..., None] * big).transpose(-1, -2) @ small  # (H, nb, b)
        ctx.save_for_backward(dt, a_re, a, r, w, coef, small, big, Bc, Cc)
        ctx.L = L
        return 2 * K.real.reshape(z.shape[0], nb * b)[:, :L]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        dt, a_re, a, r, w, coef, small, big, Bc, Cc = ctx.saved_tensors
        L = ctx.L
        b, nb = vandermonde_blocks(L)
        # P1 = Σ_l g_l z^l and P2 = Σ_l (l+1) g_{l+1} z^l in one pass over the blocks.
        g_deriv = F.pad(g[:, 1:] * torch.arange(1, L, device=g.device, dtype=g.dtype), (0, 1))
        weights = F.pad(torch.stack([g, g_deriv], 1), (0, nb * b - L)).view(g.shape[0], 2, nb, b).to(r.dtype)
        P1, P2 = ((weights @ small.transpose(-1, -2)[:, None]) * big.transpose(-1, -2)[:, None]).sum(-2).unbind(1)
        X = (r * coef) * (r * P2 + 0.5 * P1)
        Y = r * P1
        two_dt = 2 * dt
        d_log_dt = (a * X + w * P1).real.sum(-1) * two_dt[:, 0]
        d_B = torch.view_as_real((two_dt * Cc * Y).conj_physical())
        d_C = torch.view_as_real((two_dt * Bc * Y).conj_physical())
        return d_log_dt, -(two_dt * a_re) * X.real, -two_dt * X.imag, d_B, d_C, None
