"""`python -m seqmix plan`: what a study costs before it runs.

The cost of a run is counted on its real model: the run's spec is built exactly as training
builds it (budget solved, its block, its mixer options), without any data
(``Task.without_data``), and one training step on a made-up batch of the run's shapes is run
on the CPU in fp32 under ``measure.Count`` (FLOPs of the ops it has formulas for: linear,
bmm, convolution, SDPA, FFTs, Mamba's fused scan; elementwise work such as eager scans is not
counted; SDPA's CPU kernel is counted as its GPU kernels), FLOPs at batch 1 and memory at
batches 2 and 3, extended to the run's batch (``measure.small_steps``). A run whose step
could not even be counted here (its activations alone beyond this machine's memory at
batch 3) is refused first, as ``preflight`` refuses limits its data decide. Per task and
architecture:

    runs          training runs (sweep points × seeds)
    params        parameters of the model (the largest over a sweep)
    tokens        tokens trained on, steps × batch × sequence (at most: early stopping ends
                  runs sooner; SNLI pairs counted at their longest)
    pflop         FLOPs of every training step and periodic evaluation (forward only) of
                  all those runs, in 10^15; the final evaluation on whole splits is not
                  counted (under 1 % of the WikiText-2 runs' training)
    act_gib       activation memory of one training step: the tensors alive at the end of
                  its forward pass, which the backward pass reads (fp32; bf16 autocast keeps
                  some in half), GiB
    train_gib     the most memory one training step holds: the peak of its forward and
                  backward passes (activations, the backward's temporaries, gradients) plus
                  fp32 weights and AdamW's two moments (12 bytes per parameter), GiB
    h100_hours    hours on one H100 SXM, from measured step times where there are some
                  (below), else pflop / (peak × MFU), the peak being its dense BF16
                  tensor-core rate, 989.4 TFLOP/s (NVIDIA H100 datasheet)
    basis         what h100_hours rests on, per run: "measured", the MFU of the nearest
                  measured point ("from <point>"), or the assumed MFU
    assumed_mfu_hours  pflop / (peak × the assumed MFU) (``--mfu``, default 5 %): the plan
                  without measurements, for comparison

Seed packs (a task's ``train.pack``, seqmix.train.pack): ``packed_hours`` is ``h100_hours``
with every pack's seeds trained as one, its step time predicted (never measured: no packed
step has run on a GPU) by the time model of docs/runbook/gpu-headline.md from launch counts taken on a
CPU (``--pack-counts``, default ``results/bench/time_model/counts.json``, written by
``python -m tools.bench.time_model``): a launch-bound eager step of a pack of n seeds takes its
single step's time x (the pack's launches / the single step's) x the host cost per launch of a
packed step against a single one, measured side by side on the CPU; the pack's launches are
interpolated between one seed and the counted pack, as the time model does. A packed
architecture with no count keeps its unpacked hours, and the notes say so.

Measured step times (``--measured``, default ``results/bench/nvidia-h100-80gb-hbm3``): the
``train_probe.csv`` that ``make gpu-check`` writes there, the step time of each (task point,
architecture) of the paper profile on that GPU (``tools.bench.train_probe``). A measurement
applies to every point whose step costs the same (``preflight.cost_key``: its sweep's learning
rates) where the model is the one measured (same parameters, batch and precision); a run then
costs its steps × the measured step time, and its periodic evaluations their FLOPs at the MFU
that step time gives (the counted FLOPs of the step over its time and the peak). A run with no
measurement is extrapolated by its counted FLOPs at the MFU of the nearest measured point of
its architecture (nearest in FLOPs per step), or, where its architecture has none, at the
assumed MFU. Small models' steps are launch-bound (measured MFU 0.2-7 % on an H100), so a
point with far fewer FLOPs than its source is underestimated: the basis gives the ratio.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from seqmix import catalogue, measure
from seqmix.errors import ConfigError
from seqmix.expansion.table import Expansion
from seqmix.measure import GIB, STATE_BYTES_PER_PARAM
from seqmix.preflight import cost_key, solved_size, step_floor_problem
from seqmix.study.jobs import TrainJob
from seqmix.tasks import task_class

H100_BF16_PEAK = 989.4e12  # FLOP/s, H100 SXM5, dense BF16 (NVIDIA H100 Tensor Core GPU datasheet)
DEFAULT_MFU = 0.05

FIELDS = ["task", "arch", "block", "runs", "params", "tokens", "pflop", "act_gib", "train_gib", "h100_hours",
          "basis", "assumed_mfu_hours", "packed_hours"]
# The H100 whose peak is H100_BF16_PEAK: where `make gpu-check` writes its step times
# (seqmix.device.device_slug of "NVIDIA H100 80GB HBM3"), and where the plan reads them.
MEASURED_DIR = Path("results/bench") / "nvidia-h100-80gb-hbm3"
STEP_TIMES = "train_probe.csv"
PACK_COUNTS = Path("results/bench/time_model") / "counts.json"  # the time model's launch counts


@dataclasses.dataclass(frozen=True)
class StepCost:
    params: int
    train_flops: float  # one optimiser step's forward and backward
    eval_flops: float  # one evaluation batch's forward
    activation_bytes: float  # tensors alive at the end of the forward pass (kept for backward)
    peak_bytes: float  # the most alive at once in the forward and backward passes
    tokens: int  # tokens (sequence positions) in one training batch


def measure_step(spec: TrainJob) -> StepCost:
    """One training step of ``spec``'s model at its batch size (module docstring); refused
    (ConfigError) before the model is built where the activations of the batches it is
    counted at alone would not fit this machine."""
    problem = step_floor_problem(spec, max(measure.MEMORY_BATCHES), measure.available_memory("cpu"),
                                 "this machine, which counts it,")
    if problem is not None:
        raise ConfigError(f"cannot count it: {problem}")
    task = task_class(spec.kind).without_data(spec)
    size = solved_size(spec)
    torch.manual_seed(0)
    model = task.build_model(size.d_model, size.n_layers, size.d_ff_mult)
    small = measure.small_steps(lambda b: task.loss(model, task.example_batch(b, "cpu")), model)
    B = spec.train.batch_size
    activations, peak = measure.step_bytes(small, B)
    tokens = int(task.example_batch(1, "cpu")[0].numel())
    # FLOPs are linear in the batch (there is no per-batch matmul work): batch 1 times B.
    return StepCost(size.params, B * (small.forward_flops + small.backward_flops), B * small.forward_flops,
                    activations, peak, B * tokens)


def run_cost(spec: TrainJob, step: StepCost) -> tuple[float, int]:
    """(FLOPs, tokens) of one whole run: every step, and every periodic evaluation."""
    t = spec.train
    evals = t.steps // t.eval_every + (t.steps % t.eval_every != 0)
    return t.steps * step.train_flops + evals * t.eval_batches * step.eval_flops, t.steps * step.tokens


def read_step_times(directory: str | Path | None) -> list[dict]:
    """The rows of ``<directory>/train_probe.csv`` (``make gpu-check``'s step times); [] without it."""
    path = Path(directory) / STEP_TIMES if directory else None
    if path is None or not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_pack_counts(path: str | Path | None) -> dict[str, dict]:
    """The time model's launch counts by architecture (``PACK_COUNTS``); {} without them."""
    if not path or not Path(path).is_file():
        return {}
    import json

    return json.loads(Path(path).read_text())["counts"]


def pack_factor(counts: dict, members: int) -> float:
    """A pack of ``members`` seeds' eager step time over its single step's (module docstring:
    predicted by the time model, tools/bench/time_model.py)."""
    one, many = counts["single"], counts["packed"]
    launches = one + (many - one) * (members - 1) / (counts["members"] - 1)
    return launches / one * (counts["host_ratio"] if members > 1 else 1.0)


@dataclasses.dataclass
class Point:
    """One (sweep point, architecture) of a study: its run spec, counted step, seeds, and the
    seconds of one step measured on the GPU (None: not measured)."""

    group: str
    name: str
    spec: TrainJob
    step: StepCost
    seeds: int
    measured_s: float | None = None

    def mfu(self, peak: float) -> float:
        return self.step.train_flops / self.measured_s / peak


def study_points(expansion: Expansion, progress=None) -> list[Point]:
    """Every (sweep point, architecture) of the study, its step counted once per cost key."""
    cache: dict[str, StepCost] = {}
    points = []
    for spec in expansion.arch_specs:
        key = cost_key(spec)
        if key not in cache:
            if progress:
                progress(f"{spec.task} {spec.arch}")
            cache[key] = measure_step(spec)
        seeds = expansion.tasks[spec.task].seeds[spec.arch]
        points.append(Point(spec.group, spec.task, spec, cache[key], len(seeds)))
    return points


def apply_measurements(points: list[Point], measured: list[dict]) -> list[str]:
    """Set ``measured_s`` of every point whose step was measured (module docstring); returns
    a line for each measured row that does not apply (its model is not the one planned)."""
    by_name = {(p.name, p.spec.arch): p for p in points}
    seconds, unused = {}, []
    for r in measured:
        p = by_name.get((r["task"], r["arch"]))
        if r.get("status") != "ok" or p is None:
            continue
        planned = (p.step.params, p.spec.train.batch_size, p.spec.train.precision)
        if (int(r["params"]), int(r["batch"]), r["precision"]) != planned:
            unused.append(f"{r['task']} {r['arch']}: measured {r['params']} parameters, batch {r['batch']}, "
                          f"{r['precision']}; planned {planned[0]}, {planned[1]}, {planned[2]}")
            continue
        seconds[cost_key(p.spec)] = float(r["step_ms"]) / 1e3
    for p in points:
        p.measured_s = seconds.get(cost_key(p.spec))
    return unused


def _basis(p: Point, measured: list[Point], mfu: float, peak: float) -> tuple[float, str]:
    """(MFU, basis) of a point: its own measurement's, the nearest measured point's of its
    architecture (in log FLOPs per step), or the assumed one."""
    if p.measured_s is not None:
        return p.mfu(peak), "measured"
    same = [m for m in measured if m.spec.arch == p.spec.arch]
    if not same:
        return mfu, f"assumed {mfu:.0%} MFU"
    near = min(same, key=lambda m: abs(math.log(p.step.train_flops / m.step.train_flops)))
    return near.mfu(peak), (f"from {near.name} ({near.mfu(peak):.1%} MFU, "
                            f"{p.step.train_flops / near.step.train_flops:.2g}x its FLOPs)")


def packed_runs(p: Point, pack_counts: dict[str, dict], missing: set[str]) -> float:
    """How many single runs' time a point's seeds take: its seeds, or where they train as one
    pack, its predicted pack step over the single one (``pack_factor``)."""
    if not p.spec.train.pack:
        return p.seeds
    if p.spec.arch not in pack_counts:
        missing.add(p.spec.arch)
        return p.seeds
    return pack_factor(pack_counts[p.spec.arch], p.seeds)


def plan_rows(expansion: Expansion, mfu: float = DEFAULT_MFU, peak: float = H100_BF16_PEAK, progress=None,
              measured: list[dict] | None = None, notes: list[str] | None = None,
              pack_counts: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """One row per (task as written in the config, architecture): its sweep points and
    seeds added up (module docstring). ``measured``: ``read_step_times``' rows; ``notes`` gets
    a line for each measured row that does not apply; ``pack_counts``: ``read_pack_counts``'."""
    points = study_points(expansion, progress)
    unused, missing = apply_measurements(points, measured or []), set()
    if notes is not None:
        notes += [f"measured but not the model planned, so not used: {u}" for u in unused]
    known = [p for p in points if p.measured_s is not None]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for p in points:
        flops, tokens = run_cost(p.spec, p.step)
        point_mfu, basis = _basis(p, known, mfu, peak)
        row = rows.setdefault((p.group, p.spec.arch), {
            "task": p.group, "arch": p.spec.arch, "block": p.spec.model.block, "runs": 0, "params": 0, "tokens": 0,
            "pflop": 0.0, "act_gib": 0.0, "train_gib": 0.0, "h100_hours": 0.0, "assumed_mfu_hours": 0.0,
            "packed_hours": 0.0, "_basis": {}})
        row["runs"] += p.seeds
        row["params"] = max(row["params"], p.step.params)
        row["tokens"] += p.seeds * tokens
        row["pflop"] += p.seeds * flops / 1e15
        row["act_gib"] = max(row["act_gib"], p.step.activation_bytes / GIB)
        row["train_gib"] = max(row["train_gib"], (p.step.peak_bytes + STATE_BYTES_PER_PARAM * p.step.params) / GIB)
        row["h100_hours"] += p.seeds * flops / (peak * point_mfu) / 3600
        row["packed_hours"] += packed_runs(p, pack_counts or {}, missing) * flops / (peak * point_mfu) / 3600
        row["assumed_mfu_hours"] += p.seeds * flops / (peak * mfu) / 3600
        row["_basis"][basis] = row["_basis"].get(basis, 0) + p.seeds
    if notes is not None and missing:
        notes.append(f"packed but with no launch count in the time model ({', '.join(sorted(missing))}): "
                     "their packed hours are their unpacked ones")
    for row in rows.values():
        parts = row.pop("_basis")
        row["basis"] = "measured" if list(parts) == ["measured"] else "; ".join(
            f"{n} {basis}" for basis, n in parts.items())
    return list(rows.values())


def totals(rows: list[dict]) -> dict[str, Any]:
    return {"task": "total", "arch": "", "block": "", "runs": sum(r["runs"] for r in rows), "params": "",
            "tokens": sum(r["tokens"] for r in rows), "pflop": sum(r["pflop"] for r in rows),
            "act_gib": max((r["act_gib"] for r in rows), default=0.0),
            "train_gib": max((r["train_gib"] for r in rows), default=0.0),
            "h100_hours": sum(r["h100_hours"] for r in rows), "basis": "",
            "assumed_mfu_hours": sum(r["assumed_mfu_hours"] for r in rows),
            "packed_hours": sum(r["packed_hours"] for r in rows)}


def _cell(key: str, value) -> str:
    if value == "" or value is None:
        return ""
    if key == "params":
        return f"{value / 1e6:.2f}M"
    if key == "tokens":
        return f"{value / 1e9:.2f}B"
    if isinstance(value, float):
        return f"{value:.3g}" if not key.endswith("hours") else f"{value:.1f}"
    return str(value)


def _per_task(rows: list[dict]) -> list[str]:
    """H100 hours per task: as planned (measured where measured) and at the assumed MFU."""
    tasks: dict[str, list[float]] = {}
    for r in rows:
        hours = tasks.setdefault(r["task"], [0.0, 0.0])
        hours[0] += r["h100_hours"]
        hours[1] += r["assumed_mfu_hours"]
    return ["| task | H100 h | at the assumed MFU |", "|---|---|---|"] + [
        f"| {task} | {h:.1f} | {a:.1f} |" for task, (h, a) in tasks.items()]


def _packs(rows: list[dict]) -> list[str]:
    """The hours with and without the study's seed packs, where it has any."""
    packed = [r for r in rows if not math.isclose(r["packed_hours"], r["h100_hours"])]
    if not packed:
        return []
    total = totals(rows)
    return [f"With the study's seed packs the study would cost {total['packed_hours']:.1f} H100 h, against "
            f"{total['h100_hours']:.1f} without: the packed step times are predicted by the time model "
            "(docs/runbook/gpu-headline.md: launch counts taken on a CPU), not measured.", "",
            "| task | architecture | runs | H100 h without packs | with packs (predicted) |", "|---|---|---|---|---|",
            *(f"| {r['task']} | {catalogue.title(r['arch'])} | {r['runs']} | {r['h100_hours']:.2f} | "
              f"{r['packed_hours']:.2f} |" for r in packed), ""]


def markdown(rows: list[dict], mfu: float, peak: float, measured_from: str | None = None,
             notes: list[str] | None = None) -> str:
    """The plan as a Markdown table with its total, the hours per task, and what they rest on."""
    heads = ["task", "architecture", "block", "runs", "params", "tokens", "PFLOP", "act. GiB", "train GiB",
             "H100 h", "H100 h from"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in [*rows, totals(rows)]:
        title = catalogue.title(r["arch"]) if r["arch"] else ""
        cells = [r["task"], title] + [_cell(k, r[k]) for k in FIELDS[2:-2]]
        lines.append("| " + " | ".join(cells) + " |")
    total, assumed = totals(rows)["h100_hours"], totals(rows)["assumed_mfu_hours"]
    source = (f"step times measured on an H100 ({measured_from}/{STEP_TIMES}, written by `make gpu-check`) where "
              "the last column says measured, else the MFU it names" if measured_from else "no measured step times")
    lines += ["", f"H100 hours from {source}; an assumed MFU is {mfu:.0%} of {peak / 1e12:.1f} TFLOP/s (dense BF16). "
              f"At the assumed {mfu:.0%} everywhere the study would cost {assumed:.1f} H100 h; from measurements it "
              f"costs {total:.1f}. FLOPs counted by FlopCounterMode on each run's model (matmul-class ops, SDPA, FFTs, "
              "Mamba's fused scan); tokens and FLOPs are upper bounds where early stopping ends runs sooner; the "
              "final evaluation on whole splits is not counted.", "", *_packs(rows), *_per_task(rows)]
    lines += [f"\n{n}" for n in notes or []]
    return "\n".join(lines) + "\n"
