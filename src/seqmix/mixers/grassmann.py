"""Causal Grassmann mixing (Zhang 2025, "Attention Is Not What You Need: Grassmann Flows as
an Attention-Free Alternative for Sequence Modeling", arXiv:2512.19428, §3.2): each token
is reduced to z_t ∈ R^r, paired with earlier tokens z_{t-Δ} at a few offsets, and the
normalised Plücker coordinates of span(z_t, z_{t-Δ}), averaged over the valid offsets, are
projected and gated back into the stream. The equations and the three choices the paper
leaves open (pairing t with t-Δ, ``schedule``, ``out_proj``: the output projection its
parameter counts imply) are in the report's "Architectures" section.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import PositiveInt
from torch import nn

from seqmix.mixers import dispatch
from seqmix.mixers.base import Mixer, kernel, linear_flops


@dataclasses.dataclass
class GrassmannOptions:
    rank: int = dataclasses.field(default=32, metadata={"ge": 2})
    offsets: tuple[PositiveInt, ...] = dataclasses.field(default=(1, 2, 4, 8, 12, 16), metadata={"min_length": 1})
    # §4.1's 12-layer list (1,1,2,2,...,16,16): every layer averages all of it (all), or layer ℓ
    # uses offsets[ℓ] (per_layer); the paper's runs may be either.
    schedule: Literal["all", "per_layer"] = "all"
    out_proj: bool = True  # Linear(d, d) after the blend: the paper's 13.00M/18.16M parameters need it
    normalize: bool = True
    eps: float = 1e-6


def pair_indices(r: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(i, j) with i < j in row-major order: the r(r-1)/2 Plücker coordinate indices."""
    iu = torch.triu_indices(r, r, offset=1, device=device)
    return iu[0], iu[1]


