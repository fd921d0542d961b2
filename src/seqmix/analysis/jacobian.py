"""Effective attention of any mixer, a_{t,s} = ‖∂y_t/∂x_s‖_F, from its Jacobian on real
inputs: a row of non-negative weights per query position even for mixers with no score
matrix, so that Su's sparsity (Su 2023, kexue.fm/archives/9889) puts every mixer on one
axis. It is not the attention matrix, even for softmax (the report's "Attention sparsity").

The d vector-Jacobian products per query position run as one batched backward per chunk of
rows (``is_grads_batched``: vmap over the backward); where a mixer's backward has no batching
rule, the sequence is repeated along the batch axis instead, one cotangent per copy: the
same numbers, needing nothing of the mixer but batch independence.
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
