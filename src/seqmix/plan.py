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
    h100_hours    pflop / (peak × MFU): the peak is the H100 SXM's dense BF16 tensor-core
                  rate, 989.4 TFLOP/s (NVIDIA H100 datasheet); the MFU is an assumption
                  (``--mfu``, default 5 %: models of 1-13M parameters keep an H100 far from
                  its peak). It has not been measured: no GPU was available to this project.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from seqmix import catalogue, measure
from seqmix.errors import ConfigError
from seqmix.measure import GIB, STATE_BYTES_PER_PARAM
from seqmix.preflight import cost_key, solved_size, step_floor_problem
from seqmix.sections import Study
from seqmix.spec import RunSpec
from seqmix.study import run_spec, task_architectures, variants
from seqmix.tasks import task_class

H100_BF16_PEAK = 989.4e12  # FLOP/s, H100 SXM5, dense BF16 (NVIDIA H100 Tensor Core GPU datasheet)
DEFAULT_MFU = 0.05

FIELDS = ["task", "arch", "block", "runs", "params", "tokens", "pflop", "act_gib", "train_gib", "h100_hours"]


@dataclasses.dataclass(frozen=True)
class StepCost:
    params: int
    train_flops: float  # one optimiser step's forward and backward
    eval_flops: float  # one evaluation batch's forward
    activation_bytes: float  # tensors alive at the end of the forward pass (kept for backward)
    peak_bytes: float  # the most alive at once in the forward and backward passes
    tokens: int  # tokens (sequence positions) in one training batch


def measure_step(spec: RunSpec) -> StepCost:
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


def run_cost(spec: RunSpec, step: StepCost) -> tuple[float, int]:
    """(FLOPs, tokens) of one whole run: every step, and every periodic evaluation."""
    t = spec.train
    evals = t.steps // t.eval_every + (t.steps % t.eval_every != 0)
    return t.steps * step.train_flops + evals * t.eval_batches * step.eval_flops, t.steps * step.tokens


def plan_rows(study: Study, mfu: float = DEFAULT_MFU, peak: float = H100_BF16_PEAK,
              progress=None) -> list[dict[str, Any]]:
    """One row per (task as written in the config, architecture): its sweep points and
    seeds added up (module docstring)."""
    cache: dict[str, StepCost] = {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for v in variants(study):
        for arch in task_architectures(study, v):
            spec = run_spec(study, v.name, arch, 0)
            key = cost_key(spec)
            if key not in cache:
                if progress:
                    progress(f"{v.name} {arch}")
                cache[key] = measure_step(spec)
            step, n_seeds = cache[key], len(v.section.seeds or study.seeds)
            flops, tokens = run_cost(spec, step)
            row = rows.setdefault((v.group, arch), {"task": v.group, "arch": arch, "block": spec.model.block,
                                                    "runs": 0, "params": 0, "tokens": 0, "pflop": 0.0,
                                                    "act_gib": 0.0, "train_gib": 0.0})
            row["runs"] += n_seeds
            row["params"] = max(row["params"], step.params)
            row["tokens"] += n_seeds * tokens
            row["pflop"] += n_seeds * flops / 1e15
            row["act_gib"] = max(row["act_gib"], step.activation_bytes / GIB)
            row["train_gib"] = max(row["train_gib"],
                                   (step.peak_bytes + STATE_BYTES_PER_PARAM * step.params) / GIB)
    for row in rows.values():
        row["h100_hours"] = row["pflop"] * 1e15 / (peak * mfu) / 3600
    return list(rows.values())


def totals(rows: list[dict]) -> dict[str, Any]:
    return {"task": "total", "arch": "", "block": "", "runs": sum(r["runs"] for r in rows), "params": "",
            "tokens": sum(r["tokens"] for r in rows), "pflop": sum(r["pflop"] for r in rows),
            "act_gib": max((r["act_gib"] for r in rows), default=0.0),
            "train_gib": max((r["train_gib"] for r in rows), default=0.0),
            "h100_hours": sum(r["h100_hours"] for r in rows)}


def _cell(key: str, value) -> str:
    if value == "" or value is None:
        return ""
    if key == "params":
        return f"{value / 1e6:.2f}M"
    if key == "tokens":
        return f"{value / 1e9:.2f}B"
    if isinstance(value, float):
        return f"{value:.3g}" if key != "h100_hours" else f"{value:.1f}"
    return str(value)


def markdown(rows: list[dict], mfu: float, peak: float) -> str:
    """The plan as a Markdown table with its total and the assumptions it rests on."""
    heads = ["task", "architecture", "block", "runs", "params", "tokens", "PFLOP", "act. GiB", "train GiB",
             "H100 h"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in [*rows, totals(rows)]:
        label = catalogue.label(r["arch"]) if r["arch"] else ""
        cells = [r["task"], label] + [_cell(k, r[k]) for k in FIELDS[2:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"H100 hours at an assumed {mfu:.0%} of {peak / 1e12:.1f} TFLOP/s (dense BF16); FLOPs counted "
                 "by FlopCounterMode on each run's model (matmul-class ops, SDPA, FFTs, Mamba's fused scan); tokens and FLOPs are upper bounds "
                 "where early stopping ends runs sooner; the final evaluation on whole splits is not counted.")
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- plan: generated by `make plan` (python -m seqmix plan --config config/paper.yaml) -->"
README_END = "<!-- plan: end -->"


def splice_between(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with what stands between the lines ``begin`` and ``end`` replaced by ``body``
    (a README's generated tables)."""
    if begin not in text or end not in text:
        raise ValueError(f"no markers {begin} ... {end} to put the table between")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + rest[rest.index(end):]
