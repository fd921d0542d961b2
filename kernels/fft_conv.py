"""The causal convolution by FFT with its backward written out: H3's shift and diagonal SSMs
(``seqmix.mixers.h3``), where the skip D is the kernel's lag 0. Its plain reference, an
explicit sum per position, is ``seqmix.mixers.h3.causal_conv_reference``
(tests/mixers/test_mixers_recurrent.py compares them forward and backward).
"""

from __future__ import annotations

import torch


def causal_fft_conv(u: torch.Tensor, kernel: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
    """y_t = Σ_{s≤t} kernel_{t-s} u_s (+ skip · u_t) along the last dim by FFT (zero-padded to 2L).

    u: (..., L); kernel: broadcastable to u, length L; skip: broadcastable to u[..., 0] or
    None -> (..., L). O(L log L). The skip is the kernel's lag 0 (κ + skip·δ₀), added to its
    transform (where δ₀'s is 1 at every frequency), so it costs no pass over u.
    """
    return _CausalFFTConv.apply(u, kernel, skip)


class _CausalFFTConv(torch.autograd.Function):
    """``causal_fft_conv`` with its backward written out: with n = 2L, U = rfft(u, n) and
    K = rfft(κ, n) + skip, y = irfft(U K)[:L]; the backward is the two causal correlations,
    ∂u = irfft(G conj(K))[:L] and ∂κ = Σ_batch irfft(G conj(U))[:L] (G = rfft(∂y, n); the
    zero padding to 2L keeps both free of wrap-around), ∂skip = ∂κ at lag 0. Autograd's own
    backward of the same three FFTs also zero-fills the padding and the cut-off half of the
    output and copies them (four more passes over u's size per convolution); here only u
    and K are kept, and U is recomputed."""

    @staticmethod
    def forward(ctx, u, kernel, skip):
        L = u.shape[-1]
        n = 2 * L
        K = torch.fft.rfft(kernel, n=n)
        if skip is not None:
            K = K + skip[..., None]
        ctx.save_for_backward(u, K)
        ctx.kernel_shape, ctx.skip_shape = kernel.shape, None if skip is None else skip.shape
        return torch.fft.irfft(torch.fft.rfft(u, n=n) * K, n=n)[..., :L]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        u, K = ctx.saved_tensors
        L = u.shape[-1]
        n = 2 * L
        G = torch.fft.rfft(gy, n=n)
        du = dkernel = dskip = None
        if ctx.needs_input_grad[0]:
            du = torch.fft.irfft(G * K.conj(), n=n)[..., :L]
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            GU = (G * torch.fft.rfft(u, n=n).conj()).sum_to_size(*ctx.kernel_shape[:-1], G.shape[-1])
            dkernel = torch.fft.irfft(GU, n=n)[..., :L]
            if ctx.needs_input_grad[2]:
                dskip = dkernel[..., 0].sum_to_size(ctx.skip_shape)
        return du, dkernel, dskip
