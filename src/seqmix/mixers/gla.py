"""Gated linear attention, GLA (Yang et al., ICML 2024; REFERENCE.md §5.1, fla defaults).

Block: pre-LN (``pre``): the GLA Transformer is pre-norm, a GLA layer then a feed-forward,
each with a residual (Yang et al. 2024, arXiv:2312.06635, §4); its SwiGLU/RMSNorm are not reproduced (GELU MLP, LayerNorm).

Linear attention whose d_k × d_v state forgets along the key dimension with a
data-dependent gate α_t ∈ (0, 1]^{d_k}, per head:

    S_t = Diag(α_t) S_{t-1} + k_tᵀ v_t,      o_t = q_t S_t               (recurrent form)
    log α_t = logsigmoid(x_t W_α1 W_α2 + b_α) / τ,  rank 16, τ = 16     (fla ``gk``)

The layer around it (fla ``GatedLinearAttention``): q = x W_q, k = x W_k with
d_k = d/2 (expand_k 0.5), v = x W_v (expand_v 1), 4 heads, q scaled by d_k_head^-1/2,
then per-head RMSNorm of o, an output gate swish(x W_g) and W_o. No feature map, no short
convolution (fla's defaults).

Two functions form the kernel interface (shapes (B, H, L, Dk) for q, k, log_alpha and
(B, H, L, Dv) for v; log_alpha ≤ 0; output (B, H, L, Dv)):

- ``gla_recurrent_reference``: the token-by-token recurrence (fla ``naive_recurrent_gla``),
  the specification.
- ``gla_chunk_reference``: the chunkwise-parallel form of §5.1, used by ``forward`` on the
  CPU (on a GPU ``forward`` calls the Triton kernel ``seqmix.kernels.gla.chunk_gla``). With
  b_t the cumulative gate from the chunk start, the state is carried across chunks,
      S_[n] = γ_n S_[n-1] + (K_[n] ⊙ Γ_[n])ᵀ V_[n],   O_[n] = (Q_[n] ⊙ Λ_[n]) S_[n-1] + intra,
  and inside a chunk the masked product (Q ⊙ Λ)(K / Λ)ᵀ is formed by *secondary chunking*
  (§5.1, fla ``chunk.py``): sub-chunks of 16 tokens; between sub-chunks I > J the decay is
  split at the end of sub-chunk I-1, so q and k are each scaled by exp(≤ 0); inside a
  sub-chunk the decay exp(g_i - g_j), i ≥ j, is formed pairwise in log space. No factor
  exp(+Σ log α) is ever formed, so strong decays (log α = -5 per step, -320 over a
  64-token chunk) underflow harmlessly to 0 instead of overflowing to inf.
  Per head: time O(L C (d_k + d_v) + L d_k d_v), memory O(L (16 + C/16) d_k + L d_v);
  linear in L for a fixed chunk. The loop in Python runs over the L/C chunks only.

This mixer is causal only (``supports_noncausal = False``): the SNLI classifier runs it
causally. It has no non-negative L × L score matrix (q kᵀ is signed), so the sparsity
analysis uses its Jacobian.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.mixers.base import Mixer, linear_flops, use_kernel

# Secondary chunk length inside a chunk (fla uses 16); the sub-chunk is gcd(C, 16).
SUBCHUNK = 16


@dataclasses.dataclass
class GLAOptions:
    n_heads: int = 4
    expand_k: float = 0.5  # d_k = expand_k · d
    expand_v: float = 1.0  # d_v = expand_v · d
    gate_low_rank_dim: int = 16  # rank of W_α1 W_α2
    gate_logit_normalizer: float = 16.0  # τ: log α = logsigmoid(·) / τ
    norm_eps: float = 1e-5  # ε of the per-head RMSNorm
    chunk_size: int = 64  # C of the chunkwise form (a speed knob, not a model choice)

    def __post_init__(self):
        if self.chunk_size < 1:
            raise ValueError(f"gla chunk_size must be >= 1, got {self.chunk_size}")
        if self.gate_logit_normalizer <= 0:
            raise ValueError(
                f"gla gate_logit_normalizer must be > 0, got {self.gate_logit_normalizer}"
            )


def gla_recurrent_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor
) -> torch.Tensor:
    """S_t = diag(α_t) S_{t-1} + k_tᵀ v_t; o_t = q_t S_t (REFERENCE.md §5.1, recurrent form).

    q, k, log_alpha: (B, H, L, Dk); v: (B, H, L, Dv) -> o: (B, H, L, Dv). q is used as
    given (the mixer scales it by Dk^-1/2 beforehand). One Python step per token: the
    specification, not the fast path.
    """
    B, H, L, Dk = q.shape
    S = q.new_zeros(B, H, Dk, v.shape[-1])
    outs = []
    for t in range(L):
        S = S * log_alpha[:, :, t, :, None].exp() + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * S).sum(-2))  # q_t S_t: (B, H, Dv)
    return torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])


def _masked_exp(exponent: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(exponent) where ``keep``, exactly 0 elsewhere (masked before exp, so no inf)."""
    return exponent.masked_fill(~keep, float("-inf")).exp()


