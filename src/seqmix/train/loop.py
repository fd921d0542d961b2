"""`python -m seqmix train`: one (task, architecture, seed) run.

Seeded; AdamW with linear warmup and cosine decay; gradient clipping; periodic evaluation;
an atomic checkpoint every N steps and automatic resume from it; a run directory with
metrics.json, log.csv, config.json, provenance.json and model.pt. A run whose loss becomes
NaN or infinite is recorded as diverged (status "diverged") and exits cleanly so the DAG
goes on.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from seqmix.mixers.base import force_reference
from seqmix.models.budget import solve_budget
from seqmix.train import checkpoint
from seqmix.train.provenance import provenance
from seqmix.train.tasks import Task, make_task

LOG_FIELDS = ["step", "phase", "loss", "metric", "metric_value", "lr", "grad_norm", "seen", "elapsed_s"]
CHECKPOINT = Path("checkpoints") / "last.pt"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config key 'train.device' is 'cuda' but no GPU is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def spec_hash(spec: dict) -> str:
    """Identity of a run's settings; a checkpoint from other settings is not resumed."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def lr_lambda(tcfg: dict):
    warmup, total, floor = tcfg["warmup_steps"], tcfg["steps"], tcfg["min_lr_ratio"]

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def make_optimizer(model: torch.nn.Module, tcfg: dict) -> torch.optim.AdamW:
    # Decay matrices only (nanoGPT): not biases, norms, embeddings' positions, nor the
    # parameters a mixer names in no_weight_decay() (Mamba's A_log and D, ToST's temp).
    no_decay = set()
    for mod_name, module in model.named_modules():
        if hasattr(module, "no_weight_decay") and callable(module.no_weight_decay):
            no_decay |= {f"{mod_name}.{n}" if mod_name else n for n in module.no_weight_decay()}
    decay, other, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and name not in no_decay else other).append(p)
    groups = [{"params": decay, "weight_decay": tcfg["weight_decay"]}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg["lr"], betas=tuple(tcfg["betas"]))


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def eval_splits(task: Task) -> tuple[str, str]:
    """(periodic-evaluation split, final test split)."""
    cfg = task.cfg
    return cfg.get("eval_split", "validation"), cfg.get("test_split", "test")


