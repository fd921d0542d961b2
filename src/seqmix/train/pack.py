"""Seed packs: the seeds of one run configuration trained in one process as one vectorised
model (``train_pack``), so that a launch-bound GPU step carries every seed for about the
kernel launches of one (docs/runbook/gpu-headline.md).

A pack is a list of run specs (``TrainJob``) of one task and architecture that differ only in
seed and run directory. Each member is built exactly as its single run (``loop.build_for_spec``:
the same initial weights); their parameters and buffers are stacked along a leading member
dimension and one step trains them all: ``torch.func.vmap`` over ``functional_call`` of the
task's ``pack_loss``, the losses summed and differentiated once, then per member what a single
run does per run:

- its own batches (its task draws them from its own seed, ``batch_generator``);
- clipping by its own gradient norm (``clip_by_member``: ``clip_grad_norm_``'s arithmetic on
  the member's slices);
- AdamW on the stacked tensors: elementwise, so each member's slice is updated as a single run
  updates its weights; every member is at the same step, so the one LR schedule is each one's;
- its own ending: a member that diverges, reaches ``train.early_stop`` or the plateau rule
  leaves the pack at that step (its results written, its weights frozen from then on) and
  the others go on, re-stacked without it.

What a packed run is: its weights, batches, schedule and evaluations are its single run's,
its arithmetic is batched (equal to the single run's up to fp32 rounding: tests/train/test_packs.py),
and its dropout masks are drawn for all members at once from one generator (vmap's
``randomness="different"``), so they depend on the pack's members: a packed run cannot
reproduce its single run's dropout stream, and is not the same run. Its identity
(``pack_identity``) is the single run's plus the pack (its seeds): a checkpoint of a packed
run is never resumed by a single run, nor one of a single run by a pack, nor one of another
pack. provenance.json's ``pack`` names the pack and the member.

Files: each member writes exactly a single run's (config.json, log.csv, checkpoints/,
model.pt, metrics.json, provenance.json), in the single run's formats, so that evaluation,
recording and every report read it unchanged. Checkpoints are written for every member at
one step (``commit``): each member's last.pt is first moved to checkpoints/previous.pt, the
new one written, and the previous ones deleted only once every member has its new one; a
pack killed between two members' writes therefore finds every member's checkpoint of the
earlier step and resumes all of them from it (``resume``). A member leaving the pack is a
commit too (every member's state at that step written before the leaving one's results), so
that a resumed pack has the members the uninterrupted one had at every step.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from seqmix.device import resolve_device
from seqmix.errors import CodeChanged, ConfigError
from seqmix.io import exclusive_lock, remove_stale_temps, write_json
from seqmix.mixers import dispatch
from seqmix.sources import Code, code_of, run_modules
from seqmix.study.jobs import TrainJob
from seqmix.tasks import make_task
from seqmix.train import checkpoint, loop
from seqmix.train.step import StepLoss, adamw, decay_split, lr_lambda

STEP = "seqmix.train.pack"  # what trains a pack (seqmix.sources.run_modules' ``step``)
PREVIOUS = Path("checkpoints") / "previous.pt"  # a member's last.pt while a commit writes the new one
SAME_EXCEPT = {"seed", "run_dir"}  # what may differ between the members of a pack


class PackError(ConfigError):
    """Specs that cannot train as one pack, named with the reason."""


# ------------------------------------------------------------------------------------------
# What a pack is: its members, its identity.
# ------------------------------------------------------------------------------------------


def check_pack(specs: list[TrainJob]) -> None:
    """Refuse, naming the reason, specs that are not one run configuration's seeds or whose
    mixer cannot be vectorised (``Mixer.packable``)."""
    if not specs:
        raise PackError("a pack needs at least one run spec")
    first = specs[0].model_dump(mode="json", exclude=SAME_EXCEPT)
    for spec in specs[1:]:
        other = spec.model_dump(mode="json", exclude=SAME_EXCEPT)
        if other != first:
            keys = sorted(k for k in first if first[k] != other.get(k))
            raise PackError(f"runs {specs[0].run_name} and {spec.run_name} differ in {', '.join(keys)}: a pack holds "
                            "the seeds of one run configuration, which differ in seed and run directory only")
    seeds, dirs = [s.seed for s in specs], [s.run_dir for s in specs]
    if len(set(seeds)) != len(seeds) or len(set(dirs)) != len(dirs):
        raise PackError(f"a pack's seeds and run directories must be distinct, got seeds {seeds}")
    from seqmix.mixers import mixer_class

    reason = mixer_class(specs[0].arch).packable
    if reason is not True:
        raise PackError(f"{specs[0].arch} cannot train in a pack: {reason}; train its seeds as single runs")


def pack_record(specs: list[TrainJob], member: int) -> dict:
    """provenance.json's ``pack``: the pack's seeds and run directories, and this member."""
    return {"seeds": [s.seed for s in specs], "run_dirs": [s.run_dir for s in specs], "member": member,
            "vectorised": "torch.func.vmap over functional_call, stacked weights",
            "dropout": "masks drawn for every member at once from one generator (vmap randomness 'different')"}


def pack_identity(spec: TrainJob, specs: list[TrainJob], code: Code) -> str:
    """A packed run's identity: its single run's (settings and code) and its pack's seeds."""
    single = loop.run_identity(spec, code)
    seeds = ",".join(str(s.seed) for s in specs)
    return hashlib.sha256(f"{single}\npack of seeds {seeds}".encode()).hexdigest()[:16]


