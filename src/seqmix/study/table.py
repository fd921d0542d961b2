"""A validated study as lists of things to do: its tasks (sweeps expanded), its runs, where
each run and each task's data live, and the spec every job receives (the words: seqmix.study).

Names: a task is ``<kind>`` or ``<kind>/<variant>``; a task with a ``sweep`` becomes one
task per grid point, ``<task>/<point>`` (e.g. ``mqar/L64-kv4/d64-lr0.001``), whose ``group``
is the task it came from: the points of a sweep share the group's data directory. A
result row carries the sweep's axes (``axes``) so that figures can pick the best point.

``job_table`` is all of it as JSON: what `python -m seqmix jobs` prints and the Snakefile
builds its rules from (seqmix.study.dag), each job with the spec it reads and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from seqmix import REPO_ROOT, catalogue
from seqmix.io import read_json
from seqmix.mixers import mixer_class
from seqmix.sources import EVALUATION, Reader, run_modules
from seqmix.study.jobs import (
    CollectJob,
    ComplexityJob,
    CopyProbeJob,
    DataJob,
    GeometryJob,
    SparsityJob,
    ThroughputJob,
    TokenizerJob,
    TrainJob,
)
from seqmix.study.load import mixer_options, settings_of
from seqmix.study.settings import Budget, Study, TaskCommon, TrainSettings
from seqmix.study.sweep import sweep_points
from seqmix.tasks import task_class


class Run(NamedTuple):
    task: str
    arch: str
    seed: int


@dataclasses.dataclass(frozen=True)
class StudyTask:
    """One task of the study after sweep expansion."""

    name: str
    group: str
    kind: str
    section: TaskCommon  # its settings, model and train at this point
    axes: dict[str, Any]


# ------------------------------------------------------------------------------------------
# Tasks, runs and paths.
# ------------------------------------------------------------------------------------------


def study_tasks(study: Study) -> list[StudyTask]:
    out = []
    for name, section in study.tasks.items():
        kind = catalogue.kind_of(name)
        points = sweep_points(section)
        if not points:
            out.append(StudyTask(name, name, kind, section, {}))
        out += [StudyTask(f"{name}/{point}", name, kind, s, axes) for point, axes, s in points]
    return out


def study_task(study: Study, name: str) -> StudyTask:
    for task in study_tasks(study):
        if task.name == name:
            return task
    raise KeyError(f"task {name!r} is not in this study; tasks: {', '.join(task.name for task in study_tasks(study))}")


def groups(study: Study) -> list[str]:
    """The tasks as written in the config (before sweep expansion): one data directory each."""
    return list(study.tasks)


def task_architectures(study: Study, task: StudyTask) -> list[str]:
    """The architectures a task trains: non-causal-only mixers skip language-model tasks."""
    archs = task.section.architectures or study.architectures
    if task_class(task.kind).is_language_model:
        archs = [a for a in archs if mixer_class(a).supports_causal]
    return list(archs)


def _trained(study: Study) -> Iterator[tuple[StudyTask, str, int]]:
    for task in study_tasks(study):
        for arch in task_architectures(study, task):
            for seed in task.section.seeds_for(arch, study.seeds):
                yield task, arch, seed


def runs(study: Study) -> list[Run]:
    """Every (task, arch, seed) the study trains."""
    return [Run(task.name, arch, seed) for task, arch, seed in _trained(study)]


def run_dir(study: Study, run: Run) -> Path:
    return Path(study.results_dir) / "runs" / run.task / run.arch / f"seed{run.seed}"


def report_dir(study: Study) -> Path:
    """Where the study's report is built: its figures/, tables/, report.pdf and report.html.
    Under its own results_dir, so that no other study writes there (a shared folder would let
    one study's report stand, up to date in Snakemake's eyes, for another's)."""
    return Path(study.results_dir) / "report"


def data_dir(study: Study, group: str) -> Path:
    return Path(study.data.dir) / group


def tokenizer_dir(study: Study) -> Path:
    return Path(study.data.dir) / "tokenizer"


def needs_tokenizer(study: Study, group: str) -> bool:
    return task_class(catalogue.kind_of(group)).needs_tokenizer


# ------------------------------------------------------------------------------------------
# Job specs.
# ------------------------------------------------------------------------------------------


def run_spec(study: Study, task: str, arch: str, seed: int) -> TrainJob:
    return _run_spec(study, study_task(study, task), arch, seed)


def _run_spec(study: Study, task: StudyTask, arch: str, seed: int) -> TrainJob:
    if arch not in task_architectures(study, task):
        raise KeyError(f"architecture {arch!r} does not train on {task.name!r}; it trains: "
                       f"{', '.join(task_architectures(study, task))}")
    return TrainJob(
        profile=study.profile, task=task.name, kind=task.kind, group=task.group, axes=task.axes, arch=arch,
        seed=int(seed), run_dir=str(run_dir(study, Run(task.name, arch, seed))),
        data_dir=str(data_dir(study, task.group)), tokenizer_dir=str(tokenizer_dir(study)),
        data=study.data, tokenizer=study.tokenizer, train=task.section.train,
        # The block and positions this architecture trains with, resolved and recorded.
        model=task.section.model.model_copy(update={"block": task.section.model.block_for(arch),
                                                    "positions": task.section.model.positions_for(arch)}),
        mixer_options=task_mixer_options(study, task.section, arch),
        settings=settings_of(task.kind, task.section).model_dump(mode="json"),
    )


def task_mixer_options(study: Study, section: TaskCommon, arch: str) -> dict[str, Any]:
    """A mixer's complete options on a task: its defaults, the study's ``mixers.<arch>``,
    then the task's own ``mixers.<arch>`` (Zoology's H3 d_state = L on each MQAR length)."""
    return mixer_options(arch, {**study.mixers.get(arch, {}), **section.mixers.get(arch, {})})


def data_job(study: Study, group: str) -> DataJob:
    section = study.tasks[group]
    kind = catalogue.kind_of(group)
    return DataJob(kind=kind, group=group, out_dir=str(data_dir(study, group)),
                   tokenizer_dir=str(tokenizer_dir(study)), data=study.data, tokenizer=study.tokenizer,
                   settings=settings_of(kind, section).model_dump(mode="json"))


def tokenizer_job(study: Study) -> TokenizerJob:
    return TokenizerJob(out_dir=str(tokenizer_dir(study)), data=study.data, tokenizer=study.tokenizer)


# ------------------------------------------------------------------------------------------
# What the analyses read.
# ------------------------------------------------------------------------------------------


def run_status(path: Path) -> str:
    return read_json(path / "metrics.json", fix=f"train the run again (delete {path} and rerun the DAG)")["status"]


def finished(run_dirs: list[str] | list[Path]) -> list[Path]:
    """The run directories among ``run_dirs`` whose training finished (status ok)."""
    return [Path(d) for d in run_dirs if run_status(Path(d)) == "ok"]


def language_model_tasks(study: Study) -> list[str]:
    return [task.name for task in study_tasks(study) if task_class(task.kind).is_language_model]


def sparsity_runs(study: Study) -> list[Run]:
    """The runs whose trained attention the sparsity analysis measures: every run of
    ``analysis.sparsity.tasks`` (default: the first language-model task), and, for
    architectures with no run there (non-causal-only mixers on a language-model task),
    their runs of ``fallback_task`` (``auto``: the first task that has them)."""
    spec = study.analysis.sparsity
    all_runs = runs(study)
    tasks = set(spec.tasks or language_model_tasks(study)[:1])
    group = {task.name: task.group for task in study_tasks(study)}
    primary = [r for r in all_runs if r.task in tasks or group[r.task] in tasks]
    covered = {r.arch for r in primary}
    missing = [a for a in study.architectures if a not in covered]
    fallback = spec.fallback_task
    if fallback == "auto":
        fallback = next((r.task for r in all_runs if r.arch in missing), None)
    return primary + [r for r in all_runs if fallback and r.task == fallback and r.arch in missing]


def geometry_runs(study: Study) -> list[Run]:
    task = study.analysis.geometry.task or next(iter(language_model_tasks(study)), None)
    group = {task.name: task.group for task in study_tasks(study)}
    return [r for r in runs(study) if task in (r.task, group[r.task])]


def copy_probe_task(study: Study) -> StudyTask | None:
    """The recall task (MQAR) whose model settings the copy probe takes:
    ``analysis.copy_probe.task`` (a swept task: its first point), ``auto``: the study's first
    recall task; None when it is null or the study has none (no probe)."""
    chosen = study.analysis.copy_probe.task
    recall = [task for task in study_tasks(study) if task_class(task.kind).is_recall]
    if chosen == "auto":
        return next(iter(recall), None)
    return next((task for task in recall if chosen in (task.name, task.group)), None)


def copy_probe_architectures(study: Study) -> list[str]:
    """``analysis.copy_probe.architectures``, else the study's that have a causal form."""
    return list(study.analysis.copy_probe.architectures
                or [a for a in study.architectures if mixer_class(a).supports_causal])


def complexity_architectures(study: Study) -> list[str]:
    chosen = study.analysis.complexity.architectures
    if chosen == "all":
        return catalogue.mixer_names()
    return list(chosen or study.architectures)


def throughput_architectures(study: Study) -> list[str]:
    """The architectures ``analysis.throughput.architectures`` names (null: the study's)."""
    chosen = study.analysis.throughput.architectures
    return catalogue.mixer_names() if chosen == "all" else list(chosen or study.architectures)


# ------------------------------------------------------------------------------------------
# Analysis job specs: each holds what its command reads, so that an edit elsewhere in the
# study leaves it, and its results, alone.
# ------------------------------------------------------------------------------------------


def _options_of(study: Study, archs: list[str]) -> dict[str, dict[str, Any]]:
    return {arch: options for arch, options in study.mixers.items() if arch in archs}


def collect_job(study: Study) -> CollectJob:
    return CollectJob(run_dirs=[str(run_dir(study, r)) for r in runs(study)])


def complexity_job(study: Study) -> ComplexityJob:
    archs = complexity_architectures(study)
    return ComplexityJob(architectures=archs, mixers=_options_of(study, archs), complexity=study.analysis.complexity)


def throughput_job(study: Study) -> ThroughputJob:
    archs = throughput_architectures(study)  # softmax is timed too: the ratios are to it
    return ThroughputJob(architectures=archs, mixers=_options_of(study, [*archs, catalogue.BASELINE]),
                         throughput=study.analysis.throughput)


def sparsity_job(study: Study, among: list[Run] | None = None) -> SparsityJob:
    """The sparsity of the runs ``among`` (default: every run the analysis measures)."""
    chosen = sparsity_runs(study) if among is None else among
    return SparsityJob(run_dirs=[str(run_dir(study, r)) for r in chosen], sparsity=study.analysis.sparsity)


def copy_probe_job(study: Study) -> CopyProbeJob | None:
    """The copy probe, or None where the study has no MQAR task for it (or it is off)."""
    task, probe = copy_probe_task(study), study.analysis.copy_probe
    if task is None:
        return None
    archs = copy_probe_architectures(study)
    # The task's optimiser but for the probe's own schedule: an edit of the task's lr or
    # steps leaves the probe (and its result) alone.
    train = task.section.train
    return CopyProbeJob(
        task=task.name, architectures=archs,
        model=task.section.model.model_copy(update={"d_model": probe.d_model, "budget": Budget()}),
        mixers={a: task_mixer_options(study, task.section, a) for a in archs},
        train=TrainSettings(steps=probe.steps, batch_size=probe.batch_size, lr=probe.lr, warmup_steps=probe.warmup_steps,
                        weight_decay=train.weight_decay, betas=train.betas, min_lr_ratio=train.min_lr_ratio,
                        grad_clip=train.grad_clip, device=train.device, reference_mixers=train.reference_mixers),
        copy_probe=probe)


def geometry_job(study: Study) -> GeometryJob:
    return GeometryJob(run_dirs=[str(run_dir(study, r)) for r in geometry_runs(study)],
                       geometry=study.analysis.geometry)


# ------------------------------------------------------------------------------------------
# The job table.
# ------------------------------------------------------------------------------------------


NOTEBOOKS_GLOB = "notebooks/*.ipynb"  # the report's notebooks, in the checkout


def job_code(study: Study) -> dict[str, Any]:
    """Each job's code (seqmix.sources.code_of: the modules its command runs and their closure,
    as files and one digest): what Snakemake reruns the job on. Training and evaluation by
    ``"<arch> <kind>"``; data by group; the analyses by name, each its module and the mixers it
    builds; each notebook of notebooks/ by name (its code cells' imports)."""
    reader = Reader()  # one reading of the code for every job

    def code(entries) -> dict[str, Any]:
        found = reader.code(entries)
        return {"files": [str(p) for p in found.files], "digest": found.digest}

    def mixers(archs) -> list[str]:
        return [catalogue.mixer_entry(a).path.partition(":")[0] for a in archs]

    pairs = sorted({(arch, task.kind) for task, arch, _ in _trained(study)})
    probe = copy_probe_task(study)
    analyses = {
        "collect": ["seqmix.report.collect"],
        "concat": ["seqmix.io"],
        "complexity": ["seqmix.analysis.complexity", *mixers(complexity_architectures(study))],
        "throughput": ["seqmix.analysis.throughput", *mixers([*throughput_architectures(study), catalogue.BASELINE])],
        "sparsity_run": ["seqmix.analysis.sparsity"],
        "sparsity_analytic": ["seqmix.analysis.su"],
        "geometry": ["seqmix.analysis.geometry"],
        **({"copy_probe": ["seqmix.analysis.copy_probe", catalogue.task_entry(probe.kind).path.partition(":")[0],
                           *mixers(copy_probe_architectures(study))]} if probe else {}),
    }
    return {
        "tokenizer": code(["seqmix.data.tokenizer"]),
        "data": {g: code([catalogue.task_entry(catalogue.kind_of(g)).path.partition(":")[0]]) for g in groups(study)},
        "train": {f"{a} {k}": code(run_modules(a, k)) for a, k in pairs},
        "eval": {f"{a} {k}": code(run_modules(a, k, EVALUATION)) for a, k in pairs},
        "analyses": {name: code(modules) for name, modules in analyses.items()},
        "notebooks": {nb.stem: code([nb]) for nb in sorted(REPO_ROOT.glob(NOTEBOOKS_GLOB))},
    }


def job_table(study: Study) -> dict[str, Any]:
    """The study as the Snakefile reads it (seqmix.study.dag): path patterns, every task, run and
    analysis with its spec, and the resources each rule declares; plain JSON data. Specs
    are the JSON text each command takes, as pydantic writes it (``--spec``)."""
    tasks = {task.name: {"group": task.group, "threads": task.section.train.threads,
                         "resources": {rule: (getattr(task.section.resources, rule) or getattr(study.resources, rule)).model_dump()
                                       for rule in ("train", "eval")}}
             for task in study_tasks(study)}
    collect, geometry, copy_probe = collect_job(study), geometry_job(study), copy_probe_job(study)
    return {
        "study": study.model_dump(mode="json"),
        "paths": {"results": study.results_dir, "report": str(report_dir(study)), "data": str(data_dir(study, "{group}")),
                  "tokenizer": str(tokenizer_dir(study)), "run": str(run_dir(study, Run("{task}", "{arch}", "{seed}")))},
        "resources": study.resources.model_dump(),
        "tokenizer": {"spec": tokenizer_job(study).model_dump_json()},
        "groups": {g: {"needs_tokenizer": needs_tokenizer(study, g), "spec": data_job(study, g).model_dump_json()}
                   for g in groups(study)},
        "tasks": tasks,
        "runs": [{"task": task.name, "arch": arch, "seed": seed, "spec": _run_spec(study, task, arch, seed).model_dump_json()}
                 for task, arch, seed in _trained(study)],
        "analyses": {
            "collect": {"spec": collect.model_dump_json(), "run_dirs": collect.run_dirs},
            "complexity": {"spec": complexity_job(study).model_dump_json()},
            "throughput": {"spec": throughput_job(study).model_dump_json()},
            "sparsity_analytic": {"spec": study.analysis.sparsity_analytic.model_dump_json()},
            "geometry": {"spec": geometry.model_dump_json(), "run_dirs": geometry.run_dirs},
            # Only where the study has an MQAR task to take its models from.
            **({"copy_probe": {"spec": copy_probe.model_dump_json()}} if copy_probe else {}),
        },
        # One sparsity job per run, whose spec names that run alone.
        "sparsity_runs": [{"task": r.task, "arch": r.arch, "seed": r.seed,
                           "spec": sparsity_job(study, [r]).model_dump_json()} for r in sparsity_runs(study)],
        "code": job_code(study),
    }
