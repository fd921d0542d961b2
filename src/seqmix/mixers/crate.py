"""CRATE: white-box transformer, MSSA + ISTA (Yu et al. 2023, NeurIPS, arXiv:2306.01129), as
in its reference code (Ma-Lab-Berkeley/CRATE ``model/crate.py``). Each layer is one step of
sparse rate reduction, Z^{ℓ+1} = ISTA(Z^ℓ + MSSA(Z^ℓ)): MSSA is softmax attention with tied
projections Q = K = V = U x (so it has ``scores`` and a ``step``), and ISTA, one sparse-coding
step ReLU(x + η Dᵀ(x − D x) − ηλ), replaces the block's feed-forward and its output replaces
the stream (``feedforward_residual = False``: the reference has no residual around it).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.mixers.base import Mixer, linear_flops


@dataclasses.dataclass
class CrateOptions:
    n_heads: int = 4
    dim_head: int | None = dataclasses.field(default=None, metadata={"ge": 1})  # None = d_model // n_heads
    attn_dropout: float = 0.0
    # ISTA's η = λ = 0.1 are constants of ``ISTA`` (the reference's): the block builds the
    # feed-forward from (d_model, d_ff, dropout) alone.


class ISTA(nn.Module):
    """One ISTA step with a complete dictionary D ∈ R^{d×d} (Ma-Lab-Berkeley/CRATE ``FeedForward``):
    ReLU(x + η(Dᵀx − DᵀDx) − ηλ). Row vectors: Dx is ``x @ Dᵀ``, Dᵀx is ``x @ D``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, step_size: float = 0.1, lambd: float = 0.1):
        super().__init__()  # d_ff and dropout are unused, as in the reference's FeedForward
        self.step_size = step_size
        self.lambd = lambd
        self.weight = nn.Parameter(torch.empty(d_model, d_model))  # D
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        # The reference's init (a=0: bound √(6/d)), re-applied after the LM's GPT-2 init. MSSA's
        # Linear layers keep the GPT-2 init: the reference has no scheme of its own for them.
        nn.init.kaiming_uniform_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        D = self.weight
        dtd_x = F.linear(F.linear(x, D), D.T)  # DᵀD x
        dt_x = F.linear(x, D.T)  # Dᵀ x
        return F.relu(x + self.step_size * (dt_x - dtd_x) - self.step_size * self.lambd)

    def extra_repr(self) -> str:
        return f"d={self.weight.shape[0]}, step_size={self.step_size}, lambd={self.lambd}"


class CrateAttention(Mixer):
    Options = CrateOptions
    has_scores = True
    has_step = True
    feedforward = ISTA
    feedforward_residual = False

    def __init__(self, d_model: int, options: CrateOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        if options.dim_head is None and d_model % options.n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={options.n_heads}")
        self.n_heads = options.n_heads
        self.dim_head = options.dim_head or d_model // options.n_heads
        inner = self.n_heads * self.dim_head
        self.qkv = nn.Linear(d_model, inner, bias=False)  # U: Q = K = V = w
        # The reference skips to_out when heads == 1 and dim_head == d.
        self.to_out = nn.Linear(inner, d_model) if (self.n_heads, self.dim_head) != (1, d_model) else nn.Identity()

    def _w(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return self.qkv(x).view(B, L, self.n_heads, self.dim_head).transpose(1, 2)  # (B, H, L, Dh)

    def _out(self, y: torch.Tensor) -> torch.Tensor:
        B, H, L, Dh = y.shape
        return self.to_out(y.transpose(1, 2).reshape(B, L, H * Dh))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self._w(x)
        p = self.options.attn_dropout if self.training else 0.0
        # SDPA's default scale is dim_head^(-1/2), the reference's.
        return self._out(F.scaled_dot_product_attention(w, w, w, dropout_p=p, is_causal=self.causal))

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """softmax(w wᵀ · dim_head^(-1/2)) w written out (tests compare it with ``forward``)."""
        w = self._w(x)
        logits = w @ w.transpose(-1, -2) * self.dim_head**-0.5
        if self.causal:
            L = x.shape[1]
            mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            logits = logits.masked_fill(~mask, -math.inf)
        return self._out(torch.softmax(logits, dim=-1) @ w)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """exp(w·w/√dim_head − row max), zero above the diagonal when causal: (B, H, L, L)."""
        w = self._w(x)
        logits = w @ w.transpose(-1, -2) * self.dim_head**-0.5
        if self.causal:
            L = x.shape[1]
            mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            logits = logits.masked_fill(~mask, -math.inf)
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True))

    # Recurrent form: a cache of w (keys and values are the same tensor).
    def init_state(self, batch, device, dtype):
        return torch.zeros(batch, self.n_heads, 0, self.dim_head, device=device, dtype=dtype)

    def step(self, x_t: torch.Tensor, w_cache: torch.Tensor):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        w = self._w(x_t[:, None, :])  # (B, H, 1, Dh)
        w_cache = torch.cat([w_cache, w], dim=2)
        logits = w @ w_cache.transpose(-1, -2) * self.dim_head**-0.5  # (B, H, 1, t+1)
        return self._out(torch.softmax(logits, dim=-1) @ w_cache)[:, 0], w_cache

    def flops(self, seq_len: int) -> float:
        L, d = seq_len, self.d_model
        inner = self.n_heads * self.dim_head
        proj = linear_flops(L, d, inner) + (linear_flops(L, inner, d) if isinstance(self.to_out, nn.Linear) else 0.0)
        # w wᵀ and softmax · w: 2·L²·inner each, halved when causal.
        return proj + 4.0 * L * L * inner * (0.5 if self.causal else 1.0)
