"""SNLI sentence-pair classification (Bowman et al. 2015, arXiv:1508.05326) with the mixer
stack as a from-scratch encoder: [CLS] premise [SEP] hypothesis [SEP], scored by accuracy."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from seqmix.data.manifest import read_manifest
from seqmix.data.snli import prepare_snli
from seqmix.models.classifier import ClassifierConfig, PairClassifier
from seqmix.study.jobs import DataJob
from seqmix.study.settings import TaskSettings
from seqmix.tasks.base import Task, batch_generator


class SNLISettings(TaskSettings):
    train_file: Literal["train", "train_sample_1pct", "train_head_1024"] = Field(
        "train", description="which SNLI train file: the full split (hub, or a mirror that has it) or one of the subsets of the shared mirror")
    max_sentence_tokens: int = Field(48, ge=4)
    eval_max_examples: int | None = Field(None, ge=1, description="cap on pairs scored by the final evaluation of each split; null = the whole split")


class SNLI(Task):
    kind = "snli"
    Settings = SNLISettings
    is_language_model = False
    needs_tokenizer = True
    metric = "accuracy"
    higher_is_better = True
    progress_unit = "examples"
    scored_unit = "examples"
    length_key = "max_sentence_tokens"
    shorter_batches = {"train": "all", "eval": "all"}  # every batch is padded to its longest pair (collate)
    packable = "every batch is padded to its own longest pair, so the members' batches differ in shape"

    @classmethod
    def prepare(cls, job: DataJob) -> dict:
        s = cls.Settings.model_validate(job.settings)
        return prepare_snli(job.data, s.train_file, s.max_sentence_tokens, job.out_dir, job.tokenizer_dir,
                            job.env_mirror)

    def __init__(self, spec):
        super().__init__(spec)
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
        self.specials = read_manifest(spec.tokenizer_dir, "tokenizer", verify=False)["specials"]
        self.max_len = 2 * self.settings.max_sentence_tokens + 3
        self.arrays: dict[str, dict[str, np.ndarray]] = {}

    def init_shapes(self):
        self.vocab_size = self.spec.tokenizer.vocab_size
        self.max_len = 2 * self.settings.max_sentence_tokens + 3

    @property
    def sequence_length(self) -> int:
        return self.max_len

    def example_batch(self, batch_size, device):
        g = batch_generator(0, 0)
        ids = torch.randint(0, self.vocab_size, (batch_size, self.max_len), generator=g).to(device)
        segments = (torch.arange(self.max_len) > self.max_len // 2).long().expand(batch_size, -1).to(device)
        labels = torch.randint(0, 3, (batch_size,), generator=g).to(device)
        return ids, segments, torch.ones_like(ids, dtype=torch.bool), labels

    def split(self, split: str) -> dict[str, np.ndarray]:
        if split not in self.arrays:
            z = np.load(self.data_dir / f"{split}.npz")
            self.arrays[split] = {k: z[k] for k in z.files}
        return self.arrays[split]

    def build_model(self, d_model, n_layers, d_ff_mult=None):
        m = self.spec.model
        return PairClassifier(ClassifierConfig(
            arch=self.spec.arch, vocab_size=self.vocab_size, max_len=self.max_len, d_model=d_model,
            n_layers=n_layers, d_ff_mult=m.d_ff_mult if d_ff_mult is None else d_ff_mult, dropout=m.dropout,
            block=m.block, mixer_options=dict(self.spec.mixer_options),
        ))

    def collate(self, split: str, idx: np.ndarray, device):
        """(ids, segments, mask, labels) of pairs ``idx``, padded on the right to the longest."""
        a = self.split(split)
        cls_id, sep_id, pad_id = self.specials["[CLS]"], self.specials["[SEP]"], self.specials["[PAD]"]
        rows, segs = [], []
        for i in idx:
            p = a["premise"][a["premise_offsets"][i] : a["premise_offsets"][i + 1]]
            h = a["hypothesis"][a["hypothesis_offsets"][i] : a["hypothesis_offsets"][i + 1]]
            rows.append(np.concatenate([[cls_id], p, [sep_id], h, [sep_id]]))
            segs.append(np.concatenate([np.zeros(len(p) + 2, np.int64), np.ones(len(h) + 1, np.int64)]))
        L = max(len(r) for r in rows)
        ids = np.full((len(rows), L), pad_id, np.int64)
        seg = np.zeros((len(rows), L), np.int64)
        for j, (r, s) in enumerate(zip(rows, segs)):
            ids[j, : len(r)], seg[j, : len(s)] = r, s
        ids, seg = torch.from_numpy(ids).to(device), torch.from_numpy(seg).to(device)
        labels = torch.from_numpy(a["labels"][idx].astype(np.int64)).to(device)
        return ids, seg, ids != pad_id, labels

    def train_batch(self, step, batch_size, device):
        n = len(self.split("train")["labels"])
        idx = torch.randint(0, n, (batch_size,), generator=batch_generator(self.spec.seed, step)).numpy()
        return self.collate("train", idx, device)

    def loss(self, model, batch):
        ids, seg, mask, labels = batch
        return F.cross_entropy(model(ids, seg, mask).float(), labels)

    def progress(self, batch):
        return len(batch[-1])

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None):
        size = len(self.split(split)["labels"])
        n = size if max_batches is None else min(size, max_batches * batch_size)
        if max_batches is None and self.settings.eval_max_examples is not None:
            n = min(n, self.settings.eval_max_examples)
        total, correct = 0.0, 0
        for i in range(0, n, batch_size):
            ids, seg, mask, labels = self.collate(split, np.arange(i, min(i + batch_size, n)), device)
            logits = model(ids, seg, mask).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(-1) == labels).sum().item()
        return {"loss": total / n, "accuracy": correct / n, "scored": n, "split_size": size}

    def heldout_inputs(self, split, num, crop_len):
        """The first ``num`` held-out pairs whose [CLS] premise [SEP] hypothesis [SEP] row has
        at least ``crop_len`` tokens, cropped to it: no padding, so every row of the effective
        attention is over real tokens."""
        a = self.split(split)
        lengths = np.diff(a["premise_offsets"]) + np.diff(a["hypothesis_offsets"]) + 3
        pick = np.flatnonzero(lengths >= crop_len)[:num]
        if len(pick) == 0:
            raise ValueError(f"no held-out pair of {self.spec.task!r} split {split!r} has {crop_len} tokens; "
                             "lower analysis.sparsity.crop_len")
        ids, seg, mask, _ = self.collate(split, pick, "cpu")
        return ids[:, :crop_len], seg[:, :crop_len], mask[:, :crop_len]
