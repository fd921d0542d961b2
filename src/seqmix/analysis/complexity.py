"""Cost of every mixer vs sequence length: counted FLOPs, bytes written and peak tensor
memory of one forward and one forward+backward (deterministic, ``seqmix.measure``),
wall time beside them (the minimum of ``repeats`` calls), the fitted log-log exponents
and the growth of each per doubling of L.

One mixer layer is measured alone (``mixers.build`` at width d_model, causal where the
mixer has a causal form, max_len = L so that per-position mixers such as Linformer fit),
on random inputs. Lengths are the configured ones in ascending order (powers of two).

- **Counts** are taken at every length, on the CPU path of the mixer (the PyTorch code;
  a GPU's Triton kernels are opaque to the counters), under ``FakeTensorMode`` (no
  arithmetic: long lengths cost only Python per op) where ``count_tensors`` asks for it
  (``auto``: until the mixer's op count grows like a chunk loop, ``still_fake``) and the
  mixer runs there (on a copy of the mixer, so that no fake tensor stays in its caches),
  else on real CPU tensors; either way after one uncounted call (so that per-length caches,
  e.g. BigBird's block table, are built first). Counts are exact and the same on every run; fake and real ones agree
  (tests/test_cost_count.py).
- **Wall time** is taken on ``device`` after ``warmup`` calls, ``repeats`` times each;
  a mixer stops being timed once its fastest forward+backward takes longer than
  ``max_seconds`` or runs out of memory (its counts go on). Time on a shared CPU is noisy
  and, at long L, dominated by the cache hierarchy: it is reported beside the counts and
  decides nothing (report.claims decides the cost claims on the counts).

``results/analysis/complexity.csv`` (``python -m seqmix complexity``; with ``--device cuda
--out results/bench/complexity-<gpu>.csv`` the committed GPU table), one row per
(arch, seq_len, repeat), a length that was counted but not timed one row (repeat 0);
columns:

    arch                  registered mixer name
    device                where the time was taken: cpu | cuda;  device_name: its model
    d_model, batch        layer width and batch size measured
    seq_len               L (tokens)
    repeat                repeat index (0-based); every repeat is a separate timing
    fwd_ms                forward wall time under no_grad (milliseconds); empty if not timed
    fwdbwd_ms             forward + backward wall time (milliseconds); empty if not timed
    flops_fwd             FLOPs counted by FlopCounterMode in one forward (no_grad)
    flops_fwdbwd          the same for one forward + backward (gradients of input and weights)
    bytes_written_fwd     bytes of every tensor an op wrote in one forward (views excluded,
                          in-place writes included): all work, elementwise too
    bytes_written_fwdbwd  the same for forward + backward
    peak_fwd_bytes        peak bytes of live tensors allocated during one forward
    peak_fwdbwd_bytes     the same for forward + backward (saved activations included)
    ops_fwdbwd            aten ops dispatched in one forward + backward: constant in L for a
                          vectorised mixer, growing for one that loops over chunks in Python
    count_mode            fake (FakeTensorMode) | real (CPU tensors): how the counts were taken
    flops_stated          the mixer's own formula, ``mixer.flops(L) × batch`` (forward; NaN if
                          it states none)
    status                ok (counted and timed) | counted (counted only: past the time cap, or
                          timing ran out of memory) | oom (counting ran out of memory: only
                          arch, device, seq_len; no longer lengths follow)

``results/analysis/complexity_fit.csv``, one row per (arch, measure); columns:

    arch, device,      as above
    d_model, batch
    measure            a column of complexity.csv: fwd_ms, fwdbwd_ms (kind timed), flops_*,
                       bytes_written_*, peak_* (kind counted), flops_stated (kind stated)
    kind               timed | counted | stated;  count_mode: how the counts of the fit range
                       were taken (fake, real, or fake+real where auto switched inside it)
    min_len, max_len   the L range of the fit: the ``fit_longest`` largest lengths at which the
                       measure was taken (counts: every length, so the longest configured)
    slope              OLS slope k of log(value) on log(L) (value ∝ L^k), one point per length
                       (a time's point: its minimum over the repeats)
    ci_low, ci_high    95% t-interval of a timed slope; empty for exact (counted, stated) values
    points, r2         number of lengths in the fit, coefficient of determination
    local_min,         the smallest and largest exponent between consecutive lengths of the
    local_max          range, log(v₁/v₀)/log(L₁/L₀): the counted verdicts use all of them
    flops_slope        the counted fwd+bwd FLOP exponent over the same lengths, for comparison
    value_at_max_len   the value at max_len (ms, FLOPs or bytes)

The fit range is the longest lengths because there the leading term of each cost
dominates: the L-independent terms (weights and their gradients) and the terms in a
mixer's own scale (chunk C, window w, block b, d) weigh least when L ≫ C, w, b, d; the
local exponents show how far each count has converged.

``results/analysis/complexity_growth.csv``, one row per (arch, consecutive pair of counted
lengths): arch, device, len_from, len_to and, for fwdbwd_ms, flops_fwdbwd,
bytes_written_fwdbwd and peak_fwdbwd_bytes, ``growth_<measure>`` = the growth per doubling
of L between the two lengths, (v₁/v₀)^(1/log2(L₁/L₀)): 2 linear, 4 quadratic; time empty
unless both lengths were timed. A time that grows faster per doubling than the counts is
the machine (caches, memory bandwidth), not the algorithm.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from seqmix import mixers
from seqmix.analysis.cost_fit import (  # noqa: F401 (the fit is part of this module's interface)
    FIT_FIELDS,
    GROWTH_FIELDS,
    MEASURES,
    fit_exponent,
    fit_table,
    growth_table,
)
from seqmix.measure import count_mixer
from seqmix.sections import ComplexitySpec
from seqmix.train.provenance import device_record

COUNT_FIELDS = ["flops_fwd", "flops_fwdbwd", "bytes_written_fwd", "bytes_written_fwdbwd", "peak_fwd_bytes",
                "peak_fwdbwd_bytes", "ops_fwdbwd", "count_mode"]
FIELDS = ["arch", "device", "device_name", "d_model", "batch", "seq_len", "repeat", "fwd_ms", "fwdbwd_ms",
          *COUNT_FIELDS, "flops_stated", "status"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def build_mixer(arch: str, d_model: int, seq_len: int, options: dict, device) -> mixers.Mixer:
    cls = mixers.mixer_class(arch)
    torch.manual_seed(0)
    return mixers.build(arch, d_model, causal=cls.supports_causal, max_len=seq_len, **options).to(device)


def time_mixer(mixer: mixers.Mixer, seq_len: int, batch: int, repeats: int, warmup: int,
               device: torch.device) -> list[tuple[float, float]]:
    """(forward ms, forward+backward ms) of ``repeats`` calls after ``warmup`` of each."""
    x = torch.randn(batch, seq_len, mixer.d_model, device=device, requires_grad=True)
    grad_out = torch.randn(batch, seq_len, mixer.d_model, device=device)

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
    return [(_timed(forward, device), _timed(forward_backward, device)) for _ in range(repeats)]


# ``count_tensors: auto`` counts fake until a mixer's number of ops grows this much per
# doubling of L: a Python loop over L/C chunks, whose fake count costs about a millisecond
# of Python per op, in proportion to L, while its real arithmetic at these widths costs less.
LOOP_OPS_GROWTH = 1.5


def still_fake(fake: bool, previous: dict | None, row: dict) -> bool:
    """Whether the next length of a mixer is counted fake, after ``row`` (its counts at
    this length) and ``previous`` (at the last length); module docstring, ``count_tensors``."""
    if not fake or row["count_mode"] != "fake":
        return False  # real asked for, or the mixer cannot run fake
    if previous is None:
        return True
    doublings = math.log2(row["seq_len"] / previous["seq_len"])
    return (row["ops_fwdbwd"] / previous["ops_fwdbwd"]) ** (1 / doublings) < LOOP_OPS_GROWTH


def _is_oom(e: Exception) -> bool:
    # CUDA raises OutOfMemoryError; the CPU allocator a RuntimeError naming memory.
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "memory" in str(e))


def measure_mixer(arch: str, cfg: ComplexitySpec, seq_len: int, device: torch.device, options: dict,
                  timed: bool = True, fake: bool = False) -> list[dict]:
    """The rows of one (arch, L): counts (on CPU tensors, fake ones when ``fake``), and
    ``cfg.repeats`` timings on ``device`` when ``timed``. A timing that runs out of memory
    leaves a counted row."""
    counted = build_mixer(arch, cfg.d_model, seq_len, options, "cpu")
    counts = count_mixer(counted, seq_len, cfg.batch_size, fake=fake)
    try:
        stated = counted.flops(seq_len) * cfg.batch_size
    except NotImplementedError:
        stated = float("nan")
    base = {"arch": arch, "device": device.type, "device_name": device_record(device)["name"],
            "d_model": cfg.d_model, "batch": cfg.batch_size, "seq_len": seq_len, **counts, "flops_stated": stated}
    times: list[tuple[float, float]] = []
    if timed:
        try:
            mixer = counted if device.type == "cpu" else build_mixer(arch, cfg.d_model, seq_len, options, device)
            times = time_mixer(mixer, seq_len, cfg.batch_size, cfg.repeats, cfg.warmup, device)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if not times:
        return [{**base, "repeat": 0, "fwd_ms": float("nan"), "fwdbwd_ms": float("nan"), "status": "counted"}]
    return [{**base, "repeat": r, "fwd_ms": f, "fwdbwd_ms": fb, "status": "ok"} for r, (f, fb) in enumerate(times)]


def run_complexity(archs: list[str], cfg: ComplexitySpec, device: torch.device, mixer_options: dict,
                   progress: bool = True) -> list[dict]:
    """Count every arch at every length of cfg.lengths (ascending), timing it until its
    fastest forward+backward takes longer than cfg.max_seconds (module docstring)."""
    rows = []
    lengths = sorted(cfg.lengths)
    untimed: set[str] = set()
    stopped: set[str] = set()
    fake = {a: cfg.count_tensors != "real" for a in archs}
    last: dict[str, dict] = {}
    for arch, L in tqdm([(a, L) for a in archs for L in lengths], desc="complexity", disable=not progress):
        if arch in stopped:
            continue
        try:
            got = measure_mixer(arch, cfg, L, device, mixer_options.get(arch, {}), timed=arch not in untimed,
                                fake=fake[arch])
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
            rows.append({"arch": arch, "device": device.type, "seq_len": L, "status": "oom"})
            stopped.add(arch)
            continue
        rows.extend(got)
        if cfg.count_tensors == "auto":
            fake[arch] = still_fake(fake[arch], last.get(arch), got[0])
        last[arch] = got[0]
        if got[0]["status"] != "ok" or min(r["fwdbwd_ms"] for r in got) > cfg.max_seconds * 1e3:
            untimed.add(arch)
    return rows


def write_complexity(archs: list[str], spec: ComplexitySpec, mixer_options: dict, out: Path, fit_out: Path,
                     growth_out: Path, *, device: str | None = None, threads: int | None = None,
                     progress: bool = True) -> tuple[int, int]:
    """Measure ``archs`` as ``spec`` says and write complexity.csv, complexity_fit.csv and
    complexity_growth.csv; returns (rows, fits). ``device`` overrides ``spec.device``."""
    from seqmix.io import write_csv
    from seqmix.train.loop import resolve_device

    if threads:
        torch.set_num_threads(threads)
    rows = run_complexity(archs, spec, resolve_device(device or spec.device), mixer_options, progress=progress)
    fits = fit_table(rows, longest=spec.fit_longest)
    write_csv(out, rows, FIELDS)
    write_csv(fit_out, fits, FIT_FIELDS)
    write_csv(growth_out, growth_table(rows), GROWTH_FIELDS)
    return len(rows), len(fits)
