"""Mamba: the selective state-space block (Gu & Dao 2023; REFERENCE.md §5.3).

Block: Mamba's (``pre_rms``): x + Mamba(RMSNorm(x)), no separate MLP, final RMSNorm and
out_proj scaled by 1/√n_layers (state-spaces/mamba mamba_simple.py Block, MixerModel).

Per channel d of the inner width D = expand · d_model and state index n ≤ N:

    [x, z] = in_proj(u)                                     (d_model → 2D, no bias)
    x      = SiLU(causal depthwise conv1d(x)),  kernel d_conv = 4
    (δ, B, C) = x_proj(x)                                   (D → dt_rank + 2N)
    Δ      = softplus(dt_proj(δ) + b_Δ)                     (dt_rank → D)
    A      = -exp(A_log)                                    (D × N, real, S4D-real init A_n = -n)
    h_t    = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t             (selective scan, B̄ ≈ ΔB)
    y_t    = C_t · h_t + D ⊙ x_t;   out = out_proj(y ⊙ SiLU(z))

``selective_scan_reference`` is mamba_ssm's ``selective_scan_ref`` (the sequential
definition, one Python step per token; Δ already includes b_Δ and softplus).
``selective_scan_chunked`` is the fast form ``forward`` uses: the linear recurrence
h_t = a_t h_{t-1} + b_t is cut into chunks of C tokens; one loop over the C positions
advances every chunk at once (the chunk-local states and cumulative decays), the
chunk-final states are carried across chunks by the same scan one level up, and a broadcast
adds each chunk's incoming state. That is C + L/C vectorised steps instead of L, and it only
ever multiplies decays a ∈ (0, 1], so nothing overflows however strong the decay (no
exp(-Σ Δ A) factor as in a cumulative-sum form). A custom backward runs the adjoint
recurrence λ_t = g_t + a_{t+1} λ_{t+1} through the same scan in reverse, so autograd stores
a and h only. Time and memory O(L D N): linear in L. Without a fused kernel
the (B, D, N, L) states are materialised; mamba_ssm's CUDA scan avoids that.

Initialisation (mamba_simple.py, re-applied by ``reset_mixer_parameters`` after the LM's
GPT-2 init): A_log = log(1..N) per channel, D = 1, dt_proj weight U(±dt_rank^-1/2),
b_Δ = softplus⁻¹(Δ₀) with Δ₀ ~ LogUniform[1e-3, 1e-1] floored at 1e-4. A_log and D are
excluded from weight decay.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from seqmix.mixers.base import Mixer, linear_flops


@dataclasses.dataclass
class MambaOptions:
    d_state: int = 16  # N
    d_conv: int = 4
    expand: int = 2  # D = expand · d_model
    dt_rank: int | str = "auto"  # "auto" = ceil(d_model / 16)
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_scale: float = 1.0
    conv_bias: bool = True
    bias: bool = False  # in_proj / out_proj bias
    chunk_size: int = 16  # C of the chunked scan: C + L/C Python steps; 16 was fastest on a CPU for L = 32..1024

    def __post_init__(self):
        if self.dt_rank != "auto" and (not isinstance(self.dt_rank, int) or self.dt_rank < 1):
            raise ValueError(
                f"mamba dt_rank must be 'auto' or a positive integer, got {self.dt_rank!r}"
            )
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"mamba needs 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if self.chunk_size < 1:
            raise ValueError(f"mamba chunk_size must be >= 1, got {self.chunk_size}")


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
    D: torch.Tensor | None,
) -> torch.Tensor:
    """The selective scan, one step per token (mamba_ssm ``selective_scan_ref``).

    u, delta: (Bt, D, L) (delta > 0, after bias and softplus); A: (D, N); B, C: (Bt, N, L);
    D: (D,) or None. Returns y: (Bt, D, L) with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t,
    y_t = C_t · h_t + D u_t. Computed in fp32 (fp64 for fp64 inputs), returned in u's dtype.
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D = _at_least_fp32(u, delta, A, B, C, D)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    h = u.new_zeros(u.shape[0], A.shape[0], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        h = deltaA[:, :, t] * h + deltaB_u[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, t]))
    y = torch.stack(ys, dim=2)
    return (y if D is None else y + u * D[:, None]).to(out_dtype)