def gla_chunk_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, chunk_size: int = 64
) -> torch.Tensor:
    """The chunkwise-parallel form of ``gla_recurrent_reference`` (REFERENCE.md §5.1).

    Same arguments and result; ``chunk_size`` is C. Any L works (the tail chunk is padded
    with zeros and log α = 0, which leaves the earlier outputs unchanged). Half-precision
    inputs are computed in fp32 and cast back.
    """
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = v.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, log_alpha = (t.float() for t in (q, k, v, log_alpha))
    C = chunk_size
    c = math.gcd(C, SUBCHUNK)  # sub-chunk length
    pad = (-L) % C
    if pad:
        q, k, v, log_alpha = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_alpha))
    N, Ns = (L + pad) // C, C // c

    q, k, log_alpha = (t.reshape(B, H, N, C, Dk) for t in (q, k, log_alpha))
    v = v.reshape(B, H, N, C, Dv)
    g = log_alpha.cumsum(dim=-2)  # log b_t / b_{chunk start}: ≤ 0, non-increasing in t
    g_last = g[..., -1:, :]  # log γ_n: (B, H, N, 1, Dk)

    # Inter-chunk (§5.1): S_[n] = γ_n S_[n-1] + (K ⊙ Γ)ᵀ V with Γ_t = b_end / b_t ≤ 1.
    U = (k * (g_last - g).exp()).transpose(-1, -2) @ v  # (B, H, N, Dk, Dv)
    decay = g_last.squeeze(-2).exp()[..., None]  # γ_n: (B, H, N, Dk, 1)
    S = q.new_zeros(B, H, Dk, Dv)
    S_before = []  # the state entering chunk n
    for n in range(N):  # L / C steps on (Dk, Dv) states only
        S_before.append(S)
        S = decay[:, :, n] * S + U[:, :, n]
    o = (q * g.exp()) @ torch.stack(S_before, dim=2)  # (Q ⊙ Λ) S_[n-1]: (B, H, N, C, Dv)

    # Intra-chunk, secondary chunking: sub-chunks of c tokens.
    qs, ks, gs = (t.reshape(B, H, N, Ns, c, Dk) for t in (q, k, g))
    vs = v.reshape(B, H, N, Ns, c, Dv)
    # Diagonal sub-chunks: A_ij = Σ_d q_i k_j exp(g_i - g_j), j ≤ i, pairwise in log space.
    tril = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    pair_decay = _masked_exp(gs[..., :, None, :] - gs[..., None, :, :], tril[..., None])
    A = (qs[..., :, None, :] * ks[..., None, :, :] * pair_decay).sum(-1)  # (B, H, N, Ns, c, c)
    o_intra = A @ vs  # (B, H, N, Ns, c, Dv)
    if Ns > 1:
        # Off-diagonal sub-chunks I > J: exp(g_i - g_j) = exp(g_i - r_I) · exp(r_I - g_j) with
        # r_I = g at the last token of sub-chunk I-1, so both factors are ≤ 1.
        r = gs[..., :-1, -1:, :]  # (B, H, N, Ns-1, 1, Dk): references of query sub-chunks 1..Ns-1
        q_rel = qs[..., 1:, :, :] * (gs[..., 1:, :, :] - r).exp()  # (B, H, N, Ns-1, c, Dk)
        earlier = torch.ones(Ns - 1, Ns, dtype=torch.bool, device=q.device).tril()  # J ≤ I-1
        k_rel = ks[..., None, :, :, :] * _masked_exp(
            r[..., None, :, :] - gs[..., None, :, :, :], earlier[:, :, None, None]
        )  # (B, H, N, Ns-1, Ns, c, Dk): key sub-chunk J seen from query sub-chunk I
        A_off = q_rel[..., :, None, :, :] @ k_rel.transpose(-1, -2)  # (B, H, N, Ns-1, Ns, c, c)
        o_off = torch.einsum("bhnijxy,bhnjyv->bhnixv", A_off, vs)
        o_intra = torch.cat([o_intra[..., :1, :, :], o_intra[..., 1:, :, :] + o_off], dim=-3)
    o = o + o_intra.reshape(B, H, N, C, Dv)
    return o.reshape(B, H, N * C, Dv)[:, :, :L].to(out_dtype)


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
        if use_kernel(q):
            from seqmix.kernels.gla import chunk_gla

            return chunk_gla(q, k, v, log_alpha, self.options.chunk_size)
        return gla_chunk_reference(q, k, v, log_alpha, self.options.chunk_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, log_alpha, gate = self._qkvg(x)
        return self._output(self.core(q, k, v, log_alpha).transpose(1, 2), gate)

    # Recurrent form: one (Dk_h × Dv_h) state per head (REFERENCE.md §8).
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