def write_log(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LOG_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def build_for_spec(spec: dict, task: Task) -> tuple[torch.nn.Module, dict]:
    """The model of a run, sized by its budget; returns (model, size record)."""
    m = spec["model"]
    d, n, params = solve_budget(task.build_model, d_model=m["d_model"], n_layers=m["n_layers"], **m["budget"])
    torch.manual_seed(spec["seed"])
    model = task.build_model(d, n)
    return model, {"d_model": d, "n_layers": n, "params": params, "budget": m["budget"]}


def train(spec: dict, progress: bool = True) -> dict:
    run_dir = Path(spec["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    tcfg = spec["train"]
    if tcfg["threads"]:
        torch.set_num_threads(tcfg["threads"])
    force_reference(tcfg["reference_mixers"])
    device = resolve_device(tcfg["device"])
    task = make_task(spec)  # checks every data file against its manifest first
    model, size = build_for_spec(spec, task)
    model.to(device)
    opt = make_optimizer(model, tcfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tcfg))
    identity = spec_hash(spec)
    state = {"step": 0, "log": [], "best": None, "elapsed": 0.0, "resumed_from": [], "seen": 0}

    ckpt_path = run_dir / CHECKPOINT
    if ckpt_path.exists():
        ckpt = checkpoint.load(ckpt_path)
        if ckpt["spec_hash"] == identity:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["scheduler"])
            checkpoint.set_rng_state(ckpt["rng"])
            state = ckpt["state"]
            state["resumed_from"].append(state["step"])
            print(f"resuming {run_dir} from step {state['step']}", file=sys.stderr)
        else:
            print(f"ignoring {ckpt_path}: written with other settings", file=sys.stderr)
    else:
        torch.manual_seed(spec["seed"] + 1)  # dropout stream, independent of init

    write_json(run_dir / "config.json", {**spec, "resolved_size": size, "spec_hash": identity})
    eval_split, _ = eval_splits(task)
    started = time.time() - state["elapsed"]
    status, diverged_at = "ok", None
    bar = tqdm(total=tcfg["steps"], initial=state["step"], desc=f"{spec['task']}/{spec['arch']}/seed{spec['seed']}",
               disable=not progress, mininterval=2.0, file=sys.stderr)
    recent = []
    while state["step"] < tcfg["steps"]:
        model.train()
        batch = task.train_batch(state["step"], tcfg["batch_size"], device)
        with _autocast(device, tcfg["precision"]):
            loss = task.loss(model, batch)
        if not torch.isfinite(loss):
            status, diverged_at = "diverged", state["step"]
            print(f"loss is {loss.item()} at step {state['step']}: recording the run as diverged", file=sys.stderr)
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"] or float("inf"))
        opt.step()
        sched.step()
        state["step"] += 1
        state["seen"] += int(batch[0].numel()) if spec["task"] != "snli" else len(batch[-1])
        recent = (recent + [loss.item()])[-tcfg["log_every"]:]
        step = state["step"]
        bar.update(1)
        if step % tcfg["log_every"] == 0 or step == tcfg["steps"]:
            state["log"].append(_row(step, "train", sum(recent) / len(recent), None, None,
                                     sched.get_last_lr()[0], float(grad_norm), state["seen"], time.time() - started))
            bar.set_postfix(loss=f"{state['log'][-1]['loss']:.3f}")
        if step % tcfg["eval_every"] == 0 or step == tcfg["steps"]:
            model.eval()
            ev = task.evaluate(model, eval_split, tcfg["batch_size"], device, max_batches=tcfg["eval_batches"])
            state["log"].append(_row(step, "eval", ev["loss"], task.metric, ev[task.metric], None, None,
                                     state["seen"], time.time() - started))
            best = state["best"]
            if best is None or (ev[task.metric] > best[task.metric] if task.higher_is_better
                                else ev[task.metric] < best[task.metric]):
                state["best"] = {**ev, "step": step}
            state["last_eval"] = {**ev, "step": step}
        if step % tcfg["checkpoint_every"] == 0 and step < tcfg["steps"]:
            state["elapsed"] = time.time() - started
            checkpoint.save_atomic({
                "spec_hash": identity, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(), "state": state,
            }, ckpt_path)
    bar.close()

    wall = time.time() - started
    checkpoint.save_atomic({"model": model.state_dict(), "size": size}, run_dir / "model.pt")
    write_log(run_dir / "log.csv", state["log"])
    metrics = {
        "status": status,
        "profile": spec["profile"],
        "task": spec["task"],
        "arch": spec["arch"],
        "seed": spec["seed"],
        **size,
        "metric": task.metric,
        "higher_is_better": task.higher_is_better,
        "steps_planned": tcfg["steps"],
        "steps_completed": state["step"],
        "diverged_at_step": diverged_at,
        "seen": state["seen"],
        "seen_unit": "sentence pairs" if spec["task"] == "snli" else "tokens",
        "eval_split": eval_split,
        "eval_batches": tcfg["eval_batches"],
        "last_eval": state.get("last_eval"),
        "best_eval": state["best"],
        "train_loss_last": state["log"][-1]["loss"] if state["log"] else None,
        "wall_time_s": wall,
        "resumed_from_steps": state["resumed_from"],
        "device": device.type,
        "data": task.data_record(),
    }
    write_json(run_dir / "provenance.json", provenance(device, seed=spec["seed"], wall_time_s=wall))
    write_json(run_dir / "metrics.json", metrics)
    if ckpt_path.exists():
        ckpt_path.unlink()  # the run is complete; model.pt holds the result
    return metrics


def _row(step, phase, loss, metric, value, lr, grad_norm, seen, elapsed) -> dict:
    return {"step": step, "phase": phase, "loss": loss, "metric": metric, "metric_value": value,
            "lr": lr, "grad_norm": grad_norm, "seen": seen, "elapsed_s": round(elapsed, 3)}
