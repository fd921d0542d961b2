"""Kernel launches of one headline training step, counted on a CPU, and the headline call's
wall time they predict on an H100 and an H200 (``python -m tools.bench.time_model``): the time
model of docs/runbook/gpu-headline.md, which decides before anything runs on a GPU.

Counts (``count``), per architecture of config/paper-headline.yaml at its solved size, one
step at batch 2 (a launch count does not depend on the batch), the third step counted (the
first two resolve the fast paths):

- eager: every ATen op the step dispatches (a ``TorchDispatchMode``), as launches on a GPU: a
  view or an allocation launches nothing, a ``_foreach_`` op one launch per 48 tensors
  (multi_tensor_apply's chunks), any other op one. The step is the GPU's: bf16 autocast,
  AdamW and clipping through their ``_foreach_`` paths (CUDA's default), Grassmann's fused
  kernel (its custom ops' bodies counted, each Triton launch one: the kernels themselves do
  not run here, their results come from the reference so that the step stays finite);
- packed: the same step of a pack of ``--members`` seeds (seqmix.train.pack); the CPU's
  flash attention has no vmap batching rule (it loops over the members) where CUDA's
  flash and efficient kernels have one (one launch for the pack): counted once per pack;
- the periodic evaluation's forward (fp32, no autocast, as ``Task.evaluate`` runs it).

What a count misses: launches inside an op that are not ATen ops (cuBLAS may split a GEMM;
SDPA's backward is one ATen op and one or two kernels), the host's Python time between ops,
and everything a compiled step changes (not counted here: the compiled step is a bonus the
on-GPU measurement may choose, never assumed).

The prediction (``predict``): the committed eager step times on one H100
(results/bench/nvidia-h100-80gb-hbm3/train_probe.csv) divided by the single step's launches
give each architecture's host time per launch; a packed step's host time is its launches at
that cost times the per-launch cost ratio of a packed to a single step measured here side by
side (``--ratio-rounds``: vmap's batching rules cost host time per op); a step's device time
is its kernels at ``--kernel-us`` each plus its FLOPs at ``--efficiency`` of the GPU's
peak; a step takes the larger. Processes sharing the GPU add their device times. The call:
install, measurement, the DAG's fixed costs and the record (``--fixed-s``, from the last CPU
rehearsal, docs/runbook/gpu-headline.md) plus the runs: their steps, their periodic evaluations, one
member after another in a pack.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # Grassmann's kernels as objects whose launches are counted

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

HEADLINE = "config/paper-headline.yaml"
PROBE = Path("results/bench/nvidia-h100-80gb-hbm3/train_probe.csv")
FOREACH_CHUNK = 48  # tensors per multi_tensor_apply launch (depth 3: AdamW's lists)
NO_LAUNCH = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
             "aten::lift_fresh", "aten::_local_scalar_dense_"}
PER_PACK = {"aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
GPUS = {  # what differs between the two for a device-bound step (vendors' datasheets: SXM, dense bf16)
    "H100": {"tflops": 989.4, "hbm_tb_s": 3.35},
    "H200": {"tflops": 989.4, "hbm_tb_s": 4.8},
}


# ------------------------------------------------------------------------------------------
# Counting.
# ------------------------------------------------------------------------------------------


def launches(func, args) -> int:
    name = func._schema.name
    if name in NO_LAUNCH:
        return 0
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return 0  # a view
    if name.startswith("aten::_foreach_"):
        return max(1, math.ceil(len(args[0]) / FOREACH_CHUNK))
    return 1


class Count(TorchDispatchMode):
    """Launches by op name into ``counts``; seqmix's custom ops (Grassmann's kernels) counted
    through their bodies, their results taken from ``CUSTOM``'s stand-ins."""

    def __init__(self, counts: collections.Counter, host: set[int] = frozenset()):
        super().__init__()
        self.counts, self.host = counts, host  # host: ids of tensors a GPU run keeps on its CPU

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in custom_ops():
            body, result = custom_ops()[name]
            with Count(self.counts, self.host):
                body(*args, **kwargs)
            return result(*args, **kwargs)
        tensors = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, list | tuple) else [a])
                   if isinstance(t, torch.Tensor)]
        if not (tensors and all(id(t) in self.host for t in tensors)):  # AdamW's step counts: on the CPU
            self.counts[name] += launches(func, args)
        return func(*args, **kwargs)


