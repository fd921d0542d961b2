"""A validated study expanded once: its tasks (sweeps expanded), its runs, what each analysis
reads, where each run and each task's data live, and the spec every job receives (the words:
seqmix.study.glossary). ``expand(study)`` makes it, an ``Expansion``, once per process; the job table,
the plan and the tools read that one object and never expand the study again (the preflight reads
the specs it builds: seqmix.preflight.Specs).

Names: a task is ``<kind>`` or ``<kind>/<variant>``; a task with a ``sweep`` becomes one
task per grid point, ``<task>/<point>`` (e.g. ``mqar/L64-kv4/d64-lr0.001``), whose ``group``
is the task it came from: the points of a sweep share the group's data directory. A
result row carries the sweep's axes (``axes``) so that figures can pick the best point.

``job_table`` is all of it as JSON: what `python -m seqmix jobs` prints and the Snakefile
builds its rules from (seqmix.study.dag), each job with the spec it reads and nothing else;
``made_table`` is that with the files it was made from, as the command prints it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from seqmix import REPO_ROOT, catalogue
from seqmix.errors import ConfigError
from seqmix.expansion.validate import mixer_options, settings_of
from seqmix.io import read_json
from seqmix.mixers import mixer_class
from seqmix.sources import EVALUATION, Reader, run_modules
from seqmix.study.jobs import (
    CollectJob,
    ComplexityJob,
    CopyProbeJob,
    DataJob,
    GeometryJob,
    PackJob,
    SparsityJob,
    ThroughputJob,
    TokenizerJob,
    TrainJob,
)
from seqmix.study.settings import Budget, Study, TaskCommon, TrainSettings
from seqmix.study.sweep import sweep_points
from seqmix.tasks import task_class

PACK_STEP = "seqmix.train.pack"  # what trains a pack (seqmix.train.pack.STEP; this module imports no torch)


class Run(NamedTuple):
    task: str
    arch: str
    seed: int


@dataclasses.dataclass(frozen=True)
class StudyTask:
    """One task of the study after sweep expansion, with the seeds of each architecture it
    trains (non-causal-only mixers skip language-model tasks)."""

    name: str
    group: str
    kind: str
    section: TaskCommon  # its settings, model and train at this point
    axes: dict[str, Any]
    seeds: dict[str, tuple[int, ...]]  # by architecture, in the study's order

    @property
    def architectures(self) -> list[str]:
        return list(self.seeds)


@dataclasses.dataclass(frozen=True)
class Expansion:
    """A validated study expanded once (``expand``): every task and run, and what each analysis
    reads, as fields; paths and job specs, built from them, as methods. Made once per process
    and passed where the study was: nothing downstream expands the sweeps again."""

    study: Study
    tasks: dict[str, StudyTask]  # by name, sweeps expanded, in the config's order
    runs: tuple[Run, ...]  # every (task, arch, seed) the study trains, task by task
    sparsity_runs: tuple[Run, ...]  # those whose trained attention the sparsity analysis measures
    geometry_runs: tuple[Run, ...]  # those the geometry analysis reads
    copy_probe_task: StudyTask | None  # the recall task whose models the copy probe takes
    copy_probe_architectures: tuple[str, ...]
    complexity_architectures: tuple[str, ...]
    throughput_architectures: tuple[str, ...]

    # -- tasks and paths ---------------------------------------------------------------------

    def task(self, name: str) -> StudyTask:
        if name not in self.tasks:
            raise KeyError(f"task {name!r} is not in this study; tasks: {', '.join(self.tasks)}")
        return self.tasks[name]

    @property
    def groups(self) -> list[str]:
        """The tasks as written in the config (before sweep expansion): one data directory each."""
        return list(self.study.tasks)

    def run_dir(self, run: Run) -> Path:
        return Path(self.study.results_dir) / "runs" / run.task / run.arch / f"seed{run.seed}"

    @property
    def report_dir(self) -> Path:
        """Where the study's report is built: its figures/, tables/, report.pdf and report.html.
        Under its own results_dir, so that no other study writes there (a shared folder would
        let one study's report stand, up to date in Snakemake's eyes, for another's)."""
        return Path(self.study.results_dir) / "report"

    def data_dir(self, group: str) -> Path:
        return Path(self.study.data.dir) / group

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self.study.data.dir) / "tokenizer"

    def needs_tokenizer(self, group: str) -> bool:
        return task_class(catalogue.kind_of(group)).needs_tokenizer

    # -- job specs ---------------------------------------------------------------------------

    def run_spec(self, task: str, arch: str, seed: int) -> TrainJob:
        found, study = self.task(task), self.study
        if arch not in found.seeds:
            raise KeyError(f"architecture {arch!r} does not train on {task!r}; it trains: "
                           f"{', '.join(found.architectures)}")
        return TrainJob(
            numerics=study.numerics, profile=study.profile, task=found.name, kind=found.kind, group=found.group, axes=found.axes, arch=arch,
            seed=int(seed), run_dir=str(self.run_dir(Run(task, arch, seed))),
            data_dir=str(self.data_dir(found.group)), tokenizer_dir=str(self.tokenizer_dir),
            data=study.data, tokenizer=study.tokenizer,
            train=found.section.train.model_copy(update={"pack": found.section.train.pack_for(arch)}),
            # The block and positions this architecture trains with, resolved and recorded.
            model=found.section.model.model_copy(update={"block": found.section.model.block_for(arch),
                                                         "positions": found.section.model.positions_for(arch)}),
            mixer_options=self._mixer_options(found.section, arch),
            settings=settings_of(found.kind, found.section).model_dump(mode="json"),
        )

    @functools.cached_property
    def packs(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """(task, arch, seeds) of every seed pack: the seeds of an architecture on a task whose
        ``train.pack`` holds for it train as one job (seqmix.train.pack), in the study's order."""
        return tuple((task.name, arch, seeds) for task in self.tasks.values() for arch, seeds in task.seeds.items()
                     if seeds and task.section.train.pack_for(arch))

    def pack_job(self, task: str, arch: str) -> PackJob:
        """The seed pack of ``arch`` on ``task``; a ConfigError where it does not pack."""
        if not any(p[:2] == (task, arch) for p in self.packs):
            raise ConfigError(f"{arch} on {task!r} does not train as a seed pack (config key "
                              f"'tasks.{self.task(task).group}.train.pack'); train its seeds with `seqmix train`")
        return PackJob(specs=[self.run_spec(task, arch, seed) for seed in self.task(task).seeds[arch]])

    @functools.cached_property
    def arch_specs(self) -> tuple[TrainJob, ...]:
        """One run spec per (task, architecture), at seed 0, in the study's order: what every
        run of it costs per step, whatever its seed (the plan counts them, the preflight checks
        them). Built at the first read, kept with the expansion."""
        return tuple(self.run_spec(task.name, arch, 0) for task in self.tasks.values() for arch in task.seeds)

    def _mixer_options(self, section: TaskCommon, arch: str) -> dict[str, Any]:
        """A mixer's complete options on a task: its defaults, the study's ``mixers.<arch>``,
        then the task's own ``mixers.<arch>`` (Zoology's H3 d_state = L on each MQAR length)."""
        return mixer_options(arch, {**self.study.mixers.get(arch, {}), **section.mixers.get(arch, {})})

    def data_job(self, group: str) -> DataJob:
        section, kind = self.study.tasks[group], catalogue.kind_of(group)
        return DataJob(kind=kind, group=group, out_dir=str(self.data_dir(group)), tokenizer_dir=str(self.tokenizer_dir),
                       data=self.study.data, tokenizer=self.study.tokenizer,
                       settings=settings_of(kind, section).model_dump(mode="json"))

    def tokenizer_job(self) -> TokenizerJob:
        return TokenizerJob(out_dir=str(self.tokenizer_dir), data=self.study.data, tokenizer=self.study.tokenizer)

    # -- analysis job specs: each holds what its command reads, so that an edit elsewhere in
    # the study leaves it, and its results, alone.

    def _options_of(self, archs: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
        return {arch: options for arch, options in self.study.mixers.items() if arch in archs}

    def collect_job(self) -> CollectJob:
        return CollectJob(run_dirs=[str(self.run_dir(r)) for r in self.runs], recordings=self.study.recordings)

    def complexity_job(self) -> ComplexityJob:
        archs = list(self.complexity_architectures)
        return ComplexityJob(numerics=self.study.numerics, architectures=archs, mixers=self._options_of(archs),
                             complexity=self.study.analysis.complexity)

    def throughput_job(self) -> ThroughputJob:
        archs = list(self.throughput_architectures)  # softmax is timed too: the ratios are to it
        return ThroughputJob(numerics=self.study.numerics, architectures=archs, mixers=self._options_of([*archs, catalogue.BASELINE]),
                             throughput=self.study.analysis.throughput)

    def sparsity_job(self, among: list[Run] | tuple[Run, ...] | None = None) -> SparsityJob:
        """The sparsity of the runs ``among`` (default: every run the analysis measures)."""
        chosen = self.sparsity_runs if among is None else among
        return SparsityJob(numerics=self.study.numerics, run_dirs=[str(self.run_dir(r)) for r in chosen],
                           sparsity=self.study.analysis.sparsity)

    def copy_probe_job(self) -> CopyProbeJob | None:
        """The copy probe, or None where the study has no MQAR task for it (or it is off)."""
        task, probe = self.copy_probe_task, self.study.analysis.copy_probe
        if task is None:
            return None
        archs = list(self.copy_probe_architectures)
        # The task's optimiser but for the probe's own schedule: an edit of the task's lr or
        # steps leaves the probe (and its result) alone.
        train = task.section.train
        return CopyProbeJob(
            numerics=self.study.numerics, task=task.name, architectures=archs,
            model=task.section.model.model_copy(update={"d_model": probe.d_model, "budget": Budget()}),
            mixers={a: self._mixer_options(task.section, a) for a in archs},
            train=TrainSettings(steps=probe.steps, batch_size=probe.batch_size, lr=probe.lr,
                                warmup_steps=probe.warmup_steps, weight_decay=train.weight_decay, betas=train.betas,
                                min_lr_ratio=train.min_lr_ratio, grad_clip=train.grad_clip, device=train.device,
                                reference_mixers=train.reference_mixers),
            copy_probe=probe)

    def geometry_job(self) -> GeometryJob:
        return GeometryJob(numerics=self.study.numerics, run_dirs=[str(self.run_dir(r)) for r in self.geometry_runs],
                           geometry=self.study.analysis.geometry)


# ------------------------------------------------------------------------------------------
# Expanding a study: its tasks and runs, then what each analysis takes of them.
# ------------------------------------------------------------------------------------------


def expand(study: Study) -> Expansion:
    """The study expanded once: every task (sweeps expanded), run and analysis selection."""
    tasks = {task.name: task for task in _study_tasks(study)}
    runs = tuple(Run(task.name, arch, seed) for task in tasks.values() for arch, seeds in task.seeds.items()
                 for seed in seeds)
    analysis = study.analysis
    causal = [a for a in study.architectures if mixer_class(a).supports_causal]
    return Expansion(
        study=study, tasks=tasks, runs=runs,
        sparsity_runs=_sparsity_runs(study, tasks, runs), geometry_runs=_geometry_runs(study, tasks, runs),
        copy_probe_task=_copy_probe_task(study, tasks),
        copy_probe_architectures=tuple(analysis.copy_probe.architectures or causal),
        complexity_architectures=tuple(_chosen(analysis.complexity.architectures, study)),
        throughput_architectures=tuple(_chosen(analysis.throughput.architectures, study)),
    )


def _study_tasks(study: Study) -> Iterator[StudyTask]:
    for name, section in study.tasks.items():
        kind = catalogue.kind_of(name)
        points = sweep_points(section)
        if not points:
            yield StudyTask(name, name, kind, section, {}, _seeds(study, kind, section))
        for point, axes, at in points:
            yield StudyTask(f"{name}/{point}", name, kind, at, axes, _seeds(study, kind, at))


def _seeds(study: Study, kind: str, section: TaskCommon) -> dict[str, tuple[int, ...]]:
    """The seeds of each architecture a task trains: non-causal-only mixers skip language-model
    tasks."""
    archs = section.architectures or study.architectures
    if task_class(kind).is_language_model:
        archs = [a for a in archs if mixer_class(a).supports_causal]
    return {arch: tuple(section.seeds_for(arch, study.seeds)) for arch in archs}


def _language_model_tasks(tasks: dict[str, StudyTask]) -> list[str]:
    return [task.name for task in tasks.values() if task_class(task.kind).is_language_model]


def _sparsity_runs(study: Study, tasks: dict[str, StudyTask], runs: tuple[Run, ...]) -> tuple[Run, ...]:
    """The runs whose trained attention the sparsity analysis measures: every run of
    ``analysis.sparsity.tasks`` (default: the first language-model task), and, for
    architectures with no run there (non-causal-only mixers on a language-model task),
    their runs of ``fallback_task`` (``auto``: the first task that has them)."""
    spec = study.analysis.sparsity
    chosen = set(spec.tasks or _language_model_tasks(tasks)[:1])
    primary = [r for r in runs if r.task in chosen or tasks[r.task].group in chosen]
    covered = {r.arch for r in primary}
    missing = [a for a in study.architectures if a not in covered]
    fallback = spec.fallback_task
    if fallback == "auto":
        fallback = next((r.task for r in runs if r.arch in missing), None)
    return tuple(primary + [r for r in runs if fallback and r.task == fallback and r.arch in missing])


def _geometry_runs(study: Study, tasks: dict[str, StudyTask], runs: tuple[Run, ...]) -> tuple[Run, ...]:
    task = study.analysis.geometry.task or next(iter(_language_model_tasks(tasks)), None)
    return tuple(r for r in runs if task in (r.task, tasks[r.task].group))


def _copy_probe_task(study: Study, tasks: dict[str, StudyTask]) -> StudyTask | None:
    """The recall task (MQAR) whose model settings the copy probe takes:
    ``analysis.copy_probe.task`` (a swept task: its first point), ``auto``: the study's first
    recall task; None when it is null or the study has none (no probe)."""
    chosen = study.analysis.copy_probe.task
    recall = [task for task in tasks.values() if task_class(task.kind).is_recall]
    if chosen == "auto":
        return next(iter(recall), None)
    return next((task for task in recall if chosen in (task.name, task.group)), None)


def _chosen(architectures: str | list[str] | None, study: Study) -> list[str]:
    """An analysis's ``architectures``: ``all`` (every catalogued mixer), a list, or null (the
    study's)."""
    return catalogue.mixer_names() if architectures == "all" else list(architectures or study.architectures)


# ------------------------------------------------------------------------------------------
# What the analyses read.
# ------------------------------------------------------------------------------------------


def run_status(path: Path) -> str:
    return read_json(path / "metrics.json", fix=f"train the run again (delete {path} and rerun the DAG)")["status"]


def finished(run_dirs: list[str] | list[Path]) -> list[Path]:
    """The run directories among ``run_dirs`` whose training finished (status ok)."""
    return [Path(d) for d in run_dirs if run_status(Path(d)) == "ok"]


# ------------------------------------------------------------------------------------------
# The job table.
# ------------------------------------------------------------------------------------------


NOTEBOOKS_GLOB = "notebooks/*.ipynb"  # the report's notebooks, in the checkout


def job_code(expansion: Expansion) -> dict[str, Any]:
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

    pairs = sorted({(r.arch, expansion.tasks[r.task].kind) for r in expansion.runs})
    probe = expansion.copy_probe_task
    analyses = {
        "collect": ["seqmix.report.collect"],
        "concat": ["seqmix.io"],
        "complexity": ["seqmix.analysis.complexity", *mixers(expansion.complexity_architectures)],
        "throughput": ["seqmix.analysis.throughput", *mixers([*expansion.throughput_architectures, catalogue.BASELINE])],
        "sparsity_run": ["seqmix.analysis.sparsity"],
        "sparsity_analytic": ["seqmix.analysis.su"],
        "geometry": ["seqmix.analysis.geometry"],
        **({"copy_probe": ["seqmix.analysis.copy_probe", catalogue.task_entry(probe.kind).path.partition(":")[0],
                           *mixers(expansion.copy_probe_architectures)]} if probe else {}),
    }
    packed = sorted({(arch, expansion.tasks[task].kind) for task, arch, _ in expansion.packs})
    return {
        # A pack's code: its run's and seqmix.train.pack (only in a study that packs)
        **({"train_pack": {f"{a} {k}": code(run_modules(a, k, PACK_STEP)) for a, k in packed}} if packed else {}),
        "tokenizer": code(["seqmix.data.tokenizer"]),
        "data": {g: code([catalogue.task_entry(catalogue.kind_of(g)).path.partition(":")[0]]) for g in expansion.groups},
        "train": {f"{a} {k}": code(run_modules(a, k)) for a, k in pairs},
        "eval": {f"{a} {k}": code(run_modules(a, k, EVALUATION)) for a, k in pairs},
        "analyses": {name: code(modules) for name, modules in analyses.items()},
        "notebooks": {nb.stem: code([nb]) for nb in sorted(REPO_ROOT.glob(NOTEBOOKS_GLOB))},
    }


def job_table(expansion: Expansion) -> dict[str, Any]:
    """The study as the Snakefile reads it (seqmix.study.dag): path patterns, every task, run and
    analysis with its spec, and the resources each rule declares; plain JSON data. Specs
    are the JSON text each command takes, as pydantic writes it (``--spec``)."""
    study = expansion.study
    tasks = {task.name: {"group": task.group, "threads": task.section.train.threads,
                         "resources": {rule: (getattr(task.section.resources, rule) or getattr(study.resources, rule)).model_dump()
                                       for rule in ("train", "eval")}}
             for task in expansion.tasks.values()}
    collect, geometry = expansion.collect_job(), expansion.geometry_job()
    copy_probe = expansion.copy_probe_job()
    return {
        "study": study.model_dump(mode="json"),
        "paths": {"results": study.results_dir, "report": str(expansion.report_dir),
                  "data": str(expansion.data_dir("{group}")), "tokenizer": str(expansion.tokenizer_dir),
                  "run": str(expansion.run_dir(Run("{task}", "{arch}", "{seed}")))},
        "resources": study.resources.model_dump(),
        "tokenizer": {"spec": expansion.tokenizer_job().model_dump_json()},
        "groups": {g: {"needs_tokenizer": expansion.needs_tokenizer(g), "spec": expansion.data_job(g).model_dump_json()}
                   for g in expansion.groups},
        "tasks": tasks,
        "runs": [{"task": r.task, "arch": r.arch, "seed": r.seed, "spec": expansion.run_spec(*r).model_dump_json()}
                 for r in expansion.runs],
        # Seed packs (only in a study that packs): their runs are in "runs" too, trained by the pack's job
        **({"packs": [{"task": task, "arch": arch, "seeds": list(seeds), "name": job.name, "spec": job.model_dump_json()}
                      for task, arch, seeds in expansion.packs for job in [expansion.pack_job(task, arch)]]}
           if expansion.packs else {}),
        "analyses": {
            "collect": {"spec": collect.model_dump_json(), "run_dirs": collect.run_dirs},
            "complexity": {"spec": expansion.complexity_job().model_dump_json()},
            "throughput": {"spec": expansion.throughput_job().model_dump_json()},
            "sparsity_analytic": {"spec": study.analysis.sparsity_analytic.model_dump_json()},
            "geometry": {"spec": geometry.model_dump_json(), "run_dirs": geometry.run_dirs},
            # Only where the study has an MQAR task to take its models from.
            **({"copy_probe": {"spec": copy_probe.model_dump_json()}} if copy_probe else {}),
        },
        # One sparsity job per run, whose spec names that run alone.
        "sparsity_runs": [{"task": r.task, "arch": r.arch, "seed": r.seed,
                           "spec": expansion.sparsity_job([r]).model_dump_json()} for r in expansion.sparsity_runs],
        "code": job_code(expansion),
    }


def made_table(expansion: Expansion, profile_files: Iterable[Path]) -> dict[str, Any]:
    """What `python -m seqmix jobs` prints: the job table, the files it was made from with their
    sha256 (the profile's, as read: seqmix.study.profile.Profile.files; every module this process
    imported; every file of every job's code, whose digests the table holds) and the folder
    listings it read (a notebook added is a new job's code). seqmix.study.dag reuses the table
    while they all hold."""
    from seqmix.study.dag import imported_sources, sha256_of

    table = job_table(expansion)
    code = [f for per in table["code"].values() for c in ([per] if "files" in per else per.values()) for f in c["files"]]
    read = sorted({str(p) for p in [*profile_files, *imported_sources(), *code]})
    listed = {NOTEBOOKS_GLOB: sorted(str(p) for p in REPO_ROOT.glob(NOTEBOOKS_GLOB))}
    return {"jobs": table, "read": {p: sha256_of(p) for p in read}, "listed": listed}
