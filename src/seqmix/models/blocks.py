"""The residual blocks a mixer sits in, one per published architecture family (``post``,
``pre``, ``pre_layerscale``, ``pre_rms``; each method below names its source). Each mixer
trains in its own paper's block by default (``model.block: native``, the catalogue's
``MixerEntry.block``); a config can force one block for all (``model.block: post``, an
ablation) or per architecture (``{default: pre, mamba: native}``). The equations are in the
report's "Architectures" section.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from seqmix import catalogue, mixers

LAYERSCALE_INIT = 1e-5  # ToST's γ init (its language configs' ``*_ls``)
RMS_EPS = 1e-5  # Mamba's norm_epsilon
# Names (suffixes) of residual-branch output projections, the GPT-2 convention the
# references' scaled init keys on (nanoGPT's ``c_proj.weight``, Mamba's ``out_proj.weight``).
RESIDUAL_PROJECTIONS = ("c_proj.weight", "out_proj.weight")


class MLP(nn.Module):
    """W2 GELU(W1 h + b1) + b2 with d_ff = d_ff_mult · d."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def norm_class(block: str) -> type[nn.Module]:
    """The normalisation a block uses, and the LM's final norm after it (RMSNorm after
    pre_rms blocks, as Mamba's MixerModel ``norm_f``; LayerNorm otherwise)."""
    if block not in catalogue.BLOCKS:
        raise ValueError(f"unknown block {block!r}; blocks: {', '.join(catalogue.BLOCKS)}")
    return nn.RMSNorm if block == "pre_rms" else nn.LayerNorm


def make_norm(block: str, d_model: int) -> nn.Module:
    return nn.RMSNorm(d_model, eps=RMS_EPS) if norm_class(block) is nn.RMSNorm else nn.LayerNorm(d_model)