def custom_ops() -> dict:
    """{op: (its Python body, a finite stand-in for its result)} of Grassmann's custom ops."""
    from seqmix.kernels import grassmann as kg
    from seqmix.mixers.grassmann import grassmann_mix_collapsed

    def fwd(z, weight, bias, offsets, normalize, eps):
        g = grassmann_mix_collapsed(z.float(), weight.float(), None if bias is None else bias.float(), tuple(offsets))
        n, m = z.shape[0] * z.shape[1], len(offsets)
        return g.to(z.dtype), z.new_zeros(n, z.shape[2], dtype=torch.float32), z.new_zeros(n, m, dtype=torch.float32), \
            z.new_zeros(n, m, dtype=torch.float32)

    def bwd(dg, z, weight, c, s, rn, offsets, has_bias, need_dz, need_dw):
        return (torch.zeros_like(z) if need_dz else z.new_empty(0),
                torch.zeros_like(weight) if need_dw else weight.new_empty(0),
                weight.new_zeros(weight.shape[0], dtype=torch.float32) if need_dw and has_bias
                else weight.new_empty(0, dtype=torch.float32))

    return {"seqmix::grassmann_fwd": (kg._forward._init_fn, fwd), "seqmix::grassmann_bwd": (kg._backward._init_fn, bwd)}


def stub_triton(counts: collections.Counter) -> None:
    """Every Triton launch counted and not run (the interpreter would take minutes)."""
    from triton.runtime.interpreter import InterpretedFunction

    def run(self, *args, **kwargs):
        counts[f"triton:{self.fn.__name__}"] += 1

    InterpretedFunction.run = run


def models(arch: str, d_model: int | None = None):
    """(spec, task, model) of the headline's ``arch`` at its solved size (or ``d_model``)."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.preflight import solved_size
    from seqmix.tasks import task_class

    spec = expand(load_study(HEADLINE)).run_spec("wikitext2", arch, 0)
    size = solved_size(spec)
    task = task_class(spec.kind).without_data(spec)
    torch.manual_seed(0)
    return spec, task, task.build_model(d_model or size.d_model, size.n_layers, size.d_ff_mult).train()


def foreach(opt: torch.optim.Optimizer) -> None:
    for group in opt.param_groups:  # CUDA's default path, as one dispatched op per list here
        group["foreach"] = True


def single_stepper(arch: str, precision: str, d_model: int | None = None):
    """One eager training step as ``optimizer_step`` takes it on a GPU (clipping's _foreach_ path)."""
    from seqmix.train.step import make_optimizer, step_loss

    spec, task, model = models(arch, d_model)
    train = spec.train.model_copy(update={"precision": precision, "compile": False})
    opt, loss_of = make_optimizer(model, train), step_loss(task, model, torch.device("cpu"), train)
    foreach(opt)
    batch = task.example_batch(2, "cpu")

    def step():
        loss = loss_of(batch)
        bool(torch.isfinite(loss))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)), 2)
        torch._foreach_mul_(grads, torch.clamp(spec.train.grad_clip / (total + 1e-6), max=1.0))
        opt.step()
        return loss.item(), float(total)

    return step, opt, (task, model, batch)


