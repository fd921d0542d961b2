"""`python -m seqmix eval`: score a finished run's model on its evaluation and test splits
(whole splits unless the task's settings cap them; the cap is recorded) into eval.json.

A run directory whose files are missing, truncated or corrupted fails with FileError naming
the file and how to make it again (train the run again), before anything is scored."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from pydantic import ValidationError

from seqmix.device import resolve_device
from seqmix.io import FileError, read_json, write_json
from seqmix.study.jobs import TrainJob
from seqmix.tasks import make_task
from seqmix.tasks.base import Task
from seqmix.train import checkpoint


def retrain_fix(run_dir: str | Path) -> str:
    return (f"train the run again: delete {run_dir} and rerun the DAG, or run `python -m seqmix train` "
            "with its spec")


def run_spec_of(run_dir: str | Path) -> TrainJob:
    """The spec a run directory was trained with (its config.json)."""
    path = Path(run_dir) / "config.json"
    recorded = read_json(path, fix=retrain_fix(run_dir))
    try:
        return TrainJob.model_validate({k: v for k, v in recorded.items() if k in TrainJob.model_fields})
    except (ValidationError, AttributeError) as e:
        raise FileError(f"{path} is not a run's config ({str(e).splitlines()[0]}); {retrain_fix(run_dir)}") from None


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, Task, TrainJob]:
    """The trained model of a run directory, its task and its spec."""
    run_dir = Path(run_dir)
    spec = run_spec_of(run_dir)
    task = make_task(spec)
    size = read_json(run_dir / "config.json")["resolved_size"]
    model = task.build_model(size["d_model"], size["n_layers"], size.get("d_ff_mult"))
    path = run_dir / "model.pt"
    try:
        state = checkpoint.load(path, keys=("model",))["model"]
    except (checkpoint.CorruptCheckpoint, FileNotFoundError) as e:
        raise FileError(f"{e}; {retrain_fix(run_dir)}") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # weights of another model (the message lists the keys)
        raise FileError(f"{path} does not hold this run's model ({str(e).splitlines()[0]}); "
                        f"{retrain_fix(run_dir)}") from None
    return model.to(device).eval(), task, spec


def evaluate_run(run_dir: str | Path, device: str = "auto") -> dict:
    run_dir = Path(run_dir)
    metrics = read_json(run_dir / "metrics.json", fix=retrain_fix(run_dir))
    missing = [k for k in ("task", "arch", "seed", "status", "metric") if not isinstance(metrics, dict) or k not in metrics]
    if missing:
        raise FileError(f"{run_dir / 'metrics.json'} is not a run's metrics (no {', '.join(missing)}); "
                        f"{retrain_fix(run_dir)}")
    out = {"task": metrics["task"], "arch": metrics["arch"], "seed": metrics["seed"],
           "status": metrics["status"], "metric": metrics["metric"], "splits": {}}
    if metrics["status"] != "ok":
        # A diverged model has nothing to score; the DAG goes on with NaN.
        write_json(run_dir / "eval.json", out)
        return out
    dev = resolve_device(device)
    model, task, spec = load_run(run_dir, dev)
    if spec.train.threads:
        torch.set_num_threads(spec.train.threads)
    started = time.time()
    for split in (task.eval_split, task.test_split):
        ev = task.evaluate(model, split, spec.train.batch_size, dev, max_batches=None)
        out["splits"][split] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in ev.items()}
    out["eval_time_s"] = time.time() - started
    write_json(run_dir / "eval.json", out)
    return out
