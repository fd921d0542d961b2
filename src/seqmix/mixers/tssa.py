"""Token Statistics Self-Attention, TSSA (ToST; Wu et al., ICLR 2025, arXiv:2412.17810, §3):
one gradient step on a variational coding-rate objective. Each head projects the tokens,
w = U_kᵀ z; soft memberships Π (softmax over heads) weight second-moment statistics of w,
and every token is rescaled feature-wise by 1/(1 + those statistics). No token pairs are
compared, so time and memory are O(L d). The causal form follows RobinWu218/ToST
``tost_lang/model_TSSA.py`` (``CausalSelfAttention_TSSA``), the non-causal one
``tost_vision/tost.py`` (``AttentionTSSA``); ``tssa_reference`` is the specification the
Triton kernel (``seqmix.kernels.tssa``) must equal.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.mixers import dispatch
from seqmix.mixers.base import Mixer, kernel, linear_flops


@dataclasses.dataclass
class TSSAOptions:
    n_heads: int = 4  # p = 64 at d = 256, as ToST-base's 768 / 12
    bias: bool = True  # c_attn / c_proj bias (nanoGPT's default)


def _check_positions(denom_bias: torch.Tensor | None, L: int) -> None:
    if denom_bias is not None and L > denom_bias.shape[1]:
        raise ValueError(
            f"sequence length {L} exceeds TSSA's max_len {denom_bias.shape[1]} (denom_bias has one "
            "row per position); build the mixer with a larger max_len"
        )


def tssa_membership(
    w: torch.Tensor, temp: torch.Tensor, denom_bias: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """Π: soft membership of every token in every head, softmax over heads.

    w: (B, H, L, p); temp: (H,); denom_bias: (H, L_max, 1) when causal (None: no bias,
    as in the kernel) -> Π: (B, H, L).
    """
    if causal:
        L = w.shape[2]
        _check_positions(denom_bias, L)
        w_sq = w * w
        denom = w_sq.cumsum(dim=-2).clamp_min(1e-12)  # causal analogue of the column norm
        w_norm = w_sq / denom
        if denom_bias is not None:
            w_norm = w_norm + denom_bias[:, :L]
    else:
        w_norm = F.normalize(w, dim=-2) ** 2  # w / ‖w‖ over tokens, per feature column
    return torch.softmax(w_norm.sum(-1) * temp[:, None], dim=1)


def tssa_reference(
    w: torch.Tensor, temp: torch.Tensor, denom_bias: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """TSSA per head before c_proj; w: (B, H, L, p), temp: (H,), denom_bias: (H, L_max, 1)
    (None when non-causal) -> y: (B, H, L, p). Half-precision w is computed in fp32 (the
    prefix sums of w² lose too much in bf16) and the result cast back. The official attention
    dropout on 1/(1 + dots) is left out: ToST's language configs train with dropout 0."""
    out_dtype = w.dtype
    w = w.to(torch.promote_types(w.dtype, torch.float32))
    Pi = tssa_membership(w, temp, denom_bias, causal)  # (B, H, L)
    w_sq = w * w
    if causal:
        dots = (w_sq * Pi[..., None]).cumsum(dim=-2) / (Pi.cumsum(dim=-1) + 1e-8)[..., None]
    else:
        pi = Pi / (Pi.sum(dim=-1, keepdim=True) + 1e-8)
        dots = pi[..., None, :] @ w_sq  # (B, H, 1, p)
    return (-(w * Pi[..., None]) / (1 + dots)).to(out_dtype)


@kernel("tssa", "triton", reference=tssa_reference, test="tests/kernels/test_kernels.py")
def triton_tssa():  # same arguments as tssa_reference
    from seqmix.kernels.tssa import tssa

    return tssa


TRITON = dispatch.triton_path(triton_tssa)


