"""`python -m seqmix eval`: score a finished run's model on its evaluation and test splits
(whole splits unless the config caps them; the cap is recorded) into eval.json."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from seqmix.train import checkpoint
from seqmix.train.loop import eval_splits, resolve_device, write_json
from seqmix.train.tasks import Task, make_task


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, Task, dict]:
    """The trained model of a run directory, its task and its spec."""
    run_dir = Path(run_dir)
    spec = json.loads((run_dir / "config.json").read_text())
    task = make_task(spec)
    size = spec["resolved_size"]
    model = task.build_model(size["d_model"], size["n_layers"])
    model.load_state_dict(checkpoint.load(run_dir / "model.pt")["model"])
    return model.to(device).eval(), task, spec


def evaluate_run(run_dir: str | Path, device: str = "auto") -> dict:
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    out = {"task": metrics["task"], "arch": metrics["arch"], "seed": metrics["seed"],
           "status": metrics["status"], "metric": metrics["metric"], "splits": {}}
    if metrics["status"] != "ok":
        # A diverged model has nothing to score; the DAG goes on with NaN.
        write_json(run_dir / "eval.json", out)
        return out
    dev = resolve_device(device)
    model, task, spec = load_run(run_dir, dev)
    if spec["train"]["threads"]:
        torch.set_num_threads(spec["train"]["threads"])
    batch = spec["train"]["batch_size"]
    max_tokens = task.cfg.get("eval_max_tokens")
    started = time.time()
    for split in eval_splits(task):
        ev = task.evaluate(model, split, batch, dev, max_batches=None, max_tokens=max_tokens)
        ev = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in ev.items()}
        out["splits"][split] = ev
    out["eval_time_s"] = time.time() - started
    write_json(run_dir / "eval.json", out)
    return out