def packed_stepper(arch: str, precision: str, members: int, d_model: int | None = None):
    """One step of a pack of ``members`` seeds (seqmix.train.pack.pack_step)."""
    from seqmix.train import loop, pack
    from seqmix.train.step import StepLoss

    runs = []
    for seed in range(members):
        spec, task, model = models(arch, d_model)
        spec = spec.model_copy(update={"seed": seed, "run_dir": f"/nonexistent/seed{seed}"})
        runs.append(loop.Run(spec, task, model, None, None, torch.device("cpu"), {}, "", loop.Progress(), None))
    objective = pack._Objective(runs[0].task, runs[0].model)
    loss_of = StepLoss(pack.PackLoss(objective), None, torch.device("cpu"), precision)
    train = runs[0].spec.train.model_copy(update={"precision": precision, "compile": False})
    p = pack.Pack([r.spec.model_copy(update={"train": train}) for r in runs], list(runs), runs, objective, {}, {},
                  None, None, loss_of, torch.device("cpu"))
    pack.assemble(p, None, None)
    foreach(p.opt)
    stacked = tuple(torch.stack([t] * members) for t in runs[0].task.example_batch(2, "cpu"))
    return lambda: pack.pack_step(p, stacked), p.opt


def counted(step, opt, steps: int = 3) -> collections.Counter:
    """The launches of the ``steps``-th step (every step under the count: Grassmann's custom
    ops return their stand-ins, so that the steps stay finite)."""
    for _ in range(steps - 1):
        with Count(collections.Counter()):
            step()
    counts = collections.Counter()
    with Count(counts, {id(state["step"]) for state in opt.state.values() if "step" in state}):
        step()
    return counts


def eval_counts(task, model, batch) -> collections.Counter:
    """The periodic evaluation's forward of one batch (fp32, no grad: ``Task.evaluate``)."""
    counts = collections.Counter()
    model.eval()
    with torch.no_grad(), Count(counts):
        logits = model(batch[0]).float()
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[1].reshape(-1),
                                          reduction="sum").item()
    model.train()
    return counts


def total(counts: collections.Counter, members: int = 1) -> int:
    """Launches on a GPU: an op the CPU loops over the members (PER_PACK) once per pack, less
    what that loop (functorch's BatchedFallback) adds around the CPU's flash attention: a stack
    of each of its two outputs per call, and a select_backward of each of its three inputs per
    member. CUDA's flash and efficient attention fold the members into their batch."""
    looped = counts.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0) // members if members > 1 else 0
    fallback = looped * (2 + 3 * members)  # stacks, select_backwards
    return sum(n // members if name in PER_PACK else n for name, n in counts.items()) - fallback


def host_ratio(arch: str, members: int, rounds: int) -> float:
    """Host time per launch of a packed step over a single step's, measured side by side at a
    tiny width (the headline's layers, d 32, fp32, reference paths: the kernels' own time is
    nothing, what is left is the host's per-op cost)."""
    single, opt, _ = single_stepper(arch, "fp32", d_model=32)
    packed, popt = packed_stepper(arch, "fp32", members, d_model=32)
    n1, nk = total(counted(single, opt)), total(counted(packed, popt), 1)  # the CPU's own launches here
    times = {"single": [], "packed": []}
    for _ in range(rounds):
        for key, step in (("single", single), ("packed", packed)):
            t0 = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - t0)
    return round((statistics.median(times["packed"]) / nk) / (statistics.median(times["single"]) / n1), 3)


def count(members: int, rounds: int) -> dict:
    """Every count the prediction rests on, per architecture of the headline."""
    from seqmix.mixers import dispatch

    triton = collections.Counter()
    stub_triton(triton)
    out = {}
    for arch in ("softmax", "grassmann"):
        with dispatch.using("triton"):  # Grassmann's GPU path: its custom ops (their launches counted)
            step, opt, (task, model, batch) = single_stepper(arch, "bf16")
            single = counted(step, opt)
            evaluation = eval_counts(task, model, batch)
            packed = counted(*packed_stepper(arch, "bf16", members))
        with dispatch.using("reference"):
            ratio = host_ratio(arch, members, rounds)
        out[arch] = {"single": total(single), "packed": total(packed, members), "eval": total(evaluation),
                     "host_ratio": ratio, "members": members,
                     "top_single": dict(single.most_common(8)), "top_packed": dict(packed.most_common(8))}
    return out


# ------------------------------------------------------------------------------------------
# The prediction.
# ------------------------------------------------------------------------------------------


