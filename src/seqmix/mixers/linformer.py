"""Linformer: low-rank attention over a projected sequence axis (Wang et al. 2020,
arXiv:2006.04768): head_h = softmax(Q_h (E K_h)ᵀ / √d_head)(F V_h) with learned
E, F ∈ R^{k×n}, n = max_len, shared by the heads and not across layers. Non-causal only: E
mixes every position into every projected key. A sequence of L < max_len uses the first L
columns of E and F, the same as padding K and V with zero rows (lucidrains/linformer slices
the same way). No ``scores``: the matrix that mixes V, softmax(Q (EK)ᵀ) F, is signed (F is);
no ``step``: there is no recurrent form.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from seqmix.mixers.base import Mixer, linear_flops


@dataclasses.dataclass
class LinformerOptions:
    n_heads: int = 4
    bias: bool = True
    k: int = dataclasses.field(default=64, metadata={"ge": 1})  # projected length (capped at max_len)
    share_kv: bool = False  # F = E, the paper's key-value sharing (default: lucidrains' "headwise")


def linformer_attention(q, k, v, E: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
    """softmax(q (E k)ᵀ / √d) (F v); q, k, v: (B, H, L, Dh); E, F: (k, L) -> (B, H, L, Dh)."""
    k_proj = E @ k  # (B, H, k, Dh): E (k × L) mixes the sequence axis
    v_proj = F @ v
    logits = q @ k_proj.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, L, k)
    return torch.softmax(logits, dim=-1) @ v_proj


class Linformer(Mixer):
    Options = LinformerOptions
    supports_causal = False

    def __init__(self, d_model: int, options: LinformerOptions, *, causal=False, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        if causal:
            raise ValueError("mixer 'linformer' has no causal form; build it with causal=False")
        if max_len is None:
            raise ValueError(
                "linformer needs max_len (its E, F project a fixed number of positions): "
                "pass max_len=... to seqmix.mixers.build (the models pass their block size)"
            )
        if d_model % options.n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={options.n_heads}")
        self.n_heads = options.n_heads
        self.d_head = d_model // options.n_heads
        self.k_len = min(options.k, max_len)
        self.q_proj = nn.Linear(d_model, d_model, bias=options.bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=options.bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=options.bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=options.bias)
        self.E = nn.Parameter(torch.empty(self.k_len, max_len))
        self.F = None if options.share_kv else nn.Parameter(torch.empty(self.k_len, max_len))
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        # lucidrains/linformer: U(−1/√k, 1/√k). E, F are plain Parameters, so the LM's GPT-2
        # init (Linear/Embedding only) leaves them alone; the hook re-applies it anyway.
        bound = 1.0 / math.sqrt(self.k_len)
        with torch.no_grad():
            for p in (self.E, self.F):
                if p is not None:
                    p.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        if L > self.max_len:
            raise ValueError(
                f"linformer was built for max_len={self.max_len} positions, got a sequence of "
                f"{L}; build it with max_len >= {L}"
            )
        split = lambda t: t.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        E = self.E[:, :L]
        F = E if self.F is None else self.F[:, :L]
        y = linformer_attention(q, k, v, E, F)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def flops(self, seq_len: int) -> float:
        L, d, k = seq_len, self.d_model, self.k_len
        proj = 4 * linear_flops(L, d, d)
        # E K and F V (2·k·L·d each), q (EK)ᵀ and p (FV) (2·L·k·d each).
        return proj + 8.0 * L * k * d