def pack_code(spec: TrainJob, planned: str | None = None) -> Code:
    """The code that trains a pack of ``spec``'s configuration (its mixer's and task's modules
    and this one); ``planned`` as ``loop.run_code``'s."""
    code = code_of(run_modules(spec.arch, spec.kind, STEP))
    if planned is not None and planned != code.digest:
        raise CodeChanged(f"the code of the pack of {spec.run_name} changed after the workflow planned it "
                          f"(planned digest {planned}, this checkout's {code.digest}): run the workflow again")
    return code


class _Objective(nn.Module):
    """One member's loss as the pack computes it: its task's ``pack_loss`` of its model."""

    def __init__(self, task, model: nn.Module):
        super().__init__()
        self.task, self.model = task, model

    def forward(self, batch: tuple) -> torch.Tensor:
        return self.task.pack_loss(self.model, batch)


class PackLoss:
    """The losses (members,) of a stacked batch: ``loss(weights, batch)``, the form
    ``StepLoss`` calls (as a task's ``loss(model, batch)``), so that the pack's step is eager
    or compiled as a single run's is."""

    def __init__(self, objective: _Objective):
        self.objective = objective

    def loss(self, weights: tuple[dict, dict], batch: tuple) -> torch.Tensor:
        def one(params, buffers, member_batch):
            return torch.func.functional_call(self.objective, (params, buffers), (member_batch,))

        return torch.func.vmap(one, randomness="different")(*weights, batch)


@dataclasses.dataclass
class Pack:
    """A pack in training: ``members`` are the runs still training (``loop.Run``: spec, task,
    a model holding the member's weights when they are written or evaluated, progress), in
    the specs' order; ``params`` and ``buffers`` their stacked weights by name."""

    specs: list[TrainJob]
    members: list[loop.Run]  # training
    everyone: list[loop.Run]  # every member, in the specs' order
    base: nn.Module  # the model's structure that functional_call fills with each member's weights
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    loss_of: StepLoss
    device: torch.device
    results: dict[str, dict] = dataclasses.field(default_factory=dict)  # metrics by run directory

    @property
    def train(self):
        return self.specs[0].train


# ------------------------------------------------------------------------------------------
# Stacking: the members' weights and optimiser states into the pack's, and back.
# ------------------------------------------------------------------------------------------


def member_optimizer_state(state: dict, i: int) -> dict:
    """Member ``i``'s part of the pack's AdamW state dict, in a single run's form (each
    moment its slice; the step count, shared, as it is)."""
    return {"state": {k: {name: (v if name == "step" else v[i].clone()) for name, v in entry.items()}
                      for k, entry in state["state"].items()},
            "param_groups": copy.deepcopy(state["param_groups"])}


def stacked_optimizer_state(states: list[dict]) -> dict:
    """The pack's AdamW state dict from its members' (``member_optimizer_state``'s inverse)."""
    first = states[0]
    return {"state": {k: {name: (v if name == "step" else torch.stack([s["state"][k][name] for s in states]))
                          for name, v in entry.items()} for k, entry in first["state"].items()},
            "param_groups": copy.deepcopy(first["param_groups"])}


def to_members(pack: Pack) -> None:
    """Copy the stacked weights into each member's model (before it is evaluated or written)."""
    with torch.no_grad():
        for i, run in enumerate(pack.members):
            named = {**dict(run.model.named_parameters()), **dict(run.model.named_buffers())}
            names = [n for n in (*pack.params, *pack.buffers)]
            stacked = {**pack.params, **pack.buffers}
            torch._foreach_copy_([named[n] for n in names], [stacked[n][i] for n in names])


