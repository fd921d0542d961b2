"""Geometry of the trained attention-free mixers on held-out text: for each Causal Grassmann
layer (Zhang 2025, arXiv:2512.19428, §3.2) how far its Plücker features lie from the
Grassmannian Gr(2, r) and the angles of the 2-planes it moves through; for each ToST TSSA
layer (Wu et al. 2025, arXiv:2412.17810, §3) the variational compression term R_c^var it
descends. Quantities and their reading: the report's "Geometry of the Grassmann mixer"
section. Rows: ``GeometryRow``.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from seqmix.analysis.capture import capture_mixer_inputs
from seqmix.io import columns
from seqmix.mixers.grassmann import CausalGrassmann, pair_indices, plucker
from seqmix.study.settings import GeometrySettings


class GeometryRow(TypedDict):
    """One row of geometry.csv (tidy): one statistic of one quantity of one layer of a run."""

    task: str
    arch: str
    seed: int  # the trained run
    layer: int  # block index, 0 = closest to the embedding
    quantity: str  # plucker_residual_pair | plucker_residual_used | pair_angle | plane_angle_1 | plane_angle_2 | compression_term
    offset: int  # Δ for per-offset rows; 0 = pooled over the layer's offsets, or not per offset
    stat: str  # max | mean | std | q05 | q25 | q50 | q75 | q95 (over positions, sequences, quadruples)
    value: float  # the statistic
    unit: str  # relative (ρ, dimensionless) | degrees | nats
    count: int  # values the statistic summarises


FIELDS = columns(GeometryRow)
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
DEGENERATE_SIN = 1e-6


# ---------------------------------------------------------------------------------------
# Plücker relations
# ---------------------------------------------------------------------------------------


def quadruples(r: int, max_count: int | None = None, seed: int = 0) -> torch.Tensor:
    """All i<j<k<l in range(r), or ``max_count`` of them drawn without replacement: (Q, 4)."""
    quads = torch.tensor(list(itertools.combinations(range(r), 4)), dtype=torch.long).reshape(-1, 4)
    if max_count is not None and len(quads) > max_count:
        g = torch.Generator().manual_seed(seed)
        quads = quads[torch.randperm(len(quads), generator=g)[:max_count]]
    return quads


def coordinate_index(r: int) -> torch.Tensor:
    """(r, r) table: column of p_ij in ``plucker``'s output for i < j (-1 elsewhere)."""
    idx = torch.full((r, r), -1, dtype=torch.long)
    i, j = pair_indices(r)
    idx[i, j] = torch.arange(len(i))
    return idx


def plucker_residual(p: torch.Tensor, quads: torch.Tensor) -> torch.Tensor:
    """ρ = |p_ij p_kl − p_ik p_jl + p_il p_jk| / ‖p‖² for p (..., C(r,2)), quads (Q, 4):
    returns (..., Q). NaN where p = 0."""
    C = p.shape[-1]
    r = int(round((1 + math.sqrt(1 + 8 * C)) / 2))
    col = coordinate_index(r).to(p.device)
    i, j, k, l = quads.to(p.device).unbind(-1)
    rel = p[..., col[i, j]] * p[..., col[k, l]] - p[..., col[i, k]] * p[..., col[j, l]] + p[..., col[i, l]] * p[..., col[j, k]]
    return rel.abs() / (p * p).sum(-1, keepdim=True)


# ---------------------------------------------------------------------------------------
# Angles
# ---------------------------------------------------------------------------------------