def probe_rows() -> dict[str, dict]:
    import csv

    with open(PROBE) as f:
        return {r["arch"]: r for r in csv.DictReader(f) if r["task"] == "wikitext2" and r["status"] == "ok"}


def predict(counts: dict, args) -> list[dict]:
    """Every option's predicted wall time of the whole call, per GPU (module docstring)."""
    from seqmix.expansion.validate import load_study

    train = load_study(HEADLINE).tasks["wikitext2"].train
    periodic = train.steps // train.eval_every * train.eval_batches
    probe, rows = probe_rows(), []
    options = [(k, packed, step) for step in ("eager", "compiled") for k in (1, 2, 3) for packed in (False, True)]
    for gpu, spec in GPUS.items():
        for seeds, packed, step in options:
            if step == "compiled" and not all("compiled" in c for c in counts.values()):
                continue
            procs = []  # per process: (step's host ms, step's device ms, its evaluations' ms, architecture)
            for arch, c in counts.items():
                per_launch = float(probe[arch]["step_ms"]) / c["single"]
                n = launches_of(c, step, packed, seeds)
                host = per_launch * (COMPILED_HOST if step == "compiled" else n)
                host *= c["host_ratio"] if packed and seeds > 1 and step == "eager" else 1.0
                members = seeds if packed else 1
                flop_ms = members * float(probe[arch]["step_tflop"]) / (args.efficiency * spec["tflops"]) * 1e3
                device = n * args.kernel_us / 1e3 * GPUS["H100"]["hbm_tb_s"] / spec["hbm_tb_s"] + flop_ms
                evals = members * periodic * per_launch * c["eval"]
                procs += [(host, device, evals, arch)] * (1 if packed else seeds)
            rows.append(option_row(gpu, seeds, packed, step, procs, counts, probe, train, args))
    return rows


# A compiled step's host launches on a GPU: two CUDA graph replays (forward, backward), fused
# AdamW (one per parameter group), clipping's six, the batch's two copies and three reads back.
COMPILED_HOST = 15


def launches_of(c: dict, step: str, packed: bool, seeds: int) -> float:
    """A step's launches (eager: counted ATen ops; compiled: inductor's kernels plus the eager
    optimiser's), between one member and the counted pack linearly."""
    if step == "compiled":
        one, many = c["compiled"]["single"] + COMPILED_HOST, c["compiled"]["packed"] + COMPILED_HOST
    else:
        one, many = c["single"], c["packed"]
    return one + (many - one) * (seeds - 1) / (c["members"] - 1) if packed else one


def option_row(gpu, seeds, packed, step, procs, counts, probe, train, args) -> dict:
    """One option's prediction: its processes' steps and evaluations, sharing the GPU."""
    load = max(1.0, sum(d / max(h, d) for h, d, _, _ in procs))  # processes add their device time
    runs = max(train.steps * max(h, d) * load / 1e3 + e / 1e3 for h, d, e, _ in procs)
    final = max(per_launch_eval(counts, probe)) * args.final_batches / 1e3
    whole = args.fixed_s + args.start_s + runs + args.start_s + final
    return {"gpu": gpu, "seeds": seeds, "packed": packed, "step": step, "processes": len(procs),
            "step_ms": {a: round(max(h, d) * load, 1) for h, d, _, a in procs}, "runs_s": round(runs),
            "whole_s": round(whole), "fits_70": runs <= 0.7 * args.runs_budget_s, "fits": whole <= args.limit_s}


def per_launch_eval(counts: dict, probe: dict) -> list[float]:
    return [float(probe[a]["step_ms"]) / c["single"] * c["eval"] for a, c in counts.items()]