def assemble(pack: Pack, optimizer_states: list[dict] | None, scheduler_state: dict | None) -> None:
    """Stack the members' models (as they hold them now) into the pack's weights, with a new
    AdamW over them holding ``optimizer_states`` (one per member; None: fresh) and the LR
    schedule at ``scheduler_state`` (None: its start)."""
    models = [run.model for run in pack.members]
    pack.params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_()
                   for n, _ in models[0].named_parameters()}
    pack.buffers = {n: torch.stack([dict(m.named_buffers())[n] for m in models]) for n, _ in models[0].named_buffers()}
    pack.opt = adamw(pack.params, decay_split(models[0]), pack.train)
    # the schedule first: making it sets the LR of its first step, which the optimiser's state
    # then replaces with the LR it was at (as loop.start and resume_or_init do)
    pack.sched = torch.optim.lr_scheduler.LambdaLR(pack.opt, lr_lambda(pack.train))
    if optimizer_states is not None:
        pack.opt.load_state_dict(stacked_optimizer_state(optimizer_states))
    if scheduler_state is not None:
        pack.sched.load_state_dict(scheduler_state)
    pack.loss_of.model = ({f"model.{n}": t for n, t in pack.params.items()},
                          {f"model.{n}": t for n, t in pack.buffers.items()})


# ------------------------------------------------------------------------------------------
# Start: build every member as its single run, then resume the pack or start it afresh.
# ------------------------------------------------------------------------------------------


def build_members(specs: list[TrainJob], code: Code, device: torch.device) -> list[loop.Run]:
    """Each member's run: its task (its own batches), its model built as its single run's, its
    identity (``pack_identity``); no optimiser of its own (the pack's holds its state)."""
    members = []
    for i, spec in enumerate(specs):
        run_dir = Path(spec.run_dir)
        for d in (run_dir, run_dir / loop.CHECKPOINT.parent):
            remove_stale_temps(d)  # left by a killed writer; no live one while we hold the locks
        task = make_task(spec)
        model, size = loop.build_for_spec(spec, task)
        members.append(loop.Run(spec, task, model.to(device), None, None, device, size,
                                pack_identity(spec, specs, code), loop.Progress(), None, code=code,
                                pack=pack_record(specs, i)))
    return members


def start_pack(specs: list[TrainJob], code: Code) -> Pack:
    """Build the pack, then resume it from its members' checkpoints (``resume``) or start it
    from their seeds; config.json of every member as its single run writes it."""
    train = specs[0].train
    if train.threads:
        torch.set_num_threads(train.threads)
    device = resolve_device(train.device)
    loop.check_precision(train, device)
    members = build_members(specs, code, device)
    first = members[0]
    if (problem := loop.memory_problem(first.task, first.model, train.batch_size, device, len(specs))) is not None:
        raise ConfigError(problem)
    objective = _Objective(first.task, copy.deepcopy(first.model))
    loss_of = StepLoss(PackLoss(objective), None, device, train.precision, compiled=train.compile)
    pack = Pack(specs, list(members), members, objective, {}, {}, None, None, loss_of, device)
    resume(pack)
    for run in members:
        write_json(run.run_dir / "config.json", {**run.spec.model_dump(mode="json"), "resolved_size": run.size,
                                                 "spec_hash": loop.spec_hash(run.spec)})
        run.started = time.time() - run.state.elapsed
        run.loss_of = loss_of
    return pack


def checkpoints_of(run: loop.Run) -> dict[int, dict]:
    """A member's usable checkpoints (last.pt, and previous.pt where a commit was cut short),
    by step."""
    found = {}
    for rel in (PREVIOUS, loop.CHECKPOINT):
        ckpt = loop.usable_checkpoint(run, run.run_dir / rel, loop.CHECKPOINT_KEYS)
        if ckpt is not None:
            found[ckpt["state"]["step"]] = ckpt
    return found