def _shift(x: torch.Tensor) -> torch.Tensor:
    """x one step later in time (dim 0), zero entering at t = 0."""
    return F.pad(x[:-1], (0, 0) * (x.dim() - 1) + (1, 0))


@torch.no_grad()
def _scan(a: torch.Tensor, b: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """h_t = a_t h_{t-1} + b_t along dim 0 (time-major), h_{-1} = 0; no autograd.

    Inside chunks of C: one loop over the C positions updates every chunk at once, after
    which b holds the chunk-local states and a the cumulative decays from the chunk start.
    Across chunks: the same scan on the chunk-final (decay, state) pairs, then one
    broadcast correction. C + L/C Python steps instead of L, O(L) work.
    """
    L, rest = a.shape[0], a.shape[1:]
    C = min(max(chunk_size, 2), L)  # ≥ 2 whenever L ≥ 2, so the recursion below ends
    pad = (-L) % C

    def chunked(x: torch.Tensor, fill: float) -> torch.Tensor:
        # A private contiguous copy (updated in place), (n_chunks, C, ...) time-major: each
        # step below reads and writes one position of every chunk, rows of contiguous memory.
        x = torch.cat([x, x.new_full((pad, *rest), fill)]) if pad else x.clone()
        return x.view(-1, C, *rest)

    a, b = chunked(a, 1.0), chunked(b, 0.0)
    for j in range(1, C):  # add_/mul_ on the rows: no __setitem__ copy
        b[:, j].add_(a[:, j] * b[:, j - 1])
        a[:, j].mul_(a[:, j - 1])
    if a.shape[0] > 1:
        carry = _scan(a[:, -1], b[:, -1], chunk_size)  # (n_chunks, ...): state at each chunk's end
        b[1:].add_(a[1:] * carry[:-1, None])
    return b.flatten(0, 1)[:L]


class _LinearScan(torch.autograd.Function):
    """h = scan(a, b) with the adjoint recurrence as backward: λ_t = g_t + a_{t+1} λ_{t+1},
    ∂/∂b_t = λ_t, ∂/∂a_t = λ_t h_{t-1}."""

    @staticmethod
    def forward(ctx, a, b, chunk_size):
        h = _scan(a, b, chunk_size)
        ctx.save_for_backward(a, h)
        ctx.chunk_size = chunk_size
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        a, h = ctx.saved_tensors
        a_next = _shift(a.flip(0))  # reversed time: a_{t+1}; the 0 meets λ_L = 0
        lam = _scan(a_next, g.flip(0), ctx.chunk_size).flip(0)
        return lam * _shift(h), lam, None


def linear_scan(a: torch.Tensor, b: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t along dim 0 with h_{-1} = 0; a, b: (L, ...)."""
    return _LinearScan.apply(a, b, chunk_size)


def selective_scan_chunked(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """``selective_scan_reference`` by the chunked parallel scan; same arguments and result."""
    # Time-major (L, Bt, D, N) so that the scan's steps touch contiguous rows; broadcast
    # products rather than einsum (several times faster on the CPU).
    out_dtype = u.dtype
    u, delta, A, B, C, D = _at_least_fp32(u, delta, A, B, C, D)
    u_t, delta_t = u.permute(2, 0, 1), delta.permute(2, 0, 1)  # (L, Bt, D)
    B_t, C_t = B.permute(2, 0, 1)[:, :, None, :], C.permute(2, 0, 1)[:, :, None, :]  # (L, Bt, 1, N)
    deltaA = torch.exp(delta_t[..., None] * A)  # (L, Bt, D, N), in (0, 1]
    deltaB_u = (delta_t * u_t)[..., None] * B_t
    h = linear_scan(deltaA, deltaB_u, chunk_size)
    y = (h * C_t).sum(-1).permute(1, 2, 0)  # (Bt, D, L)
    return (y if D is None else y + u * D[:, None]).to(out_dtype)


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
        """The reference initialisations that must survive the LM's GPT-2 init (§5.3)."""
        o = self.options
        with torch.no_grad():
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
        y = selective_scan_chunked(
            x,
            delta.transpose(1, 2),
            A,
            B.transpose(1, 2),
            C.transpose(1, 2),
            self.D,
            self.options.chunk_size,
        )  # (Bt, D, L)
        return self.out_proj(y.transpose(1, 2) * F.silu(z))

    # Recurrent form: the last d_conv conv inputs and the SSM state (REFERENCE.md §8).
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