class Block(nn.Module):
    """One layer: a mixer and (except pre_rms, or d_ff = 0) a feed-forward, in ``block``."""

    def __init__(
        self,
        arch: str,
        d_model: int,
        mixer_options: dict,
        *,
        d_ff: int,
        dropout: float,
        block: str = "post",
        n_layers: int = 1,
        causal: bool = True,
        max_len: int | None = None,
    ):
        super().__init__()
        self.kind = block
        self.n_layers = n_layers
        self.mixer = mixers.build(arch, d_model, causal=causal, max_len=max_len, **mixer_options)
        ffn_cls = type(self.mixer).feedforward or MLP
        # d_ff = 0 (zoology's MQAR models, state_mixer = Identity) or Mamba's block: no FFN.
        self.ffn = ffn_cls(d_model, d_ff, dropout) if d_ff > 0 and block != "pre_rms" else None
        self.norm1 = make_norm(block, d_model)
        self.norm2 = make_norm(block, d_model) if self.ffn is not None else None
        self.drop = nn.Dropout(dropout)  # on each branch's output, as nanoGPT's resid_dropout
        self.gated = type(self.mixer).residual_in_mixer
        # CRATE's ISTA replaces the stream, with no residual around it in any block (its
        # reference, Ma-Lab-Berkeley/CRATE model/crate.py: x = x + attn(LN(x)); x = ff(LN(x))),
        # which keeps ISTA's exact zeros.
        self.ffn_residual = type(self.mixer).feedforward_residual
        if block == "pre_layerscale":
            self.gamma1 = nn.Parameter(torch.full((d_model,), LAYERSCALE_INIT))
            self.gamma2 = nn.Parameter(torch.full((d_model,), LAYERSCALE_INIT)) if self.ffn is not None else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.FORWARD[self.kind](self, h)

    def _post(self, h: torch.Tensor) -> torch.Tensor:
        """The Grassmann paper's post-LN Transformer block (Zhang 2025, arXiv:2512.19428, §3.2);
        a mixer with its residual inside (Grassmann's gate, §3.2 step 5) gets none around it."""
        h = self.drop(self.norm1(self.mixer(h))) if self.gated else self.norm1(h + self.drop(self.mixer(h)))
        if self.ffn is None:
            return h
        return self.norm2(h + self.drop(self.ffn(h))) if self.ffn_residual else self.norm2(self.ffn(h))

    def _pre(self, h: torch.Tensor) -> torch.Tensor:
        """Pre-LN (Xiong et al. 2020, arXiv:2002.04745; CRATE's, H3's and GLA's block)."""
        h = h + self.drop(self.mixer(self.norm1(h)))
        if self.ffn is None:
            return h
        return h + self.drop(self.ffn(self.norm2(h))) if self.ffn_residual else self.ffn(self.norm2(h))

    def _pre_layerscale(self, h: torch.Tensor) -> torch.Tensor:
        """ToST's block (Wu et al. 2025, arXiv:2412.17810; RobinWu218/ToST
        ``tost_lang/model_TSSA.py`` Block): pre-LN with both branches scaled by LayerScale γ."""
        h = h + self.gamma1 * self.drop(self.mixer(self.norm1(h)))
        if self.ffn is None:
            return h
        if not self.ffn_residual:
            return self.ffn(self.norm2(h))
        return h + self.gamma2 * self.drop(self.ffn(self.norm2(h)))

    def _pre_rms(self, h: torch.Tensor) -> torch.Tensor:
        """Mamba's block (Gu & Dao 2023, arXiv:2312.00752; state-spaces/mamba ``mamba_simple.py``
        Block + MixerModel): RMSNorm, no MLP. Its reference has no dropout: set ``dropout: 0``."""
        return h + self.drop(self.mixer(self.norm1(h)))

    FORWARD = {"post": _post, "pre": _pre, "pre_layerscale": _pre_layerscale, "pre_rms": _pre_rms}

    def no_weight_decay(self) -> set[str]:
        # LayerScale γ are 1-d and already undecayed by make_optimizer's dim rule; named
        # here so that the intent does not depend on that rule.
        return {"gamma1", "gamma2"} if self.kind == "pre_layerscale" else set()

    @torch.no_grad()
    def reset_block_parameters(self) -> None:
        """The block's own initialisation, run after the model's GPT-2 init (models/lm.py)."""
        if self.kind == "pre_layerscale":  # ToST's: γ = 1e-5, residual projections as nanoGPT's
            for gamma in (self.gamma1, self.gamma2):
                if gamma is not None:
                    gamma.fill_(LAYERSCALE_INIT)
            for p in self._residual_projections():
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layers))
        elif self.kind == "pre_rms":  # Mamba MixerModel's rescale_prenorm_residual
            for p in self._residual_projections():
                nn.init.kaiming_uniform_(p, a=math.sqrt(5))
                p /= math.sqrt(self.n_layers)  # n_residuals_per_layer = 1 (no MLP)

    def _residual_projections(self) -> list[nn.Parameter]:
        found = [p for name, p in self.mixer.named_parameters() if name.endswith(RESIDUAL_PROJECTIONS)]
        if self.ffn is not None and isinstance(self.ffn, MLP):
            found.append(self.ffn.fc2.weight)
        return found

    def extra_repr(self) -> str:
        return f"block={self.kind}"


def build_blocks(
    arch: str,
    d_model: int,
    n_layers: int,
    mixer_options: dict,
    *,
    d_ff_mult: float,
    dropout: float,
    block: str,
    causal: bool,
    max_len: int | None,
) -> nn.ModuleList:
    if block not in catalogue.BLOCKS:
        raise ValueError(f"unknown block {block!r} for {arch!r}; blocks: {', '.join(catalogue.BLOCKS)} "
                         "(resolve model.block 'native' with ModelSettings.block_for first)")
    d_ff = int(round(d_ff_mult * d_model))
    return nn.ModuleList(
        Block(
            arch,
            d_model,
            mixers.options_for_layer(arch, mixer_options, i),
            d_ff=d_ff,
            dropout=dropout,
            block=block,
            n_layers=n_layers,
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


@dataclasses.dataclass
class StackConfig:
    """What every model around a stack of mixer blocks is made of (CausalLM's LMConfig,
    PairClassifier's ClassifierConfig add their own fields)."""

    arch: str
    vocab_size: int
    max_len: int
    d_model: int = 256
    n_layers: int = 6
    d_ff_mult: float = 4.0
    dropout: float = 0.1
    block: str = "post"  # one of catalogue.BLOCKS (resolved: never "native")
    mixer_options: dict = dataclasses.field(default_factory=dict)

    def blocks(self, causal: bool) -> nn.ModuleList:
        return build_blocks(self.arch, self.d_model, self.n_layers, self.mixer_options, d_ff_mult=self.d_ff_mult,
                            dropout=self.dropout, block=self.block, causal=causal, max_len=self.max_len)
