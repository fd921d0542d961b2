"""What training the seeds of one MQAR sweep point together costs against one seed alone, and
what one training step of every run of the quick profile costs.

For every mixer of the quick profile's MQAR sweep, at each of its widths (batch 128, L 48,
V 64, 8 pairs, 2 layers, one thread), this times a training step (forward, backward, AdamW)
of one seed alone and of three seeds as one vectorised model (``torch.func.stack_module_state``
+ ``functional_call`` + ``vmap``, every seed its own weights and batch). A ratio below 3 is
what packing seeds would save; a mixer whose step cannot be vmapped is named with the reason
(its seeds could only run one after another: a ratio of 3, nothing saved). It also times one
step of every other task's runs (WikiText-2), alone, so that the table gives every run's
step cost relative to the others.

Every configuration is built first; then, round after round, each takes one step alone and
one packed, so that the machine's load falls on all of them alike. Step times are medians
over the rounds; the ratio is the median of each round's packed step over its step alone,
taken back to back.

    python tools/bench_seed_packs.py --data data [--markdown docs/investigations/seed-packs.md]

The vectorised loss scores every position and drops the unscored ones through
cross_entropy's ignore_index (the model's own loss selects the query positions with a
boolean mask, a data-dependent shape vmap cannot batch): the same loss up to float rounding.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from seqmix import numerics
from seqmix.expansion.table import expand, job_table
from seqmix.expansion.validate import load_study
from seqmix.study.jobs import TrainJob
from seqmix.tasks import make_task
from seqmix.train.loop import build_for_spec
from seqmix.train.step import make_optimizer

SEEDS = 3
BEGIN, END = "<!-- bench:", "<!-- bench: end -->"


class DenseLoss(torch.nn.Module):
    """The LM's loss over every position, the unscored ones dropped by ignore_index."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=-100)


class Case:
    """One run configuration: its step alone, and (where it vmaps) three seeds' step packed."""

    def __init__(self, spec: TrainJob, pack: bool):
        self.spec, self.task = spec, make_task(spec)
        models = [build_for_spec(spec.model_copy(update={"seed": s}), self.task)[0] for s in range(SEEDS)]
        self.alone, self.opt = models[0], make_optimizer(models[0], spec.train)
        self.spent = {"alone": [], "pack": []}
        self.note = ""
        self.packed = None
        if pack:
            params, buffers = stack_module_state(models)
            base = DenseLoss(copy.deepcopy(models[0]))

            def one(p, b, x, y):
                names = ({f"model.{k}": v for k, v in p.items()}, {f"model.{k}": v for k, v in b.items()})
                return functional_call(base, names, (x, y))

            self.packed = (vmap(one, randomness="error"), params, buffers,
                           torch.optim.AdamW(list(params.values()), lr=spec.train.lr, betas=tuple(spec.train.betas)))
        self.step_alone(0)
        if self.packed is not None:
            try:
                self.step_pack(0)
            except Exception as err:  # noqa: BLE001 - the reason is the result
                self.packed, self.note = None, f"cannot be vmapped: {str(err).splitlines()[0].split('. ')[0][:160]}"

    def step_alone(self, step: int) -> None:
        loss = self.task.loss(self.alone, self.task.train_batch(step, self.spec.train.batch_size, "cpu"))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.alone.parameters(), self.spec.train.grad_clip)
        self.opt.step()

    def step_pack(self, step: int) -> None:
        batched, params, buffers, opt = self.packed
        xs, ys = zip(*(self.task.train_batch(step, self.spec.train.batch_size, "cpu") for _ in range(SEEDS)))
        losses = batched(params, buffers, torch.stack(xs), torch.stack(ys))
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        opt.step()

    def round(self, step: int) -> None:
        for name, fn in (("alone", self.step_alone), ("pack", self.step_pack if self.packed else None)):
            if fn is not None:
                t = time.perf_counter()
                fn(step)
                self.spent[name].append(time.perf_counter() - t)

    def row(self) -> dict:
        alone, pack = self.spent["alone"], self.spent["pack"]
        return {"task": self.spec.group, "arch": self.spec.arch, "d_model": self.alone.cfg.d_model,
                "alone_ms": 1000 * statistics.median(alone), "pack_ms": 1000 * statistics.median(pack) if pack else None,
                # each round's two steps ran back to back: their ratio is what the load of the moment spares
                "ratio": statistics.median(p / a for p, a in zip(pack, alone)) if pack else None, "note": self.note}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--packed", default="mqar/V64-L48-kv8", help="the swept task whose seeds would be packed")
    p.add_argument("--data", type=Path, required=True, help="the study's prepared data directory (python -m seqmix data)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, after one untimed step of each")
    p.add_argument("--archs", default=None, help="comma-separated mixers (default: every one)")
    p.add_argument("--markdown", type=Path, default=None,
                   help="write the table (headed by commit and machine) between this file's markers, or as the file")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    runs = job_table(expand(load_study(a.config)))["runs"]
    first_seed = {}
    for r in runs:
        first_seed.setdefault((r["task"], r["arch"]), r)
    cases = []
    for (task, arch), r in first_seed.items():
        if a.archs and arch not in a.archs.split(","):
            continue
        spec = TrainJob.model_validate_json(r["spec"])
        spec = spec.model_copy(update={"data_dir": str(a.data / spec.group), "tokenizer_dir": str(a.data / "tokenizer")})
        cases.append(Case(spec, pack=spec.group == a.packed))
        print(f"built {task} {arch}", flush=True)
    for i in range(1, a.rounds + 1):  # round-robin: the load of the moment falls on every case
        for case in cases:
            case.round(i)
        print(f"round {i} of {a.rounds}", flush=True)
    rows = [c.row() for c in cases]
    for r in rows:
        print(f"{r['task']:>20} {r['arch']:>15} d {r['d_model']:>4}: 1 seed {fmt(r['alone_ms'])} ms, {SEEDS} seeds vmapped "
              f"{fmt(r['pack_ms'])} ms, ratio {fmt(r['ratio'])} {r['note']}", flush=True)
    if a.markdown:
        head = (f"{BEGIN} generated by `python tools/bench_seed_packs.py --data <data> --markdown {a.markdown}` -->\n"
                f"Measured at commit {commit()} on {numerics.cpu_model()} ({platform.node()}), one thread, torch "
                f"{torch.__version__}: {a.rounds} rounds in which every configuration took one step alone and, "
                "for the MQAR sweep, one with three seeds vmapped. Step times are medians over the rounds; the ratio "
                "is the median over rounds of three seeds packed / one seed alone, back to back (3 saves nothing).\n\n")
        lines = ["| task | mixer | d | 1 seed, ms/step | 3 seeds vmapped, ms/step | ratio | note |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['task']} | {r['arch']} | {r['d_model']} | {fmt(r['alone_ms'], 0)} | {fmt(r['pack_ms'], 0)} | "
                         f"{fmt(r['ratio'])} | {r['note']} |")
        block = head + "\n".join(lines) + f"\n{END}\n"
        text = a.markdown.read_text() if a.markdown.exists() else ""
        if BEGIN in text and END in text:  # the narrative around the block stays
            block = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END) + 1:]
        a.markdown.write_text(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
