"""What a training run needs to know about its task: the model it builds, its batches
(a pure function of the step, so that a resumed run sees the same data), its loss and its
evaluation. WikiText-2 and MQAR train a causal LM; SNLI a sentence-pair classifier."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from seqmix.config import TASKS
from seqmix.data.manifest import read_manifest
from seqmix.models.classifier import ClassifierConfig, PairClassifier
from seqmix.models.lm import CausalLM, LMConfig


def batch_generator(seed: int, step: int) -> torch.Generator:
    # One generator per (seed, step): batches do not depend on what ran before, so a run
    # resumed from a checkpoint draws exactly the batches of an uninterrupted one.
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def causal_lm(spec: dict, vocab_size: int, max_len: int, d_model: int, n_layers: int) -> CausalLM:
    """The causal LM of a run (WikiText-2, MQAR) at a given size."""
    m = spec["model"]
    return CausalLM(LMConfig(
        arch=spec["arch"], vocab_size=vocab_size, max_len=max_len, d_model=d_model, n_layers=n_layers,
        d_ff_mult=m["d_ff_mult"], dropout=m["dropout"], norm=m["norm"],
        tie_embeddings=m["tie_embeddings"], mixer_options=spec["mixer_options"],
    ))


class Task:
    name: str
    metric: str  # the primary evaluation metric
    higher_is_better: bool

    def __init__(self, spec: dict, data_dir: Path):
        self.spec = spec
        self.cfg = spec["task_config"]
        self.data_dir = data_dir
        self.manifest = read_manifest(data_dir, self.name)

    def data_record(self) -> dict:
        """What the run was trained and evaluated on, as the manifest describes it."""
        m = self.manifest
        return {
            "dataset": m["dataset"],
            "source": m["source"],
            "splits": m["splits"],
            "tokenizer": m.get("tokenizer"),
        }

    def model_config(self, d_model: int, n_layers: int):
        raise NotImplementedError

    def build_model(self, d_model: int, n_layers: int) -> torch.nn.Module:
        raise NotImplementedError

    def train_batch(self, step: int, batch_size: int, device) -> tuple:
        raise NotImplementedError

    def loss(self, model, batch) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, model, split: str, batch_size: int, device, max_batches: int | None) -> dict:
        raise NotImplementedError


class WikiTextTask(Task):
    name = "wikitext2"
    metric = "ppl"
    higher_is_better = False

    def __init__(self, spec, data_dir):
        super().__init__(spec, data_dir)
        self.block = self.cfg["block_size"]
        self.tokens = {}
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]

    def stream(self, split: str) -> np.ndarray:
        if split not in self.tokens:
            self.tokens[split] = np.load(self.data_dir / f"{split}.npy", mmap_mode="r")
        return self.tokens[split]

    def build_model(self, d_model, n_layers):
        return causal_lm(self.spec, self.vocab_size, self.block, d_model, n_layers)

    def train_batch(self, step, batch_size, device):
        data = self.stream(self.cfg["train_split"])
        g = batch_generator(self.spec["seed"], step)
        starts = torch.randint(0, len(data) - self.block - 1, (batch_size,), generator=g).numpy()
        chunk = torch.from_numpy(np.stack([data[s : s + self.block + 1] for s in starts]).astype(np.int64))
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)

    def loss(self, model, batch):
        return model.loss(*batch)

    def eval_blocks(self, split: str, max_tokens: int | None) -> torch.Tensor:
        """Non-overlapping (block+1)-token windows in order, overlapping by one token so that
        every token after the first is scored exactly once."""
        data = self.stream(split)
        n = (len(data) - 1) // self.block
        if max_tokens is not None:
            n = min(n, max(1, max_tokens // self.block))
        idx = np.arange(n)[:, None] * self.block + np.arange(self.block + 1)[None, :]
        return torch.from_numpy(np.asarray(data)[idx].astype(np.int64))

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None, max_tokens=None):
        if max_batches is not None:
            max_tokens = max_batches * batch_size * self.block
        blocks = self.eval_blocks(split, max_tokens)
        total, count = 0.0, 0
        for i in range(0, len(blocks), batch_size):
            chunk = blocks[i : i + batch_size].to(device)
            logits = model(chunk[:, :-1]).float()
            total += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += chunk[:, 1:].numel()
        loss = total / count
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count,
                "split_tokens": int(len(self.stream(split)))}


class MQARTask(Task):
    name = "mqar"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, spec, data_dir):
        super().__init__(spec, data_dir)
        self.arrays = {}

    def split(self, split):
        if split not in self.arrays:
            z = np.load(self.data_dir / f"{split}.npz")
            self.arrays[split] = (torch.from_numpy(z["inputs"]), torch.from_numpy(z["labels"]))
        return self.arrays[split]

    def build_model(self, d_model, n_layers):
        return causal_lm(self.spec, self.cfg["vocab_size"], self.cfg["seq_len"], d_model, n_layers)

    def train_batch(self, step, batch_size, device):
        inputs, labels = self.split("train")
        idx = torch.randint(0, len(inputs), (batch_size,), generator=batch_generator(self.spec["seed"], step))
        return inputs[idx].to(device), labels[idx].to(device)

    def loss(self, model, batch):
        return model.loss(*batch)

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None, max_tokens=None):
        inputs, labels = self.split(split)
        n = len(inputs) if max_batches is None else min(len(inputs), max_batches * batch_size)
        total, correct, count = 0.0, 0, 0
        for i in range(0, n, batch_size):
            x, y = inputs[i : min(i + batch_size, n)].to(device), labels[i : min(i + batch_size, n)].to(device)
            logits = model(x).float()
            mask = y != -100
            total += F.cross_entropy(logits[mask], y[mask], reduction="sum").item()
            correct += (logits[mask].argmax(-1) == y[mask]).sum().item()
            count += int(mask.sum())
        return {"loss": total / count, "accuracy": correct / count, "queries": count, "examples": n}


class SNLITask(Task):
    name = "snli"
    metric = "accuracy"
    higher_is_better = True

    def __init__(self, spec, data_dir):
        super().__init__(spec, data_dir)
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]
        self.specials = _specials(spec)
        self.max_len = 2 * self.cfg["max_sentence_tokens"] + 3
        self.arrays = {}

    def split(self, split):
        if split not in self.arrays:
            z = np.load(self.data_dir / f"{split}.npz")
            self.arrays[split] = {k: z[k] for k in z.files}
        return self.arrays[split]

    def build_model(self, d_model, n_layers):
        m = self.spec["model"]
        return PairClassifier(ClassifierConfig(
            arch=self.spec["arch"], vocab_size=self.vocab_size, max_len=self.max_len,
            d_model=d_model, n_layers=n_layers, d_ff_mult=m["d_ff_mult"], dropout=m["dropout"],
            norm=m["norm"], mixer_options=self.spec["mixer_options"],
        ))

    def collate(self, split: str, idx: np.ndarray, device):
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
        idx = torch.randint(0, n, (batch_size,), generator=batch_generator(self.spec["seed"], step)).numpy()
        return self.collate("train", idx, device)

    def loss(self, model, batch):
        ids, seg, mask, labels = batch
        return F.cross_entropy(model(ids, seg, mask).float(), labels)

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None, max_tokens=None):
        n = len(self.split(split)["labels"])
        if max_batches is not None:
            n = min(n, max_batches * batch_size)
        cap = self.cfg.get("eval_max_examples")
        if cap is not None and max_batches is None:
            n = min(n, cap)
        total, correct = 0.0, 0
        for i in range(0, n, batch_size):
            ids, seg, mask, labels = self.collate(split, np.arange(i, min(i + batch_size, n)), device)
            logits = model(ids, seg, mask).float()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(-1) == labels).sum().item()
        return {"loss": total / n, "accuracy": correct / n, "examples": n,
                "split_examples": int(len(self.split(split)["labels"]))}


def _specials(spec) -> dict:
    from seqmix.data.prepare import task_dir

    return read_manifest(task_dir(spec, "tokenizer"), "tokenizer", verify=False)["specials"]


TASK_CLASSES = {"wikitext2": WikiTextTask, "mqar": MQARTask, "snli": SNLITask}
assert set(TASK_CLASSES) == set(TASKS)


def make_task(spec: dict) -> Task:
    from seqmix.data.prepare import task_dir

    return TASK_CLASSES[spec["task"]](spec, task_dir(spec, spec["task"]))
