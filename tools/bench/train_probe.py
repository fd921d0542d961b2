"""Training step times of a study's real models on this machine's GPU (``gpu-check``'s
step-time parts; ``results/bench/<gpu>/train_probe.csv`` and ``compiled_step.csv``).

A point's model is built as ``seqmix.plan`` builds it (the run spec, ``Task.without_data``,
the budget solved by ``preflight.solved_size``, ``Task.build_model``) and moved to the GPU;
its optimiser is ``make_optimizer``'s, and each step is ``seqmix.train.step.optimizer_step``,
what training runs: the loss under the spec's autocast, backward, clipping at the spec's
``grad_clip``, AdamW's update, and the loss read back (``loss.item()``), on one made-up batch of
the run's shapes (``Task.example_batch``). ``steps`` steps; the median of the last ``timed``
is the step time, each timed from a ``torch.cuda.synchronize()`` to the next. FLOPs are
``plan.measure_step``'s count of the same step (on the CPU), so MFU = FLOPs / step time /
the GPU's dense BF16 peak (``PEAK_BF16``; empty for a GPU not listed there, and on a CPU).

``train_probe.csv`` (``FIELDS``), one row per (task point, architecture), in the columns of
the committed H100 table, which ``seqmix.plan`` reads; ``paths`` is the dispatch record (the
fast path each mixer took). ``compiled_step.csv`` (``COMPILED_FIELDS``): the eager and the
``train.compile`` step of the same model, weights and batch side by side in one process, with
the compilation's seconds, graphs and breaks, and the largest relative difference of the two
runs' losses step by step.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from seqmix.expansion.table import Expansion, expand
from seqmix.expansion.validate import load_study
from seqmix.measure import GIB
from seqmix.mixers import dispatch
from seqmix.plan import measure_step
from seqmix.preflight import solved_size
from seqmix.tasks import task_class
from seqmix.train.step import StepLoss, make_optimizer, optimizer_step

FIELDS = ["task", "arch", "status", "precision", "d_model", "params", "batch", "step_ms", "tok_per_s", "peak_gib",
          "step_tflop", "mfu", "steps", "run_hours", "runs_this_point", "loss", "paths"]
COMPILED_FIELDS = ["task", "arch", "status", "precision", "batch", "eager_ms", "compiled_ms", "speedup",
                   "first_compiled_step_s", "graphs", "graph_breaks", "max_loss_rel_diff", "mode", "paths"]
# Dense BF16 tensor-core peaks, FLOP/s, by a substring of the device name (first match wins):
# NVIDIA's datasheets (H100 SXM 989.4 TFLOP/s, as seqmix.plan; the H200 has the H100's tensor cores).
PEAK_BF16 = [("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989.4e12), ("H200", 989.4e12),
             ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12)]


def peak_bf16(device_name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16 if key.lower() in device_name.lower()), None)


@functools.cache
def _expansion(config: str) -> Expansion:
    return expand(load_study(config))


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(spec, device: torch.device, steps: int, compiled: bool) -> dict:
    """``steps`` optimiser steps of the spec's model on one made-up batch: {"seconds": [...],
    "losses": [...], "model", "loss_of", "record", "batch"}."""
    task = task_class(spec.kind).without_data(spec)
    size = solved_size(spec)
    torch.manual_seed(0)
    model = task.build_model(size.d_model, size.n_layers, size.d_ff_mult).to(device).train()
    opt = make_optimizer(model, spec.train.model_copy(update={"compile": compiled}))
    loss_of = StepLoss(task, model, device, spec.train.precision, compiled=compiled)
    batch = task.example_batch(spec.train.batch_size, device)
    seconds, losses = [], []
    with dispatch.using() as record:
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            loss, _ = optimizer_step(loss_of, model, opt, spec.train.grad_clip, batch)
            _sync(device)
            seconds.append(time.perf_counter() - t0)
            losses.append(loss)
    return {"seconds": seconds, "losses": losses, "size": size, "loss_of": loss_of, "batch": batch,
            "paths": "; ".join(f"{k}: {v}" for k, v in record.taken().items()) or "none"}


def probe_case(config: str, point: str, arch: str, steps: int = 13, timed: int = 10) -> list[dict]:
    """One (task point, architecture): its eager step's time, memory and MFU (module docstring)."""
    expansion, device = _expansion(config), _device()
    spec = expansion.run_spec(point, arch, 0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run = timed_steps(spec, device, steps, compiled=False)
    step_s = statistics.median(run["seconds"][-timed:])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    flops = measure_step(spec).train_flops
    peak = peak_bf16(name) if device.type == "cuda" else None
    tokens = int(run["batch"][0].numel())
    task = expansion.task(point)
    return [{"task": point, "arch": arch, "status": "ok", "precision": spec.train.precision,
             "d_model": run["size"].d_model, "params": run["size"].params, "batch": spec.train.batch_size,
             "step_ms": round(step_s * 1e3, 2), "tok_per_s": round(tokens / step_s),
             "peak_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 2) if device.type == "cuda" else "",
             "step_tflop": round(flops / 1e12, 3), "mfu": round(flops / step_s / peak, 4) if peak else "",
             "steps": spec.train.steps, "run_hours": round(spec.train.steps * step_s / 3600, 3),
             "runs_this_point": len(task.seeds[arch]), "loss": round(run["losses"][-1], 3),
             "paths": run["paths"]}]


def compiled_case(config: str, point: str, arch: str, steps: int = 13, timed: int = 10) -> list[dict]:
    """One (task point, architecture): the eager and the compiled step side by side."""
    expansion, device = _expansion(config), _device()
    spec = expansion.run_spec(point, arch, 0)
    eager = timed_steps(spec, device, steps, compiled=False)
    fast = timed_steps(spec, device, steps, compiled=True)
    eager_s, fast_s = (statistics.median(r["seconds"][-timed:]) for r in (eager, fast))
    record = fast["loss_of"].record()
    diff = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(eager["losses"], fast["losses"]))
    return [{"task": point, "arch": arch, "status": "ok", "precision": spec.train.precision,
             "batch": spec.train.batch_size, "eager_ms": round(eager_s * 1e3, 2), "compiled_ms": round(fast_s * 1e3, 2),
             "speedup": round(eager_s / fast_s, 2), "first_compiled_step_s": record["first_compiled_step_s"],
             "graphs": record["graphs"], "graph_breaks": record["graph_breaks"], "max_loss_rel_diff": f"{diff:.1e}",
             "mode": record["mode"], "paths": fast["paths"]}]
