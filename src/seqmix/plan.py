"""`python -m seqmix plan`: what a study costs before it runs, and what would fail at its
shapes, checked before the first job.

The cost of a run is counted on its real model: the run's spec is built exactly as training
builds it (budget solved, its block, its mixer options), without any data
(``Task.without_data``), and one training step on a made-up batch of the run's shapes is
run on the CPU in fp32 under ``torch.utils.flop_counter.FlopCounterMode`` (FLOPs of the
matmul-class ops it has formulas for: linear, bmm, convolution, SDPA; elementwise work such
as scans is not counted; SDPA's CPU kernel is counted as its GPU kernels), at batch 1 and
times the run's batch (FLOPs are linear in it); a dispatch mode tracks the bytes of every
tensor a forward pass allocates and keeps, at batch 1 and 2, extended linearly to the
run's batch (and the peak of forward and backward the same way). Per task and
architecture the plan reports:

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

``preflight`` is what ``snakemake`` runs before the first job (Snakefile ``onstart``) and
what ``plan`` prints first: budgets that cannot be met within their tolerance, bf16 autocast
on a machine without a GPU, and the complexity analysis's longest length where a mixer's
forward and backward would need more memory than the machine has.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from seqmix import catalogue
from seqmix.models.budget import BudgetError, Size, solve_budget
from seqmix.sections import Study
from seqmix.spec import RunSpec
from seqmix.study import complexity_architectures, run_spec, task_architectures, variants
from seqmix.tasks import task_class

H100_BF16_PEAK = 989.4e12  # FLOP/s, H100 SXM5, dense BF16 (NVIDIA H100 Tensor Core GPU datasheet)
DEFAULT_MFU = 0.05
STATE_BYTES_PER_PARAM = 12  # fp32 weights, AdamW's exp_avg and exp_avg_sq (gradients are in the peak)
GIB = 2**30

FIELDS = ["task", "arch", "block", "runs", "params", "tokens", "pflop", "act_gib", "train_gib", "h100_hours"]


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode with SDPA's CPU kernel counted as its GPU kernels are (torch 2.13 has
    no formula for it, so attention would count 0 FLOPs on a CPU)."""
    aten = torch.ops.aten
    return FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
    })


