"""Cost of one mixer layer against sequence length: the FLOPs, bytes written and peak
tensor memory of one forward and one forward+backward, counted by ``seqmix.measure``, wall
time beside them, and the log-log exponents and per-doubling growth fitted to them
(``cost_fit``). Rows: ``ComplexityRow``, ``cost_fit.FitRow``, ``cost_fit.GrowthRow``.

The counts are exact, the same on every run, and decide the cost claims; wall time on a
shared CPU is noisy and at long L measures the cache hierarchy, so it is reported beside
them and decides nothing. Method and fit range: the report's "Cost versus sequence length".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import torch
from tqdm import tqdm

from seqmix import mixers
from seqmix.analysis.cost_fit import (  # noqa: F401 (the fit is part of this module's interface)
    FIT_FIELDS,
    GROWTH_FIELDS,
    MEASURES,
    FitRow,
    GrowthRow,
    fit_exponent,
    fit_table,
    growth_table,
)
from seqmix.io import columns
from seqmix.measure import count_mixer
from seqmix.study.settings import ComplexitySettings
from seqmix.train.provenance import device_record


class ComplexityRow(TypedDict, total=False):
    """One row of complexity.csv: one timing of one (arch, seq_len). A length counted but not
    timed is one row (repeat 0); one whose counting ran out of memory holds only arch, device,
    seq_len and status, and no longer length of that arch follows."""

    arch: str  # registered mixer name
    device: str  # where the time was taken: cpu | cuda
    device_name: str  # the device's model
    d_model: int  # layer width
    batch: int  # batch size
    seq_len: int  # L (tokens)
    repeat: int  # repeat index (0-based); each repeat is a separate timing
    fwd_ms: float  # forward wall time under no_grad (ms); NaN if not timed
    fwdbwd_ms: float  # forward + backward wall time (ms); NaN if not timed
    flops_fwd: float  # FLOPs of one forward (no_grad), FlopCounterMode plus measure's formulas
    flops_fwdbwd: float  # the same for forward + backward (gradients of input and weights)
    bytes_written_fwd: int  # bytes every op wrote in one forward (views excluded, in-place included)
    bytes_written_fwdbwd: int  # the same for forward + backward
    peak_fwd_bytes: int  # peak bytes of live tensors allocated during one forward
    peak_fwdbwd_bytes: int  # the same for forward + backward (saved activations included)
    ops_fwdbwd: int  # aten ops of one forward + backward: grows with L only for a Python chunk loop
    count_mode: str  # fake (FakeTensorMode) | real (CPU tensors): how the counts were taken
    flops_stated: float  # the mixer's own formula, mixer.flops(L) × batch (forward); NaN if none
    status: str  # ok (counted, timed) | counted (past the time cap or out of memory timing) | oom


FIELDS = columns(ComplexityRow)
COUNT_FIELDS = FIELDS[FIELDS.index("flops_fwd"):FIELDS.index("count_mode") + 1]  # what count_mixer returns


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
    """One layer of ``arch``, causal where it has a causal form; max_len = L so that mixers
    with per-position weights (Linformer, ToST) fit every length."""
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
    this length) and ``previous`` (at the last length): while fake was asked for, the mixer
    ran fake, and its op count grew less than LOOP_OPS_GROWTH per doubling."""
    if not fake or row["count_mode"] != "fake":
        return False  # real asked for, or the mixer cannot run fake
    if previous is None:
        return True
    doublings = math.log2(row["seq_len"] / previous["seq_len"])
    return (row["ops_fwdbwd"] / previous["ops_fwdbwd"]) ** (1 / doublings) < LOOP_OPS_GROWTH


def _is_oom(e: Exception) -> bool:
    # CUDA raises OutOfMemoryError; the CPU allocator a RuntimeError naming memory.
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "memory" in str(e))


def measure_mixer(arch: str, cfg: ComplexitySettings, seq_len: int, device: torch.device, options: dict,
                  timed: bool = True, fake: bool = False) -> list[ComplexityRow]:
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


def run_complexity(archs: list[str], cfg: ComplexitySettings, device: torch.device, mixer_options: dict,
                   progress: bool = True) -> list[ComplexityRow]:
    """ComplexityRows of every arch at every length of cfg.lengths (ascending). An arch is
    timed until its fastest forward+backward takes longer than cfg.max_seconds or timing runs
    out of memory, counted on until counting does."""
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


def write_complexity(archs: list[str], spec: ComplexitySettings, mixer_options: dict, out: Path, fit_out: Path,
                     growth_out: Path, *, device: str | None = None, threads: int | None = None,
                     progress: bool = True) -> tuple[int, int]:
    """Measure ``archs`` as ``spec`` says and write complexity.csv, complexity_fit.csv and
    complexity_growth.csv; returns (rows, fits). ``device`` overrides ``spec.device``."""
    from seqmix.device import resolve_device
    from seqmix.io import write_rows

    if threads:
        torch.set_num_threads(threads)
    rows = run_complexity(archs, spec, resolve_device(device or spec.device), mixer_options, progress=progress)
    fits = fit_table(rows, longest=spec.fit_longest)
    write_rows(out, rows, ComplexityRow)
    write_rows(fit_out, fits, FitRow)
    write_rows(growth_out, growth_table(rows), GrowthRow)
    return len(rows), len(fits)
