"""What would make a study fail at its shapes, found before the first job: ``snakemake`` runs
``preflight`` in its ``onstart`` (not in a dry run), and ``python -m seqmix plan`` checks the
same before it counts anything. Each problem is one line naming the config key and the fix.
Nothing is built at a size that can fail: the checks go cheapest first, limits the data
decide and activation floors from the shapes (``shape_problems``) before budgets solved on
the meta device and memory counted under FakeTensorMode (``setup_problems``).

The checks read the specs of the study's jobs (``Specs``), as the jobs receive them: from an
expansion in the process that expanded the study (``Specs.of_expansion``: the plan), or from
the job table (``Specs.of_table``: the Snakefile's onstart, which so neither validates nor
expands the study a second time; the `jobs` command did, once).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import torch

from seqmix import measure, numerics
from seqmix.measure import GIB
from seqmix.models.budget import BudgetError, Size, solve_budget
from seqmix.study.jobs import ComplexityJob, SparsityJob, TrainJob
from seqmix.tasks import task_class

if TYPE_CHECKING:
    from seqmix.expansion.table import Expansion


@dataclasses.dataclass(frozen=True)
class Specs:
    """What the preflight reads of a study: the specs of the jobs it checks."""

    runs: tuple[TrainJob, ...]  # the first run of each (task, architecture), in the study's order
    sparsity: tuple[tuple[str, SparsityJob], ...]  # each run's sparsity job, with the run's task
    complexity: ComplexityJob
    numerics: str

    @classmethod
    def of_expansion(cls, expansion: Expansion) -> Specs:
        """The specs an expansion builds (seqmix.expansion.table)."""
        runs = tuple(expansion.run_spec(task.name, arch, seeds[0]) for task in expansion.tasks.values()
                     for arch, seeds in task.seeds.items())
        return cls(runs=runs, sparsity=tuple((r.task, expansion.sparsity_job([r])) for r in expansion.sparsity_runs),
                   complexity=expansion.complexity_job(), numerics=expansion.study.numerics)

    @classmethod
    def of_table(cls, table: dict[str, Any]) -> Specs:
        """The same specs from the job table (seqmix.study.dag.Jobs.table): its JSON, parsed."""
        first: dict[tuple[str, str], str] = {}
        for run in table["runs"]:  # task by task, each architecture's seeds in order
            first.setdefault((run["task"], run["arch"]), run["spec"])
        return cls(runs=tuple(TrainJob.model_validate_json(spec) for spec in first.values()),
                   sparsity=tuple((r["task"], SparsityJob.model_validate_json(r["spec"])) for r in table["sparsity_runs"]),
                   complexity=ComplexityJob.model_validate_json(table["analyses"]["complexity"]["spec"]),
                   numerics=table["study"]["numerics"])


def cost_key(spec: TrainJob) -> str:
    """Runs that differ only in seed, learning rate or schedule cost the same per step."""
    return json.dumps([spec.kind, spec.arch, spec.settings, spec.model.model_dump(mode="json"),
                       spec.mixer_options, spec.train.batch_size], sort_keys=True)


def cost_specs(specs: Specs) -> list[TrainJob]:
    """One run spec per distinct per-step cost of the study, in config order."""
    found: dict[str, TrainJob] = {}
    for spec in specs.runs:
        found.setdefault(cost_key(spec), spec)
    return list(found.values())


_SIZES: dict[str, Size] = {}


def solved_size(spec: TrainJob) -> Size:
    """The run's size as training solves it, on the meta device (cached: the preflight and the
    plan share it)."""
    key = cost_key(spec)
    if key not in _SIZES:
        task, m = task_class(spec.kind).without_data(spec), spec.model
        _SIZES[key] = solve_budget(task.build_model, d_model=m.d_model, n_layers=m.n_layers,
                                   d_ff_mult=m.d_ff_mult, **m.budget.model_dump())
    return _SIZES[key]


# ------------------------------------------------------------------------------------------
# Shapes: limits the data decide, and memory no model need be built to know.
# ------------------------------------------------------------------------------------------


def data_limit_problems(specs: Specs) -> dict[str, list[str]]:
    """Each task's data limits (``Task.limit_problems``), by task as configured (group)."""
    problems: dict[str, list[str]] = {}
    for spec in cost_specs(specs):
        if spec.group not in problems:  # the points of a sweep share their group's settings
            problems[spec.group] = task_class(spec.kind).limit_problems(spec)
    return {group: found for group, found in problems.items() if found}


def crop_problems(specs: Specs) -> list[str]:
    """The sparsity analysis crops held-out inputs of encoder tasks to ``crop_len`` tokens: a
    task whose inputs are all shorter has none to give it."""
    problems = []
    for name, crop in {task: job.sparsity.crop_len for task, job in specs.sparsity}.items():
        spec = next(s for s in specs.runs if s.task == name)  # the task's first architecture
        cls = task_class(spec.kind)
        if cls.is_language_model:
            continue
        longest = cls.without_data(spec).sequence_length
        if longest is not None and crop > longest:
            problems.append(f"config key 'analysis.sparsity.crop_len' ({crop}) is longer than every input of task "
                            f"'{name}' (at most {longest} tokens): the sparsity analysis would find no held-out "
                            f"input to crop; set crop_len <= {longest}")
    return problems