class TokenStatisticsAttention(Mixer):
    Options = TSSAOptions
    supports_noncausal = True
    has_step = True

    def __init__(self, d_model: int, options: TSSAOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        if d_model % options.n_heads:
            raise ValueError(
                f"tssa: d_model={d_model} is not divisible by n_heads={options.n_heads}"
            )
        if causal and max_len is None:
            raise ValueError(
                "causal tssa needs max_len (its denom_bias is a learned per-position table); "
                "pass max_len to mixers.build (the LM passes its block size)"
            )
        self.n_heads = options.n_heads
        self.d_head = d_model // options.n_heads
        self.c_attn = nn.Linear(d_model, d_model, bias=options.bias)  # the U_kᵀ, fused
        self.c_proj = nn.Linear(d_model, d_model, bias=options.bias)  # Σ_k U_k(·)
        self.temp = nn.Parameter(torch.empty(self.n_heads))
        self.denom_bias = nn.Parameter(torch.empty(self.n_heads, max_len, 1)) if causal else None
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        with torch.no_grad():
            self.temp.fill_(1.0)
            if self.denom_bias is not None:
                self.denom_bias.zero_()

    def no_weight_decay(self) -> set[str]:
        return {"temp", "denom_bias"} if self.causal else {"temp"}

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """w = U_kᵀ z per head: (B, L, d) -> (B, H, L, p)."""
        B, L, _ = x.shape
        return self.c_attn(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        w = self._heads(x)
        y = dispatch.call("tssa", (w, self.temp, self.denom_bias, self.causal), tssa_reference, TRITON)
        return self.c_proj(y.transpose(1, 2).reshape(B, L, D))

    def compression_term(self, x: torch.Tensor, eps: float = 0.5) -> torch.Tensor:
        """Per head, R_c^var (ToST's variational bound, §3) on this layer's input x (B, L, d): (B, H), summing to R_c^var.

            R_k = ½ (n_k / n) Σ_{i≤p} log(1 + (d / ε²) [(U_kᵀZ)^{⊙2} π_k / n_k]_i)

        with n = L, π_k = Π[:, k] from this layer's membership (causal or not), n_k = Σ_t π_k,t,
        U_kᵀZ = c_attn(x) split into heads (bias included, as the layer computes it), d the
        token dimension d_model and ε the coding precision (MCR²'s ε; 0.5 by default). The
        statistics are over the whole sequence (for the causal layer: those of the last token).
        """
        w = self._heads(x)
        Pi = tssa_membership(w, self.temp, self.denom_bias, self.causal)  # (B, H, L)
        n_k = Pi.sum(dim=-1)  # (B, H)
        second_moment = (Pi[..., None] * w * w).sum(dim=-2) / (n_k[..., None] + 1e-8)  # (B, H, p)
        coding = torch.log1p(self.d_model / eps**2 * second_moment).sum(-1)
        return 0.5 * (n_k / x.shape[1]) * coding

    # Recurrent form: A = Σ w², M = Σ Π w², c = Σ Π per head, and the position t.
    def init_state(self, batch, device, dtype):
        zeros = torch.zeros(batch, self.n_heads, self.d_head, device=device, dtype=dtype)
        return zeros, zeros.clone(), torch.zeros(batch, self.n_heads, device=device, dtype=dtype), 0

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        A, M, c, t = state
        _check_positions(self.denom_bias, t + 1)
        w = self._heads(x_t[:, None, :])[:, :, 0]  # (B, H, p)
        w_sq = w * w
        A = A + w_sq
        w_norm = w_sq / A.clamp_min(1e-12) + self.denom_bias[:, t]
        Pi = torch.softmax(w_norm.sum(-1) * self.temp, dim=1)  # (B, H)
        M = M + Pi[..., None] * w_sq
        c = c + Pi
        y = -(w * Pi[..., None]) / (1 + M / (c + 1e-8)[..., None])
        return self.c_proj(y.reshape(x_t.shape[0], self.d_model)), (A, M, c, t + 1)

    def flops(self, seq_len: int) -> float:
        d, H = self.d_model, self.n_heads
        # Per token: w², its prefix sum, /denom, +b, Σ_c (5 per feature); Π w², its prefix
        # sum, /c (3); 1 + dots, the quotient and -Π w (3); plus the softmax over heads.
        stats = seq_len * (11.0 * d + 5.0 * H)
        return 2 * linear_flops(seq_len, d, d) + stats
