"""Exponents of cost against sequence length, fitted to the rows of complexity.csv
(``FitRow``, ``GrowthRow``). Torch-free: the claims evaluator and the notebooks read these too."""

from __future__ import annotations

import math
from typing import TypedDict

import numpy as np

from seqmix.io import columns

# Counted on the code that runs (seqmix.measure): one exact value per length.
COUNTED = ("flops_fwd", "flops_fwdbwd", "bytes_written_fwd", "bytes_written_fwdbwd", "peak_fwd_bytes",
           "peak_fwdbwd_bytes")
STATED = ("flops_stated",)  # the mixer's own formula, mixer.flops(L) × batch
TIMED = ("fwd_ms", "fwdbwd_ms")  # wall time: the minimum over the repeats at each length
MEASURES = TIMED + COUNTED + STATED
# Per-doubling growth, time beside what was counted (complexity_growth.csv).
GROWTH = ("fwdbwd_ms", "flops_fwdbwd", "bytes_written_fwdbwd", "peak_fwdbwd_bytes")
COUNTED_STATUSES = ("ok", "counted")


class FitRow(TypedDict, total=False):
    """One row of complexity_fit.csv: the exponent of one measure of one arch, fitted over
    the longest lengths where it was taken, where each cost's leading term dominates."""

    arch: str  # registered mixer name
    device: str  # where the times were taken: cpu | cuda
    d_model: int  # layer width
    batch: int  # batch size
    measure: str  # a column of complexity.csv: fwd_ms, fwdbwd_ms, flops_*, bytes_written_*, peak_*
    kind: str  # timed | counted | stated
    count_mode: str  # how the counts of the fit range were taken: fake | real | fake+real
    min_len: int  # shortest L of the fit range
    max_len: int  # longest L of the fit range
    slope: float  # OLS slope k of log(value) on log(L), value ∝ L^k (a time: its minimum per length)
    ci_low: float  # 95 % t-interval of a timed slope; NaN for exact (counted, stated) values
    ci_high: float
    points: int  # lengths in the fit
    r2: float  # coefficient of determination (empty under 3 points)
    local_min: float  # smallest exponent between consecutive lengths, log(v₁/v₀)/log(L₁/L₀)
    local_max: float  # largest: the counted verdicts use all of them
    flops_slope: float  # counted fwd+bwd FLOP exponent over the same lengths, for comparison
    value_at_max_len: float  # the value at max_len (ms, FLOPs or bytes)


class GrowthRow(TypedDict, total=False):
    """One row of complexity_growth.csv: the growth of each GROWTH measure per doubling of L
    between two consecutive counted lengths, (v₁/v₀)^(1/log2(L₁/L₀)): 2 linear, 4 quadratic.
    A time that grows faster than the counts is the machine (caches), not the algorithm."""

    arch: str
    device: str
    len_from: int  # L₀
    len_to: int  # L₁
    growth_fwdbwd_ms: float  # NaN unless both lengths were timed
    growth_flops_fwdbwd: float
    growth_bytes_written_fwdbwd: float
    growth_peak_fwdbwd_bytes: float


FIT_FIELDS = columns(FitRow)
GROWTH_FIELDS = columns(GrowthRow)


def fit_exponent(seq_len: np.ndarray, value: np.ndarray) -> dict:
    """OLS slope of log(value) on log(L) with a 95% t-interval: value ∝ L^slope."""
    from scipy import stats

    x, y = np.log(np.asarray(seq_len, float)), np.log(np.asarray(value, float))
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return {"slope": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "points": n}
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.975, n - 2) * res.stderr
    return {"slope": res.slope, "ci_low": res.slope - half, "ci_high": res.slope + half,
            "points": n, "r2": res.rvalue ** 2}


def local_exponents(seq_len, value) -> list[float]:
    """log(v_{i+1}/v_i) / log(L_{i+1}/L_i) between consecutive lengths (ascending L)."""
    pairs = sorted(zip(seq_len, value))
    return [math.log(v1 / v0) / math.log(L1 / L0) for (L0, v0), (L1, v1) in zip(pairs, pairs[1:])]


