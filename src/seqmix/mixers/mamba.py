"""Mamba: the selective state-space block (Gu & Dao 2023, arXiv:2312.00752).

Per channel d of the inner width D = expand · d_model and state index n ≤ N:

    [x, z] = in_proj(u)                                     (d_model → 2D, no bias)
    x      = SiLU(causal depthwise conv1d(x)),  kernel d_conv = 4
    (δ, B, C) = x_proj(x)                                   (D → dt_rank + 2N)
    Δ      = softplus(dt_proj(δ) + b_Δ)                     (dt_rank → D)
    A      = -exp(A_log)                                    (D × N, real, S4D-real init A_n = -n)
    h_t    = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t             (selective scan, B̄ ≈ ΔB)
    y_t    = C_t · h_t + D ⊙ x_t;   out = out_proj(y ⊙ SiLU(z))

``selective_scan_reference`` is mamba_ssm's ``selective_scan_ref`` (the sequential
definition, one Python step per token; Δ already includes b_Δ and softplus; D u and the
SiLU(z) gate are applied inside, as mamba_ssm's scans do). ``forward`` takes one of three
fast forms of it (``seqmix.mixers.dispatch``):

``seqmix.kernels.selective_scan``, for CUDA tensors: the Triton scan (forward and backward,
states recomputed in the backward from per-chunk checkpoints, as mamba_ssm's CUDA kernel).

``selective_scan_fused``, for CPU tensors: one C++ loop per sequence
(``seqmix.kernels.selective_scan_cpu``, compiled at first use), about 5× faster than the
eager form on the CPU. Used unless no C++ compiler is found or the reference is forced.

``selective_scan_chunked``, everywhere else (``seqmix.kernels.selective_scan_chunked``: chunks
of C tokens advanced together by Python loops over the C positions, forward and backward
written by hand in PyTorch; 2C + O(L/C²) vectorised steps instead of L, nothing overflows
however strong the decay). It materialises the (L, B, N, D) states; the fused kernels avoid
that. Each of the three is declared below (``seqmix.mixers.base.kernel``) with the reference
it equals and the test comparing them.

Initialisation (mamba_simple.py, re-applied by ``reset_mixer_parameters`` after the LM's
GPT-2 init): A_log = log(1..N) per channel, D = 1, dt_proj weight U(±dt_rank^-1/2),
b_Δ = softplus⁻¹(Δ₀) with Δ₀ ~ LogUniform[1e-3, 1e-1] floored at 1e-4, and in_proj and
x_proj at nn.Linear's own init, U(±fan_in^-1/2), which mamba_ssm's model init leaves alone.
A_log and D are excluded from weight decay.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import BeforeValidator, PositiveInt
from torch import nn

from seqmix.kernels import (
    selective_scan_cpu,  # defines the fused CPU op (and its FLOPs) before any model runs
)
from seqmix.kernels.selective_scan_chunked import selective_scan_chunked as chunked_scan
from seqmix.mixers import dispatch
from seqmix.mixers.base import Mixer, kernel, linear_flops


def _auto_or_positive(value):
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"must be 'auto' or a positive integer, got {value!r}")


# One message for either form (a plain union would report each of its members).
DtRank = Annotated[PositiveInt | Literal["auto"], BeforeValidator(_auto_or_positive)]


@dataclasses.dataclass
class MambaOptions:
    d_state: int = 16  # N
    d_conv: int = 4
    expand: int = 2  # D = expand · d_model
    dt_rank: DtRank = "auto"  # "auto" = ceil(d_model / 16)
    dt_min: float = dataclasses.field(default=0.001, metadata={"gt": 0})
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_scale: float = 1.0
    conv_bias: bool = True
    bias: bool = False  # in_proj / out_proj bias
    # C of the eager chunked scan (GPU tensors, or where the fused CPU scan is not built):
    # 2C (+ L/C²) Python steps per pass, C when L ≤ C (one chunk, no carry). 64 covers L 64
    # in one chunk: 12 % less CPU time per Mamba layer (fwd+bwd) there than C 16, 4 % more
    # at L 1024 (d 64, 4,096 tokens, one thread).
    chunk_size: int = dataclasses.field(default=64, metadata={"ge": 1})

    def __post_init__(self):
        if self.dt_min > self.dt_max:
            raise ValueError(f"mamba needs dt_min <= dt_max, got dt_min={self.dt_min}, dt_max={self.dt_max}")


def _at_least_fp32(*tensors):
    """Half-precision inputs upcast to fp32 (as mamba_ssm's scans compute), others as given."""
    dtype = torch.promote_types(tensors[0].dtype, torch.float32)
    return [None if t is None else t.to(dtype) for t in tensors]


def selective_scan_reference(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> torch.Tensor:
    """The selective scan, one step per token (mamba_ssm ``selective_scan_ref``).

    u, delta: (Bt, D, L) (delta > 0, after bias and softplus); A: (D, N); B, C: (Bt, N, L);
    D: (D,) or None; z: (Bt, D, L) or None. Returns (Bt, D, L): y with h_t = exp(Δ_t A) h_{t-1}
    + Δ_t B_t u_t, y_t = C_t · h_t + D u_t, times SiLU(z) when z is given. Computed in fp32
    (fp64 for fp64 inputs), returned in u's dtype.
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D, z = _at_least_fp32(u, delta, A, B, C, D, z)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    h = u.new_zeros(u.shape[0], A.shape[0], A.shape[1])
    ys = []
    for a_t, b_t, c_t in zip(deltaA.unbind(2), deltaB_u.unbind(2), C.unbind(2)):  # unbind: O(L) backward
        h = a_t * h + b_t
        ys.append(torch.einsum("bdn,bn->bd", h, c_t))
    y = torch.stack(ys, dim=2)
    return _skip_and_gate(y, u, D, z).to(out_dtype)


def _skip_and_gate(y, u, D, z):
    """y + D u, times SiLU(z): the parts of the output outside the recurrence."""
    y = y if D is None else y + u * D[:, None]
    return y if z is None else y * F.silu(z)


def selective_scan_chunked(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    chunk_size: int = MambaOptions.chunk_size,
) -> torch.Tensor:
    """``selective_scan_reference`` by the chunked scan (``seqmix.kernels.selective_scan_chunked``);
    same arguments and result."""
    out_dtype = u.dtype
    u, delta, A, B, C, D, z = _at_least_fp32(u, delta, A, B, C, D, z)
    time_major = lambda t: t.permute(2, 0, 1)  # noqa: E731  (Bt, ·, L) -> (L, Bt, ·)
    x = time_major(delta * u)
    y = chunked_scan(x, time_major(delta), A, time_major(B), time_major(C), chunk_size)
    y = y.permute(1, 2, 0)  # (Bt, D, L)
    return _skip_and_gate(y, u, D, z).to(out_dtype)


def selective_scan_fused(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> torch.Tensor:
    """``selective_scan_reference`` by the fused C++ loop for CPU tensors
    (``seqmix.kernels.selective_scan_cpu``); same arguments and result."""
    out_dtype = u.dtype
    u, delta, A, B, C, D, z = _at_least_fp32(u, delta, A, B, C, D, z)
    x, dt, B_tm, C_tm = (t.transpose(1, 2) for t in (delta * u, delta, B, C))  # the op is time-major: (Bt, L, ·)
    y = selective_scan_cpu.selective_scan_cpu(x, dt, A, B_tm, C_tm).transpose(1, 2)
    return _skip_and_gate(y, u, D, z).to(out_dtype)


# The kernels, each equal to selective_scan_reference.
@kernel("selective_scan", "triton", reference=selective_scan_reference, test="tests/kernels/test_kernels.py")
def triton_scan():
    """The D skip and SiLU(z) gate inside; the backward recomputes the states from per-chunk
    checkpoints instead of storing L x D x N."""
    from seqmix.kernels.selective_scan import selective_scan

    return selective_scan


@kernel("selective_scan_cpu", "cpp", reference=selective_scan_reference, test="tests/mixers/test_mixers_scan.py")
def cpp_scan():
    """Time-major, without D and z: ``selective_scan_fused`` adds them."""
    return selective_scan_cpu.selective_scan_cpu


@kernel("selective_scan_chunked", "pytorch", reference=selective_scan_reference, test="tests/mixers/test_mixers_scan.py")
def pytorch_scan():
    """Time-major, without D and z: ``selective_scan_chunked`` adds them."""
    return chunked_scan


def _fused_scan_builds() -> bool:
    return selective_scan_cpu.available()


def _fused_scan(u, delta, A, B, C, D, z, chunk_size: int) -> torch.Tensor:
    return selective_scan_fused(u, delta, A, B, C, D, z)  # one loop per sequence: no chunks


def _triton_scan(u, delta, A, B, C, D, z, chunk_size: int) -> torch.Tensor:
    return triton_scan(u, delta, A, B, C, D, z)  # chunks of its own tile size


# Same arguments as selective_scan_chunked: the Triton scan for CUDA tensors, the C++ op for
# CPU tensors where it builds.
TRITON = dispatch.triton_path(_triton_scan)
FUSED_CPU = dispatch.fused_cpu_path(_fused_scan, _fused_scan_builds)


class Mamba(Mixer):
    Options = MambaOptions
    supports_noncausal = False
    has_step = True

    def __init__(self, d_model: int, options: MambaOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        o = options
        self.d_inner = o.expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if o.dt_rank == "auto" else o.dt_rank
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=o.bias)
        self.conv1d = nn.Conv1d(
            self.d_inner,
            self.d_inner,
            o.d_conv,
            groups=self.d_inner,
            padding=o.d_conv - 1,
            bias=o.conv_bias,
        )
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * o.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, o.d_state))
        self.D = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=o.bias)
        self.reset_mixer_parameters()

    def reset_mixer_parameters(self) -> None:
        """The reference initialisations that must survive the LM's GPT-2 init (state-spaces/mamba ``mamba_simple.py``)."""
        o = self.options
        with torch.no_grad():
            # mamba_ssm's model init re-draws only embeddings and residual projections: the
            # mixer's other linear maps keep nn.Linear's own (Kaiming-uniform) init, ~3.6x the
            # GPT-2 N(0, 0.02) at d 64, so the LM's init must not stand for theirs.
            for linear in (self.in_proj, self.x_proj):
                nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5))
            std = self.dt_rank**-0.5 * o.dt_scale
            nn.init.uniform_(self.dt_proj.weight, -std, std)
            # softplus(b_Δ) ~ LogUniform[dt_min, dt_max], floored; b_Δ = Δ + log(1 - e^-Δ).
            dt = torch.exp(
                torch.rand(self.d_inner) * (math.log(o.dt_max) - math.log(o.dt_min))
                + math.log(o.dt_min)
            ).clamp(min=o.dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            n = torch.arange(1, o.d_state + 1, dtype=torch.float32)
            self.A_log.copy_(torch.log(n).expand(self.d_inner, -1))  # S4D-real: A_n = -n
            self.D.fill_(1.0)

    def no_weight_decay(self) -> set[str]:
        return {"A_log", "D"}

    def _ssm_params(self, x: torch.Tensor):
        """Δ (…, D), B (…, N), C (…, N) from the conv output x (…, D)."""
        N = self.options.d_state
        delta, B, C = self.x_proj(x).split([self.dt_rank, N, N], dim=-1)
        return F.softplus(self.dt_proj(delta)), B, C

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        L = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)  # (Bt, L, D) each
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :L])  # causal: left padding only
        delta, B, C = self._ssm_params(x.transpose(1, 2))  # (Bt, L, ·)
        A = -torch.exp(self.A_log)
        args = (x, delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), self.D, z.transpose(1, 2),
                self.options.chunk_size)
        y = dispatch.call("mamba", args, selective_scan_chunked, TRITON, FUSED_CPU)  # (Bt, D, L), gated
        return self.out_proj(y.transpose(1, 2))

    # Recurrent form: the last d_conv conv inputs and the SSM state.
    def init_state(self, batch, device, dtype):
        conv_state = torch.zeros(
            batch, self.d_inner, self.options.d_conv, device=device, dtype=dtype
        )
        ssm_state = torch.zeros(
            batch, self.d_inner, self.options.d_state, device=device, dtype=dtype
        )
        return conv_state, ssm_state

    def step(self, u_t: torch.Tensor, state):
        conv_state, h = state
        x, z = self.in_proj(u_t).chunk(2, dim=-1)  # (Bt, D)
        conv_state = torch.cat([conv_state[..., 1:], x[..., None]], dim=-1)
        x = (conv_state * self.conv1d.weight[:, 0]).sum(-1)
        if self.conv1d.bias is not None:
            x = x + self.conv1d.bias
        x = F.silu(x)
        delta, B, C = self._ssm_params(x)
        A = -torch.exp(self.A_log)
        h = torch.exp(delta[..., None] * A) * h + (delta * x)[..., None] * B[:, None, :]
        y = (h * C[:, None, :]).sum(-1) + self.D * x
        return self.out_proj(y * F.silu(z)), (conv_state, h)

    def flops(self, seq_len: int) -> float:
        d, D, N, R, K = (
            self.d_model,
            self.d_inner,
            self.options.d_state,
            self.dt_rank,
            self.options.d_conv,
        )
        proj = (
            linear_flops(seq_len, d, 2 * D)
            + linear_flops(seq_len, D, R + 2 * N)
            + linear_flops(seq_len, R, D)
            + linear_flops(seq_len, D, d)
        )
        conv = 2.0 * seq_len * D * K
        # Scan per token, channel and state: ΔA and its exp (2), Δ·B·x (2), a·h + b (2), C·h (2);
        # then D·x, SiLU gate and softplus/SiLU activations, O(D) per token.
        scan = 8.0 * seq_len * D * N + 6.0 * seq_len * D
        return proj + conv + scan
