"""The Task interface: everything that differs between tasks lives in a Task subclass, so
that the config, the rules, the training loop, the analyses, ``collect`` and the notebooks
never branch on a task's name. A task kind is one module (in this package or any importable
one) with a ``Task`` subclass, plus one line in ``seqmix/catalogue.py``: it declares the
class attributes below and implements data preparation, the model a run trains, its
batches, loss and evaluation, and the held-out inputs the analyses read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from seqmix.data.manifest import read_manifest
from seqmix.study.jobs import DataJob, TrainJob
from seqmix.study.settings import TaskSettings


def batch_generator(seed: int, step: int) -> torch.Generator:
    # One generator per (seed, step): batches do not depend on what ran before, so a run
    # resumed from a checkpoint draws exactly the batches of an uninterrupted one.
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class Task:
    kind: ClassVar[str]
    Settings: ClassVar[type[TaskSettings]] = TaskSettings  # its config section's own keys and defaults
    # A causal LM (only mixers with a causal form run on it), or an encoder (mixers are built
    # non-causal where they can be).
    is_language_model: ClassVar[bool]
    needs_tokenizer: ClassVar[bool] = False  # whether its data preparation reads the shared tokenizer
    metric: ClassVar[str]  # its primary evaluation metric
    higher_is_better: ClassVar[bool]
    progress_unit: ClassVar[str]  # what training's ``seen`` counts: tokens | examples
    scored_unit: ClassVar[str]  # what an evaluation scores: tokens | queries | examples
    length_key: ClassVar[str | None] = None  # the setting its length comes from, named by the preflight
    # An associative-recall task: the copy probe (seqmix/analysis/copy_probe.py) builds its
    # models as the first such task of a study builds its own
    is_recall: ClassVar[bool] = False
    # Batches shorter than its sequence length, by phase: "one" (a single tail batch of every
    # shorter length, batch 1) or "all" (any shorter length at any batch size); what the
    # kernel compile check must compile for
    shorter_batches: ClassVar[dict[str, str]] = {}
    # Whether its runs can train as a seed pack (seqmix.train.pack stacks the members' batches):
    # True, or the reason they cannot, which validation names for `train.pack`
    packable: ClassVar[bool | str] = True

    # -- data (before any run) --------------------------------------------------------------

    @classmethod
    def prepare(cls, job: DataJob) -> dict[str, Any]:
        """Write the task's prepared files and their manifest into ``job.out_dir``;
        return the manifest's information."""
        raise NotImplementedError

    # -- one run ----------------------------------------------------------------------------

    def __init__(self, spec: TrainJob):
        self.spec = spec
        self.settings = self.Settings.model_validate(spec.settings)
        self.data_dir = Path(spec.data_dir)
        self.manifest = read_manifest(self.data_dir, spec.task)  # every file checked first
        self.check_data()

    def check_data(self) -> None:
        """Raise DataError when the prepared data cannot serve these settings (a limit only
        the data decide, e.g. a block longer than a split), naming the config key and the
        fix. Called when a job builds its task: before a run's first step."""

    # -- a run's shapes without its data (python -m seqmix plan) -------------------------

    @classmethod
    def without_data(cls, spec: TrainJob) -> Task:
        """The task of ``spec`` before any data exist: it builds the run's model and
        ``example_batch``es of its training shapes (the cost plan), nothing else."""
        task = cls.__new__(cls)
        task.spec, task.settings = spec, cls.Settings.model_validate(spec.settings)
        task.data_dir, task.manifest = Path(spec.data_dir), None
        task.init_shapes()
        return task

    def init_shapes(self) -> None:
        """Set what ``build_model`` reads from the prepared data (vocabulary size, lengths)
        from the spec alone (the configured vocabulary: a trained one can come out smaller)."""

    def example_batch(self, batch_size: int, device) -> tuple:
        """A training batch of the run's shapes, made up (its cost is the point, not its
        content); the longest a real batch can be where lengths vary."""
        raise NotImplementedError

    @property
    def sequence_length(self) -> int | None:
        """Tokens in the longest sequence of a training batch: what a step's activations grow
        with (the preflight bounds its memory from it before any model is built); None:
        not known, no bound."""
        return None

    # -- limits the data decide, before any job (seqmix.preflight) --------------------------

    @classmethod
    def limit_problems(cls, spec: TrainJob) -> list[str]:
        """What ``check_data`` would refuse, found before the first job from cheap metadata:
        the prepared data's manifest where it exists, else a bound from the raw files. One
        line per problem, naming the config key and the fix; [] where none is known (the
        job's ``check_data`` still checks the prepared data)."""
        return []

    @property
    def chance(self) -> float | None:
        """The metric of a model that has learned the task's format but nothing more (the
        floor claims compare with); None when there is no such level."""
        return None

    @property
    def blind_loss(self) -> float | None:
        """The cross-entropy of a model that knows the answer's vocabulary but reads nothing of
        the input (MQAR: ln of the number of value tokens); None when there is no such level."""
        return None

    @property
    def eval_split(self) -> str:
        """The split of periodic evaluation (model selection)."""
        return "validation"

    @property
    def test_split(self) -> str:
        """The split of the final test score."""
        return "test"

    @property
    def train_split(self) -> str:
        return "train"

    def data_record(self) -> dict:
        """What the run was trained and evaluated on, as the manifest describes it."""
        m = self.manifest
        return {"dataset": m["dataset"], "source": m["source"], "splits": m["splits"],
                "tokenizer": m.get("tokenizer")}

    def build_model(self, d_model: int, n_layers: int, d_ff_mult: float | None = None) -> torch.nn.Module:
        """The run's model at this size; d_ff_mult None = the spec's (a budget may refine it)."""
        raise NotImplementedError

    def train_batch(self, step: int, batch_size: int, device) -> tuple:
        """The batch of ``step``: a pure function of (seed, step) (``batch_generator``), so that a
        resumed run draws the batches of an uninterrupted one."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        raise NotImplementedError

    def pack_loss(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        """``loss`` as a pack of seeds computes it (seqmix.train.pack, under torch.func.vmap):
        the same value up to float rounding, with no shape or branch that depends on the
        batch's values, which vmap cannot batch. Default: ``loss`` itself."""
        return self.loss(model, batch)

    def progress(self, batch: tuple) -> int:
        """How many ``progress_unit`` a training batch holds."""
        raise NotImplementedError

    def evaluate(self, model, split: str, batch_size: int, device, max_batches: int | None = None) -> dict:
        """{"loss", <metric>, "scored" (in scored_unit), "split_size" (scored units of the
        whole split)}, on the whole split or its first ``max_batches`` batches. A task may
        add ``"breakdown": {<by>: {<value>: [correct, scored]}}`` (MQAR: by query distance);
        ``collect`` writes every run's breakdown into results/summary/breakdown.csv."""
        raise NotImplementedError

    def heldout_inputs(self, split: str, num: int, crop_len: int) -> tuple[torch.Tensor, ...]:
        """The model's arguments for ``num`` held-out inputs of ``split`` (the analyses read
        them): every row a real input of one length, with no padding; encoder tasks crop
        to ``crop_len`` tokens."""
        raise NotImplementedError

    def heldout_rows(self, split: str, num: int) -> torch.Tensor | None:
        """Which positions of those inputs are scored, (num, L) bool; None = all. The
        sparsity analysis measures attention rows there (MQAR: at the queries, where the
        right answer is one key)."""
        return None
