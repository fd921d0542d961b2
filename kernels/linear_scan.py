"""The linear recurrence h_t = a_t ⊙ h_{t-1} + b_t along time, vectorised: the fast form of
``seqmix.mixers.scan.linear_scan_reference`` (its spec, one step per token), compared with it
in tests/mixers/test_mixers_scan.py. GLA's chunk-to-chunk state carry and Performer's causal
FAVOR+ use ``linear_scan`` (autograd); Mamba's chunked scan carries its chunk states with
``scan`` (no autograd, seqmix.kernels.selective_scan_chunked).

Both take time-major tensors (L, ...) and never run a Python step per token. Plain PyTorch:
no Triton, no compiler.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _shift(x: torch.Tensor) -> torch.Tensor:
    """x one step later in time (dim 0), zero entering at t = 0."""
    return F.pad(x[:-1], (0, 0) * (x.dim() - 1) + (1, 0))


@torch.no_grad()
def scan(a: torch.Tensor, b: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """h_t = a_t h_{t-1} + b_t along dim 0 (time-major), h_{-1} = 0; no autograd.

    Inside chunks of C: one loop over the C positions updates every chunk at once, after
    which b holds the chunk-local states and a the cumulative decays from the chunk start.
    Across chunks: the same scan on the chunk-final (decay, state) pairs, then one
    broadcast correction. C + L/C Python steps instead of L, O(L) work.
    """
    L, rest = a.shape[0], a.shape[1:]
    C = min(max(chunk_size, 2), L)  # ≥ 2 whenever L ≥ 2, so the recursion below ends
    pad = (-L) % C

    def chunked(x: torch.Tensor, fill: float) -> torch.Tensor:
        # A private contiguous copy (updated in place), (n_chunks, C, ...) time-major: each
        # step below reads and writes one position of every chunk, rows of contiguous memory.
        x = torch.cat([x, x.new_full((pad, *rest), fill)]) if pad else x.clone()
        return x.view(-1, C, *rest)

    a, b = chunked(a, 1.0), chunked(b, 0.0)
    for j in range(1, C):  # add_/mul_ on the rows: no __setitem__ copy
        b[:, j].add_(a[:, j] * b[:, j - 1])
        a[:, j].mul_(a[:, j - 1])
    if a.shape[0] > 1:
        carry = scan(a[:, -1], b[:, -1], chunk_size)  # (n_chunks, ...): state at each chunk's end
        b[1:].add_(a[1:] * carry[:-1, None])
    return b.flatten(0, 1)[:L]


class _LinearScan(torch.autograd.Function):
    """h = scan(a, b) with the adjoint recurrence as backward: λ_t = g_t + a_{t+1} λ_{t+1},
    ∂/∂b_t = λ_t, ∂/∂a_t = λ_t h_{t-1}."""

    @staticmethod
    def forward(ctx, a, b, chunk_size):
        h = scan(a, b, chunk_size)
        ctx.save_for_backward(a, h)
        ctx.chunk_size = chunk_size
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        a, h = ctx.saved_tensors
        a_next = _shift(a.flip(0))  # reversed time: a_{t+1}; the 0 meets λ_L = 0
        lam = scan(a_next, g.flip(0), ctx.chunk_size).flip(0)
        return lam * _shift(h), lam, None


def linear_scan(a: torch.Tensor, b: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t along dim 0 with h_{-1} = 0; a, b: (L, ...)."""
    return _LinearScan.apply(a, b, chunk_size)
