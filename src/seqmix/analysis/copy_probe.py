"""Copy probe: can a mixer move token t-1's identity to position t?

MQAR recall (Arora et al. 2024, arXiv:2312.04927) needs a token-pair interaction: a query
must find the key that matches it and read the value that follows it. The smallest such
interaction is copying the previous token. A mixer that cannot learn to copy it has none to
recall with, and this gives a measured reason for a mixer that ends MQAR below informed
chance (ToST's TSSA, whose attention over a sequence does not depend on token pairs).

For each architecture a fresh causal LM, built as the MQAR task of ``analysis.copy_probe.task``
builds its models (its n_layers, d_ff_mult, dropout, block and positions resolved for that
architecture, tie_embeddings and mixer options; the probe's own d_model), trains on uniform
random tokens over ``vocab_size`` of length ``seq_len``, drawn afresh each step, to predict at
position t the input token at t-lag (positions before ``lag`` are unscored), once per lag of
``analysis.copy_probe.lags`` (default: 1, the previous token; a lag other than 1 only for mixers
whose reach is finite, which it tests). A lag beyond a mixer's reach
(the positions its output can read, e.g. Grassmann's n_layers x its largest offset) asks for a
token the model cannot see: there it scores chance, within reach it shows it can copy at all
(claim grassmann-recall-reach). The optimiser is the project's:
AdamW (the task's weight decay and betas), linear warm-up then cosine to the task's floor,
gradient clipping at the task's ``grad_clip``. After training it is scored on
``eval_sequences`` held-out sequences drawn from a generator of their own.

Rows (``CopyProbeRow``), one per architecture, of copy_probe.csv:
  arch         the mixer
  d_model      width of the probe model
  n_layers     its blocks (the MQAR task's)
  seq_len      tokens per sequence
  vocab_size   tokens are uniform over it
  steps        training steps
  batch_size   sequences per step
  lr           peak learning rate
  seed         seed of the model's initialisation and the training tokens (held-out tokens: their own)
  lag          the token copied lies this many positions back (1: the previous token)
  reach        how many positions back the model's output can read (models/blocks.py stack_reach);
               empty: every earlier position
  scored       held-out positions scored: eval_sequences x (L - lag)
  accuracy     held-out fraction of scored positions (lag..L-1) whose argmax is the token lag back
  loss         held-out mean cross-entropy over those positions (nats)
  chance       1 / vocab_size, the accuracy of guessing
  seconds      wall time of training and scoring this architecture
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch
import torch.nn.functional as F

from seqmix.device import resolve_device
from seqmix.io import write_rows
from seqmix.mixers import dispatch
from seqmix.models.blocks import stack_reach
from seqmix.models.lm import CausalLM, LMConfig
from seqmix.study.jobs import CopyProbeJob
from seqmix.train.step import lr_lambda, make_optimizer, optimizer_step


class CopyProbeRow(TypedDict):
    """One row of copy_probe.csv: one architecture's probe (columns: the module docstring)."""

    arch: str
    d_model: int
    n_layers: int
    seq_len: int
    vocab_size: int
    steps: int
    batch_size: int
    lr: float
    seed: int
    lag: int
    reach: int | None
    scored: int
    accuracy: float
    loss: float
    chance: float
    seconds: float