def _finite_positive(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v > 0


def per_length(rows: list[dict], measure: str) -> dict[int, float]:
    """One value of ``measure`` per length: the minimum over the repeats (a count is the
    same on every repeat, a time's minimum is its least disturbed call)."""
    out: dict[int, float] = {}
    for r in rows:
        v = r.get(measure)
        if _finite_positive(v):
            out[r["seq_len"]] = min(out.get(r["seq_len"], math.inf), float(v))
    return out


def _measure_rows(arch_rows: list[dict]) -> dict[str, list[dict]]:
    """The rows each kind of measure is fitted on: times on the timed lengths, counts on
    every counted length."""
    counted = [r for r in arch_rows if r.get("status") in COUNTED_STATUSES]
    return {"timed": [r for r in counted if r["status"] == "ok"], "counted": counted, "stated": counted}


def _kind(measure: str) -> str:
    return "timed" if measure in TIMED else "stated" if measure in STATED else "counted"


def _modes(rows: list[dict], lengths: list[int]) -> str:
    """How the counts over ``lengths`` were taken: fake, real or fake+real."""
    return "+".join(sorted({str(r.get("count_mode", "")) for r in rows if r["seq_len"] in lengths}))


def _fit_one(values: dict[int, float], lengths: list[int]) -> dict:
    xs = [L for L in lengths if L in values]
    fit = fit_exponent(np.array(xs, float), np.array([values[L] for L in xs], float))
    local = local_exponents(xs, [values[L] for L in xs])
    return {**fit, "local_min": min(local, default=float("nan")), "local_max": max(local, default=float("nan"))}


def fit_table(rows: list[dict], longest: int = 3) -> list[FitRow]:
    """Fitted exponents per (arch, measure) over the ``longest`` largest lengths where the
    measure was taken; counted FLOPs fwd+bwd fitted over the same lengths beside each."""
    out = []
    for arch in dict.fromkeys(r["arch"] for r in rows):
        mine = [r for r in rows if r["arch"] == arch]
        by_kind = _measure_rows(mine)
        for measure in MEASURES:
            kind = _kind(measure)
            values = per_length(by_kind[kind], measure)
            lengths = sorted(values)[-longest:]
            if not lengths:
                continue
            fit = _fit_one(values, lengths)
            if kind != "timed":  # exact values: their spread is curvature, not noise
                fit.update(ci_low=float("nan"), ci_high=float("nan"))
            flops = per_length(by_kind["counted"], "flops_fwdbwd")
            flops_fit = _fit_one(flops, [L for L in lengths if L in flops])
            out.append({"arch": arch, "device": mine[0]["device"], "d_model": mine[0].get("d_model"),
                        "batch": mine[0].get("batch"), "measure": measure, "kind": kind,
                        "count_mode": _modes(by_kind["counted"], lengths), "min_len": lengths[0], "max_len": lengths[-1],
                        **fit, "flops_slope": flops_fit["slope"], "value_at_max_len": values[lengths[-1]]})
    return out


def growth_table(rows: list[dict]) -> list[GrowthRow]:
    """Growth of each GROWTH measure per doubling of L between consecutive counted lengths:
    (v(L₁)/v(L₀))^(1/log2(L₁/L₀)), 2 for linear, 4 for quadratic; time only where both
    lengths were timed."""
    out = []
    for arch in dict.fromkeys(r["arch"] for r in rows):
        mine = [r for r in rows if r["arch"] == arch]
        by_kind = _measure_rows(mine)
        values = {m: per_length(by_kind[_kind(m)], m) for m in GROWTH}
        lengths = sorted(per_length(by_kind["counted"], "flops_fwdbwd") or values["bytes_written_fwdbwd"])
        for L0, L1 in zip(lengths, lengths[1:]):
            row = {"arch": arch, "device": mine[0]["device"], "len_from": L0, "len_to": L1}
            for m in GROWTH:
                v = values[m]
                row[f"growth_{m}"] = ((v[L1] / v[L0]) ** (1 / math.log2(L1 / L0))
                                      if L0 in v and L1 in v else float("nan"))
            out.append(row)
    return out

