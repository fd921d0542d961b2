"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", ICML,
arXiv:2006.16236): softmax's exp(qᵀk) replaced by φ(q)ᵀφ(k), φ = elu + 1 > 0, so the sum over
keys factorises through a d_k × d_v state, V'_i = φ(Q_i)ᵀ S_i / (φ(Q_i)ᵀ z_i + ε) with
S_i = Σ_{j≤i} φ(K_j) V_jᵀ, z_i = Σ_{j≤i} φ(K_j) (causal; all j when not). Multi-head with
Q/K/V/O projections with bias, like the softmax baseline. The causal core is chunked (fla's
``chunk`` form): linear in L, with no L × L tensor and no (L, d_k, d_v) cumulative sum;
``linear_attention_reference`` is the dense form it must equal.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from seqmix.mixers.base import HeadProjections, Mixer, linear_flops


@dataclasses.dataclass
class LinearOptions:
    n_heads: int = 4
    bias: bool = True
    eps: float = 1e-6  # ε of the reference's denominator
    chunk_size: int = dataclasses.field(default=64, metadata={"ge": 1})  # C of the chunked causal form (a speed knob, not a model choice)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1, positive everywhere (fast-transformers' ``elu_feature_map``)."""
    return F.elu(x) + 1


def linear_attention_reference(q, k, v, causal: bool, eps: float = 1e-6) -> torch.Tensor:
    """The dense form: (A v) / (A 1 + ε) with A = q kᵀ (masked when causal).

    q, k: (B, H, L, Dk) already feature-mapped (non-negative); v: (B, H, L, Dv).
    O(L²) memory: the specification, for tests only.
    """
    A = q @ k.transpose(-1, -2)  # (B, H, L, L)
    if causal:
        A = A.tril()
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)


def noncausal_linear_attention(q, k, v, eps: float = 1e-6) -> torch.Tensor:
    """φ(Q) S / (φ(Q)·z + ε) with S = Σ_j k_j v_jᵀ, z = Σ_j k_j; (B, H, L, D) inputs."""
    S = k.transpose(-1, -2) @ v  # (B, H, Dk, Dv)
    z = k.sum(dim=-2)  # (B, H, Dk)
    den = (q * z[..., None, :]).sum(-1, keepdim=True)  # (B, H, L, 1)
    return (q @ S) / (den + eps)


def causal_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6, chunk_size: int = 64
) -> torch.Tensor:
    """Causal linear attention on feature-mapped inputs, chunked; O(L) time and memory.

    q, k: (B, H, L, Dk) non-negative features; v: (B, H, L, Dv) -> (B, H, L, Dv).
    out_i = q_i S_i / (q_i·z_i + ε), S_i = Σ_{j≤i} k_j v_jᵀ, z_i = Σ_{j≤i} k_j.
    A Triton kernel may replace this function; ``linear_attention_reference`` is its spec.
    """
    B, H, L, Dk = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, L)
    causal = _lower_triangle(C, q.dtype, q.device)
    if L <= C:  # one chunk: the masked product alone, no state to carry
        A = (q @ k.transpose(-1, -2)) * causal
        return (A @ v) / (A.sum(-1, keepdim=True) + eps)
    pad = (-L) % C
    if pad:  # zero keys add nothing to S or z; the padded queries are dropped at the end
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    N = (L + pad) // C
    q = q.reshape(B, H, N, C, Dk)
    k = k.reshape(B, H, N, C, Dk)
    v = v.reshape(B, H, N, C, Dv)

    # State entering each chunk: exclusive prefix sum of the per-chunk sums (the paper's S_i, z_i).
    kv = k.transpose(-1, -2) @ v  # (B, H, N, Dk, Dv)
    S = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1]], dim=2).cumsum(dim=2)
    ksum = k.sum(dim=-2)  # (B, H, N, Dk)
    z = torch.cat([torch.zeros_like(ksum[:, :, :1]), ksum[:, :, :-1]], dim=2).cumsum(dim=2)

    # Inside a chunk: the masked C × C scores (j ≤ i), masked by a product (cheaper than tril).
    A = (q @ k.transpose(-1, -2)) * causal  # (B, H, N, C, C)
    num = q @ S + A @ v  # (B, H, N, C, Dv)
    den = (q * z[..., None, :]).sum(-1, keepdim=True) + A.sum(-1, keepdim=True)
    out = num / (den + eps)
    return out.reshape(B, H, N * C, Dv)[:, :, :L]


def _lower_triangle(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(n, n) ones on and below the diagonal, zeros above, as a multiplicative mask."""
    return torch.ones(n, n, dtype=dtype, device=device).tril()


class LinearAttention(HeadProjections, Mixer):
    Options = LinearOptions
    has_scores = True
    has_step = True

    def __init__(self, d_model: int, options: LinearOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        self.init_projections(d_model, options.n_heads, options.bias)

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """φ(q), φ(k), v: (B, H, L, Dh) each."""
        # φ on the (B, L, d) projections before the head split: elementwise, so the same,
        # and on contiguous memory (φ's backward is several times slower on the split view).
        q = self._split(elu_feature_map(self.q_proj(x)))
        k = self._split(elu_feature_map(self.k_proj(x)))
        return q, k, self._split(self.v_proj(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self._features(x)
        eps = self.options.eps
        if self.causal:
            y = causal_linear_attention(q, k, v, eps, self.options.chunk_size)
        else:
            y = noncausal_linear_attention(q, k, v, eps)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, D))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """φ(q) φ(k)ᵀ, zero above the diagonal when causal: (B, H, L, L)."""
        q, k, _ = self._features(x)
        A = q @ k.transpose(-1, -2)
        return A.tril() if self.causal else A

    # Recurrent form (Katharopoulos et al. 2020): S ∈ R^{Dk×Dv} and z ∈ R^{Dk} per head.
    def init_state(self, batch, device, dtype):
        H, Dh = self.n_heads, self.d_head
        S = torch.zeros(batch, H, Dh, Dh, device=device, dtype=dtype)
        z = torch.zeros(batch, H, Dh, device=device, dtype=dtype)
        return (S, z)

    def step(self, x_t: torch.Tensor, state):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        S, z = state
        q, k, v = (t[:, :, 0] for t in self._features(x_t[:, None, :]))  # (B, H, Dh)
        S = S + k[..., :, None] * v[..., None, :]
        z = z + k
        num = (q[..., None, :] @ S)[..., 0, :]  # (B, H, Dv)
        den = (q * z).sum(-1, keepdim=True) + self.options.eps
        y = (num / den).reshape(x_t.shape[0], self.d_model)
        return self.out_proj(y), (S, z)

    def flops(self, seq_len: int) -> float:
        L, d, Dh = seq_len, self.d_model, self.d_head
        proj = 4 * linear_flops(L, d, d)
        # Per head and token: k vᵀ into the state and q·S out of it (2·Dh·Dh each), and the
        # normaliser q·z (2·Dh). The causal chunked form adds the masked intra-chunk q kᵀ and
        # A v (2·C·Dh each, about half of it masked).
        per_token = 4.0 * Dh * Dh + 2.0 * Dh
        if self.causal:
            per_token += 2.0 * min(self.options.chunk_size, L) * Dh
        return proj + L * self.n_heads * per_token
