"""Multi-query associative recall (MQAR; Arora et al. 2024, Zoology, arXiv:2312.04927):
key-value pairs, then the keys again; the model must predict each key's value. Scored by
accuracy at the query positions only."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from seqmix.data.manifest import MANIFEST, DataError
from seqmix.data.mqar import multiquery_ar, prepare_mqar
from seqmix.study.jobs import DataJob
from seqmix.study.settings import TaskSettings
from seqmix.tasks.base import Task, batch_generator
from seqmix.tasks.lm import causal_lm


class MQARSettings(TaskSettings):
    vocab_size: int = Field(8192, ge=8)
    seq_len: int = Field(64, ge=4)
    num_kv_pairs: int = Field(4, ge=1)
    num_train: int = Field(100000, ge=1)
    num_test: int = Field(3000, ge=1)
    power_a: float = Field(0.01, gt=0)
    random_non_queries: bool = False
    data_seed: int = Field(1234, ge=0)

    @model_validator(mode="after")
    def _generator_can_build_it(self):
        # The generator's own constraints (Zoology's multiquery_ar asserts the same).
        if self.seq_len % 2:
            raise ValueError(f"seq_len must be even, got {self.seq_len}")
        if self.vocab_size <= self.seq_len:
            raise ValueError(f"vocab_size ({self.vocab_size}) must exceed seq_len ({self.seq_len})")
        if self.num_kv_pairs * 4 > self.seq_len:
            raise ValueError(f"num_kv_pairs * 4 ({self.num_kv_pairs * 4}) must be <= seq_len ({self.seq_len}): "
                             "the context and one query per key must fit")
        if self.num_kv_pairs > self.vocab_size // 2 - 1:
            raise ValueError(f"num_kv_pairs ({self.num_kv_pairs}) must be <= vocab_size/2 - 1 (distinct keys)")
        return self


class MQAR(Task):
    kind = "mqar"
    Settings = MQARSettings
    is_language_model = True
    is_recall = True
    needs_tokenizer = False
    metric = "accuracy"
    higher_is_better = True
    progress_unit = "tokens"
    scored_unit = "queries"
    length_key = "seq_len"

    @classmethod
    def prepare(cls, job: DataJob) -> dict:
        s = cls.Settings.model_validate(job.settings)
        return prepare_mqar(s.vocab_size, s.seq_len, s.num_kv_pairs, s.num_train, s.num_test, s.power_a,
                            s.random_non_queries, s.data_seed, job.out_dir)

    def __init__(self, spec):
        super().__init__(spec)
        self.arrays: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def check_data(self) -> None:
        # The data directory is the group's: prepared for the settings it was asked with.
        made = self.manifest["generator"]
        wanted = self.settings.model_dump(include=set(made))
        if made != wanted:
            diff = ", ".join(f"{k} {made[k]!r} (config: {wanted[k]!r})" for k in made if made[k] != wanted[k])
            raise DataError(
                f"{self.data_dir / MANIFEST} was generated with {diff}: the data do not match the "
                f"config's 'tasks.{self.spec.group}'; rerun `python -m seqmix data {self.spec.group}` "
                "(the DAG does this when the settings change)")

    @property
    def chance(self) -> float:
        # A model that outputs a value of the context without knowing which one.
        return 1.0 / self.settings.num_kv_pairs

    @property
    def blind_loss(self) -> float:
        # Values are drawn from the upper half of the vocabulary (data/mqar.py): uniform over them.
        return math.log(self.settings.vocab_size - self.settings.vocab_size // 2)

    @property
    def sequence_length(self) -> int:
        return self.settings.seq_len

    def example_batch(self, batch_size, device):
        s = self.settings
        inputs, labels = multiquery_ar(s.vocab_size, batch_size, s.seq_len, s.num_kv_pairs, s.power_a,
                                       s.random_non_queries, s.data_seed)
        return torch.from_numpy(inputs).to(device), torch.from_numpy(labels).to(device)

    def split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self.arrays:
            z = np.load(self.data_dir / f"{split}.npz")
            self.arrays[split] = (torch.from_numpy(z["inputs"]), torch.from_numpy(z["labels"]))
        return self.arrays[split]

    def build_model(self, d_model, n_layers, d_ff_mult=None):
        return causal_lm(self.spec, self.settings.vocab_size, self.settings.seq_len, d_model, n_layers, d_ff_mult)

    def train_batch(self, step, batch_size, device):
        inputs, labels = self.split("train")
        idx = torch.randint(0, len(inputs), (batch_size,), generator=batch_generator(self.spec.seed, step))
        return inputs[idx].to(device), labels[idx].to(device)

    def loss(self, model, batch):
        return model.loss(*batch)

    def pack_loss(self, model, batch):
        # every position through the head, the unscored ones (-100) dropped by cross_entropy's
        # ignore_index: the loss of the query positions without selecting them by a mask
        return model.loss(*batch, every_position=True)

    def progress(self, batch):
        return int(batch[0].numel())

    def query_distance(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """For every query position (labels != -100), how many tokens back its key stands in
        the context: the distance a mixer must reach to recall the value. (N,) int64."""
        pairs = self.settings.num_kv_pairs
        keys = inputs[:, 0 : 2 * pairs : 2]  # (B, pairs): the context's keys at 0, 2, 4, ...
        rows, cols = (labels != -100).nonzero(as_tuple=True)
        which = (inputs[rows, cols][:, None] == keys[rows]).float().argmax(-1)  # keys are distinct
        return cols - 2 * which

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None):
        """Accuracy and loss at the query positions; ``breakdown.query_distance`` maps each
        distance from query to key to [correct, queries] (the analyses bin it)."""
        inputs, labels = self.split(split)
        n = len(inputs) if max_batches is None else min(len(inputs), max_batches * batch_size)
        total, correct, count = 0.0, 0, 0
        by_distance: dict[int, list[int]] = {}
        for i in range(0, n, batch_size):
            x, y = inputs[i : min(i + batch_size, n)].to(device), labels[i : min(i + batch_size, n)].to(device)
            mask = y != -100
            logits = model.logits_at(x, mask).float()
            total += F.cross_entropy(logits, y[mask], reduction="sum").item()
            hit = (logits.argmax(-1) == y[mask]).cpu()
            correct += int(hit.sum())
            count += int(mask.sum())
            for d, h in zip(self.query_distance(x.cpu(), y.cpu()).tolist(), hit.tolist()):
                entry = by_distance.setdefault(d, [0, 0])
                entry[0] += int(h)
                entry[1] += 1
        return {"loss": total / count, "accuracy": correct / count, "scored": count,
                "split_size": int((labels != -100).sum()),
                "breakdown": {"query_distance": {str(d): v for d, v in sorted(by_distance.items())}}}

    def heldout_rows(self, split: str, num: int) -> torch.Tensor:
        """The query positions of the held-out inputs: the rows where the answer is one key."""
        return self.split(split)[1][:num] != -100

    def heldout_inputs(self, split, num, crop_len):
        return (self.split(split)[0][:num],)
