"""What would make a study fail at its shapes, found before the first job: ``snakemake`` runs
``preflight`` in its ``onstart`` (not in a dry run), and ``python -m seqmix plan`` prints it
first. Each problem is one line naming the config key and the fix: budgets that cannot be
met within their tolerance (solved on the meta device), bf16 autocast without a GPU, and the
complexity analysis's longest length where a mixer's forward and backward would need more
memory than the machine has (counted under FakeTensorMode, so L = 65,536 costs no memory).
"""

from __future__ import annotations

import json

import torch

from seqmix import catalogue, measure
from seqmix.measure import GIB
from seqmix.models.budget import BudgetError, Size, solve_budget
from seqmix.sections import Study
from seqmix.spec import RunSpec
from seqmix.study import complexity_architectures, run_spec, task_architectures, variants
from seqmix.tasks import task_class


def cost_key(spec: RunSpec) -> str:
    """Runs that differ only in seed, learning rate or schedule cost the same per step."""
    return json.dumps([spec.kind, spec.arch, spec.settings, spec.model.model_dump(mode="json"),
                       spec.mixer_options, spec.train.batch_size], sort_keys=True)


def cost_specs(study: Study) -> list[RunSpec]:
    """One run spec (seed 0) per distinct per-step cost of the study, in config order."""
    specs: dict[str, RunSpec] = {}
    for v in variants(study):
        for arch in task_architectures(study, v):
            spec = run_spec(study, v.name, arch, 0)
            specs.setdefault(cost_key(spec), spec)
    return list(specs.values())


_SIZES: dict[str, Size] = {}


def solved_size(spec: RunSpec) -> Size:
    """The run's size as training solves it, on the meta device (cached: the preflight and the
    plan share it)."""
    key = cost_key(spec)
    if key not in _SIZES:
        task, m = task_class(spec.kind).without_data(spec), spec.model
        _SIZES[key] = solve_budget(task.build_model, d_model=m.d_model, n_layers=m.n_layers,
                                   d_ff_mult=m.d_ff_mult, **m.budget.model_dump())
    return _SIZES[key]


def budget_problems(study: Study) -> list[str]:
    """Every (task, architecture) whose budget has a tolerance is solved now (meta device):
    one that cannot be met is refused before training starts."""
    problems = []
    for spec in cost_specs(study):
        budget = spec.model.budget
        if budget.params is None or budget.tolerance is None:
            continue
        try:
            solved_size(spec)
        except BudgetError as e:
            problems.append(f"config key 'tasks.{spec.group}.model.budget' ({spec.arch}): {e}")
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

    entry = catalogue.mixer_entry(arch)
    try:
        with FakeTensorMode():
            mixer = mixers.build(arch, d_model, causal=entry.causal, max_len=seq_len)
            x = torch.randn(batch, seq_len, d_model, requires_grad=True)
            with measure.Count() as count:
                mixer(x).sum().backward()
        return float(count.peak)
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


def setup_problems(study: Study, local: bool = True) -> list[str]:
    problems = budget_problems(study)
    if local:
        problems += precision_problems(study, torch.cuda.is_available())
        problems += complexity_problems(study, measure.available_memory(study.analysis.complexity.device))
    return problems


def preflight(study: Study, local: bool = True) -> list[str]:
    """Problems that would make the study fail at its shapes, one line each (empty: none).
    ``local``: the jobs run on this machine (its memory and GPU are checked too)."""
    return setup_problems(study, local)
