"""Gated linear attention, GLA (Yang et al., ICML 2024, arXiv:2312.06635; fla defaults):
linear attention whose d_k × d_v state forgets along the key dimension with a data-dependent
gate, S_t = Diag(α_t) S_{t-1} + k_tᵀ v_t, o_t = q_t S_t, log α_t = logsigmoid(x W_α1 W_α2 +
b_α) / τ (fla ``gk``), inside fla's ``GatedLinearAttention`` layer (d_k = d/2, per-head
RMSNorm, output gate swish(x W_g); no feature map, no short convolution).

``gla_recurrent_reference`` (fla ``naive_recurrent_gla``) is the specification; the
chunkwise forms (the CPU path) and the Triton kernel (``seqmix.kernels.gla``) must equal it.
Causal only. It has no score matrix (q kᵀ is signed), so the sparsity analysis reads its
Jacobian.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.kernels.linear_scan import linear_scan
from seqmix.mixers import dispatch
from seqmix.mixers.base import Mixer, linear_flops

# Secondary chunk length inside a chunk (fla uses 16); the sub-chunk is gcd(C, 16).
SUBCHUNK = 16


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


def _masked_exp(exponent: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(exponent) where ``keep``, exactly 0 elsewhere (masked before exp, so no inf)."""
    return exponent.masked_fill(~keep, float("-inf")).exp()


def gla_chunk_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, chunk_size: int = 64
) -> torch.Tensor:
    """The chunkwise-parallel form of ``gla_recurrent_reference`` (Yang et al. 2024), secondary
    chunking inside (fla ``chunk.py``): no exp(+Σ log α) is formed, so strong decays underflow
    to 0 instead of overflowing. ``chunk_size`` is C; any L works (the tail chunk is padded
    with zeros and log α = 0); half-precision inputs are computed in fp32 and cast back."""
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

    # Inter-chunk: S_[n] = γ_n S_[n-1] + (K ⊙ Γ)ᵀ V with Γ_t = b_end / b_t ≤ 1.
    U = (k * (g_last - g).exp()).transpose(-1, -2) @ v  # (B, H, N, Dk, Dv)
    decay = g_last.squeeze(-2).exp()[..., None]  # γ_n: (B, H, N, Dk, 1)
    S = q.new_zeros(B, H, Dk, Dv)
    S_before = []  # the state entering chunk n
    # unbind, not decay[:, :, n] in the loop: indexing one chunk per step makes autograd
    # zero-fill a gradient of the full (B, H, N, ...) size at every step, O(N²) backward.
    for decay_n, U_n in zip(decay.unbind(2), U.unbind(2)):  # L / C steps on (Dk, Dv) states
        S_before.append(S)
        S = decay_n * S + U_n
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


def gla_chunk_hierarchical(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_alpha: torch.Tensor, chunk_size: int = 64
) -> torch.Tensor:
    """``gla_recurrent_reference`` by chunks whose inside is split in halves: the CPU path.

    Same arguments and result; ``chunk_size`` C must be a power of two. Across chunks the
    state is carried by ``seqmix.kernels.linear_scan.linear_scan`` (no Python loop over chunks).
    Inside a chunk every pair j < i lies in exactly one block of s = C, C/2, …, 2 tokens with
    j in its first half and i in its second; splitting the decay at the end of the first
    half (both factors ≤ 1) makes each level two matrix products on rescaled q and k (the
    secondary chunking of §5.1 applied recursively). Nothing of size C × C × d_k is
    materialised: per head O(L (d_k log C + C + d_v)) work.
    """
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = v.dtype
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, log_alpha = (t.float() for t in (q, k, v, log_alpha))
    C = min(chunk_size, 1 << max(L - 1, 0).bit_length())  # a shorter sequence: one chunk
    pad = (-L) % C
    if pad:
        q, k, v, log_alpha = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_alpha))
    Lp = L + pad
    g = log_alpha.reshape(B, H, Lp // C, C, Dk).cumsum(dim=-2).reshape(B, H, Lp, Dk)
    o = (q * k).sum(-1, keepdim=True) * v  # j = i
    s = 2
    while s <= C:  # the second half of every s-block reads its first half
        h, n = s // 2, Lp // s
        # unbind into (first half, second half): one backward that stacks the two gradients,
        # where indexing each half would zero-fill a full-size gradient per index.
        (q_lo, q_hi), (k_lo, _), (v_lo, _), (g_lo, g_hi), (o_lo, o_hi) = (
            t.view(B, H, n, 2, h, t.shape[-1]).unbind(3) for t in (q, k, v, g, o))
        r = g_lo[..., -1:, :]  # g at the last token of the first half
        q_up = q_hi * (g_hi - r).exp()
        k_low = k_lo * (r - g_lo).exp()
        cross = (q_up @ k_low.transpose(-1, -2)) @ v_lo  # (B, H, n, h, Dv)
        o = torch.stack([o_lo, o_hi + cross], dim=3).view(B, H, Lp, Dv)
        s *= 2
    o = o + _gla_across_chunks(q, k, v, g, C)
    return o[:, :, :L].to(out_dtype)


def _gla_across_chunks(q, k, v, g, C: int) -> torch.Tensor:
    """(Q ⊙ Λ) S_[n-1] of every chunk n (zero for the first), S carried by linear_scan."""
    B, H, Lp, Dk = q.shape
    N = Lp // C
    if N == 1:
        return torch.zeros_like(v)
    qc, kc, gc = (t.view(B, H, N, C, Dk) for t in (q, k, g))
    vc = v.view(B, H, N, C, v.shape[-1])
    g_last = gc[..., -1:, :]  # log γ_n
    U = (kc * (g_last - gc).exp()).transpose(-1, -2) @ vc  # (B, H, N, Dk, Dv)
    decay = g_last.transpose(-1, -2).exp().expand_as(U)  # γ_n per key feature
    time_major = lambda t: t[:, :, :-1].permute(2, 0, 1, 3, 4)  # noqa: E731  chunks 0..N-2 first
    S = linear_scan(time_major(decay), time_major(U)).permute(1, 2, 0, 3, 4)  # after chunk n
    S_before = torch.cat([torch.zeros_like(S[:, :, :1]), S], dim=2)
    return ((qc * gc.exp()) @ S_before).view(B, H, Lp, v.shape[-1])


def gla_chunk(q, k, v, log_alpha, C: int) -> torch.Tensor:
    """The PyTorch chunked form: hierarchical when C is a power of two (halves all the way
    down), else one level of chunks."""
    if C & (C - 1) == 0:
        return gla_chunk_hierarchical(q, k, v, log_alpha, C)
    return gla_chunk_reference(q, k, v, log_alpha, C)


def _kernel_chunk_gla(*args) -> torch.Tensor:
    from seqmix.kernels.gla import chunk_gla

    return chunk_gla(*args)


KERNEL = dispatch.triton_path(_kernel_chunk_gla)  # same arguments as gla_chunk


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
        return dispatch.call("gla", (q, k, v, log_alpha, self.options.chunk_size), gla_chunk, KERNEL)

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
