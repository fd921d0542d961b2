"""Cost in practice: training tokens/s of every causal mixer's language model, side by side
with softmax attention, on the machine at hand.

``python -m seqmix throughput [--config …] [--out results/analysis/throughput.csv]``

For every length L of ``analysis.throughput`` and every causal architecture (softmax is
always added: it is the baseline), a ``CausalLM`` of the configured width, depth,
feed-forward and vocabulary is built with its AdamW optimiser and trained on random tokens
with the next-token loss at every position, ``tokens_per_batch // L`` sequences per batch.
After ``warmup`` steps per model, ``repeats`` rounds follow; in each round every
(length, architecture) in turn takes one untimed step and then times ``steps`` training
steps (forward, backward, optimiser), so that whatever else loads the machine during a
round loads every architecture alike. A round's ratio to softmax is the two tokens/s of that round; the table reports the
median over rounds of the tokens/s and of the ratio. Threads: ``threads`` (1 by default,
so that the numbers are per core and do not depend on what else runs beside the job).

``results/analysis/throughput.csv``, one row per (arch, seq_len); columns:

    arch                 catalogued mixer name (causal mixers only)
    device, device_name  cpu | cuda and the CPU or GPU model
    threads              torch CPU threads during the measurement
    d_model, n_layers, d_ff_mult, vocab_size   the model
    seq_len, batch       L and sequences per batch (batch · L tokens per step)
    params               the model's parameter count
    repeats, steps       rounds, and training steps timed per round
    step_ms              median wall time of one training step (milliseconds)
    tokens_per_s         median over rounds of batch · L · steps / (time of the round's steps)
    tokens_per_s_min, tokens_per_s_max   the range over rounds
    ratio_to_softmax     median over rounds of tokens_per_s / softmax's tokens_per_s of
                         the same round and length (> 1: faster than softmax)
    implementation       the dispatch setting (seqmix.mixers.dispatch: auto | reference)
    fast_paths           the path each mixer fast path took, e.g. "mamba: fused_cpu"; "none"
                         for a model without one (softmax's SDPA is PyTorch's own)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from seqmix import catalogue, mixers
from seqmix.device import resolve_device
from seqmix.io import write_csv
from seqmix.mixers import dispatch
from seqmix.models.lm import CausalLM, LMConfig
from seqmix.study.settings import ThroughputSettings
from seqmix.train.provenance import device_record

FIELDS = ["arch", "device", "device_name", "threads", "d_model", "n_layers", "d_ff_mult", "vocab_size",
          "seq_len", "batch", "params", "repeats", "steps", "step_ms", "tokens_per_s",
          "tokens_per_s_min", "tokens_per_s_max", "ratio_to_softmax", "implementation", "fast_paths"]
BASELINE = catalogue.BASELINE


def causal_architectures(archs: list[str]) -> list[str]:
    """The causal ones among ``archs``, softmax first (added when missing), in catalogue order."""
    causal = [m.name for m in catalogue.MIXERS if mixers.mixer_class(m.name).supports_causal]
    chosen = set(archs) | {BASELINE}
    return [BASELINE] + [a for a in causal if a in chosen and a != BASELINE]


def training_step(arch: str, seq_len: int, settings: ThroughputSettings, options: dict,
                  device: torch.device) -> tuple[Callable[[], None], int, int]:
    """A closure running one training step of ``arch``'s LM on a fixed random batch, the
    batch size and the parameter count. Seeded, so every run times the same model."""
    torch.manual_seed(0)
    cfg = LMConfig(arch=arch, vocab_size=settings.vocab_size, max_len=seq_len, d_model=settings.d_model,
                   n_layers=settings.n_layers, d_ff_mult=settings.d_ff_mult, dropout=settings.dropout,
                   block=catalogue.mixer_entry(arch).block if settings.block == "native" else settings.block,
                   mixer_options=options)
    model = CausalLM(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = max(1, settings.tokens_per_batch // seq_len)
    tokens = torch.randint(0, settings.vocab_size, (batch, seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch, sum(p.numel() for p in model.parameters())


def _seconds(step: Callable[[], None], n: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def measure_rounds(archs: list[str], settings: ThroughputSettings, mixer_options: dict, device: torch.device,
                   progress: bool = True) -> tuple[dict, dict, dict]:
    """Seconds of ``settings.steps`` steps per (arch, L) in every round, interleaved: round r times
    every (L, arch) once before round r + 1 starts. Returns ({(arch, L): [s, …]}, {(arch, L):
    (batch, params)}, {(arch, L): the dispatch record of its last untimed step})."""
    steps, shapes, paths = {}, {}, {}
    for L in settings.lengths:
        for arch in archs:
            step, batch, params = training_step(arch, L, settings, mixer_options.get(arch, {}), device)
            _seconds(step, settings.warmup, device)
            steps[arch, L], shapes[arch, L] = step, (batch, params)
    seconds: dict = {key: [] for key in steps}
    bar = tqdm(total=settings.repeats * len(steps), desc="throughput", disable=not progress)
    for _ in range(settings.repeats):
        for key, step in steps.items():
            # One untimed step first, so that the timed ones do not pay for what the models
            # timed before left behind (cold caches, memory to map again): with one timed
            # step and none untimed, ToST's unchanged code measured 0.60× and 1.87× softmax
            # at L = 1024 in two runs.
            with dispatch.using() as paths[key]:  # a fallback happens at a first call, never timed
                step()
            seconds[key].append(_seconds(step, settings.steps, device))
            bar.update()
    bar.close()
    return seconds, shapes, paths


def throughput_rows(archs: list[str], settings: ThroughputSettings, mixer_options: dict,
                    progress: bool = True) -> list[dict]:
    """One row per (arch, L) as the module docstring describes."""
    device = resolve_device(settings.device, "analysis.throughput.device")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        archs = causal_architectures(archs)
        seconds, shapes, paths = measure_rounds(archs, settings, mixer_options, device, progress)
        rec = device_record(device)
    finally:
        torch.set_num_threads(previous_threads)
    rows = []
    for (arch, L), secs in seconds.items():
        batch, params = shapes[arch, L]
        tokens = batch * L * settings.steps
        rates = [tokens / s for s in secs]
        base = [tokens / s for s in seconds[BASELINE, L]]
        rows.append({
            "arch": arch, "device": device.type, "device_name": rec["name"], "threads": settings.threads,
            "d_model": settings.d_model, "n_layers": settings.n_layers, "d_ff_mult": settings.d_ff_mult,
            "vocab_size": settings.vocab_size, "seq_len": L, "batch": batch, "params": params,
            "repeats": settings.repeats, "steps": settings.steps,
            "step_ms": statistics.median(secs) / settings.steps * 1e3,
            "tokens_per_s": statistics.median(rates), "tokens_per_s_min": min(rates),
            "tokens_per_s_max": max(rates),
            "ratio_to_softmax": statistics.median(r / b for r, b in zip(rates, base)),
            "implementation": paths[arch, L].setting,
            "fast_paths": ", ".join(f"{k}: {v}" for k, v in paths[arch, L].taken().items()) or "none",
        })
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as a plain-text table: tokens/s and the ratio to softmax per length."""
    lengths = sorted({r["seq_len"] for r in rows})
    by = {(r["arch"], r["seq_len"]): r for r in rows}
    head = f"{'arch':<16}" + "".join(f"{f'L={L} tok/s':>16}{'x softmax':>11}" for L in lengths)
    lines = [head]
    for arch in dict.fromkeys(r["arch"] for r in rows):
        cells = "".join(f"{by[arch, L]['tokens_per_s']:>16,.0f}{by[arch, L]['ratio_to_softmax']:>11.2f}"
                        for L in lengths if (arch, L) in by)
        lines.append(f"{arch:<16}{cells}")
    first = rows[0]
    lines.append(f"({first['device_name']}, {first['threads']} thread(s), d_model {first['d_model']}, "
                 f"{first['n_layers']} layers, d_ff_mult {first['d_ff_mult']}, V {first['vocab_size']}; "
                 f"median of {first['repeats']} interleaved rounds of {first['steps']} steps)")
    return "\n".join(lines)


def write_throughput(archs: list[str], settings: ThroughputSettings, mixer_options: dict, out,
                     progress: bool = True) -> list[dict]:
    rows = throughput_rows(archs, settings, mixer_options, progress)
    write_csv(out, rows, FIELDS)
    return rows