def resume(pack: Pack) -> None:
    """Members with a final checkpoint of this identity have ended (their results are written
    again); the others resume from the latest step at which every one of them has a
    checkpoint, or, where there is none, start afresh: the pack's dropout stream seeded from
    its first seed, as a single run seeds its own."""
    active = []
    for run in pack.members:
        final = loop.usable_checkpoint(run, run.run_dir / loop.FINAL, loop.FINAL_KEYS)
        if final is None:
            active.append(run)
            continue
        run.model.load_state_dict(final["model"])
        run.state, run.finished_before = loop.Progress(**final["state"]), True
        run.hashes = final.get("hashes")  # its results written again carry the hashes it ended with
        run.state.resumed_from.append(run.state.step)
        print(f"{run.run_dir} finished at step {run.state.step} ({loop.FINAL}): writing its results again "
              "without training", file=sys.stderr)
    pack.members = active
    found = [checkpoints_of(run) for run in active]
    common = set.intersection(*(set(f) for f in found)) if found else set()
    if not common:
        for run in active:
            run.state = loop.Progress()
        torch.manual_seed(pack.specs[0].seed + 1)
        if active:
            assemble(pack, None, None)
        return
    step = max(common)
    for run, f in zip(active, found):
        run.model.load_state_dict(f[step]["model"])
        run.state = loop.Progress(**f[step]["state"])
        run.state.resumed_from.append(step)
        print(f"resuming {run.run_dir} from step {step} (a pack of seeds {pack_record(pack.specs, 0)['seeds']})",
              file=sys.stderr)
    first = found[0][step]
    checkpoint.set_rng_state(first["rng"])
    assemble(pack, [f[step]["optimizer"] for f in found], first["scheduler"])


# ------------------------------------------------------------------------------------------
# Training: one step for every member, then each member's bookkeeping as a single run's.
# ------------------------------------------------------------------------------------------