def vector_angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle between a and b (..., r) in degrees, in [0, 180]; atan2 keeps small angles exact."""
    cos = (a * b).sum(-1)
    sin = torch.sqrt(((a * a).sum(-1) * (b * b).sum(-1) - cos * cos).clamp_min(0))
    return torch.rad2deg(torch.atan2(sin, cos))


def principal_angles(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Principal angles (degrees, ascending) between span(A) and span(B); A, B: (..., r, 2)
    with independent columns. Returns (..., 2)."""
    Qa, _ = torch.linalg.qr(A)
    Qb, _ = torch.linalg.qr(B)
    M = Qa.transpose(-1, -2) @ Qb  # (..., 2, 2)
    cos = torch.linalg.svdvals(M)  # descending: angles ascending
    sin = torch.linalg.svdvals(Qb - Qa @ M).flip(-1)  # of (I - QaQaᵀ)Qb, made ascending
    # arccos loses half the digits near 0° (and arcsin near 90°): take each where it is exact,
    # as scipy.linalg.subspace_angles does.
    theta = torch.where(cos * cos < 0.5, torch.arccos(cos.clamp(-1.0, 1.0)), torch.arcsin(sin.clamp(-1.0, 1.0)))
    return torch.rad2deg(theta)


# ---------------------------------------------------------------------------------------
# Per layer
# ---------------------------------------------------------------------------------------


def _describe(values: torch.Tensor, quantity: str, offset: int, unit: str) -> list[dict]:
    v = values.detach().double().reshape(-1)
    v = v[torch.isfinite(v)].numpy()
    if v.size == 0:
        return []
    out = [{"quantity": quantity, "offset": offset, "stat": "mean", "value": float(v.mean()), "unit": unit,
            "count": int(v.size)}]
    for q in QUANTILES:
        out.append({"quantity": quantity, "offset": offset, "stat": f"q{round(100 * q):02d}",
                    "value": float(np.quantile(v, q)), "unit": unit, "count": int(v.size)})
    return out


def _extremes(values: torch.Tensor, quantity: str) -> list[dict]:
    v = values.detach().double().reshape(-1)
    v = v[torch.isfinite(v)]
    if v.numel() == 0:
        return []
    return [{"quantity": quantity, "offset": 0, "stat": s, "value": float(f(v)), "unit": "relative",
             "count": int(v.numel())} for s, f in (("max", torch.max), ("mean", torch.mean))]