def plucker(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plücker coordinates of span(a, b): p_ij = a_i b_j - a_j b_i for i < j.

    a, b: (..., r) -> (..., r(r-1)/2), ordered as ``pair_indices(r)``. The coordinates
    a_i, a_j are picked by products with one-hot (r, r(r-1)/2) matrices (exact: one term
    each) rather than by indexing, whose backward (a scattered index_put) is several times
    slower on a CPU.
    """
    pick_i, pick_j = _pair_pickers(a.shape[-1], a.dtype, a.device)
    return (a @ pick_i) * (b @ pick_j) - (a @ pick_j) * (b @ pick_i)


def _pair_pickers(r: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot matrices with x @ pick_i = x[..., i] and x @ pick_j = x[..., j]."""
    i, j = pair_indices(r, device=device)
    eye = torch.eye(r, dtype=dtype, device=device)
    return eye[:, i], eye[:, j]


def grassmann_mix_reference(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    offsets: tuple[int, ...],
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """g from reduced states: the specification the fused Triton kernel must equal.

    z: (B, L, r); weight: (d, r(r-1)/2); offsets are signed: position t is paired with
    t - Δ (Δ > 0 looks back; Δ < 0 looks ahead, used only by the non-causal variant).
    Returns g: (B, L, d), zero where no offset is valid.
    """
    B, L, r = z.shape
    C = r * (r - 1) // 2
    p_sum = z.new_zeros(B, L, C)
    count = z.new_zeros(L)
    # §3.2 pairs t with t + Δ, which reads the next token; pairing backwards only flips the
    # features' sign, which W_plü absorbs (as kanenorman/grassmann ``model.py`` and
    # alphaXiv/paper-implementations ``grassmann.py`` do). W_plü is linear and shared across
    # offsets, so the Plücker vectors are averaged first and projected once.
    for delta in offsets:
        if abs(delta) >= L:
            continue
        if delta > 0:  # positions t = Δ..L-1 pair with t - Δ
            p = plucker(z[:, delta:], z[:, :-delta])
            pad = (0, 0, delta, 0)
        else:  # positions t = 0..L-1-|Δ| pair with t + |Δ|
            p = plucker(z[:, :delta], z[:, -delta:])
            pad = (0, 0, 0, -delta)
        if normalize:
            p = p / p.norm(dim=-1, keepdim=True).clamp_min(eps)
        p_sum = p_sum + F.pad(p, pad)
        count = count + F.pad(torch.ones_like(p[0, :, 0]), pad[2:])
    g = F.linear(p_sum / count.clamp_min(1)[:, None], weight, bias)
    return g * (count > 0).to(g.dtype)[:, None]


# The Triton kernel, never storing the Plücker tensor: causal offsets only; same arguments
# as the collapsed form below. Its forward and backward are torch.library custom ops: a
# compiled training step traces them without a graph break.
@kernel("grassmann", "triton", reference=grassmann_mix_reference, test="tests/kernels/test_kernels.py")
def triton_grassmann():
    from seqmix.kernels.grassmann import grassmann_mix

    return grassmann_mix


TRITON = dispatch.triton_path(triton_grassmann, compilable=True)


def grassmann_mix_collapsed(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    offsets: tuple[int, ...],
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``grassmann_mix_reference`` with one Plücker product per position instead of one per
    offset: the fast path on the CPU (the Triton kernel uses the same identity).

    p(a, b) is linear in b, so mean_Δ p(z_t, z_{t-Δ}) / n_Δ(t) = p(z_t, c_t) with
    c_t = mean_Δ z_{t-Δ} / n_Δ(t) and n_Δ(t) = max(‖p(z_t, z_{t-Δ})‖, ε). The norms come from
    Lagrange's identity in its Gram-Schmidt form, ‖p(a, b)‖ = ‖a‖·‖b − (a·b/‖a‖²) a‖, which
    needs O(r) work per offset and avoids the cancellation of ‖a‖²‖b‖² − (a·b)².
    """
    B, L, r = z.shape
    c = torch.zeros_like(z)
    count = z.new_zeros(L)
    a_sq = (z * z).sum(-1, keepdim=True)  # ‖z_t‖², (B, L, 1)
    for delta in offsets:
        if abs(delta) >= L:
            continue
        if delta > 0:
            cur, past, a2, pad = z[:, delta:], z[:, :-delta], a_sq[:, delta:], (0, 0, delta, 0)
        else:
            cur, past, a2, pad = z[:, :delta], z[:, -delta:], a_sq[:, :delta], (0, 0, 0, -delta)
        if normalize:
            # ‖p‖² = ‖a‖²·‖b_⊥‖², floored at ε² (= max(‖p‖, ε)², and keeps sqrt's gradient finite).
            proj = (cur * past).sum(-1, keepdim=True) / a2.clamp_min(torch.finfo(z.dtype).tiny)
            b_perp = past - proj * cur
            norm = (a2 * (b_perp * b_perp).sum(-1, keepdim=True)).clamp_min(eps * eps).sqrt()
            past = past / norm
        c = c + F.pad(past, pad)
        count = count + F.pad(torch.ones_like(cur[0, :, 0]), pad[2:])
    p = plucker(z, c / count.clamp_min(1)[:, None])
    g = F.linear(p, weight, bias)
    return g * (count > 0).to(g.dtype)[:, None]


class CausalGrassmann(Mixer):
    Options = GrassmannOptions
    has_step = True
    residual_in_mixer = True

    def __init__(self, d_model: int, options: GrassmannOptions, *, causal=True, max_len=None):
        super().__init__(d_model, options, causal=causal, max_len=max_len)
        r = options.rank
        self.reduce = nn.Linear(d_model, r)  # W_red, b_red
        self.plucker_proj = nn.Linear(r * (r - 1) // 2, d_model)  # W_plü, shared across Δ
        self.gate = nn.Linear(2 * d_model, d_model)  # W_gate on [h; g]
        self.out = nn.Linear(d_model, d_model) if options.out_proj else nn.Identity()

    @classmethod
    def options_for_layer(cls, options, layer_index):
        if options.get("schedule", "all") != "per_layer":
            return options
        offsets = tuple(options.get("offsets", GrassmannOptions.offsets))
        return {**options, "offsets": (offsets[layer_index % len(offsets)],)}

    def reach(self) -> int | None:
        # Position t pairs z_t only with z_{t-Δ}, Δ in its offsets (Zhang 2025, §3.2, causal
        # form): one layer reads max Δ tokens back, n layers at most the sum of theirs.
        return max(self.options.offsets) if self.causal else None

    def signed_offsets(self) -> tuple[int, ...]:
        o = self.options.offsets
        return o if self.causal else o + tuple(-d for d in o)

    def mix(self, z: torch.Tensor) -> torch.Tensor:
        """g from z: the fused Triton kernel on a GPU (causal), else the collapsed PyTorch form;
        both are tested against ``grassmann_mix_reference``."""
        o = self.options
        args = (z, self.plucker_proj.weight, self.plucker_proj.bias, self.signed_offsets(), o.normalize, o.eps)
        kernels = (TRITON,) if self.causal else ()
        return dispatch.call("grassmann", args, grassmann_mix_collapsed, *kernels)

    def blend(self, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        alpha = torch.sigmoid(self.gate(torch.cat([h, g], dim=-1)))
        return self.out(alpha * h + (1 - alpha) * g)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.blend(h, self.mix(self.reduce(h)))

    # Recurrent form: the state is the last max(Δ) reduced vectors (O(max Δ · r) per sequence).
    def init_state(self, batch, device, dtype):
        return torch.zeros(batch, 0, self.options.rank, device=device, dtype=dtype)

    def step(self, h_t: torch.Tensor, past_z: torch.Tensor):
        if not self.causal:
            raise ValueError("step() needs a causal mixer")
        o = self.options
        z_t = self.reduce(h_t)  # (B, r)
        t = past_z.shape[1]  # number of earlier tokens kept (capped at max Δ)
        valid = [d for d in o.offsets if d <= t]
        if valid:
            z_past = torch.stack([past_z[:, t - d] for d in valid], dim=1)  # (B, m, r)
            p = plucker(z_t[:, None, :].expand_as(z_past), z_past)
            if o.normalize:
                p = p / p.norm(dim=-1, keepdim=True).clamp_min(o.eps)
            g = self.plucker_proj(p.mean(dim=1))
        else:
            g = torch.zeros_like(h_t)
        keep = max(o.offsets)
        past_z = torch.cat([past_z, z_t[:, None, :]], dim=1)[:, -keep:]
        return self.blend(h_t, g), past_z

    def flops(self, seq_len: int) -> float:
        d, r = self.d_model, self.options.rank
        C = r * (r - 1) // 2
        m = len(self.signed_offsets())
        plucker_ops = seq_len * m * C * (3 + (3 if self.options.normalize else 0))
        return (
            linear_flops(seq_len, d, r)
            + plucker_ops
            + linear_flops(seq_len, C, d)
            + linear_flops(seq_len, 2 * d, d)
            + (linear_flops(seq_len, d, d) if self.options.out_proj else 0.0)
        )