def _sdpa_cpu(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _sdpa_cpu_backward(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors allocated under it that are alive now (``live``) and at most
    (``peak``): every op output that is not an alias of an input (view and in-place results
    are not new memory) counts until it is freed."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and i < len(returns) and returns[i].alias_info is None:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out

    def _free(self, n: int) -> None:
        self.live -= n


@dataclasses.dataclass(frozen=True)
class StepCost:
    params: int
    train_flops: float  # one optimiser step's forward and backward
    eval_flops: float  # one evaluation batch's forward
    activation_bytes: float  # tensors alive at the end of the forward pass (kept for backward)
    peak_bytes: float  # the most alive at once in the forward and backward passes
    tokens: int  # tokens (sequence positions) in one training batch


@dataclasses.dataclass(frozen=True)
class SmallSteps:
    """Forward and backward passes at batches 1 and 2 (``_small_steps``)."""

    held: tuple[float, float]  # bytes the forward pass keeps for the backward pass
    peaks: tuple[float, float]  # the most bytes alive at once in both passes
    forward_flops: float  # at batch 1
    backward_flops: float  # at batch 1
    tokens: int  # at batch 1


def _small_steps(task, model, device="cpu") -> SmallSteps:
    """Eval mode: no dropout masks (a byte per element), no random draws, no state advanced
    (the Performer counts training calls), so training afterwards is unchanged."""
    held, peaks, flops, was_training = [], [], [], model.training
    model.eval()
    for b in (1, 2):
        batch = task.example_batch(b, device)
        with LiveBytes() as live:
            with flop_counter() as forward:
                loss = task.loss(model, batch)
            held.append(live.live)
            with flop_counter() as backward:
                loss.backward()
        peaks.append(live.peak)
        flops.append((forward.get_total_flops(), backward.get_total_flops()))
        del loss
        model.zero_grad(set_to_none=True)
    model.train(was_training)
    tokens = int(task.example_batch(1, device)[0].numel())
    return SmallSteps((held[0], held[1]), (peaks[0], peaks[1]), flops[0][0], flops[0][1], tokens)


def _extend(pair: tuple[float, float], batch_size: int) -> float:
    return pair[0] + (pair[1] - pair[0]) * (batch_size - 1)


def step_bytes(task, model, batch_size: int, device="cpu", small: SmallSteps | None = None) -> tuple[float, float]:
    """(activations, peak) of one forward and backward pass at ``batch_size``: the bytes the
    forward pass keeps for the backward pass, and the most alive at once during both
    (gradients included), each measured at batches of 1 and 2 and extended linearly (nothing
    at the full batch is allocated). The peak is at least activations + gradients (at tiny
    batches the gradients' allocation hides the batch's share of the peak)."""
    small = small or _small_steps(task, model, device)
    activations = _extend(small.held, batch_size)
    grads = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    return activations, max(_extend(small.peaks, batch_size), activations + grads)


def memory_problem(task, model, batch_size: int, device: torch.device) -> str | None:
    """A training step that cannot fit this machine: the peak of its forward and backward
    passes plus 12 bytes per parameter (fp32 weights, AdamW's two moments) against the
    memory it has; None if it fits."""
    params = sum(p.numel() for p in model.parameters())
    need = step_bytes(task, model, batch_size, device)[1] + STATE_BYTES_PER_PARAM * params
    have = available_memory(device.type)
    if need <= have:
        return None
    return (f"a training step of {task.spec.label} needs about {need / GIB:.1f} GiB (its forward and backward "
            f"at batch {batch_size}, weights and AdamW's moments), and this machine has {have / GIB:.1f} GiB "
            "available: lower train.batch_size or model.d_model, or run it on a GPU with that much memory "
            "(python -m seqmix plan shows every run's)")


_SIZES: dict[str, Size] = {}


def solved_size(spec: RunSpec) -> Size:
    """The run's size as training solves it (cached: the preflight and the plan share it)."""
    key = _cost_key(spec)
    if key not in _SIZES:
        task, m = task_class(spec.kind).without_data(spec), spec.model
        _SIZES[key] = solve_budget(task.build_model, d_model=m.d_model, n_layers=m.n_layers,
                                   d_ff_mult=m.d_ff_mult, **m.budget.model_dump())
    return _SIZES[key]


def measure_step(spec: RunSpec) -> StepCost:
    """One training step of ``spec``'s model at its batch size (module docstring)."""
    task = task_class(spec.kind).without_data(spec)
    size = solved_size(spec)
    torch.manual_seed(0)
    model = task.build_model(size.d_model, size.n_layers, size.d_ff_mult)
    small = _small_steps(task, model)
    B = spec.train.batch_size
    activations, peak = step_bytes(task, model, B, small=small)
    # FLOPs are linear in the batch (there is no per-batch matmul work): batch 1 times B.
    return StepCost(size.params, B * (small.forward_flops + small.backward_flops), B * small.forward_flops,
                    activations, peak, B * small.tokens)


def _cost_key(spec: RunSpec) -> str:
    # Runs that differ only in seed, learning rate or schedule cost the same per step.
    return json.dumps([spec.kind, spec.arch, spec.settings, spec.model.model_dump(mode="json"),
                       spec.mixer_options, spec.train.batch_size], sort_keys=True)


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
            key = _cost_key(spec)
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
                 "by FlopCounterMode on each run's model (matmul-class ops); tokens and FLOPs are upper bounds "
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


# ------------------------------------------------------------------------------------------
# Preflight: what would fail at this study's shapes, before the first job.
# ------------------------------------------------------------------------------------------


def budget_problems(study: Study) -> list[str]:
    """Every (task, architecture) whose budget has a tolerance is solved now (meta device):
    one that cannot be met is refused before training starts."""
    problems, seen = [], set()
    for v in variants(study):
        budget = v.section.model.budget
        if budget.params is None or budget.tolerance is None:
            continue
        for arch in task_architectures(study, v):
            spec = run_spec(study, v.name, arch, 0)
            if (key := _cost_key(spec)) in seen:
                continue
            seen.add(key)
            try:
                solved_size(spec)
            except BudgetError as e:
                problems.append(f"config key 'tasks.{v.group}.model.budget' ({arch}): {e}")
    return problems


def precision_problems(study: Study, has_gpu: bool) -> list[str]:
    if has_gpu:
        return []
    bf16 = sorted({v.group for v in variants(study) if v.section.train.precision == "bf16"
                   and v.section.train.device != "cuda"})
    return [f"config key 'tasks.{g}.train.precision' is bf16 but this machine has no GPU, where bf16 autocast "
            "runs many times slower than fp32: set train.precision: fp32 for a CPU run (config/paper-smoke.yaml "
            "does), or run on a GPU" for g in bf16]


def mixer_peak_bytes(arch: str, d_model: int, seq_len: int, batch: int) -> float | None:
    """Peak bytes of one mixer layer's forward and backward at (batch, seq_len, d_model),
    under FakeTensorMode (nothing computed, so L = 65,536 costs nothing); None where the
    mixer's forward reads its data (random features drawn with a generator)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from seqmix import mixers

    try:
        with FakeTensorMode():
            mixer = mixers.build(arch, d_model, causal=mixers.mixer_class(arch).supports_causal, max_len=seq_len)
            x = torch.randn(batch, seq_len, d_model, requires_grad=True)
            with LiveBytes() as live:
                mixer(x).sum().backward()
        return float(live.peak)
    except Exception:  # noqa: BLE001 - data-dependent ops: no estimate, not a failure
        return None


def complexity_problems(study: Study, available_bytes: float) -> list[str]:
    spec = study.analysis.complexity
    longest = max(spec.lengths)
    problems = []
    for arch in complexity_architectures(study):
        need = mixer_peak_bytes(arch, spec.d_model, longest, spec.batch_size)
        if need is not None and need > available_bytes:
            problems.append(
                f"config key 'analysis.complexity.lengths' reaches L = {longest:,}, where {arch}'s forward and "
                f"backward need about {need / GIB:.1f} GiB and this machine has {available_bytes / GIB:.1f} GiB: "
                "drop the longest lengths (config/paper-smoke.yaml stops at 8,192)")
    return problems


def available_memory(device: str) -> float:
    """Bytes the analyses can use: the GPU's memory, or the host's available memory."""
    if device != "cpu" and torch.cuda.is_available():
        return float(torch.cuda.mem_get_info()[1])
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return float(info.get("MemAvailable", info["MemTotal"]))


def preflight(study: Study, local: bool = True) -> list[str]:
    """Problems that would make the study fail at its shapes, one line each (empty: none).
    ``local``: the jobs run on this machine (precision and memory are checked here too)."""
    problems = budget_problems(study)
    if local:
        problems += precision_problems(study, torch.cuda.is_available())
        problems += complexity_problems(study, available_memory(study.analysis.complexity.device))
    return problems
