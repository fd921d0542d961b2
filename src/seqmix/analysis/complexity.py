"""Cost of every mixer vs sequence length: forward and forward+backward wall time, peak
tensor memory, and the theoretical FLOP count beside them; then the fitted log-log
exponent (time ∝ L^k) with its 95% confidence interval over the longest lengths.

One mixer layer is measured alone (``mixers.build`` at width d_model, causal where the
mixer has a causal form, max_len = L so that per-position mixers such as Linformer fit),
on random inputs, after ``warmup`` calls. Lengths are the configured ones in ascending
order (powers of two); a mixer stops growing L once the median forward+backward call takes
longer than ``max_seconds`` or runs out of memory.

Peak memory on a GPU is torch.cuda.max_memory_allocated; on the CPU it is the high-water
mark of tensor allocations recorded by torch.profiler (same meaning: bytes of live
tensors, not process RSS).

``results/analysis/complexity.csv`` (``python -m seqmix complexity``; with ``--device cuda
--out results/bench/complexity-<gpu>.csv`` the committed GPU table), one row per
(arch, seq_len, repeat); columns:

    arch               registered mixer name
    device             cpu | cuda;  device_name: the CPU or GPU model
    d_model, batch     layer width and batch size measured
    seq_len            L (tokens)
    repeat             repeat index (0-based); every repeat is a separate timing
    fwd_ms             forward wall time under no_grad (milliseconds)
    fwdbwd_ms          forward + backward wall time (milliseconds)
    peak_fwd_bytes     peak tensor memory of one forward above what was live before (bytes)
    peak_fwdbwd_bytes  the same for forward + backward (bytes)
    flops_fwd          theoretical forward FLOPs, ``mixer.flops(L) × batch`` (NaN if the
                       mixer states none)
    status             ok | oom (an oom row has only arch, device, seq_len)

``results/analysis/complexity_fit.csv``, one row per (arch, measure); columns:

    arch, device       as above
    measure            fwd_ms | fwdbwd_ms | peak_fwdbwd_bytes | flops_fwd (the column fitted)
    min_len, max_len   the L range of the fit: the ``longest`` (3) largest lengths measured
    slope              OLS slope k of log(measure) on log(L), every repeat a point
    ci_low, ci_high    its 95% t-interval
    points             number of (L, value) points in the fit
    r2                 coefficient of determination of the fit
    flops_slope        the same fit of the theoretical FLOP count over the same lengths:
                       the exponent the measurement is to be compared with
    value_at_max_len   median of the measure at max_len (its unit: ms, bytes or FLOPs)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from seqmix import mixers
from seqmix.sections import ComplexitySpec
from seqmix.train.provenance import device_record

FIELDS = ["arch", "device", "device_name", "d_model", "batch", "seq_len", "repeat",
          "fwd_ms", "fwdbwd_ms", "peak_fwd_bytes", "peak_fwdbwd_bytes", "flops_fwd", "status"]
FIT_FIELDS = ["arch", "device", "measure", "min_len", "max_len", "slope", "ci_low", "ci_high", "points",
              "r2", "flops_slope", "value_at_max_len"]
MEASURES = ("fwd_ms", "fwdbwd_ms", "peak_fwdbwd_bytes", "flops_fwd")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def peak_memory_bytes(fn: Callable[[], None], device: torch.device) -> int:
    """Peak bytes of tensors allocated while ``fn`` runs, above what was live before."""
    if device.type == "cuda":
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return int(peak)


def build_mixer(arch: str, d_model: int, seq_len: int, options: dict, device) -> mixers.Mixer:
    cls = mixers.mixer_class(arch)
    torch.manual_seed(0)
    return mixers.build(arch, d_model, causal=cls.supports_causal, max_len=seq_len, **options).to(device)


def measure_mixer(arch: str, d_model: int, seq_len: int, batch: int, repeats: int, warmup: int,
                  device: torch.device, options: dict | None = None) -> list[dict]:
    mixer = build_mixer(arch, d_model, seq_len, options or {}, device)
    x = torch.randn(batch, seq_len, d_model, device=device, requires_grad=True)
    grad_out = torch.randn(batch, seq_len, d_model, device=device)

    def forward():
        with torch.no_grad():
            mixer(x)

    def forward_backward():
        mixer.zero_grad(set_to_none=True)
        x.grad = None
        mixer(x).backward(grad_out)

    for _ in range(warmup):
        forward()
        forward_backward()
    peak_fwd = peak_memory_bytes(forward, device)
    peak_fb = peak_memory_bytes(forward_backward, device)
    try:
        flops = mixer.flops(seq_len) * batch
    except NotImplementedError:
        flops = float("nan")
    rec = device_record(device)
    rows = []
    for r in range(repeats):
        rows.append({
            "arch": arch, "device": device.type, "device_name": rec["name"], "d_model": d_model,
            "batch": batch, "seq_len": seq_len, "repeat": r,
            "fwd_ms": _timed(forward, device), "fwdbwd_ms": _timed(forward_backward, device),
            "peak_fwd_bytes": peak_fwd, "peak_fwdbwd_bytes": peak_fb, "flops_fwd": flops, "status": "ok",
        })
    return rows


def run_complexity(archs: list[str], cfg: ComplexitySpec, device: torch.device, mixer_options: dict,
                   progress: bool = True) -> list[dict]:
    """Measure every arch over cfg.lengths (ascending); an arch stops growing L once
    one forward+backward takes longer than cfg.max_seconds or runs out of memory."""
    rows = []
    lengths = sorted(cfg.lengths)
    jobs = tqdm([(a, L) for a in archs for L in lengths], desc="complexity", disable=not progress)
    stopped: set[str] = set()
    for arch, L in jobs:
        if arch in stopped:
            continue
        try:
            got = measure_mixer(arch, cfg.d_model, L, cfg.batch_size, cfg.repeats,
                                cfg.warmup, device, mixer_options.get(arch, {}))
        except (torch.OutOfMemoryError, RuntimeError) as e:
            # CUDA raises OutOfMemoryError; the CPU allocator a RuntimeError naming memory.
            if not isinstance(e, torch.OutOfMemoryError) and "memory" not in str(e):
                raise
            rows.append({"arch": arch, "device": device.type, "seq_len": L, "status": "oom"})
            stopped.add(arch)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        rows.extend(got)
        if statistics.median(r["fwdbwd_ms"] for r in got) > cfg.max_seconds * 1e3:
            stopped.add(arch)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def fit_exponent(seq_len: np.ndarray, time_ms: np.ndarray) -> dict:
    """OLS slope of log(time) on log(L) with a 95% t-interval: time ∝ L^slope."""
    from scipy import stats

    x, y = np.log(np.asarray(seq_len, float)), np.log(np.asarray(time_ms, float))
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return {"slope": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "points": n}
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.975, n - 2) * res.stderr
    return {"slope": res.slope, "ci_low": res.slope - half, "ci_high": res.slope + half,
            "points": n, "r2": res.rvalue ** 2}


def _finite_positive(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v > 0


def fit_table(rows: list[dict], longest: int = 3) -> list[dict]:
    """Fitted exponents per (arch, measure) over the ``longest`` largest lengths measured,
    each with the FLOP-count exponent over the same lengths beside it (module docstring)."""
    out = []
    ok = [r for r in rows if r.get("status") == "ok"]
    for arch in dict.fromkeys(r["arch"] for r in ok):
        mine = [r for r in ok if r["arch"] == arch]
        lengths = sorted({r["seq_len"] for r in mine})[-longest:]
        sel = [r for r in mine if r["seq_len"] in lengths]
        fits = {}
        for measure in MEASURES:
            vals = [(r["seq_len"], r[measure]) for r in sel if _finite_positive(r[measure])]
            if vals:
                fits[measure] = (fit_exponent(*map(np.array, zip(*vals))), vals)
        flops_slope = fits["flops_fwd"][0]["slope"] if "flops_fwd" in fits else float("nan")
        for measure, (fit, vals) in fits.items():
            at_max = [v for L, v in vals if L == lengths[-1]]
            out.append({"arch": arch, "device": sel[0]["device"], "measure": measure,
                        "min_len": lengths[0], "max_len": lengths[-1], **fit, "flops_slope": flops_slope,
                        "value_at_max_len": statistics.median(at_max) if at_max else float("nan")})
    return out


def write_complexity(archs: list[str], spec: ComplexitySpec, mixer_options: dict, out: Path, fit_out: Path, *,
                     device: str | None = None, threads: int | None = None, progress: bool = True) -> tuple[int, int]:
    """Measure ``archs`` as ``spec`` says and write complexity.csv and complexity_fit.csv;
    returns (rows, fits). ``device`` overrides ``spec.device``."""
    from seqmix.io import write_csv
    from seqmix.train.loop import resolve_device

    if threads:
        torch.set_num_threads(threads)
    rows = run_complexity(archs, spec, resolve_device(device or spec.device), mixer_options, progress=progress)
    fits = fit_table(rows, longest=spec.fit_longest)
    write_csv(out, rows, FIELDS)
    write_csv(fit_out, fits, FIT_FIELDS)
    return len(rows), len(fits)
