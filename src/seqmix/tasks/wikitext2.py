"""WikiText-2 causal language modelling (Merity et al. 2016, arXiv:1609.07843): contiguous
blocks of the tokenised raw text, scored by perplexity on held-out splits."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from seqmix.data.manifest import MANIFEST, DataError
from seqmix.data.wikitext import SplitTokens, manifest_tokens, prepare_wikitext2, split_tokens
from seqmix.study.jobs import DataJob
from seqmix.study.settings import TaskSettings
from seqmix.tasks.base import Task, batch_generator
from seqmix.tasks.lm import causal_lm

Split = Literal["train", "validation", "test"]


class WikiText2Settings(TaskSettings):
    train_split: Split = "train"
    eval_split: Split = "validation"
    test_split: Split = "test"
    block_size: int = Field(128, ge=2)
    eval_max_tokens: int | None = Field(None, ge=1, description="cap on tokens scored by the final evaluation of each split; null = the whole split")

    @model_validator(mode="after")
    def _held_out(self):
        if self.train_split == self.eval_split:
            raise ValueError(f"eval_split equals train_split ({self.train_split!r}); evaluate on a split the model did not train on")
        if self.eval_max_tokens is not None and self.eval_max_tokens < self.block_size:
            raise ValueError(f"eval_max_tokens ({self.eval_max_tokens}) is below block_size ({self.block_size}): an "
                             "evaluation scores whole blocks, so it would score one block anyway; set eval_max_tokens "
                             ">= block_size, or null for whole splits")
        return self

    def split_needs(self) -> list[tuple[str, str, int]]:
        """(config key, split, tokens it needs): a training batch draws a start in
        [0, tokens - block - 1), so at least block + 2 tokens; an evaluation needs one whole
        (block + 1)-token window."""
        return [("train_split", self.train_split, self.block_size + 2),
                ("eval_split", self.eval_split, self.block_size + 1),
                ("test_split", self.test_split, self.block_size + 1)]

    def too_long(self, group: str, counts: dict[str, SplitTokens]) -> list[str]:
        """A problem for each split whose (exact or bounding) token count is below its need."""
        problems = []
        for key, split, need in self.split_needs():
            count = counts.get(split)
            if count is None or count.tokens >= need:
                continue
            longest = count.tokens - (need - self.block_size)
            if count.exact:
                has, fix = f"it has {count.tokens:,} tokens ({count.source})", f"set block_size <= {longest}"
            else:
                has = (f"it has at most {count.tokens:,} tokens (a WordPiece token covers at least one byte of "
                       f"{count.source}; the data are not prepared yet)")
                fix = f"set block_size <= {longest} at the very most (the prepared data give the exact limit)"
            problems.append(f"config key 'tasks.{group}.block_size' ({self.block_size}) is too long for the {split} "
                            f"split ({key}): {has} and needs at least {need:,}; {fix}, or choose a longer split "
                            f"for '{key}'")
        return problems


class WikiText2(Task):
    kind = "wikitext2"
    Settings = WikiText2Settings
    is_language_model = True
    needs_tokenizer = True
    metric = "ppl"
    higher_is_better = False
    progress_unit = "tokens"
    scored_unit = "tokens"
    length_key = "block_size"
    shorter_batches = {"eval": "one"}  # evaluation ends with one window of (len - 1) % block tokens (eval_tail)

    @classmethod
    def prepare(cls, job: DataJob) -> dict:
        return prepare_wikitext2(job.data, job.out_dir, job.tokenizer_dir, job.env_mirror)

    def __init__(self, spec):
        super().__init__(spec)
        self.block = self.settings.block_size
        self.tokens: dict[str, np.ndarray] = {}
        self.vocab_size = self.manifest["tokenizer"]["vocab_size"]

    def check_data(self) -> None:
        counts = manifest_tokens(self.manifest, self.data_dir / MANIFEST)
        if problems := self.settings.too_long(self.spec.group, counts):
            raise DataError(problems[0])

    @classmethod
    def limit_problems(cls, spec) -> list[str]:
        settings = cls.Settings.model_validate(spec.settings)
        return settings.too_long(spec.group, split_tokens(spec.data_dir, spec.data, spec.tokenizer_dir))

    def init_shapes(self):
        self.block, self.vocab_size = self.settings.block_size, self.spec.tokenizer.vocab_size

    @property
    def sequence_length(self) -> int:
        return self.block

    def example_batch(self, batch_size, device):
        chunk = torch.randint(0, self.vocab_size, (batch_size, self.block + 1), generator=batch_generator(0, 0))
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)

    @property
    def train_split(self) -> str:
        return self.settings.train_split

    @property
    def eval_split(self) -> str:
        return self.settings.eval_split

    @property
    def test_split(self) -> str:
        return self.settings.test_split

    def stream(self, split: str) -> np.ndarray:
        if split not in self.tokens:
            self.tokens[split] = np.load(self.data_dir / f"{split}.npy", mmap_mode="r")
        return self.tokens[split]

    def build_model(self, d_model, n_layers, d_ff_mult=None):
        return causal_lm(self.spec, self.vocab_size, self.block, d_model, n_layers, d_ff_mult)

    def train_batch(self, step, batch_size, device):
        data = self.stream(self.train_split)
        g = batch_generator(self.spec.seed, step)
        starts = torch.randint(0, len(data) - self.block - 1, (batch_size,), generator=g).numpy()
        chunk = torch.from_numpy(np.stack([data[s : s + self.block + 1] for s in starts]).astype(np.int64))
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)

    def loss(self, model, batch):
        return model.loss(*batch, every_position=True)  # contiguous text: every position has a target

    def progress(self, batch):
        return int(batch[0].numel())

    def eval_blocks(self, split: str, max_tokens: int | None) -> torch.Tensor:
        """The whole (block+1)-token windows in order, each overlapping the next by one token
        (under a cap, the first max(1, max_tokens // block) of them): (n, block+1)."""
        data = self.stream(split)
        n = (len(data) - 1) // self.block
        if max_tokens is not None:
            n = min(n, max(1, max_tokens // self.block))
        idx = np.arange(n)[:, None] * self.block + np.arange(self.block + 1)[None, :]
        return torch.from_numpy(np.asarray(data)[idx].astype(np.int64))

    def eval_tail(self, split: str, max_tokens: int | None) -> torch.Tensor | None:
        """The shorter last window, (1, r+1), whose r = (len - 1) % block targets the whole
        windows leave; None when r = 0 or a cap below the split's len - 1 targets stops
        the evaluation within the whole windows."""
        data = self.stream(split)
        targets = len(data) - 1
        r = targets % self.block
        if r == 0 or (max_tokens is not None and max_tokens < targets):
            return None
        return torch.from_numpy(np.asarray(data[targets - r :]).astype(np.int64))[None]

    @torch.no_grad()
    def evaluate(self, model, split, batch_size, device, max_batches=None):
        """Mean loss and perplexity over the whole windows and the tail: uncapped, every
        token of the split after the first, each once (``scored`` == ``split_size``)."""
        if max_batches is not None:
            max_tokens = max_batches * batch_size * self.block
        else:
            max_tokens = self.settings.eval_max_tokens
        blocks = self.eval_blocks(split, max_tokens)
        batches = [blocks[i : i + batch_size] for i in range(0, len(blocks), batch_size)]
        tail = self.eval_tail(split, max_tokens)
        total, count = 0.0, 0
        for chunk in batches + ([] if tail is None else [tail]):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1]).float()
            total += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += chunk[:, 1:].numel()
        loss = total / count
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "scored": count,
                "split_size": int(len(self.stream(split))) - 1}

    def heldout_inputs(self, split, num, crop_len):
        return (self.eval_blocks(split, None)[:num, :-1],)
