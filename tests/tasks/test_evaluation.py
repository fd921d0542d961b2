"""Evaluation scores what it claims to score: every WikiText-2 token after the first exactly
once (the tail of a split included), MQAR at its query positions only, perplexity as the
exponential of the mean loss. The models here are chosen so that the right answer is
known without the code under test: a context-free bigram table (its loss does not depend
on how the stream is cut into windows) and an MQAR oracle that reads the answer from the
context."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqmix.data.mqar import multiquery_ar
from seqmix.tasks.mqar import MQAR, MQARSettings
from seqmix.tasks.wikitext2 import WikiText2, WikiText2Settings

V = 11


class Bigram(nn.Module):
    """logits_t = table[x_t]: the loss of a target depends on the token before it only, so
    the mean loss over a split is known whatever the windows are."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx]


def wikitext(stream: np.ndarray, block: int, eval_max_tokens: int | None = None) -> WikiText2:
    """A WikiText2 task over an in-memory token stream (the evaluation logic only)."""
    task = WikiText2.__new__(WikiText2)
    task.settings = WikiText2Settings(block_size=block, eval_max_tokens=eval_max_tokens)
    task.block = block
    task.tokens = {"validation": stream}
    return task


def bigram_loss(model: Bigram, stream: np.ndarray, targets: int) -> float:
    """Mean cross-entropy of the first ``targets`` tokens after the first."""
    s = torch.from_numpy(stream.astype(np.int64))
    return F.cross_entropy(model.table[s[:targets]], s[1 : targets + 1]).item()


# Lengths with a tail ((N - 1) % block != 0), without one, and shorter than one window.
@pytest.mark.parametrize("length,block,batch", [(103, 8, 5), (97, 8, 4), (6, 8, 2), (2, 8, 3)])
def test_every_wikitext_token_after_the_first_is_scored_exactly_once(length, block, batch):
    stream = np.random.default_rng(length).integers(0, V, length)
    model = Bigram(V)
    ev = wikitext(stream, block).evaluate(model, "validation", batch, "cpu")
    assert ev["scored"] == ev["split_size"] == length - 1
    assert ev["loss"] == pytest.approx(bigram_loss(model, stream, length - 1), rel=1e-5)
    assert ev["ppl"] == pytest.approx(math.exp(ev["loss"]), rel=1e-12)


def test_a_cap_scores_the_first_whole_windows():
    stream = np.random.default_rng(1).integers(0, V, 103)
    model = Bigram(V)
    ev = wikitext(stream, 8, eval_max_tokens=44).evaluate(model, "validation", 3, "cpu")
    assert ev["scored"] == 40 and ev["split_size"] == 102  # 5 windows of 8: the cap is never exceeded
    assert ev["loss"] == pytest.approx(bigram_loss(model, stream, 40), rel=1e-5)
    # A cap at least the split's size is no cap: the tail is scored too.
    ev = wikitext(stream, 8, eval_max_tokens=102).evaluate(model, "validation", 3, "cpu")
    assert ev["scored"] == 102


def test_the_windows_tile_the_stream():
    # Inputs and targets of every window, concatenated, are the stream without its last and
    # without its first token: in order, nothing twice, nothing left out.
    stream = np.arange(53)
    task = wikitext(stream, 8)
    windows = [*task.eval_blocks("validation", None), *task.eval_tail("validation", None)]
    inputs = np.concatenate([w[:-1].numpy() for w in windows])
    targets = np.concatenate([w[1:].numpy() for w in windows])
    assert np.array_equal(inputs, stream[:-1]) and np.array_equal(targets, stream[1:])
    assert all(len(w) == 9 for w in windows[:-1]) and len(windows[-1]) == 53 - 1 - 6 * 8 + 1


# --- MQAR ----------------------------------------------------------------------------------


class RecallOracle(nn.Module):
    """Reads each query's value from the context: right at every query position, and wrong
    (token 0, never a key or a value) everywhere else."""

    def __init__(self, vocab: int, pairs: int, wrong_at_queries: bool = False):
        super().__init__()
        self.vocab, self.pairs, self.wrong_at_queries = vocab, pairs, wrong_at_queries

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L = x.shape
        logits = torch.zeros(B, L, self.vocab)
        logits[..., 0] = 10.0
        keys, values = x[:, 0 : 2 * self.pairs : 2], x[:, 1 : 2 * self.pairs : 2]
        for b in range(B):
            for p in range(2 * self.pairs, L):
                hit = (keys[b] == x[b, p]).nonzero()
                if len(hit):
                    answer = values[b, hit[0, 0]]
                    logits[b, p, (answer + 1) % self.vocab if self.wrong_at_queries else answer] = 20.0
        return logits

    def logits_at(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self(x)[mask]


def mqar(vocab=32, seq_len=24, pairs=3, n=40, random_non_queries=False) -> MQAR:
    task = MQAR.__new__(MQAR)
    task.settings = MQARSettings(vocab_size=vocab, seq_len=seq_len, num_kv_pairs=pairs)
    x, y = multiquery_ar(vocab, n, seq_len, pairs, random_non_queries=random_non_queries, seed=5)
    task.arrays = {"test": (torch.from_numpy(x), torch.from_numpy(y))}
    return task


@pytest.mark.parametrize("random_non_queries", [False, True])
def test_mqar_scores_only_the_query_positions(random_non_queries):
    task = mqar(random_non_queries=random_non_queries)
    ev = task.evaluate(RecallOracle(32, 3), "test", 7, "cpu")
    queries = int((task.arrays["test"][1] != -100).sum())
    assert queries == 40 * 3
    assert ev["accuracy"] == 1.0 and ev["scored"] == ev["split_size"] == queries
    assert ev["loss"] < 1e-3
    table = ev["breakdown"]["query_distance"]
    assert sum(s for _, s in table.values()) == queries and all(c == s for c, s in table.values())
    # The same oracle off by one at each query scores nothing, wherever else it is right.
    wrong = task.evaluate(RecallOracle(32, 3, wrong_at_queries=True), "test", 7, "cpu")
    assert wrong["accuracy"] == 0.0 and wrong["scored"] == queries


def test_mqar_evaluation_caps_whole_examples():
    task = mqar()
    ev = task.evaluate(RecallOracle(32, 3), "test", 8, "cpu", max_batches=2)
    assert ev["scored"] == 16 * 3 and ev["split_size"] == 40 * 3
