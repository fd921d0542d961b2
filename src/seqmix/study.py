"""A validated study as lists of things to do: its tasks (sweeps expanded), its runs, where
each run and each task's data live, and the spec every job receives.

Names: a task is ``<kind>`` or ``<kind>/<variant>``; a task with a ``sweep`` becomes one
task per grid point, ``<task>/<point>`` (e.g. ``mqar/L64-kv4/d64-lr0.001``), whose ``group``
is the task it came from: the points of a sweep share the group's data directory. A
result row carries the sweep's axes (``axes``) so that figures can pick the best point.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

from seqmix import catalogue
from seqmix.config import mixer_options, settings_of
from seqmix.io import read_json
from seqmix.mixers import mixer_class
from seqmix.sections import Study, TaskCommon
from seqmix.spec import DataJob, RunSpec, TokenizerJob
from seqmix.sweep import sweep_points
from seqmix.tasks import task_class


class Run(NamedTuple):
    task: str
    arch: str
    seed: int


@dataclasses.dataclass(frozen=True)
class Variant:
    """One task of the study after sweep expansion."""

    name: str
    group: str
    kind: str
    section: TaskCommon  # its settings, model and train at this point
    axes: dict[str, Any]


# ------------------------------------------------------------------------------------------
# Tasks, runs and paths.
# ------------------------------------------------------------------------------------------


def variants(study: Study) -> list[Variant]:
    out = []
    for name, section in study.tasks.items():
        kind = catalogue.kind_of(name)
        points = sweep_points(section)
        if not points:
            out.append(Variant(name, name, kind, section, {}))
        out += [Variant(f"{name}/{label}", name, kind, s, axes) for label, axes, s in points]
    return out


def variant(study: Study, name: str) -> Variant:
    for v in variants(study):
        if v.name == name:
            return v
    raise KeyError(f"task {name!r} is not in this study; tasks: {', '.join(v.name for v in variants(study))}")


def groups(study: Study) -> list[str]:
    """The tasks as written in the config (before sweep expansion): one data directory each."""
    return list(study.tasks)


def task_architectures(study: Study, v: Variant) -> list[str]:
    """The architectures a task trains: non-causal-only mixers skip language-model tasks."""
    archs = v.section.architectures or study.architectures
    if task_class(v.kind).is_language_model:
        archs = [a for a in archs if mixer_class(a).supports_causal]
    return list(archs)


def runs(study: Study) -> list[Run]:
    """Every (task, arch, seed) the study trains."""
    out = []
    for v in variants(study):
        for arch in task_architectures(study, v):
            out += [Run(v.name, arch, seed) for seed in (v.section.seeds or study.seeds)]
    return out


def run_dir(study: Study, run: Run) -> Path:
    return Path(study.results_dir) / "runs" / run.task / run.arch / f"seed{run.seed}"


def data_dir(study: Study, group: str) -> Path:
    return Path(study.data.dir) / group


def tokenizer_dir(study: Study) -> Path:
    return Path(study.data.dir) / "tokenizer"


def needs_tokenizer(study: Study, group: str) -> bool:
    return task_class(catalogue.kind_of(group)).needs_tokenizer


# ------------------------------------------------------------------------------------------
# Job specs.
# ------------------------------------------------------------------------------------------


def run_spec(study: Study, task: str, arch: str, seed: int) -> RunSpec:
    v = variant(study, task)
    if arch not in task_architectures(study, v):
        raise KeyError(f"architecture {arch!r} does not train on {task!r}; it trains: "
                       f"{', '.join(task_architectures(study, v))}")
    return RunSpec(
        profile=study.profile, task=v.name, kind=v.kind, group=v.group, axes=v.axes, arch=arch,
        seed=int(seed), run_dir=str(run_dir(study, Run(task, arch, seed))),
        data_dir=str(data_dir(study, v.group)), tokenizer_dir=str(tokenizer_dir(study)),
        data=study.data, tokenizer=study.tokenizer, train=v.section.train,
        # The block this architecture trains in, resolved and recorded (never "native").
        model=v.section.model.model_copy(update={"block": v.section.model.block_for(arch)}),
        mixer_options=task_mixer_options(study, v.section, arch),
        settings=settings_of(v.kind, v.section).model_dump(mode="json"),
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


def finished(study: Study, among: list[Run]) -> list[Path]:
    """Run directories among ``among`` whose training finished (status ok)."""
    return [d for d in (run_dir(study, r) for r in among) if run_status(d) == "ok"]


def language_model_tasks(study: Study) -> list[str]:
    return [v.name for v in variants(study) if task_class(v.kind).is_language_model]


def sparsity_runs(study: Study) -> list[Run]:
    """The runs whose trained attention the sparsity analysis measures: every run of
    ``analysis.sparsity.tasks`` (default: the first language-model task), and, for
    architectures with no run there (non-causal-only mixers on a language-model task),
    their runs of ``fallback_task`` (``auto``: the first task that has them)."""
    spec = study.analysis.sparsity
    all_runs = runs(study)
    tasks = set(spec.tasks or language_model_tasks(study)[:1])
    group = {v.name: v.group for v in variants(study)}
    primary = [r for r in all_runs if r.task in tasks or group[r.task] in tasks]
    covered = {r.arch for r in primary}
    missing = [a for a in study.architectures if a not in covered]
    fallback = spec.fallback_task
    if fallback == "auto":
        fallback = next((r.task for r in all_runs if r.arch in missing), None)
    return primary + [r for r in all_runs if fallback and r.task == fallback and r.arch in missing]


def geometry_runs(study: Study) -> list[Run]:
    task = study.analysis.geometry.task or next(iter(language_model_tasks(study)), None)
    group = {v.name: v.group for v in variants(study)}
    return [r for r in runs(study) if task in (r.task, group[r.task])]


def complexity_architectures(study: Study) -> list[str]:
    chosen = study.analysis.complexity.architectures
    if chosen == "all":
        return catalogue.mixer_names()
    return list(chosen or study.architectures)
