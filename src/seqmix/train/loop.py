"""`python -m seqmix train`: one (task, architecture, seed) run.

Seeded; AdamW with linear warmup and cosine decay; gradient clipping; periodic evaluation;
an atomic checkpoint every N steps and automatic resume from it; a run directory with
metrics.json, log.csv, config.json, provenance.json, hashes.json and model.pt. A run whose loss becomes
NaN or infinite is recorded as diverged (status "diverged") and exits cleanly so the DAG
goes on. The steps of a run are named functions: ``start`` (build, then resume or
initialise), ``train_step``, ``evaluate_now``, ``save_checkpoint`` and ``finish``.

What makes a rerun end exactly like an uninterrupted run:

- one process per run directory (``train.lock``, held for the whole job; a second
  ``train`` on the same run fails at once naming the holder);
- a checkpoint holds everything the loop depends on (weights, optimiser, schedule, RNG,
  the log and the train-loss window), and every fresh start (no checkpoint, one from other
  settings or other code, or an unreadable one, which is moved aside) seeds the dropout
  stream the same way;
- a checkpoint is the run's only when its identity (``run_identity``: the settings and the
  digest of the code that trains it) is this run's: an edited mixer trains from step 0;
- a finished run keeps ``checkpoints/final.pt`` (weights and log, no optimiser state): a
  job killed after its results were written (Snakemake then deletes them) writes them
  again from it instead of training again. Delete ``checkpoints/`` to reclaim the space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from seqmix import measure
from seqmix.device import resolve_device
from seqmix.errors import CodeChanged, ConfigError
from seqmix.io import exclusive_lock, remove_stale_temps, write_csv, write_json
from seqmix.measure import GIB
from seqmix.mixers import dispatch
from seqmix.models.blocks import stack_reach
from seqmix.models.budget import solve_budget
from seqmix.sources import Code, code_of, run_modules
from seqmix.study.jobs import TrainJob
from seqmix.study.settings import TrainSettings
from seqmix.tasks import make_task
from seqmix.tasks.base import Task
from seqmix.train import checkpoint
from seqmix.train.hashes import final_hashes, write_hashes
from seqmix.train.provenance import provenance
from seqmix.train.step import StepLoss, lr_lambda, make_optimizer, optimizer_step, step_loss

LOG_FIELDS = ["step", "phase", "loss", "metric", "metric_value", "lr", "grad_norm", "seen", "elapsed_s"]
CHECKPOINT = Path("checkpoints") / "last.pt"  # the latest state of a run in progress
FINAL = Path("checkpoints") / "final.pt"  # a finished run: what its results are written from
LOCK = "train.lock"
CHECKPOINT_KEYS = ("identity", "model", "optimizer", "scheduler", "rng", "state")
FINAL_KEYS = ("identity", "model", "state")


def check_precision(train: TrainSettings, device: torch.device) -> None:
    """bf16 autocast on a CPU is refused before step 1: it runs many times slower than fp32
    there (the paper profile's bf16 is meant for a GPU)."""
    if train.precision == "bf16" and device.type == "cpu":
        raise ConfigError("config key 'train.precision' is bf16 but this job runs on a CPU, where bf16 "
                          "autocast is many times slower than fp32; set train.precision: fp32 for a CPU run "
                          "(config/paper-smoke.yaml does), or run on a GPU")


def memory_problem(task: Task, model: torch.nn.Module, batch_size: int, device: torch.device,
                   copies: int = 1) -> str | None:
    """A training step that cannot fit this machine: its forward and backward at small batches
    extended to ``batch_size``, weights and AdamW's moments (``measure.training_step_bytes``),
    times ``copies`` (a pack of seeds: seqmix.train.pack), against the memory it has; None if
    it fits."""

    def loss_at(b: int) -> torch.Tensor:
        return task.loss(model, task.example_batch(b, device))

    need = copies * measure.training_step_bytes(loss_at, model, batch_size)
    have = measure.available_memory(device.type)
    if need <= have:
        return None
    whose = task.spec.run_name if copies == 1 else f"a pack of {copies} seeds of {task.spec.run_name}"
    return (f"a training step of {whose} needs about {need / GIB:.1f} GiB (its forward and backward "
            f"at batch {batch_size}, weights and AdamW's moments), and this machine has {have / GIB:.1f} GiB "
            "available: lower train.batch_size or model.d_model, or run it on a GPU with that much memory "
            "(python -m seqmix plan shows every run's)")


def spec_hash(spec: TrainJob) -> str:
    """Identity of a run's settings (config.json's ``spec_hash``)."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]


def run_code(spec: TrainJob, planned: str | None = None) -> Code:
    """The code that trains ``spec`` (seqmix.sources: its mixer's and task's modules, the
    training loop, what they import). ``planned``: the digest the workflow planned the job
    with (``train --code``); a checkout whose code differs now fails before any step, since
    its results would be recorded under a digest they were not made by."""
    code = code_of(run_modules(spec.arch, spec.kind))
    if planned is not None and planned != code.digest:
        raise CodeChanged(f"the code of run {spec.run_name} changed after the workflow planned it (planned "
                          f"digest {planned}, this checkout's {code.digest}): run the workflow again, which "
                          "plans it with the code as it is now")
    return code


def run_identity(spec: TrainJob, code: Code) -> str:
    """Identity of a run: its settings and the digest of its code. A checkpoint (last or
    final) of another identity is never resumed: the run trains from its first step."""
    return hashlib.sha256(f"{spec.model_dump_json()}\n{code.digest}".encode()).hexdigest()[:16]


def build_for_spec(spec: TrainJob, task: Task) -> tuple[torch.nn.Module, dict]:
    """The model of a run, sized by its budget; returns (model, size record)."""
    m = spec.model
    size = solve_budget(task.build_model, d_model=m.d_model, n_layers=m.n_layers, d_ff_mult=m.d_ff_mult,
                        **m.budget.model_dump())
    torch.manual_seed(spec.seed)
    model = task.build_model(size.d_model, size.n_layers, size.d_ff_mult)
    return model, {**dataclasses.asdict(size), "budget": m.budget.model_dump()}


@dataclasses.dataclass
class Progress:
    """What a checkpoint saves besides the weights and the optimiser."""

    step: int = 0
    seen: int = 0
    elapsed: float = 0.0
    log: list[dict] = dataclasses.field(default_factory=list)
    best: dict | None = None
    last_eval: dict | None = None
    resumed_from: list[int] = dataclasses.field(default_factory=list)
    recent: list[float] = dataclasses.field(default_factory=list)  # the train-loss window of the next log row
    status: str | None = None  # "ok" or "diverged" once the run has ended
    diverged_at: int | None = None
    stopped_at: int | None = None  # the step at which train.early_stop was reached
    plateau_at: int | None = None  # the step at which train.plateau stopped the run


@dataclasses.dataclass
class Run:
    """A training run in progress."""

    spec: TrainJob
    task: Task
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    device: torch.device
    size: dict
    identity: str
    state: Progress
    loss_of: StepLoss  # the training step's loss: eager, or compiled under train.compile
    started: float = 0.0
    code: Code | None = None  # the code that trains it (seqmix.sources), part of its identity
    finished_before: bool = False  # restored from final.pt: only the results are written again
    pack: dict | None = None  # trained in a pack of seeds (seqmix.train.pack): provenance.json names it
    hashes: dict | None = None  # its final weights' and optimiser state's (seqmix.train.hashes), once ended

    @property
    def run_dir(self) -> Path:
        return Path(self.spec.run_dir)


def start(spec: TrainJob, code: Code) -> Run:
    """Build the task, model and optimiser; resume from the run's checkpoint when it was
    written with these settings and this code, else start from the seed. The caller holds
    the lock."""
    run_dir = Path(spec.run_dir)
    for d in (run_dir, run_dir / CHECKPOINT.parent):
        remove_stale_temps(d)  # left by a killed writer; no live one while we hold the lock
    train = spec.train
    if train.threads:
        torch.set_num_threads(train.threads)
    device = resolve_device(train.device)
    check_precision(train, device)
    task = make_task(spec)  # checks every data file against its manifest, and its limits
    model, size = build_for_spec(spec, task)
    model.to(device)
    if (problem := memory_problem(task, model, train.batch_size, device)) is not None:
        raise ConfigError(problem)  # before step 1, instead of the kernel's OOM kill mid-run
    opt = make_optimizer(model, train)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(train))
    run = Run(spec, task, model, opt, sched, device, size, run_identity(spec, code), Progress(),
              step_loss(task, model, device, train), code=code)
    resume_or_init(run)
    write_json(run_dir / "config.json", {**spec.model_dump(mode="json"), "resolved_size": size,
                                         "spec_hash": spec_hash(spec)})
    run.started = time.time() - run.state.elapsed
    return run


def resume_or_init(run: Run) -> None:
    """Resume from the final checkpoint (a finished run: only its results are written
    again) or the last one, when written with these settings and this code; else start
    afresh."""
    for rel, keys in ((FINAL, FINAL_KEYS), (CHECKPOINT, CHECKPOINT_KEYS)):
        ckpt = usable_checkpoint(run, run.run_dir / rel, keys)
        if ckpt is None:
            continue
        run.model.load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:  # a final checkpoint has none: its run trains no further
            run.opt.load_state_dict(ckpt["optimizer"])
            run.sched.load_state_dict(ckpt["scheduler"])
            checkpoint.set_rng_state(ckpt["rng"])
        run.state = Progress(**ckpt["state"])
        run.state.resumed_from.append(run.state.step)
        run.finished_before = rel == FINAL
        run.hashes = ckpt.get("hashes") if run.finished_before else None
        if not run.finished_before:
            print(f"resuming {run.run_dir} from step {run.state.step}", file=sys.stderr)
        else:
            print(f"{run.run_dir} finished at step {run.state.step} ({rel}): writing its results "
                  "again without training", file=sys.stderr)
        return
    run.state = Progress()
    torch.manual_seed(run.spec.seed + 1)  # dropout stream, independent of init: every fresh start alike


def usable_checkpoint(run: Run, path: Path, keys: tuple[str, ...]) -> dict | None:
    """The checkpoint at ``path`` if it exists, can be read and was written with this run's
    settings and code; an unreadable one is moved aside (else every rerun would fail on it)."""
    if not path.exists():
        return None
    try:
        ckpt = checkpoint.load(path, keys=keys)
    except checkpoint.CorruptCheckpoint as e:
        aside = checkpoint.move_aside(path)
        print(f"warning: {e}; moved it to {aside} and not resuming from it", file=sys.stderr)
        return None
    if ckpt["identity"] != run.identity:
        print(f"ignoring {path}: written with other settings or other code", file=sys.stderr)
        return None
    return ckpt


def train_step(run: Run) -> tuple[float, float] | None:
    """One optimiser step; (loss, grad norm), or None when the loss is not finite."""
    run.model.train()
    batch = run.task.train_batch(run.state.step, run.spec.train.batch_size, run.device)
    loss, grad_norm = optimizer_step(run.loss_of, run.model, run.opt, run.spec.train.grad_clip, batch)
    if grad_norm is None:
        print(f"loss is {loss} at step {run.state.step}: recording the run as diverged", file=sys.stderr)
        return None
    run.sched.step()
    run.state.step += 1
    run.state.seen += run.task.progress(batch)
    return loss, grad_norm


def log_row(run: Run, phase: str, loss: float, metric=None, value=None, lr=None, grad_norm=None) -> None:
    run.state.log.append({"step": run.state.step, "phase": phase, "loss": loss, "metric": metric,
                          "metric_value": value, "lr": lr, "grad_norm": grad_norm, "seen": run.state.seen,
                          "elapsed_s": round(time.time() - run.started, 3)})


def evaluate_now(run: Run) -> None:
    """Periodic evaluation on the task's eval split; keeps the best and the last."""
    task, train = run.task, run.spec.train
    run.model.eval()
    ev = task.evaluate(run.model, task.eval_split, train.batch_size, run.device, max_batches=train.eval_batches)
    log_row(run, "eval", ev["loss"], task.metric, ev[task.metric])
    better = (lambda a, b: a > b) if task.higher_is_better else (lambda a, b: a < b)
    best = run.state.best
    if best is None or better(ev[task.metric], best[task.metric]):
        run.state.best = {**ev, "step": run.state.step}
    run.state.last_eval = {**ev, "step": run.state.step}


def reached_early_stop(run: Run) -> bool:
    """Whether the last evaluation reached ``train.early_stop`` (Zoology: 0.99 accuracy)."""
    target, ev, task = run.spec.train.early_stop, run.state.last_eval, run.task
    if target is None or ev is None:
        return False
    return ev[task.metric] >= target if task.higher_is_better else ev[task.metric] <= target


def reached_plateau(run: Run) -> bool:
    """Whether ``train.plateau`` stops the run now: from step ``after``, the best periodic
    evaluation of the last ``window`` steps beats the best before them by less than ``min_gain``."""
    rule, step, sign = run.spec.train.plateau, run.state.step, 1 if run.task.higher_is_better else -1
    if rule is None or step < rule.after:
        return False
    evals = [(r["step"], sign * r["metric_value"]) for r in run.state.log if r["phase"] == "eval"]
    recent = [v for s, v in evals if s > step - rule.window]
    before = [v for s, v in evals if s <= step - rule.window]
    return bool(recent and before) and max(recent) - max(before) < rule.min_gain


def ended(state: Progress) -> str:
    """Why a run ended: diverged, solved (reached train.early_stop), plateau (stopped by
    train.plateau) or budget (ran all its steps)."""
    if state.status == "diverged":
        return "diverged"
    return "solved" if state.stopped_at is not None else "plateau" if state.plateau_at is not None else "budget"


def save_checkpoint(run: Run) -> None:
    run.state.elapsed = time.time() - run.started
    checkpoint.save_atomic({
        "identity": run.identity, "model": run.model.state_dict(), "optimizer": run.opt.state_dict(),
        "scheduler": run.sched.state_dict(), "rng": checkpoint.rng_state(),
        "state": dataclasses.asdict(run.state),
    }, run.run_dir / CHECKPOINT)


def train(spec: TrainJob, progress: bool = True, planned_code: str | None = None) -> dict:
    """Train one run to its end (or its divergence) and write its results; the run
    directory is this process's until then. ``planned_code``: the digest of its code the
    workflow planned it with (``run_code``)."""
    run_dir = Path(spec.run_dir)
    # train.reference_mixers forces the references for this run; else the process's setting
    # (provenance.json records it and the path each fast path took)
    implementation = "reference" if spec.train.reference_mixers else None
    with exclusive_lock(run_dir / LOCK, f"run directory {run_dir}"), dispatch.using(implementation):
        run = start(spec, run_code(spec, planned_code))
        if run.state.status is None:
            train_steps(run, progress)
        return finish(run)


def train_steps(run: Run, progress: bool) -> None:
    """Step from the run's current step to its last (or to a non-finite loss), logging,
    evaluating and checkpointing on schedule; sets ``run.state.status``."""
    train_cfg, state = run.spec.train, run.state
    bar = tqdm(total=train_cfg.steps, initial=state.step, desc=run.spec.run_name, disable=not progress,
               mininterval=2.0, file=sys.stderr)
    while state.step < train_cfg.steps:
        out = train_step(run)
        if out is None:
            state.status, state.diverged_at = "diverged", state.step
            break
        loss, grad_norm = out
        state.recent = (state.recent + [loss])[-train_cfg.log_every:]
        step = state.step
        bar.update(1)
        if step % train_cfg.log_every == 0 or step == train_cfg.steps:
            log_row(run, "train", sum(state.recent) / len(state.recent), lr=run.sched.get_last_lr()[0],
                    grad_norm=grad_norm)
            bar.set_postfix(loss=f"{state.log[-1]['loss']:.3f}")
        if step % train_cfg.eval_every == 0 or step == train_cfg.steps:
            evaluate_now(run)
            if reached_early_stop(run) and step < train_cfg.steps:
                state.stopped_at = step
                break
            if reached_plateau(run) and step < train_cfg.steps:
                state.plateau_at = step
                break
        if step % train_cfg.checkpoint_every == 0 and step < train_cfg.steps:
            save_checkpoint(run)
    bar.close()
    state.status = state.status or "ok"


def finish(run: Run, optimizer_state: dict | None = None) -> dict:
    """Write the run's results (model, log, hashes, provenance, metrics) from its final state,
    kept first in checkpoints/final.pt (its hashes with it: the optimiser state is not kept),
    then drop the last checkpoint. ``optimizer_state``: the run's final one where another
    optimiser than ``run.opt`` trained it (a seed pack's member)."""
    ckpt_dir = run.run_dir / CHECKPOINT.parent
    if not run.finished_before:
        run.state.elapsed = time.time() - run.started
        # a pack's member is trained by the pack's optimiser, not run.opt: unknown unless given
        opt = optimizer_state if optimizer_state is not None else None if run.pack else run.opt.state_dict()
        run.hashes = final_hashes(run.model.state_dict(), opt)
        checkpoint.save_atomic({"identity": run.identity, "model": run.model.state_dict(),
                                "state": dataclasses.asdict(run.state), "hashes": run.hashes}, run.run_dir / FINAL)
    checkpoint.save_atomic({"model": run.model.state_dict(), "size": run.size}, run.run_dir / "model.pt")
    write_csv(run.run_dir / "log.csv", run.state.log, LOG_FIELDS)
    write_hashes(run.run_dir, run.hashes or final_hashes(run.model.state_dict(), None))
    metrics = metrics_of(run)
    write_json(run.run_dir / "provenance.json", provenance(run.device, seed=run.spec.seed, code=run.code,
                                                          wall_time_s=run.state.elapsed,
                                                          training_step=run.loss_of.record(),
                                                          **({"pack": run.pack} if run.pack else {})))
    write_json(run.run_dir / "metrics.json", metrics)
    (run.run_dir / CHECKPOINT).unlink(missing_ok=True)  # final.pt holds all a rerun needs
    remove_stale_temps(ckpt_dir)
    return metrics


def metrics_of(run: Run) -> dict:
    """metrics.json of a run that has ended."""
    spec, task, state = run.spec, run.task, run.state
    train_rows = [r for r in state.log if r["phase"] == "train"]
    return {
        "status": state.status, "profile": spec.profile, "task": spec.task, "kind": spec.kind,
        "group": spec.group, "axes": spec.axes, "arch": spec.arch, "seed": spec.seed, **run.size,
        "metric": task.metric, "higher_is_better": task.higher_is_better,
        "steps_planned": spec.train.steps, "steps_completed": state.step, "diverged_at_step": state.diverged_at,
        "early_stop": spec.train.early_stop, "stopped_early_at_step": state.stopped_at,
        "plateau": spec.train.plateau and spec.train.plateau.model_dump(), "plateau_at_step": state.plateau_at,
        "ended": ended(state),
        "seen": state.seen, "seen_unit": task.progress_unit, "scored_unit": task.scored_unit,
        "reach": stack_reach(run.model.blocks), "chance": task.chance, "blind_loss": task.blind_loss,
        "train_split": task.train_split, "eval_split": task.eval_split, "test_split": task.test_split,
        "eval_batches": spec.train.eval_batches, "last_eval": state.last_eval, "best_eval": state.best,
        "train_loss_last": train_rows[-1]["loss"] if train_rows else None,
        "wall_time_s": state.elapsed, "resumed_from_steps": state.resumed_from, "device": run.device.type,
        "data": task.data_record(),
    }
