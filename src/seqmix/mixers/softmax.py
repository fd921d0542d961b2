"""Softmax multi-head attention, the baseline every other mixer is measured against: the
Grassmann paper's Transformer attention (Zhang 2025, arXiv:2512.19428, §4.1: 4 heads, Q/K/V/O
projections with bias). The fast path is PyTorch's scaled_dot_product_attention (flash /
memory-efficient kernels where available); ``attention_reference`` is the formula it must equal.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from seqmix.mixers.base import HeadProjections, Mixer, linear_flops


@dataclasses.dataclass
class SoftmaxOptions:
    n_heads: int = 4
    bias: bool = True
    attn_dropout: float = 0.0


def attention_reference(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d_head)) v with an optional causal mask; q, k, v: (B, H, L, Dh)."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


class SoftmaxAttention(HeadProjections, Mixer):
    Options = SoftmaxOptions
    has_scores = True
    has_step = True

    def __init__(self, d_model: int, options: SoftmaxOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        self.init_projections(d_model, options.n_heads, options.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self._heads(x)  # (B, H, L, Dh)
        p = self.options.attn_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """exp(q·k/sqrt(d_head) - row max), zero above the diagonal when causal: (B, H, L, L)."""
        q, k, _ = self._heads(x)
        logits = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        if self.causal:
            L = x.shape[1]
            mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            logits = logits.masked_fill(~mask, float("-inf"))
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True))

    # Recurrent form: a growing key/value cache.
    def init_state(self, batch, device, dtype):
        empty = torch.zeros(batch, self.n_heads, 0, self.d_head, device=device, dtype=dtype)
        return (empty, empty.clone())

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        k_cache, v_cache = state
        q, k, v = self._heads(x_t[:, None, :])  # (B, H, 1, Dh)
        k_cache = torch.cat([k_cache, k], dim=2)
        v_cache = torch.cat([v_cache, v], dim=2)
        y = attention_reference(q, k_cache, v_cache, causal=False)  # the cache is the past
        return self.out_proj(y.transpose(1, 2).reshape(x_t.shape[0], self.d_model)), (k_cache, v_cache)

    def flops(self, seq_len: int) -> float:
        proj = 4 * linear_flops(seq_len, self.d_model, self.d_model)
        # q kᵀ and (softmax) v: 2·L²·d each, halved when causal.
        attn = 4.0 * seq_len * seq_len * self.d_model * (0.5 if self.causal else 1.0)
        return proj + attn
