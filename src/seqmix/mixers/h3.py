"""H3, Hungry Hungry Hippos (Fu, Dao et al., ICLR 2023, arXiv:2212.14052).

Two state-space models around a multiplicative interaction (HazyResearch/H3 ``h3.py``):

    Q, K, V = u W_Q + b_Q, u W_K + b_K, u W_V + b_V               (Linear(d, d), bias)
    K̄_t    = Σ_{l<N} c_l K_{t-l} + D_k ⊙ K_t                       (shift SSM: learned causal FIR)
    KV_t   = K̄_t[h] V_t[h]ᵀ ∈ R^{d_h × d_h}                         (per head of dim d_h)
    Y_t    = Σ_{s≤t} κ_{t-s} KV_s + D ⊙ KV_t                         (diagonal SSM on every entry)
    O_t[h, j] = Σ_i Q_t[h, i] Y_t[h, i, j];  out = W_O O + b_O

Shift SSM: A = shift, B = e_1, learned C (one row of N = d_state taps per channel). H3
also makes B trainable, which only reparameterises the same length-N FIR filter; here
B = e_1 is fixed, so the taps are C itself.

Diagonal SSM (S4D, the H3 default ``measure="diag-lin"``, ``disc="bilinear"``): complex
diagonal A with N/2 modes per head, kernel κ_l = 2 Re Σ_n C_n B̄_n Ā_n^l with
    A_n = -exp(log_A_real_n) + i A_imag_n,  S4D-Lin init A_n = -1/2 + iπn, n = 0..N/2-1,
    Ā = (1 + ΔA/2)/(1 - ΔA/2),  B̄ = Δ B/(1 - ΔA/2),  B = 1,  C ~ CN(0, 1),
    log Δ ~ U[log 1e-3, log 1e-1] per head.
The SSM is shared by the d_h² entries of a head (H = d/d_h copies, as in H3).

Fast path (``forward``): both convolutions by FFT, O(L log L), with the skips D_k and D as
the kernels' lag 0 and a hand-written backward (``seqmix.kernels.fft_conv``); the S4D kernel
by a blocked Vandermonde product (O(L · N) work in √L-sized blocks, no (H, N, L) tensor), from
the parameters in one autograd node (``seqmix.kernels.s4d``: on a GPU these small models'
steps are bound by kernel launches, and autograd's backward through the dozen complex ops of
``diag_ssm`` and ``s4d_kernel`` launches several per op). Both are kernels declared below with
the plain reference each equals. Reference of the whole layer:
``forward_recurrent``, the recurrence token by token (``step``: shift state = the last N
K values, diagonal state = N/2 complex modes per KV entry). The output channel order is
head-major (h, j); H3 writes (j, h), a fixed permutation that W_O absorbs.

Defaults: d_state 64, head_dim 1 (zoology's MQAR sweep uses head_dim 2 and d_state = L).
log Δ, A and B are excluded from weight decay (S4's ``register``).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from seqmix.kernels.fft_conv import causal_fft_conv
from seqmix.kernels.s4d import s4d_kernel_from_parameters, vandermonde_blocks
from seqmix.mixers.base import Mixer, kernel, linear_flops


@dataclasses.dataclass
class H3Options:
    # N: shift taps, and 2 × the complex modes of the diagonal SSM (so even)
    d_state: int = dataclasses.field(default=64, metadata={"ge": 2, "multiple_of": 2})
    head_dim: int = 1  # d_h
    dt_min: float = dataclasses.field(default=0.001, metadata={"gt": 0})
    dt_max: float = 0.1

    def __post_init__(self):
        if self.dt_min > self.dt_max:
            raise ValueError(f"h3 needs dt_min <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


def causal_conv_reference(
    u: torch.Tensor, kernel: torch.Tensor, skip: torch.Tensor | None = None
) -> torch.Tensor:
    """y_t = Σ_{s≤t} kernel_{t-s} u_s (+ skip · u_t) along the last dim, as an explicit sum per
    output position (O(L²)): what ``causal_fft_conv`` computes, with the same arguments."""
    taps = kernel.expand_as(u)
    y = torch.stack(
        [(taps[..., : t + 1].flip(-1) * u[..., : t + 1]).sum(-1) for t in range(u.shape[-1])], dim=-1
    )
    return y if skip is None else y + skip[..., None] * u


def s4d_kernel(dA: torch.Tensor, coef: torch.Tensor, L: int) -> torch.Tensor:
    """κ_l = 2 Re Σ_n coef_n dA_n^l for l < L; dA, coef: (H, M) complex -> (H, L) real.

    Blocked Vandermonde: l = m·b + j with b = ⌈√L⌉, so κ = 2 Re (coef ⊙ dA^{m b})ᵀ dA^{j},
    one batched complex matmul over (H, L/b, M) × (H, M, b).
    """
    b, nb = vandermonde_blocks(L)
    log_dA = torch.log(dA)[..., None]  # (H, M, 1)
    steps = torch.arange(b, device=dA.device, dtype=dA.real.dtype)
    small = torch.exp(log_dA * steps)  # dA^j: (H, M, b)
    starts = torch.arange(nb, device=dA.device, dtype=steps.dtype) * b
    big = coef[..., None] * torch.exp(log_dA * starts)  # coef ⊙ dA^{m b}: (H, M, nb)
    K = big.transpose(-1, -2) @ small  # (H, nb, b)
    return 2 * K.real.reshape(dA.shape[0], nb * b)[:, :L]


def diag_ssm(log_dt, log_A_real, A_imag, B, C) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear discretisation: Ā (H, M) and C ⊙ B̄ (H, M), complex, from the parameters
    (log_dt: (H,); log_A_real, A_imag: (H, M); B, C: (H, M, 2) real views of complex)."""
    dt = log_dt.exp()[:, None]
    dtA = (-log_A_real.exp() + 1j * A_imag) * dt
    dA = (1 + dtA / 2) / (1 - dtA / 2)
    dB = torch.view_as_complex(B) * dt / (1 - dtA / 2)
    return dA, torch.view_as_complex(C) * dB


