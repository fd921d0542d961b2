"""The loss of one training step, eager or compiled (``train.compile``).

A step of a 13M-parameter model launches hundreds of small kernels, and on an H100 the GPU
waits for the CPU that launches them (measured MFU 0.2-3 % on WikiText-2). ``train.compile:
true`` turns on what the field uses against that, all three behind the one key:

- ``torch.compile`` of the step's whole loss computation: the task's ``loss`` under autocast,
  which calls the model's own ``loss`` (not ``forward``, so compiling the module alone would
  change nothing); AOTAutograd compiles its backward with it;
- CUDA graphs (mode ``reduce-overhead`` on a GPU): each compiled graph is captured once and
  replayed, one launch per graph. The language-model tasks' batches have one shape, so each
  graph is captured once; a task whose batches vary in length (SNLI pads pairs to the
  longest in the batch) gets one dynamic-shape graph after the second length it meets, which
  runs compiled but without CUDA graphs (inductor's ``cudagraph_skip_dynamic_graphs``);
- fused AdamW (``make_optimizer``): one kernel updates every parameter.

The first step runs eagerly: ``seqmix.mixers.dispatch`` resolves each mixer's fast path there
(compiling and checking a Triton kernel, falling back where one fails), and the compiled steps
take those paths, a fast path as an opaque call outside the graph (dispatch's docstring). The
model, batches and optimiser are the same; the losses equal eager ones up to float rounding
(fused and reordered sums; tests/train/test_train.py holds 20 steps equal). Dropout draws its masks
from inductor's generator under compile: the same distribution, other masks than eager's.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import torch

from seqmix.study.settings import TrainSettings
from seqmix.tasks.base import Task


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def compile_mode(device: torch.device) -> str:
    """CUDA graphs on a GPU (launch overhead is what a small model's step is made of);
    inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


class StepLoss:
    """``loss(batch)``: the task's loss of ``batch`` under the run's autocast; compiled from the
    second call on when ``compiled`` (module docstring). ``record()`` says what ran."""

    def __init__(self, task: Task, model: torch.nn.Module, device: torch.device, precision: str,
                 compiled: bool = False):
        self.task, self.model, self.device, self.precision = task, model, device, precision
        self.compiled = compiled
        self.calls = 0
        self.first_compiled_s: float | None = None
        self._counts_before = (0, 0)
        self._counts_after = (0, 0)
        self._fn: Callable | None = None
        if compiled:
            import torch._inductor.config as inductor

            inductor.triton.cudagraph_skip_dynamic_graphs = True
            self._fn = torch.compile(self._eager, mode=compile_mode(device), dynamic=None)

    def _eager(self, batch: tuple) -> torch.Tensor:
        with autocast(self.device, self.precision):
            return self.task.loss(self.model, batch)

    def __call__(self, batch: tuple) -> torch.Tensor:
        self.calls += 1
        if self._fn is None or self.calls == 1:  # eager, or the compiled run's first step
            return self._eager(batch)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are free
        if self.calls > 2:
            return self._fn(batch)
        self._counts_before, t0 = _dynamo_counts(), time.perf_counter()
        loss = self._fn(batch)  # compiles here
        self.first_compiled_s = round(time.perf_counter() - t0, 3)
        self._counts_after = _dynamo_counts()
        return loss

    def record(self) -> dict:
        """For provenance.json: whether the step was compiled, how, and what compiling made."""
        if not self.compiled:
            return {"compiled": False}
        (g0, b0), (g1, b1) = self._counts_before, self._counts_after
        return {"compiled": True, "mode": compile_mode(self.device), "fused_adamw": True,
                "first_compiled_step_s": self.first_compiled_s, "graphs": g1 - g0, "graph_breaks": b1 - b0,
                "torch": torch.__version__}


def step_loss(task: Task, model: torch.nn.Module, device: torch.device, train: TrainSettings) -> StepLoss:
    """The loss function of a run's training steps under ``train``'s precision and ``compile``."""
    return StepLoss(task, model, device, train.precision, compiled=train.compile)


def optimizer_step(loss_of: Callable[[tuple], torch.Tensor], model: torch.nn.Module, opt: torch.optim.Optimizer,
                   grad_clip: float, batch: tuple) -> tuple[float, float | None]:
    """One training step on ``batch`` (what ``train`` runs, and the GPU check times): the loss,
    its backward, clipping at ``grad_clip`` (0: none), the optimiser's update. Returns (loss,
    grad norm); the grad norm is None, and nothing is updated, when the loss is not finite."""
    loss = loss_of(batch)
    if not torch.isfinite(loss):
        return loss.item(), None
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
    opt.step()
    return loss.item(), float(grad_norm)


def lr_lambda(train: TrainSettings):
    warmup, total, floor = train.warmup_steps, train.steps, train.min_lr_ratio

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def decay_split(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The names of the parameters AdamW decays and of the others (``make_optimizer``): matrices
    only (nanoGPT), not biases, norms, embeddings' positions, nor the parameters a mixer names
    in no_weight_decay() (Mamba's A_log and D, ToST's temp). Tied parameters once."""
    no_decay = set()
    for mod_name, module in model.named_modules():
        if hasattr(module, "no_weight_decay") and callable(module.no_weight_decay):
            no_decay |= {f"{mod_name}.{n}" if mod_name else n for n in module.no_weight_decay()}
    decay, other, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and name not in no_decay else other).append(name)
    return decay, other


def adamw(params: dict[str, torch.Tensor], split: tuple[list[str], list[str]], train: TrainSettings) -> torch.optim.AdamW:
    """AdamW over ``params`` by name, decaying the first list of ``split``; fused (one kernel for
    every update) under ``train.compile``."""
    decay, other = split
    groups = [{"params": [params[n] for n in decay], "weight_decay": train.weight_decay},
              {"params": [params[n] for n in other], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas), fused=train.compile or None)


def make_optimizer(model: torch.nn.Module, train: TrainSettings) -> torch.optim.AdamW:
    """AdamW over the model's parameters (``decay_split``, ``adamw``)."""
    return adamw(dict(model.named_parameters()), decay_split(model), train)
