"""A causal language model around any mixer (the Grassmann paper's LM, Zhang 2025,
arXiv:2512.19428, §3.1: token + learned absolute position embeddings (or none, as Zoology's
recurrences on MQAR), N blocks, a final
norm, and a head tied to the embedding). The blocks and the final norm are those of
``block`` (models/blocks.py): LayerNorm, or RMSNorm after Mamba's pre_rms blocks."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.models.blocks import StackConfig, make_norm


@dataclasses.dataclass
class LMConfig(StackConfig):
    tie_embeddings: bool = True
    positions: str = "learned"  # or "none": no position embedding (Zoology's recurrences on MQAR)


class CausalLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions not in ("learned", "none"):
            raise ValueError(f"positions must be learned or none, not {cfg.positions!r}")
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = cfg.blocks(causal=True)
        self.norm_f = make_norm(cfg.block, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.apply(_init_weights)

    def hidden_states(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """The input of every block and the final output: n_layers + 1 tensors (B, L, d)."""
        B, L = idx.shape
        if L > self.cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds the model's max_len {self.cfg.max_len}")
        h = self.tok_emb(idx)
        if self.pos_emb is not None:
            h = h + self.pos_emb(torch.arange(L, device=idx.device))
        h = self.drop(h)
        states = [h]
        for block in self.blocks:
            h = block(h)
            states.append(h)
        return states

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V)."""
        return self.head(self.norm_f(self.hidden_states(idx)[-1]))

    def logits_at(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (N, V) at the N positions where ``positions`` (B, L, bool) is True: the
        head (d × V, the largest matmul of a small model) runs only where it is scored."""
        return self.head(self.norm_f(self.hidden_states(idx)[-1])[positions])

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, every_position: bool | None = None) -> torch.Tensor:
        """Mean cross-entropy over the positions with a target (targets != -100).
        ``every_position``: the caller knows that every position has one (language
        modelling); None looks (a value read back from the device, which would break a
        compiled step's graph in two)."""
        scored = targets != -100
        if every_position or (every_position is None and bool(scored.all())):  # language modelling
            logits, targets = self(idx), targets
        else:  # MQAR: only the query positions reach the head
            logits, targets = self.logits_at(idx, scored), targets[scored]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    # GPT-2 style: N(0, 0.02) for linear and embedding weights, zero biases. Mixers that
    # need a particular initialisation (Mamba's A_log, dt bias) set it after this runs
    # through their own reset hooks, then each block its own (LayerScale γ, the scaled
    # residual projections): Module.apply visits children before their parent.
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif hasattr(module, "reset_mixer_parameters"):
        module.reset_mixer_parameters()
    elif hasattr(module, "reset_block_parameters"):
        module.reset_block_parameters()