def markdown(counts: dict, rows: list[dict], args, where: str) -> str:
    head = (f"Counted at commit {where}, torch {torch.__version__}; the H100's eager step times from {PROBE}. "
            f"The runs get {args.runs_budget_s:.0f} s of the call's {args.limit_s:.0f} s (the rest: "
            f"install, measurement, the DAG's start, the record and packing up, {args.fixed_s:.0f} s, and "
            f"{args.start_s:.0f} s of job start-up twice); the target is three seeds of both within 70 % of "
            f"{args.runs_budget_s:.0f} s = {0.7 * args.runs_budget_s:.0f} s, eager.\n\n")
    table = ["| architecture | eager launches, single step | eager, packed step (members) | eager, evaluation batch "
             "| compiled kernels, single / packed | host time per launch, packed / single | H100 eager step, ms "
             "| host time per launch |", "|---|---|---|---|---|---|---|---|"]
    probe = probe_rows()
    for arch, c in counts.items():
        t, k = float(probe[arch]["step_ms"]), c.get("compiled")
        kernels = f"{k['single']} / {k['packed']}" if k else "not counted"
        table.append(f"| {arch} | {c['single']} | {c['packed']} ({c['members']}) | {c['eval']} | {kernels} "
                     f"| {c['host_ratio']} | {t} | {1e3 * t / c['single']:.1f} µs |")
    options = ["", "| GPU | step | seeds | packed | processes | step ms (each process) | runs, s | whole call, s "
               "| runs within 70 % |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{a} {ms}" for a, ms in sorted(set(r["step_ms"].items())))
        options.append(f"| {r['gpu']} | {r['step']} | {r['seeds']} | {'yes' if r['packed'] else 'no'} | {r['processes']} "
                       f"| {steps} | {r['runs_s']} | {r['whole_s']} | {'yes' if r['fits_70'] else 'no'} |")
    return head + "\n".join(table + options + ["", *verdict(rows, args)]) + "\n"


def verdict(rows: list[dict], args) -> list[str]:
    """Per GPU, whether the issue's target (three seeds of both, eager, runs within 70 % of
    their time) is predicted reached, and by how much the best eager option misses it."""
    target, lines = 0.7 * args.runs_budget_s, []
    for gpu in GPUS:
        eager = [r for r in rows if r["gpu"] == gpu and r["step"] == "eager" and r["seeds"] == 3]
        if not eager:
            continue
        best = min(eager, key=lambda r: r["runs_s"])
        how = f"{'packed' if best['packed'] else 'unpacked'}, {best['processes']} processes"
        lines.append(f"{gpu}, eager, three seeds: the best option ({how}) is predicted at {best['runs_s']} s of runs "
                     f"against the {target:.0f} s target: " + ("reached." if best["fits_70"] else
                     f"**not reached**, by {best['runs_s'] - target:.0f} s ({best['runs_s'] / target:.1f} times the target)."))
    return lines


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.time_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--ratio-rounds", type=int, default=5)
    p.add_argument("--kernel-us", type=float, default=3.0, help="device time of one small kernel (assumed)")
    p.add_argument("--efficiency", type=float, default=0.3, help="share of peak FLOP/s the matmuls reach (assumed)")
    p.add_argument("--limit-s", type=float, default=570.0, help="the device call's timeout_s")
    p.add_argument("--fixed-s", type=float, default=142.0,
                   help="install 22 + measurement 60 + the DAG's start 10 + record and packing up 50 (the stop margin)")
    p.add_argument("--start-s", type=float, default=20.0, help="a job's start-up: imports, CUDA, model, first step")
    p.add_argument("--final-batches", type=int, default=126, help="the final evaluation's batches (59 + 67)")
    p.add_argument("--counts", default="results/bench/time_model/counts.json")
    p.add_argument("--recount", action="store_true", help="count again (else read --counts where it exists)")
    p.add_argument("--markdown", default="results/bench/time_model/table.md")
    p.add_argument("--compiled-counts", default="results/bench/time_model/compiled.json")
    p.add_argument("--recount-compiled", action="store_true", help="compile each step here and count its kernels")
    args = p.parse_args(argv)
    args.runs_budget_s = args.limit_s - args.fixed_s - 2 * args.start_s
    path = Path(args.counts)
    if args.recount or not path.exists():
        counts = count(args.members, args.ratio_rounds)
        where = f"{commit()} on {platform.node()} ({_cpu()})"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"where": where, "counts": counts}, indent=1) + "\n")
    saved = json.loads(path.read_text())
    compiled = Path(args.compiled_counts)
    if args.recount_compiled:
        compiled.write_text(json.dumps(count_compiled(args.members), indent=1) + "\n")
    if compiled.exists():  # inductor's kernels per step: the compiled options
        kernels = json.loads(compiled.read_text())
        for arch, c in saved["counts"].items():
            if "kernels" in kernels.get(f"{arch}/1", {}) and "kernels" in kernels.get(f"{arch}/{args.members}", {}):
                c["compiled"] = {"single": kernels[f"{arch}/1"]["kernels"],
                                 "packed": kernels[f"{arch}/{args.members}"]["kernels"]}
    rows = predict(saved["counts"], args)
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(markdown(saved["counts"], rows, args, saved["where"]))
    print(Path(args.markdown).read_text())
    return 0


