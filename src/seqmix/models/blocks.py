"""The block every mixer sits in: the Grassmann paper's post-LN Transformer block.

    post-LN (paper):  h = LN1(h + Dropout(mix(h)));  h = LN2(h + Dropout(FFN(h)))
    Grassmann (Zhang 2025, arXiv:2512.19428, §3.2): h = Dropout(LN1(mix(h)))  (its gate already blends h in)
    pre-LN:           h = h + Dropout(mix(LN1(h))); h = h + Dropout(FFN(LN2(h)))
    CRATE (Yu 2023):  the ISTA feed-forward replaces the stream, no residual around it:
                      post-LN h = LN2(ISTA(h)), pre-LN h = ISTA(LN2(h))
"""

from __future__ import annotations

import torch
from torch import nn

from seqmix import mixers


class MLP(nn.Module):
    """W2 GELU(W1 h + b1) + b2 with d_ff = d_ff_mult · d."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(
        self,
        arch: str,
        d_model: int,
        mixer_options: dict,
        *,
        d_ff: int,
        dropout: float,
        norm: str = "post",
        causal: bool = True,
        max_len: int | None = None,
    ):
        super().__init__()
        self.mixer = mixers.build(arch, d_model, causal=causal, max_len=max_len, **mixer_options)
        ffn_cls = type(self.mixer).feedforward or MLP
        # d_ff = 0: no feed-forward at all (zoology's MQAR models, state_mixer = Identity).
        self.ffn = ffn_cls(d_model, d_ff, dropout) if d_ff > 0 else None
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model) if self.ffn is not None else None
        self.drop = nn.Dropout(dropout)
        self.pre_norm = norm == "pre"
        self.gated = type(self.mixer).residual_in_mixer
        self.ffn_residual = type(self.mixer).feedforward_residual

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            h = h + self.drop(self.mixer(self.norm1(h)))
            if self.ffn is None:
                return h
            return h + self.drop(self.ffn(self.norm2(h))) if self.ffn_residual else self.ffn(self.norm2(h))
        if self.gated:
            h = self.drop(self.norm1(self.mixer(h)))
        else:
            h = self.norm1(h + self.drop(self.mixer(h)))
        if self.ffn is None:
            return h
        return self.norm2(h + self.drop(self.ffn(h))) if self.ffn_residual else self.norm2(self.ffn(h))


def build_blocks(
    arch: str,
    d_model: int,
    n_layers: int,
    mixer_options: dict,
    *,
    d_ff_mult: float,
    dropout: float,
    norm: str,
    causal: bool,
    max_len: int | None,
) -> nn.ModuleList:
    d_ff = int(round(d_ff_mult * d_model))
    return nn.ModuleList(
        Block(
            arch,
            d_model,
            mixers.options_for_layer(arch, mixer_options, i),
            d_ff=d_ff,
            dropout=dropout,
            norm=norm,
            causal=causal,
            max_len=max_len,
        )
        for i in range(n_layers)
    )


def stack_reach(blocks: nn.ModuleList) -> int | None:
    """How many positions back a stack's output at t can read: the sum of its mixers'
    reaches, or None (unbounded) if any mixer's is."""
    reaches = [block.mixer.reach() for block in blocks]
    return None if any(r is None for r in reaches) else sum(reaches)
