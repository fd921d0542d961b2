"""Effective attention of any mixer: how much each output position depends on each input
position, a_{t,s} = ‖∂y_t/∂x_s‖_F, from the mixer's Jacobian on real inputs.

This puts every mixer on the axis Su's sparsity measures (Su 2023, kexue.fm/archives/9889): mixers without
a score matrix (grassmann, mamba, h3, tssa, crate ...) get a row of non-negative weights per
query position t. For a causal mixer a_{t,s} = 0 for s > t exactly, so S is taken over the
visible part s ≤ t of each row.

This is not the attention matrix, even for softmax attention. For y_t = W_o Σ_s A_ts W_v x_s
with A = softmax(q kᵀ/√d_h),

    ∂y_t/∂x_s = A_ts W_o W_v + W_o Σ_u (∂A_tu/∂x_s) W_v x_u,

and the second term (the scores' own dependence on x_s: through k_s for every s, and through
q_t for s = t) makes the diagonal a_{t,t} large and spreads mass over keys whose values differ
from the row's average. Both measures are reported for softmax as the calibration between
them (sparsity.py: kind "attention" vs "jacobian").

Cost: one row of the Jacobian per output coordinate (t, i), i.e. d vector-Jacobian
products per query position t. They run as one batched backward pass per chunk of rows:
one forward, then ``torch.autograd.grad(..., is_grads_batched=True)`` with a stack of one-hot
cotangents (vmap over the backward). Where a mixer's backward cannot be vmapped (a custom
autograd function without a batching rule), the fallback repeats the sequence K times along
the batch axis and gives each copy its own cotangent: the same numbers, one forward per
copy, and nothing needed from the mixer but batch independence. Only the rows the caller
asks for are computed (the analysis skips causal rows too short to be kept).
"""

from __future__ import annotations

import torch
from torch import nn


def _jacobian_rows_batched(mixer: nn.Module, xb: torch.Tensor, cot: torch.Tensor) -> torch.Tensor:
    """Rows cotᵀJ for a stack of cotangents: xb (1, L, d), cot (K, L, d) -> (K, L, d)."""
    x = xb.detach().clone().requires_grad_(True)
    y = mixer(x)  # (1, L, d)
    (g,) = torch.autograd.grad(y, x, cot[:, None], is_grads_batched=True)
    return g[:, 0]


def _jacobian_rows_copies(mixer: nn.Module, xb: torch.Tensor, cot: torch.Tensor) -> torch.Tensor:
    """The same by repeating the sequence K times along the batch axis."""
    x = xb.detach().expand(cot.shape[0], *xb.shape[1:]).clone().requires_grad_(True)
    (g,) = torch.autograd.grad(mixer(x), x, cot)
    return g


def effective_attention(
    mixer: nn.Module,
    x: torch.Tensor,
    positions: list[int] | None = None,
    chunk: int = 512,
    batched: bool = True,
) -> torch.Tensor:
    """a[b, t, s] = ‖∂y_t/∂x_s‖_F for y = mixer(x); x: (B, L, d) -> (B, L, L).

    ``positions``: the query positions t to compute (default all); other rows are NaN.
    ``chunk``: Jacobian rows per backward pass (memory ∝ chunk × one backward).
    ``batched=False`` forces the repeated-copies path. Call it on a mixer in eval mode:
    dropout would make the rows inconsistent.
    """
    B, L, d = x.shape
    ts = torch.arange(L, device=x.device) if positions is None else torch.as_tensor(positions, dtype=torch.long, device=x.device)
    # Row (t, i) of the Jacobian for every asked t and every output feature i.
    flat = (ts[:, None] * d + torch.arange(d, device=x.device)[None, :]).reshape(-1)
    out = torch.full((B, L, L), float("nan"), dtype=x.dtype, device=x.device)
    use_batched = batched
    with torch.enable_grad():
        for b in range(B):
            sq = x.new_empty(flat.numel(), L)  # Σ_j (∂y_{t,i}/∂x_{s,j})² per row (t, i), column s
            for start in range(0, flat.numel(), chunk):
                idx = flat[start : start + chunk]
                cot = torch.zeros(idx.numel(), L * d, dtype=x.dtype, device=x.device)
                cot[torch.arange(idx.numel(), device=x.device), idx] = 1.0
                cot = cot.view(-1, L, d)
                if use_batched:
                    try:
                        g = _jacobian_rows_batched(mixer, x[b : b + 1], cot)
                    except RuntimeError:
                        use_batched = False  # no batching rule somewhere in the backward
                if not use_batched:
                    g = _jacobian_rows_copies(mixer, x[b : b + 1], cot)
                sq[start : start + idx.numel()] = g.pow(2).sum(-1)
            out[b, ts] = sq.view(ts.numel(), d, L).sum(1).sqrt()  # Frobenius norm over (i, j)
    return out


def effective_attention_reference(mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same from the full Jacobian (torch.autograd.functional.jacobian), one sequence at
    a time: (L, d, L, d) -> norm over the two feature axes. The specification the batched
    version is tested against."""
    out = []
    for b in range(x.shape[0]):
        J = torch.autograd.functional.jacobian(lambda xb: mixer(xb[None])[0], x[b].detach())
        out.append(J.pow(2).sum(dim=(1, 3)).sqrt())
    return torch.stack(out)
