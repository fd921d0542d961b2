"""Gated linear attention, GLA (Yang et al., ICML 2024, arXiv:2312.06635; fla defaults):
linear attention whose d_k × d_v state forgets along the key dimension with a data-dependent
gate, S_t = Diag(α_t) S_{t-1} + k_tᵀ v_t, o_t = q_t S_t, log α_t = logsigmoid(x W_α1 W_α2 +
b_α) / τ (fla ``gk``), inside fla's ``GatedLinearAttention`` layer (d_k = d/2, per-head
RMSNorm, output gate swish(x W_g); no feature map, no short convolution).

``gla_recurrent_reference`` (fla ``naive_recurrent_gla``) is the specification; the two
kernels declared below must equal it: the chunkwise PyTorch forms
(``seqmix.kernels.gla_chunked``, the CPU path) and the Triton kernel (``seqmix.kernels.gla``,
CUDA). Causal only. It has no score matrix (q kᵀ is signed), so the sparsity analysis reads
its Jacobian.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.kernels.gla_chunked import gla_chunk
from seqmix.mixers import dispatch
from seqmix.mixers.base import Mixer, kernel, linear_flops


@dataclasses.dataclass
class GLAOptions:
    n_heads: int = 4
    expand_k: float = 0.5  # d_k = expand_k · d
    expand_v: float = 1.0  # d_v = expand_v · d
    gate_low_rank_dim: int = 16  # rank of W_α1 W_α2
    gate_logit_normalizer: float = dataclasses.field(default=16.0, metadata={"gt": 0})  # τ: log α = logsigmoid(·) / τ
    norm_eps: float = 1e-5  # ε of the per-head RMSNorm
    chunk_size: int = dataclasses.field(default=64, metadata={"ge": 1})  # C of the chunkwise form (a speed knob, not a model choice)


def gla_recurrent_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor
) -> torch.Tensor:
    """S_t = diag(α_t) S_{t-1} + k_tᵀ v_t; o_t = q_t S_t (the paper's recurrent form).

    q, k, log_alpha: (B, H, L, Dk); v: (B, H, L, Dv) -> o: (B, H, L, Dv). q is used as
    given (the mixer scales it by Dk^-1/2 beforehand). One Python step per token: the
    specification, not the fast path.
    """
    B, H, L, Dk = q.shape
    S = q.new_zeros(B, H, Dk, v.shape[-1])
    outs = []
    for q_t, k_t, v_t, la_t in zip(*(t.unbind(2) for t in (q, k, v, log_alpha))):  # unbind: O(L) backward
        S = S * la_t[..., None].exp() + k_t[..., None] * v_t[..., None, :]
        outs.append((q_t[..., None] * S).sum(-2))  # q_t S_t: (B, H, Dv)
    return torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])


# The kernels, both taking gla_chunk's arguments (q, k, v, log_alpha, chunk_size).
@kernel("gla_chunked", "pytorch", reference=gla_recurrent_reference, test="tests/mixers/test_mixers_recurrent.py")
def chunked_gla():
    return gla_chunk


@kernel("gla", "triton", reference=gla_recurrent_reference, test="tests/kernels/test_kernels.py")
def triton_gla():
    from seqmix.kernels.gla import chunk_gla

    return chunk_gla


TRITON = dispatch.triton_path(triton_gla)


class GatedLinearAttention(Mixer):
    Options = GLAOptions
    supports_noncausal = False
    has_step = True

    def __init__(self, d_model: int, options: GLAOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        o = options
        self.key_dim = int(d_model * o.expand_k)
        self.value_dim = int(d_model * o.expand_v)
        if self.key_dim % o.n_heads or self.value_dim % o.n_heads:
            raise ValueError(
                f"gla: d_k={self.key_dim} and d_v={self.value_dim} (d_model={d_model} × expand_k="
                f"{o.expand_k}, expand_v={o.expand_v}) must both be divisible by n_heads={o.n_heads}; "
                "change n_heads or d_model"
            )
        self.n_heads = o.n_heads
        self.head_k = self.key_dim // o.n_heads
        self.head_v = self.value_dim // o.n_heads
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)  # output gate
        # Low-rank gate: x W_α1 W_α2 + b_α (fla ``gk_proj``).
        self.gk_proj = nn.Sequential(
            nn.Linear(d_model, o.gate_low_rank_dim, bias=False),
            nn.Linear(o.gate_low_rank_dim, self.key_dim, bias=True),
        )
        self.g_norm = nn.RMSNorm(self.head_v, eps=o.norm_eps)  # per head, shared across heads
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        # fla has no special gate initialisation: b_α = 0 (so α ≈ σ(0)^{1/16} ≈ 0.957 at
        # init) and the RMSNorm gain 1. fla's xavier_uniform(gain 2^-2.5) on every Linear is
        # replaced by the LM's GPT-2 init, like every other mixer's projections.
        with torch.no_grad():
            nn.init.zeros_(self.gk_proj[1].bias)
            nn.init.ones_(self.g_norm.weight)

    def _qkvg(self, x: torch.Tensor):
        """Per-head q (scaled), k, v, log α: (B, H, L, ·), and the output gate (B, L, H, Dv_h)."""
        B, L, _ = x.shape
        heads = lambda t, d: t.view(B, L, self.n_heads, d).transpose(1, 2)  # noqa: E731
        q = heads(self.q_proj(x), self.head_k) * self.head_k**-0.5
        k = heads(self.k_proj(x), self.head_k)
        v = heads(self.v_proj(x), self.head_v)
        log_alpha = heads(
            F.logsigmoid(self.gk_proj(x)) / self.options.gate_logit_normalizer, self.head_k
        )
        gate = self.g_proj(x).view(B, L, self.n_heads, self.head_v)
        return q, k, v, log_alpha, gate

    def _output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """RMSNorm(o) ⊙ swish(x W_g), then W_o. o: (B, L, H, Dv_h) -> (B, L, d)."""
        o = self.g_norm(o) * F.silu(gate)
        return self.o_proj(o.flatten(-2))

    def core(self, q, k, v, log_alpha) -> torch.Tensor:
        """o (B, H, L, Dv_h): the Triton kernel for CUDA tensors, else the chunked form."""
        return dispatch.call("gla", (q, k, v, log_alpha, self.options.chunk_size), gla_chunk, TRITON)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, log_alpha, gate = self._qkvg(x)
        return self._output(self.core(q, k, v, log_alpha).transpose(1, 2), gate)

    # Recurrent form: one (Dk_h × Dv_h) state per head.
    def init_state(self, batch, device, dtype):
        return torch.zeros(
            batch, self.n_heads, self.head_k, self.head_v, device=device, dtype=dtype
        )

    def step(self, x_t: torch.Tensor, S: torch.Tensor):
        q, k, v, log_alpha, gate = self._qkvg(x_t[:, None, :])  # (B, H, 1, ·)
        q, k, v, log_alpha = (t[:, :, 0] for t in (q, k, v, log_alpha))
        S = S * log_alpha.exp()[..., None] + k[..., None] * v[..., None, :]
        o = (q[..., None] * S).sum(-2)  # (B, H, Dv_h)
        return self._output(o[:, None], gate)[:, 0], S

    def flops(self, seq_len: int) -> float:
        d, dk, dv, r = self.d_model, self.key_dim, self.value_dim, self.options.gate_low_rank_dim
        proj = (
            2 * linear_flops(seq_len, d, dk)  # q, k
            + 2 * linear_flops(seq_len, d, dv)  # v, output gate
            + linear_flops(seq_len, d, r)
            + linear_flops(seq_len, r, dk)  # low-rank gate
            + linear_flops(seq_len, dv, d)  # W_o
        )
        # Chunkwise core per token and head: q S and the chunk's kᵀv (2·Dk·Dv each), plus
        # the causal half of the C × C intra-chunk products (C·(Dk + Dv)).
        C = min(self.options.chunk_size, seq_len)
        core = (
            seq_len
            * self.n_heads
            * (4 * self.head_k * self.head_v + C * (self.head_k + self.head_v))
        )
        return proj + core