def copy_batch(tokens: torch.Tensor, lag: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of the copy task: the label at t is the input at t-lag; positions
    before ``lag`` have none (-100, ignored by the loss)."""
    labels = torch.full_like(tokens, -100)
    labels[:, lag:] = tokens[:, :-lag]
    return tokens, labels


def random_tokens(n: int, seq_len: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab_size, (n, seq_len), generator=generator)


def _generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Independent generators of the training and held-out tokens of ``seed``."""
    train_seed, eval_seed = np.random.SeedSequence([seed, 0x636F7079]).generate_state(2)
    return torch.Generator().manual_seed(int(train_seed)), torch.Generator().manual_seed(int(eval_seed))


def build_model(job: CopyProbeJob, arch: str) -> CausalLM:
    """The probe's model of ``arch``: the MQAR task's model at the probe's width and length."""
    m, probe = job.model, job.copy_probe
    return CausalLM(LMConfig(
        arch=arch, vocab_size=probe.vocab_size, max_len=probe.seq_len, d_model=m.d_model, n_layers=m.n_layers,
        d_ff_mult=m.d_ff_mult, dropout=m.dropout, block=m.block_for(arch), tie_embeddings=m.tie_embeddings,
        positions=m.positions_for(arch), mixer_options=dict(job.mixers.get(arch, {}))))


@torch.no_grad()
def score(model: CausalLM, tokens: torch.Tensor, batch_size: int, device: torch.device,
          lag: int = 1) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of copying the token ``lag`` back over ``tokens``."""
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for chunk in tokens.split(batch_size):
        x, y = (t.to(device) for t in copy_batch(chunk, lag))
        logits, y = model(x)[:, lag:], y[:, lag:]
        loss_sum += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        total += y.numel()
    return correct / total, loss_sum / total


def probe(job: CopyProbeJob, arch: str, device: torch.device | None = None, lag: int = 1) -> CopyProbeRow:
    """Train ``arch``'s probe model to copy the token ``lag`` back and score it held out."""
    probe, train = job.copy_probe, job.train
    device = device or resolve_device(train.device)
    start = time.perf_counter()
    train_gen, eval_gen = _generators(probe.seed)
    torch.manual_seed(probe.seed)
    model = build_model(job, arch).to(device)
    opt = make_optimizer(model, train)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(train))
    model.train()
    for _ in range(train.steps):
        batch = tuple(t.to(device) for t in copy_batch(random_tokens(train.batch_size, probe.seq_len, probe.vocab_size, train_gen), lag))
        optimizer_step(lambda b: model.loss(*b), model, opt, train.grad_clip, batch)  # training's own step
        sched.step()
    held_out = random_tokens(probe.eval_sequences, probe.seq_len, probe.vocab_size, eval_gen)
    accuracy, loss = score(model, held_out, train.batch_size, device, lag)
    return CopyProbeRow(
        arch=arch, d_model=job.model.d_model, n_layers=job.model.n_layers, seq_len=probe.seq_len,
        vocab_size=probe.vocab_size, steps=train.steps, batch_size=train.batch_size, lr=train.lr, seed=probe.seed,
        lag=lag, reach=stack_reach(model.blocks), scored=held_out.shape[0] * (probe.seq_len - lag), accuracy=accuracy, loss=loss, chance=1 / probe.vocab_size,
        seconds=round(time.perf_counter() - start, 2))


def lags_of(job: CopyProbeJob, arch: str) -> list[int]:
    """The lags ``arch`` is probed at: 1 (the previous token, every mixer) and the others
    only where its reach is finite, which they test; a mixer that reads every earlier
    position has no reach for them to test."""
    lags = job.copy_probe.lags
    if lags == [1] or stack_reach(build_model(job, arch).blocks) is not None:
        return list(lags)
    return [lag for lag in lags if lag == 1]


def write_copy_probe(job: CopyProbeJob, out: Path, threads: int | None = None, progress: bool = True) -> int:
    """copy_probe.csv of every architecture of ``job``; returns the row count."""
    if threads:
        torch.set_num_threads(threads)
    rows = []
    with dispatch.using("reference" if job.train.reference_mixers else None):
        for arch in job.architectures:
            for lag in lags_of(job, arch):
                rows.append(probe(job, arch, lag=lag))
                if progress:
                    r = rows[-1]
                    print(f"{arch} (lag {lag}): accuracy {r['accuracy']:.3f} (chance {r['chance']:.4f}), "
                          f"loss {r['loss']:.3f}, {r['seconds']:.0f} s", flush=True)
    write_rows(out, rows, CopyProbeRow)
    return len(rows)