def s4d_kernel_reference(log_dt, log_A_real, A_imag, B, C, L: int) -> torch.Tensor:
    """κ (H, L) from the parameters: ``s4d_kernel`` of ``diag_ssm``, differentiated by autograd."""
    return s4d_kernel(*diag_ssm(log_dt, log_A_real, A_imag, B, C), L)


# The kernels (PyTorch, each with its backward written out), with the references they equal.
@kernel("fft_conv", "pytorch", reference=causal_conv_reference, test="tests/mixers/test_mixers_recurrent.py")
def pytorch_fft_conv():
    return causal_fft_conv


@kernel("s4d", "pytorch", reference=s4d_kernel_reference, test="tests/mixers/test_mixers_recurrent.py")
def pytorch_s4d():
    return s4d_kernel_from_parameters


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class H3(Mixer):
    Options = H3Options
    supports_noncausal = False
    has_step = True
    packable = ("its FFT convolution and S4D kernel define their backward without setup_context (kernels/fft_conv.py, kernels/s4d.py), which vmap refuses")

    def __init__(self, d_model: int, options: H3Options, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        o = options
        if d_model % o.head_dim:
            raise ValueError(f"h3: d_model={d_model} is not divisible by head_dim={o.head_dim}")
        self.head_dim = o.head_dim
        self.n_heads = d_model // o.head_dim  # H: independent diagonal SSMs
        N, M = o.d_state, o.d_state // 2
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        # Shift SSM on K: N causal taps and a skip per channel.
        self.k_shift = nn.Parameter(torch.empty(d_model, N))
        self.k_skip = nn.Parameter(torch.empty(d_model))
        # Diagonal SSM per head; complex values stored as (..., 2) real views.
        self.log_dt = nn.Parameter(torch.empty(self.n_heads))
        self.log_A_real = nn.Parameter(torch.empty(self.n_heads, M))
        self.A_imag = nn.Parameter(torch.empty(self.n_heads, M))
        self.B = nn.Parameter(torch.empty(self.n_heads, M, 2))
        self.C = nn.Parameter(torch.empty(self.n_heads, M, 2))
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.output_linear = nn.Linear(d_model, d_model)
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        """H3's SSM initialisation (S4D-Lin, ss_kernel.py), re-applied after the LM's init."""
        o = self.options
        H, N, M = self.n_heads, o.d_state, o.d_state // 2
        with torch.no_grad():
            nn.init.uniform_(self.k_shift, -(N**-0.5), N**-0.5)  # torch Conv1d init, fan-in N
            self.k_skip.normal_()
            self.log_dt.uniform_(math.log(o.dt_min), math.log(o.dt_max))
            self.log_A_real.fill_(math.log(0.5))  # Re A = -1/2
            self.A_imag.copy_(math.pi * torch.arange(M).expand(H, M))  # Im A = π n
            self.B.copy_(torch.view_as_real(torch.ones(H, M, dtype=torch.cfloat)))
            self.C.copy_(torch.view_as_real(torch.randn(H, M, dtype=torch.cfloat)))
            self.D.normal_()

    def no_weight_decay(self) -> set[str]:
        return {"log_dt", "log_A_real", "A_imag", "B"}

    def _diag_ssm(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Ā (H, M) and C ⊙ B̄ (H, M) of this layer (``diag_ssm``)."""
        return diag_ssm(self.log_dt, self.log_A_real, self.A_imag, self.B, self.C)

    def _qkv(self, x: torch.Tensor):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Bt, L, d = x.shape
        H, hd, N = self.n_heads, self.head_dim, self.options.d_state
        # The SSM part runs in fp32 at least (torch's FFT has no bf16), like H3's.
        compute = torch.promote_types(x.dtype, torch.float32)
        q, k, v = (t.transpose(1, 2).to(compute) for t in self._qkv(x))  # (Bt, d, L)
        taps = self.k_shift[:, :L] if L <= N else nn.functional.pad(self.k_shift, (0, L - N))
        k = causal_fft_conv(k, taps.to(compute), self.k_skip.to(compute))  # K̄ = shift SSM + D_k skip
        kv = k.view(Bt, H, hd, 1, L) * v.view(Bt, H, 1, hd, L)  # (Bt, H, i, j, L)
        kernel = s4d_kernel_from_parameters(self.log_dt, self.log_A_real, self.A_imag, self.B, self.C, L)
        y = causal_fft_conv(kv, kernel.to(compute)[:, None, None, :], self.D.to(compute)[:, None, None])
        if hd == 1:  # Σ_i over one i: a product (a sum over a size-1 dim would copy)
            o = q.view(Bt, H, 1, L) * y.view(Bt, H, 1, L)
        else:
            o = (q.view(Bt, H, hd, 1, L) * y).sum(2)  # Σ_i Q[h, i] Y[h, i, j]: (Bt, H, j, L)
        return self.output_linear(o.reshape(Bt, d, L).transpose(1, 2).to(x.dtype))

    def forward_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """The reference: ``step`` over every token (O(L), one Python step per token)."""
        state = self.init_state(x.shape[0], x.device, x.dtype)
        outs = []
        for t in range(x.shape[1]):
            y_t, state = self.step(x[:, t], state)
            outs.append(y_t)
        return torch.stack(outs, dim=1)

    # Recurrent form: the last N values of K and the diagonal state of every KV entry.
    def init_state(self, batch, device, dtype):
        H, hd, N = self.n_heads, self.head_dim, self.options.d_state
        k_hist = torch.zeros(batch, self.d_model, N, device=device, dtype=dtype)
        s = torch.zeros(batch, H, hd, hd, N // 2, device=device, dtype=_complex_dtype(dtype))
        return k_hist, s

    def step(self, x_t: torch.Tensor, state):
        k_hist, s = state
        Bt = x_t.shape[0]
        H, hd = self.n_heads, self.head_dim
        q, k, v = self._qkv(x_t)  # (Bt, d)
        k_hist = torch.cat([k[..., None], k_hist[..., :-1]], dim=-1)  # [K_t, K_{t-1}, ...]
        k = (k_hist * self.k_shift).sum(-1) + self.k_skip * k
        kv = k.view(Bt, H, hd, 1) * v.view(Bt, H, 1, hd)
        dA, coef = self._diag_ssm()
        s = dA[:, None, None, :] * s + coef[:, None, None, :] * kv[..., None]  # C-weighted modes
        y = 2 * s.real.sum(-1) + self.D[:, None, None] * kv
        o = (q.view(Bt, H, hd, 1) * y).sum(2)  # (Bt, H, j)
        return self.output_linear(o.reshape(Bt, self.d_model)), (k_hist, s)

    def flops(self, seq_len: int) -> float:
        d, hd, H, M = self.d_model, self.head_dim, self.n_heads, self.options.d_state // 2
        L, n = seq_len, 2 * seq_len

        def fft_conv(channels: int, kernels: int) -> float:
            # rfft/irfft of n real points ≈ 2.5 n log2 n; complex product 6 per bin.
            fft = 2.5 * n * math.log2(n)
            return channels * (2 * fft + 6 * (n // 2 + 1)) + kernels * fft

        proj = 4 * linear_flops(L, d, d)
        shift = fft_conv(d, d) + 2.0 * L * d  # + D_k skip
        kernel = 8.0 * H * M * L  # Vandermonde: one complex multiply-add per (mode, lag)
        kv = fft_conv(d * hd, H) + 3.0 * L * d * hd  # K̄Vᵀ product and D skip
        out = 2.0 * L * d * hd  # Σ_i Q_i Y_ij
        return proj + shift + kernel + kv + out