def clip_by_member(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` of each member's gradients (slice i of every stacked gradient), in
    place: its total 2-norm over its own gradients, each scaled by min(1, max_norm / (norm +
    1e-6)). Returns the members' total norms (members,). A few launches for any number of
    members: one norm over every slice, one scaling per member."""
    members = grads[0].shape[0]
    norms = torch.stack(torch._foreach_norm([g[i] for i in range(members) for g in grads])).view(members, len(grads))
    total = torch.linalg.vector_norm(norms, 2, dim=1)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for i in range(members):
        torch._foreach_mul_([g[i] for g in grads], coef[i])
    return total


def member_batches(pack: Pack) -> tuple[tuple, list[tuple]]:
    """Every member's batch of this step (its own task's draw from its own seed), and the
    same stacked along the member dimension."""
    step = pack.members[0].state.step
    each = [run.task.train_batch(step, pack.train.batch_size, pack.device) for run in pack.members]
    try:
        return tuple(torch.stack(parts) for parts in zip(*each)), each
    except RuntimeError as err:
        raise PackError(f"the members' batches of {pack.specs[0].task} at step {step} differ in shape ({err}): "
                        "a task whose batches vary in length cannot train in a pack") from None


def pack_step(pack: Pack, stacked: tuple) -> tuple[list[float], list[float] | None]:
    """One optimiser step of every member on their stacked batches: (losses, gradient norms);
    the norms are None, and nothing is updated, when a member's loss is not finite."""
    losses = pack.loss_of(stacked)
    values = losses.detach().float().tolist()
    if not all(math.isfinite(v) for v in values):
        return values, None
    pack.opt.zero_grad(set_to_none=True)
    losses.sum().backward()  # the members' losses share no weight: each gets its own gradient
    grads = [p.grad for p in pack.params.values() if p.grad is not None]
    norms = clip_by_member(grads, pack.train.grad_clip or float("inf"))
    pack.opt.step()
    pack.sched.step()
    return values, norms.tolist()


def advance(pack: Pack, run: loop.Run, batch: tuple, loss: float, grad_norm: float) -> bool:
    """A member's step done: its progress, log, evaluation and ending as ``loop.train_steps``
    keeps a single run's. True when its run ends at this step."""
    train, state = pack.train, run.state
    state.step += 1
    state.seen += run.task.progress(batch)
    state.recent = (state.recent + [loss])[-train.log_every:]
    step = state.step
    if step % train.log_every == 0 or step == train.steps:
        loop.log_row(run, "train", sum(state.recent) / len(state.recent), lr=pack.sched.get_last_lr()[0],
                     grad_norm=grad_norm)
    if step % train.eval_every == 0 or step == train.steps:
        loop.evaluate_now(run)
        if loop.reached_early_stop(run) and step < train.steps:
            state.stopped_at = step
        elif loop.reached_plateau(run) and step < train.steps:
            state.plateau_at = step
    if step in (state.stopped_at, state.plateau_at, train.steps):
        state.status = "ok"
        return True
    return False


def save_member(run: loop.Run, optimizer_state: dict, scheduler_state: dict) -> None:
    """A member's checkpoint, in a single run's form: its last.pt moved to previous.pt first."""
    last = run.run_dir / loop.CHECKPOINT
    if last.exists():
        os.replace(last, run.run_dir / PREVIOUS)
    run.state.elapsed = time.time() - run.started
    checkpoint.save_atomic({"identity": run.identity, "model": run.model.state_dict(), "optimizer": optimizer_state,
                            "scheduler": scheduler_state, "rng": checkpoint.rng_state(),
                            "state": dataclasses.asdict(run.state)}, last)


def finish_member(pack: Pack, run: loop.Run, optimizer_state: dict | None = None) -> None:
    """A member's results as a single run writes them; ``optimizer_state``: its share of the
    pack's optimiser (member_optimizer_state), whose hash the run's hashes.json keeps."""
    pack.results[run.spec.run_dir] = loop.finish(run, optimizer_state=optimizer_state)


def commit(pack: Pack, ended: list[loop.Run]) -> None:
    """Every member's checkpoint at this step (an ended one's with its final progress), then
    the ended members' results, then the previous checkpoints deleted; the pack goes on
    without the ended members (module docstring: why in this order)."""
    to_members(pack)
    opt_state, sched_state = pack.opt.state_dict(), pack.sched.state_dict()
    states = [member_optimizer_state(opt_state, i) for i in range(len(pack.members))]
    for run, state in zip(pack.members, states):
        save_member(run, state, sched_state)
    for run in ended:
        finish_member(pack, run, states[next(i for i, m in enumerate(pack.members) if m is run)])
    for run in pack.members:
        (run.run_dir / PREVIOUS).unlink(missing_ok=True)
    if ended:
        keep = [i for i, run in enumerate(pack.members) if all(run is not e for e in ended)]
        pack.members = [pack.members[i] for i in keep]
        if pack.members:
            assemble(pack, [states[i] for i in keep], sched_state)


def train_steps(pack: Pack, progress: bool) -> None:
    """Step every member until each has ended (its last step, early stop, plateau or a loss
    that is not finite), committing on the checkpoint schedule and at every ending."""
    train = pack.train
    bar = tqdm(total=train.steps, initial=pack.members[0].state.step, mininterval=2.0, file=sys.stderr,
               desc=f"{pack.specs[0].task}/{pack.specs[0].arch}/pack of seeds "
                    f"{','.join(str(s.seed) for s in pack.specs)}", disable=not progress)
    while pack.members:
        stacked, each = member_batches(pack)
        values, norms = pack_step(pack, stacked)
        if norms is None:  # those members' runs diverge here; the others take this step again
            diverged = [run for run, v in zip(pack.members, values) if not math.isfinite(v)]
            for run in diverged:
                print(f"loss is {values[pack.members.index(run)]} at step {run.state.step}: recording the run "
                      "as diverged", file=sys.stderr)
                run.state.status, run.state.diverged_at = "diverged", run.state.step
            commit(pack, diverged)
            continue
        after = pack.members[0].state.step + 1
        if after % train.eval_every == 0 or after == train.steps:
            to_members(pack)  # an evaluation reads the member's own model
        ended = [run for run, batch, loss, norm in zip(pack.members, each, values, norms)
                 if advance(pack, run, batch, loss, norm)]
        bar.update(1)
        step = pack.members[0].state.step
        if ended or (step % train.checkpoint_every == 0 and step < train.steps):
            commit(pack, ended)
    bar.close()


def train_pack(specs: list[TrainJob], progress: bool = True, planned_code: str | None = None) -> list[dict]:
    """Train the runs of ``specs`` (one configuration's seeds) as one pack to their ends and
    write each one's results; returns their metrics in the specs' order. Every member's run
    directory is this process's until then (its train.lock, as a single run's)."""
    check_pack(specs)
    implementation = "reference" if specs[0].train.reference_mixers else None
    with contextlib.ExitStack() as held:
        for spec in specs:
            held.enter_context(exclusive_lock(Path(spec.run_dir) / loop.LOCK, f"run directory {spec.run_dir}"))
        held.enter_context(dispatch.using(implementation))
        pack = start_pack(specs, pack_code(specs[0], planned_code))
        for run in pack.everyone:
            if run.finished_before:
                finish_member(pack, run)
        ended = [run for run in pack.members if run.state.status is not None]
        if ended:  # a commit cut short after every member's checkpoint: finish it
            commit(pack, ended)
        if pack.members:
            train_steps(pack, progress)
        return [pack.results[spec.run_dir] for spec in specs]
