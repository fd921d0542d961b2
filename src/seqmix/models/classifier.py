"""A sentence-pair classifier (SNLI) with any mixer as its encoder.

Input: [CLS] premise [SEP] hypothesis [SEP], padded on the right. Token + segment +
learned position embeddings, N blocks (models/blocks.py), the block's final norm, mean over the real tokens, and a
linear 3-way head. Mixers that have a non-causal form are built non-causal (an encoder);
causal-only mixers stay causal, which with right padding keeps the padding out of every
real token's state. Non-causal mixers have no key mask in the mixer interface, so the
padding rows are zeroed before each block to keep what they contribute small; batches are
padded only to their longest pair.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from seqmix import mixers
from seqmix.models.blocks import StackConfig, make_norm
from seqmix.models.lm import _init_weights

NUM_CLASSES = 3


@dataclasses.dataclass
class ClassifierConfig(StackConfig):
    n_layers: int = 2  # a sentence-pair encoder is shallow by default


class PairClassifier(nn.Module):
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.cfg = cfg
        self.causal = not mixers.mixer_class(cfg.arch).supports_noncausal
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.seg_emb = nn.Embedding(2, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = cfg.blocks(causal=self.causal)
        self.norm_f = make_norm(cfg.block, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, NUM_CLASSES)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, segments: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """idx, segments: (B, L) int; mask: (B, L) bool, True on real tokens. Logits (B, 3)."""
        B, L = idx.shape
        pos = torch.arange(L, device=idx.device)
        keep = mask[..., None].to(self.tok_emb.weight.dtype)
        h = self.drop(self.tok_emb(idx) + self.seg_emb(segments) + self.pos_emb(pos))
        for block in self.blocks:
            h = block(h * keep)
        h = self.norm_f(h) * keep
        pooled = h.sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.head(pooled)
