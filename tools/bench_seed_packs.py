"""What training the seeds of one MQAR sweep point together costs against one seed alone.

For every mixer of the quick profile's MQAR sweep, at each of its widths (batch 128, L 48,
V 64, 8 pairs, 2 layers, one thread), this times a training step (forward, backward, AdamW)
of one seed alone and of three seeds as one vectorised model (``torch.func.stack_module_state``
+ ``functional_call`` + ``vmap``, every seed its own weights and batch), interleaved in one
process so that the machine's load falls on both alike, and prints the ratio. A ratio below 3
is what packing seeds would save; a mixer whose step cannot be vmapped is named with the
reason (its seeds could only run one after another: a ratio of 3, nothing saved).

    python tools/bench_seed_packs.py --data data/mqar/V64-L48-kv8 [--markdown docs/seed-packs.md]

The vectorised loss scores every position and drops the unscored ones through
cross_entropy's ignore_index (the model's own loss selects the query positions with a
boolean mask, a data-dependent shape vmap cannot batch): the same loss up to float rounding.
"""

from __future__ import annotations

import argparse
import copy
import platform
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from seqmix.config import load_config
from seqmix.spec import RunSpec
from seqmix.study import job_table
from seqmix.tasks import make_task
from seqmix.train.loop import build_for_spec, make_optimizer
from seqmix.train.provenance import cpu_name

SEEDS = 3


def dense_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=-100)


class DenseLoss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return dense_loss(self.model, x, y)


def steppers(spec: RunSpec):
    """(one seed's step, three seeds' vectorised step), each taking the step index."""
    task = make_task(spec)
    specs = [spec.model_copy(update={"seed": s}) for s in range(SEEDS)]
    models = [build_for_spec(s, task)[0] for s in specs]
    alone, opt = models[0], make_optimizer(models[0], spec.train)
    params, buffers = stack_module_state(models)
    pack_opt = torch.optim.AdamW(list(params.values()), lr=spec.train.lr, betas=tuple(spec.train.betas))
    base = DenseLoss(copy.deepcopy(models[0]))

    def one(p, b, x, y):
        return functional_call(base, ({f"model.{k}": v for k, v in p.items()}, {f"model.{k}": v for k, v in b.items()}),
                               (x, y))

    batched = vmap(one, randomness="error")
    batch = spec.train.batch_size

    def step_alone(step: int) -> None:
        loss = task.loss(alone, task.train_batch(step, batch, "cpu"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(alone.parameters(), spec.train.grad_clip)
        opt.step()

    def step_pack(step: int) -> None:
        xs, ys = zip(*(task.train_batch(step, batch, "cpu") for _ in range(SEEDS)))
        losses = batched(params, buffers, torch.stack(xs), torch.stack(ys))
        pack_opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        pack_opt.step()

    return step_alone, step_pack


def measure(spec: RunSpec, steps: int) -> dict:
    step_alone, step_pack = steppers(spec)
    step_alone(0)
    try:
        step_pack(0)
        variants = (("alone", step_alone), ("pack", step_pack))
        note = ""
    except Exception as err:  # noqa: BLE001 - the reason is the result
        variants = (("alone", step_alone),)
        note = f"cannot be vmapped: {str(err).splitlines()[0][:110]}"
    spent = {"alone": 0.0, "pack": None}
    for i in range(1, steps + 1):  # interleaved: the load of the moment falls on both
        for name, fn in variants:
            t = time.perf_counter()
            fn(i)
            spent[name] = (spent[name] or 0.0) + time.perf_counter() - t
    pack = spent["pack"]
    return {"alone_ms": 1000 * spent["alone"] / steps, "pack_ms": None if pack is None else 1000 * pack / steps,
            "ratio": None if pack is None else pack / spent["alone"], "note": note}


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
    p.add_argument("--task", default="mqar/V64-L48-kv8", help="the swept MQAR task (its group)")
    p.add_argument("--data", type=Path, required=True, help="its prepared data directory")
    p.add_argument("--steps", type=int, default=4, help="timed steps of each variant, after one untimed")
    p.add_argument("--archs", default=None, help="comma-separated mixers (default: the task's)")
    p.add_argument("--markdown", type=Path, default=None, help="write the table here, headed by commit and machine")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    table = job_table(load_config(a.config))["runs"]
    first_seed = min(r["seed"] for r in table)
    wanted = a.archs.split(",") if a.archs else None
    rows = []
    for r in table:
        if not r["task"].startswith(a.task + "/") or r["seed"] != first_seed or (wanted and r["arch"] not in wanted):
            continue
        spec = RunSpec.model_validate_json(r["spec"]).model_copy(update={"data_dir": str(a.data)})
        row = {"arch": r["arch"], "d_model": spec.model.d_model, **measure(spec, a.steps)}
        rows.append(row)
        print(f"{row['arch']:>15} d {row['d_model']:>4}: 1 seed {fmt(row['alone_ms'])} ms, {SEEDS} seeds vmapped "
              f"{fmt(row['pack_ms'])} ms, ratio {fmt(row['ratio'])} {row['note']}", flush=True)
    if a.markdown:
        head = (f"<!-- generated by `python tools/bench_seed_packs.py --markdown {a.markdown}` -->\n"
                f"Measured at commit {commit()} on {cpu_name()} ({platform.node()}), one thread, {a.steps} "
                f"interleaved steps of each variant after one untimed, torch {torch.__version__}.\n\n")
        lines = ["| mixer | d | 1 seed, ms/step | 3 seeds vmapped, ms/step | ratio (3 together / 1 alone) | note |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['arch']} | {r['d_model']} | {fmt(r['alone_ms'], 0)} | {fmt(r['pack_ms'], 0)} | "
                         f"{fmt(r['ratio'])} | {r['note']} |")
        a.markdown.write_text(head + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
