"""What one job receives: the typed spec of a training run, a data preparation or an
analysis, built once from the validated study (seqmix.expansion.table) and passed to the job as JSON.
Each spec holds what its job reads and nothing else, so that editing one part of a study
reruns only the jobs that read it (Snakemake reruns a job whose params changed).

Downstream code reads attributes (``spec.train.lr``), never ``.get(key, default)``: every
default was filled when the config was validated (seqmix.expansion.validate). A task's own settings
travel as the validated mapping and are typed by the task itself (``Task.settings``). Every
job that computes with torch carries the study's ``numerics`` (seqmix.numerics), which the CLI
applies before torch is imported.
"""

from __future__ import annotations

from typing import Any

from pydantic import model_serializer

from seqmix.study.settings import (
    ComplexitySettings,
    CopyProbeSettings,
    DataSettings,
    GeometrySettings,
    ModelSettings,
    NumericsMode,
    Section,
    SparsitySettings,
    ThroughputSettings,
    TokenizerSettings,
    TrainSettings,
    without_empty_recordings,
)


class TokenizerJob(Section):
    """Preparing the shared tokenizer (data/tokenizer/)."""

    out_dir: str
    data: DataSettings
    tokenizer: TokenizerSettings
    env_mirror: str | None = None  # $SEQMIX_DATA_MIRROR, filled in by the CLI (used when data.mirror is null)


class DataJob(Section):
    """Preparing one task's data: the points of a sweep share their group's data."""

    kind: str
    group: str
    out_dir: str
    tokenizer_dir: str
    data: DataSettings
    tokenizer: TokenizerSettings
    settings: dict[str, Any]
    env_mirror: str | None = None  # as for TokenizerJob


class TrainJob(Section):
    """Everything one training run needs, and nothing else (so that a change to another
    task's settings does not invalidate this run)."""

    profile: str
    task: str  # the task's name: <kind>[/<variant>][/<sweep point>]
    kind: str
    group: str  # the task before its sweep point; runs of one sweep share its data
    axes: dict[str, Any]  # the sweep's settings at this point ({} outside a sweep)
    arch: str
    seed: int
    run_dir: str
    data_dir: str
    tokenizer_dir: str
    data: DataSettings
    tokenizer: TokenizerSettings
    model: ModelSettings
    train: TrainSettings
    settings: dict[str, Any]
    mixer_options: dict[str, Any]
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first

    @property
    def run_name(self) -> str:
        """The run's name, ``<task>/<arch>/seed<k>``: its logs', benchmarks' and messages'."""
        return f"{self.task}/{self.arch}/seed{self.seed}"


class PackJob(Section):
    """The seeds of one run configuration trained as one seed pack (seqmix.train.pack): each
    member's spec, in seed order, equal but for seed and run directory."""

    specs: list[TrainJob]

    @property
    def name(self) -> str:
        """``<task>/<arch>/pack<seeds joined by ->``: its log's and benchmark's name."""
        first = self.specs[0]
        return f"{first.task}/{first.arch}/pack{'-'.join(str(s.seed) for s in self.specs)}"


class CollectJob(Section):
    """Gathering runs into runs.csv and breakdown.csv, one row per run in this order."""

    run_dirs: list[str]
    recordings: list[str] = []  # the study's ``recordings``: their accepted runs are rows too

    _without_empty_recordings = model_serializer(mode="wrap")(without_empty_recordings)


class ComplexityJob(Section):
    """Cost against sequence length of these mixers, with their configured options."""

    architectures: list[str]
    mixers: dict[str, dict[str, Any]]  # options of those of ``architectures`` the config sets
    complexity: ComplexitySettings
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first


class ThroughputJob(Section):
    """Training tokens/s of these mixers' language models beside softmax's."""

    architectures: list[str]
    mixers: dict[str, dict[str, Any]]  # options of those architectures and softmax, where set
    throughput: ThroughputSettings
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first


class SparsityJob(Section):
    """Su's sparsity of these runs (those that finished; a diverged run adds no rows)."""

    run_dirs: list[str]
    sparsity: SparsitySettings
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first


class CopyProbeJob(Section):
    """The copy probe of these architectures: each a fresh model of the MQAR task ``task``
    (``model`` at the probe's width; block and positions resolved per architecture by it),
    with its complete mixer options, trained with ``train``'s optimiser settings."""

    task: str
    architectures: list[str]
    model: ModelSettings
    mixers: dict[str, dict[str, Any]]
    train: TrainSettings
    copy_probe: CopyProbeSettings
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first


class GeometryJob(Section):
    """Geometry of the finished runs among these whose mixer has one (Grassmann, TSSA)."""

    run_dirs: list[str]
    geometry: GeometrySettings
    numerics: NumericsMode  # type: ignore[valid-type]  # the study's: the CLI pins it first