def step_floor_problem(spec: TrainJob, batch_size: int, have: float, where: str) -> str | None:
    """A training step of ``spec`` at ``batch_size`` whose activations alone, from its shapes,
    exceed ``have`` bytes (``where``: the device, in words); None when they fit or the task
    states no sequence length. Builds no model (its width is solved on the meta device)."""
    task = task_class(spec.kind).without_data(spec)
    length = task.sequence_length
    if length is None:
        return None
    value_bytes = 2 if spec.train.precision == "bf16" else 4
    m, budget = spec.model, spec.model.budget
    widest = budget.max_width if budget.params is not None and budget.solve == "width" else m.d_model
    deepest = budget.max_depth if budget.params is not None and budget.solve == "depth" else m.n_layers
    if measure.activation_floor(batch_size, length, widest, deepest, value_bytes) <= have:
        return None  # fits at the largest size a budget can solve to: no need to solve it
    try:
        size = solved_size(spec)
    except BudgetError:
        return None  # budget_problems says so
    floor = measure.activation_floor(batch_size, length, size.d_model, size.n_layers, value_bytes)
    if floor <= have:
        return None
    key = f"tasks.{spec.group}"
    return (f"a training step of {spec.task}/{spec.arch} keeps at least {floor / GIB:,.1f} GiB of activations "
            f"(batch {batch_size} x {length:,} tokens x d_model {size.d_model} x {size.n_layers + 1} layer "
            f"outputs, {value_bytes} bytes each) and {where} has {have / GIB:.1f} GiB: lower config key "
            f"'{key}.{task.length_key}' or '{key}.train.batch_size', or run it where there is more memory")


def memory_problems(specs: Specs, skip_groups: set[str] = frozenset()) -> list[str]:
    """Every run whose training step cannot fit the device it would run on here."""
    problems = []
    for spec in cost_specs(specs):
        if spec.group in skip_groups:
            continue
        device = spec.train.device
        where = "the GPU" if device != "cpu" and torch.cuda.is_available() else "this machine"
        problem = step_floor_problem(spec, spec.train.batch_size, measure.available_memory(device), where)
        if problem:
            problems.append(problem)
    return problems


def shape_problems(specs: Specs, local: bool = True) -> list[str]:
    """Limits the data decide and (``local``: the jobs run here) steps beyond this machine's
    memory; cheap, and checked before anything is built."""
    by_group = data_limit_problems(specs)
    problems = [p for found in by_group.values() for p in found] + crop_problems(specs)
    if local:  # a task refused for its data is not sized as well: its shapes are the problem
        problems += memory_problems(specs, skip_groups=set(by_group))
    return problems


# ------------------------------------------------------------------------------------------
# Setup: budgets, precision, the complexity analysis's lengths.
# ------------------------------------------------------------------------------------------


def budget_problems(specs: Specs) -> list[str]:
    """Every (task, architecture) whose budget has a tolerance is solved now (meta device):
    one that cannot be met is refused before training starts."""
    problems = []
    for spec in cost_specs(specs):
        budget = spec.model.budget
        if budget.params is None or budget.tolerance is None:
            continue
        try:
            solved_size(spec)
        except BudgetError as e:
            problems.append(f"config key 'tasks.{spec.group}.model.budget' ({spec.arch}): {e}")
    return problems


def precision_problems(specs: Specs, has_gpu: bool) -> list[str]:
    if has_gpu:
        return []
    bf16 = sorted({spec.group for spec in specs.runs if spec.train.precision == "bf16" and spec.train.device != "cuda"})
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
            work = measure.WorkCounter()  # bytes only: no FLOP counter in the way
            try:
                with work:
                    mixer(x).sum().backward()
            finally:
                work.close()
        return float(work.peak)
    except Exception:  # noqa: BLE001 - data-dependent ops: no estimate, not a failure
        return None


def complexity_problems(specs: Specs, available_bytes: float) -> list[str]:
    spec = specs.complexity.complexity
    longest = max(spec.lengths)
    problems = []
    for arch in specs.complexity.architectures:
        need = mixer_peak_bytes(arch, spec.d_model, longest, spec.batch_size)
        if need is not None and need > available_bytes:
            problems.append(
                f"config key 'analysis.complexity.lengths' reaches L = {longest:,}, where {arch}'s forward and "
                f"backward need about {need / GIB:.1f} GiB and this machine has {available_bytes / GIB:.1f} GiB: "
                "drop the longest lengths (config/paper-smoke.yaml stops at 8,192)")
    return problems


def numerics_problems(mode: str) -> list[str]:
    """A host that cannot run the study's numerics ``mode`` (portable: below AVX2 and FMA, not
    x86-64, or without the means to build oneMKL's shim, which is built here, once, before the
    jobs that load it start)."""
    problem = numerics.host_problem(mode) or numerics.shim_problem(mode)
    return [f"config key 'numerics': {problem}"] if problem else []


def setup_problems(specs: Specs, local: bool = True) -> list[str]:
    """Budgets that cannot be met within their tolerance and (``local``) a CPU below the study's
    numerics, bf16 without a GPU and complexity lengths whose forward and backward exceed this
    machine's memory."""
    problems = budget_problems(specs)
    if local:
        problems += numerics_problems(specs.numerics)
        problems += precision_problems(specs, torch.cuda.is_available())
        problems += complexity_problems(specs, measure.available_memory(specs.complexity.complexity.device))
    return problems


def preflight(specs: Specs, local: bool = True) -> list[str]:
    """Problems that would make the study fail at its shapes, one line each (empty: none), from
    its jobs' specs (``Specs``). ``local``: the jobs run on this machine (its memory and GPU are
    checked too)."""
    return shape_problems(specs, local) + setup_problems(specs, local)