@torch.no_grad()
def grassmann_layer_geometry(mixer: CausalGrassmann, h: torch.Tensor, max_quadruples: int | None = 2000,
                             seed: int = 0) -> list[dict]:
    """Plücker residuals, pair angles and plane drift of one Grassmann layer on its input
    h (B, L, d), per offset and pooled (offset 0). Offsets are the layer's own (per_layer
    schedules give one); a pair whose plane is degenerate (sin < DEGENERATE_SIN) has no
    plane angle."""
    o = mixer.options
    z = mixer.reduce(h)  # (B, L, r), the model's dtype
    B, L, r = z.shape
    quads = quadruples(r, max_quadruples, seed)
    rows: list[dict] = []
    p_sum = z.new_zeros(B, L, r * (r - 1) // 2)
    count = z.new_zeros(L)
    pair_res, angles, plane1, plane2 = [], [], [], []
    for delta in mixer.signed_offsets():
        if not 0 < delta < L:
            continue  # look-ahead offsets (non-causal variant) and offsets past the sequence
        z_now, z_past = z[:, delta:], z[:, :-delta]  # pairs (z_t, z_{t-Δ}), t = Δ..L-1
        p = plucker(z_now, z_past)
        p_hat = p / p.norm(dim=-1, keepdim=True).clamp_min(o.eps) if o.normalize else p
        p_sum[:, delta:] += p_hat
        count[delta:] += 1
        res = plucker_residual(p_hat, quads)
        pair_res.append(res)
        rows += [{**row, "quantity": "plucker_residual_pair", "offset": delta}
                 for row in _extremes(res, "plucker_residual_pair")]
        # Angles in float64: the planes are compared through tiny differences.
        zn, zp = z_now.double(), z_past.double()
        ang = vector_angle(zn, zp)  # (B, L-Δ)
        angles.append(ang)
        rows += _describe(ang, "pair_angle", delta, "degrees")
        planes = torch.stack([zn, zp], dim=-1)  # (B, L-Δ, r, 2): P_t for t = Δ..L-1
        ok = torch.sin(torch.deg2rad(ang)) > DEGENERATE_SIN
        both = ok[:, 1:] & ok[:, :-1]
        pa = principal_angles(planes[:, :-1], planes[:, 1:])  # (B, L-Δ-1, 2): P_t vs P_{t+1}
        pa = pa.masked_fill(~both[..., None], float("nan"))
        plane1.append(pa[..., 0])
        plane2.append(pa[..., 1])
        rows += _describe(pa[..., 0], "plane_angle_1", delta, "degrees")
        rows += _describe(pa[..., 1], "plane_angle_2", delta, "degrees")
    if not pair_res:
        return rows
    used = p_sum[:, count > 0] / count[count > 0][:, None]  # p̄: what W_plü receives
    rows += _extremes(plucker_residual(used, quads), "plucker_residual_used")
    rows += _extremes(torch.cat([x.reshape(-1) for x in pair_res]), "plucker_residual_pair")
    rows += _describe(torch.cat([x.reshape(-1) for x in angles]), "pair_angle", 0, "degrees")
    rows += _describe(torch.cat([x.reshape(-1) for x in plane1]), "plane_angle_1", 0, "degrees")
    rows += _describe(torch.cat([x.reshape(-1) for x in plane2]), "plane_angle_2", 0, "degrees")
    return rows


@torch.no_grad()
def tssa_layer_geometry(mixer: torch.nn.Module, h: torch.Tensor, eps: float) -> list[dict]:
    """R_c^var summed over heads, per sequence, on the layer's input h (B, L, d): mean, std."""
    per_seq = mixer.compression_term(h, eps).sum(-1).double()  # (B,)
    n = per_seq.numel()
    std = per_seq.std().item() if n > 1 else float("nan")
    return [{"quantity": "compression_term", "offset": 0, "stat": s, "value": v, "unit": "nats", "count": n}
            for s, v in (("mean", per_seq.mean().item()), ("std", std))]


def has_geometry(mixer_cls: type) -> bool:
    """Whether geometry.csv has rows for this mixer class (Grassmann, or a compression term)."""
    return issubclass(mixer_cls, CausalGrassmann) or hasattr(mixer_cls, "compression_term")


def model_geometry(model: torch.nn.Module, seqs: torch.Tensor, max_quadruples: int | None = 2000,
                   tssa_eps: float = 0.5, seed: int = 0) -> list[dict]:
    """geometry.csv rows (without the run columns) for a causal LM reading ``seqs`` (N, L)."""
    model.eval()
    inputs = capture_mixer_inputs(model, lambda: model(seqs))
    rows = []
    for layer, (block, h) in enumerate(zip(model.blocks, inputs)):
        mixer = block.mixer
        if isinstance(mixer, CausalGrassmann):
            got = grassmann_layer_geometry(mixer, h, max_quadruples, seed)
        elif hasattr(mixer, "compression_term"):
            got = tssa_layer_geometry(mixer, h, tssa_eps)
        else:
            got = []
        rows += [{"layer": layer, **r} for r in got]
    return rows


def run_geometry(run_dir: str | Path, spec: GeometrySettings) -> list[GeometryRow]:
    """GeometryRows of one trained run on ``spec.num_sequences`` held-out sequences."""
    from seqmix.train.evaluate import load_run

    model, task, run = load_run(run_dir)
    (seqs,) = task.heldout_inputs(spec.split, spec.num_sequences, crop_len=0)
    ids = {"task": run.task, "arch": run.arch, "seed": run.seed}
    return [{**ids, **r} for r in model_geometry(model, seqs, spec.max_quadruples, spec.tssa_eps, spec.seed)]


def write_geometry(run_dirs: list[Path], spec: GeometrySettings, out: Path, threads: int | None = None) -> int:
    """geometry.csv of the runs among ``run_dirs`` whose mixer has a geometry to measure
    (Grassmann, TSSA); returns the row count."""
    from seqmix import mixers
    from seqmix.io import read_json, write_rows

    if threads:
        torch.set_num_threads(threads)
    rows = []
    for d in run_dirs:
        if has_geometry(mixers.mixer_class(read_json(Path(d) / "metrics.json")["arch"])):
            rows += run_geometry(d, spec)
    write_rows(out, rows, GeometryRow)
    return len(rows)
