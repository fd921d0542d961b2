"""What one job receives: the typed spec of a training run or of a data preparation,
built once from the validated study (seqmix.study) and passed to the job as JSON.

Downstream code reads attributes (``spec.train.lr``), never ``.get(key, default)``: every
default was filled when the config was validated (seqmix.config). A task's own settings
travel as the validated mapping and are typed by the task itself (``Task.settings``).
"""

from __future__ import annotations

from typing import Any

from seqmix.sections import DataSpec, ModelSpec, Section, TokenizerSpec, TrainSpec


class TokenizerJob(Section):
    """Preparing the shared tokenizer (data/tokenizer/)."""

    out_dir: str
    data: DataSpec
    tokenizer: TokenizerSpec
    env_mirror: str | None = None  # $SEQMIX_DATA_MIRROR, filled in by the CLI (used when data.mirror is null)


class DataJob(Section):
    """Preparing one task's data: the points of a sweep share their group's data."""

    kind: str
    group: str
    out_dir: str
    tokenizer_dir: str
    data: DataSpec
    tokenizer: TokenizerSpec
    settings: dict[str, Any]
    env_mirror: str | None = None  # as for TokenizerJob


class RunSpec(Section):
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
    data: DataSpec
    tokenizer: TokenizerSpec
    model: ModelSpec
    train: TrainSpec
    settings: dict[str, Any]
    mixer_options: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.task}/{self.arch}/seed{self.seed}"