def _cpu() -> str:
    from seqmix.numerics import cpu_model

    return cpu_model()


if __name__ == "__main__":
    sys.exit(main())


def count_compiled(members: int) -> dict:
    """``compiled_launches`` of each architecture, single and packed (Grassmann's reference
    traced: on a CPU its kernel path is the interpreter's), or the error that stopped it."""
    from seqmix.mixers import dispatch

    out = {}
    with dispatch.using("reference"):
        for arch in ("softmax", "grassmann"):
            for k in (1, members):
                try:
                    out[f"{arch}/{k}"] = compiled_launches(arch, None if k == 1 else k)
                except Exception as err:  # noqa: BLE001 - a step that does not compile is a row saying so
                    out[f"{arch}/{k}"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    return out


def compiled_launches(arch: str, members: int | None) -> dict:
    """Kernels per step of the compiled step (``train.compile``'s torch.compile of the loss,
    forward and backward), single (``members`` None) or packed, from the code inductor
    generates on this CPU (``run_and_get_code``): its fused kernels and its calls out (extern
    matmuls, aten fallbacks, custom ops), each one launch; the optimiser and clipping are
    eager around it (fused AdamW on a GPU: one launch per group). What it misses: a GPU's
    inductor fuses otherwise (Triton, not C++: reductions may split in two), and on a GPU the
    CUDA graphs replay all of it for one launch per graph."""
    import re

    from torch._inductor.utils import run_and_get_code

    from seqmix.train import pack
    from seqmix.train.step import StepLoss

    spec, task, model = models(arch, d_model=32)
    batch = task.example_batch(2, "cpu")
    if members is None:
        loss_of = StepLoss(task, model, torch.device("cpu"), "fp32", compiled=True)
        call = lambda: loss_of(batch).backward()  # noqa: E731
    else:
        objective = pack._Objective(task, model)
        loss_of = StepLoss(pack.PackLoss(objective), None, torch.device("cpu"), "fp32", compiled=True)
        params = {f"model.{n}": torch.stack([t.detach()] * members).requires_grad_() for n, t in model.named_parameters()}
        buffers = {f"model.{n}": torch.stack([t] * members) for n, t in model.named_buffers()}
        loss_of.model = (params, buffers)
        stacked = tuple(torch.stack([t] * members) for t in batch)
        call = lambda: loss_of(stacked).sum().backward()  # noqa: E731
    call()  # the first step runs eagerly (StepLoss)
    _, codes = run_and_get_code(call)
    calls = re.compile(r"^\s+(?:buf\w+ = )?(?:(cpp_fused_\w+)|(extern_kernels\.\w+)|(torch\.ops\.\w+\.\w+))", re.M)
    kinds = collections.Counter()
    for code in codes:
        body = code[code.index("def call("):] if "def call(" in code else ""
        for fused, extern, _op in calls.findall(body):
            kinds["fused" if fused else "extern" if extern else "op"] += 1
    return {"kernels": sum(kinds.values()), **kinds, "graphs": len(codes)}
