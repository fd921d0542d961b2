"""One run alone against several together on one GPU, with the eager and the compiled step
(``python -m tools.bench.packing --config config/paper-headline.yaml``): what
scripts/gpu-headline.sh measures before the headline study, and the choices it takes from it.

``--jobs`` K worker processes (the study's runs seed by seed: architectures and seeds as it
trains them), each holding its run's model twice as training builds it (run spec, budget
solved, optimiser), one stepped eagerly and one under ``train.compile``, on one made-up batch
of the run's shapes. This process drives them:

step kind by step kind, eager first (so that a compile that overruns ``--measure-budget-s``
leaves the eager rows):

1. warm: each worker takes a few steps of that kind (compiling at the second); the first
   worker of each architecture first, so that the others find inductor's cache (as the
   study's runs will);
2. alone: the first worker of each architecture times ``--steps`` steps and as many
   evaluation batches (forward, fp32, no grad: the periodic evaluation), the others idle;
3. together: all K workers step from one instant for ``--window`` seconds.

``packing.csv`` (``FIELDS``): one row per (architecture, step, jobs). ``choice.json``: the
step, the slots per GPU and the seeds that fit ``--budget-s``, with every option's predicted
wall time (``predict``: a run's steps and evaluations at the measured times, the times for k
jobs together interpolated between 1 and K, plus each run's measured start-up and a fixed
``--overhead-s``). ``--apply FILE`` writes the step and the seeds into the config file.
On a CPU it runs the same, slowly (the test's tiny config): its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

FIELDS = ["arch", "mode", "jobs", "status", "step_ms", "eval_ms", "steps", "first_compiled_step_s", "graphs",
          "graph_breaks", "ready_s"]
MODES = ("eager", "compiled")
REPLY = "@@reply "
STARTED = time.monotonic()


# ------------------------------------------------------------------------------------------
# Worker: one run's two models; commands on stdin, one JSON reply line each.
# ------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, config: str, task: str, arch: str, seed: int, modes: list[str]):
        import torch

        from seqmix.expansion.table import expand
        from seqmix.expansion.validate import load_study
        from seqmix.preflight import solved_size
        from seqmix.tasks import task_class
        from seqmix.train.step import make_optimizer, optimizer_step, step_loss

        self.torch, self.optimizer_step = torch, optimizer_step
        self.spec = expand(load_study(config)).run_spec(task, arch, seed)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.task = task_class(self.spec.kind).without_data(self.spec)
        size = solved_size(self.spec)
        self.models = {}
        for mode in modes:
            torch.manual_seed(seed)
            model = self.task.build_model(size.d_model, size.n_layers, size.d_ff_mult).to(self.device).train()
            train = self.spec.train.model_copy(update={"compile": mode == "compiled"})
            self.models[mode] = (model, make_optimizer(model, train), step_loss(self.task, model, self.device, train))
        self.batch = self.task.example_batch(self.spec.train.batch_size, self.device)
        self.failed: dict[str, str] = {}
        self.built_s = time.monotonic() - STARTED  # the process's start-up: imports, CUDA, the models

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def step(self, mode: str) -> None:
        model, opt, loss_of = self.models[mode]
        self.optimizer_step(loss_of, model, opt, self.spec.train.grad_clip, self.batch)

    def warm(self, steps: int, mode: str) -> dict:
        """``steps`` steps of the ``mode`` model (the compiled one compiles at its second); ready_s:
        the process's start-up and this, what a training job spends before its steps."""
        t0 = time.monotonic()
        try:
            for _ in range(steps):
                self.step(mode)
            self._sync()
        except Exception as err:  # noqa: BLE001 - a step that fails here is a row saying so
            self.failed[mode] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        record = self.models["compiled"][2].record() if mode == "compiled" else {}
        return {"first_compiled_step_s": record.get("first_compiled_step_s"), "graphs": record.get("graphs"),
                "graph_breaks": record.get("graph_breaks"), "failed": self.failed,
                "ready_s": round(self.built_s + time.monotonic() - t0, 1)}

    def time_steps(self, mode: str, steps: int) -> dict:
        if mode in self.failed:
            return {"status": f"failed: {self.failed[mode]}"}
        seconds = []
        for _ in range(steps):
            self._sync()
            t0 = time.perf_counter()
            self.step(mode)
            self._sync()
            seconds.append(time.perf_counter() - t0)
        return {"status": "ok", "step_ms": round(statistics.median(seconds) * 1e3, 3), "steps": steps}

    def time_eval(self, batches: int) -> dict:
        """Forward batches as the periodic evaluation runs them (eval mode, fp32, no grad)."""
        torch, model = self.torch, next(iter(self.models.values()))[0]
        model.eval()
        seconds = []
        with torch.no_grad():
            for _ in range(batches):
                self._sync()
                t0 = time.perf_counter()
                logits = model(self.batch[0]).float()
                torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.batch[1].reshape(-1)).item()
                seconds.append(time.perf_counter() - t0)
        model.train()
        return {"eval_ms": round(statistics.median(seconds) * 1e3, 3)}

    def window(self, mode: str, start_at: float, seconds: float) -> dict:
        """Steps from the wall-clock instant ``start_at`` for ``seconds``: the mean step time."""
        if mode in self.failed:
            return {"status": f"failed: {self.failed[mode]}"}
        time.sleep(max(0.0, start_at - time.time()))
        t0, steps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            self.step(mode)
            steps += 1
        self._sync()
        return {"status": "ok", "step_ms": round((time.perf_counter() - t0) / steps * 1e3, 3), "steps": steps}


def serve(args: dict) -> None:
    from seqmix.mixers import dispatch

    with dispatch.using():
        worker = Worker(args["config"], args["task"], args["arch"], args["seed"], args["modes"])
        print(REPLY + json.dumps({"built": True}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            do = cmd.pop("do")
            if do == "quit":
                return
            reply = {"warm": worker.warm, "time": worker.time_steps, "eval": worker.time_eval,
                     "window": worker.window}[do](**cmd)
            print(REPLY + json.dumps(reply), flush=True)


# ------------------------------------------------------------------------------------------
# Coordinator.
# ------------------------------------------------------------------------------------------


class Handle:
    """A worker process; ``ask`` sends a command and waits for its reply until a deadline."""

    def __init__(self, run: dict, config: str, modes: tuple[str, ...]):
        self.run = run
        payload = json.dumps({**run, "config": config, "modes": list(modes)})
        self.proc = subprocess.Popen([sys.executable, "-u", "-m", "tools.bench.packing", "--worker", payload],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                self.replies.put(json.loads(line[len(REPLY):]))
            else:
                print(f"[{self.run['arch']} seed {self.run['seed']}] {line}", end="", flush=True)
        self.replies.put(None)

    def send(self, do: str, **args) -> None:
        self.proc.stdin.write(json.dumps({"do": do, **args}) + "\n")
        self.proc.stdin.flush()

    def reply(self, deadline: float) -> dict:
        try:
            got = self.replies.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("no reply before the measurement's budget ran out") from None
        if got is None:
            raise RuntimeError(f"worker exited with status {self.proc.wait()}")
        return got

    def ask(self, deadline: float, do: str, **args) -> dict:
        self.send(do, **args)
        return self.reply(deadline)

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def measure(config: str, jobs: int, steps: int, window: float, budget_s: float, modes=MODES) -> list[dict]:
    """The rows of packing.csv (module docstring); what the budget left unmeasured is missing."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study

    expansion = expand(load_study(config))
    study = expansion.study
    # seed by seed, so that K < the study's runs still measures every architecture
    order = sorted(expansion.runs, key=lambda r: (study.seeds.index(r.seed), study.architectures.index(r.arch)))
    every = [{"task": r.task, "arch": r.arch, "seed": r.seed} for r in order]
    chosen = [every[i % len(every)] for i in range(jobs)]
    deadline = time.monotonic() + budget_s
    handles = [Handle(r, config, modes) for r in chosen]
    first = {}
    for i, h in enumerate(handles):
        first.setdefault(h.run["arch"], i)
    leads = [handles[i] for i in first.values()]
    rows = []
    try:
        for h in handles:
            h.reply(deadline)  # built
        for mode in modes:  # eager first: a compile that overruns the budget leaves its rows
            rows += measure_mode(handles, leads, first, mode, jobs, steps, window, deadline)
        for h in handles:
            h.send("quit")
    except (TimeoutError, RuntimeError, BrokenPipeError) as err:
        print(f"packing: measurement stopped: {err}", flush=True)
        rows.append({"arch": "", "mode": "", "jobs": "", "status": f"stopped: {err}"})
    finally:
        for h in handles:
            h.stop()
    return rows


def measure_mode(handles, leads, first, mode: str, jobs: int, steps: int, window: float, deadline: float) -> list[dict]:
    """One step kind's rows: warm every worker (the first of each architecture first, so that
    the others find inductor's cache, as the study's runs will), time each architecture alone
    (steps and evaluation batches), then all workers together for ``window`` seconds."""
    warm, rows = {}, []
    for group in (leads, [h for h in handles if h not in leads]):
        for h in group:
            h.send("warm", steps=4, mode=mode)
        for h in group:
            warm[id(h)] = h.reply(deadline)
    for h in leads:
        w, ev = warm[id(h)], h.ask(deadline, "eval", batches=steps)
        got = h.ask(deadline, "time", mode=mode, steps=steps)
        rows.append({"arch": h.run["arch"], "mode": mode, "jobs": 1, **got, "eval_ms": ev["eval_ms"],
                     "ready_s": w["ready_s"], **({k: w[k] for k in ("first_compiled_step_s", "graphs", "graph_breaks")}
                                                 if mode == "compiled" else {})})
    start_at = time.time() + 1.0
    for h in handles:
        h.send("window", mode=mode, start_at=start_at, seconds=window)
    got = [h.reply(deadline) for h in handles]
    for arch in first:
        mine = [g for h, g in zip(handles, got) if h.run["arch"] == arch]
        ok = [g["step_ms"] for g in mine if g.get("status") == "ok"]
        rows.append({"arch": arch, "mode": mode, "jobs": jobs, "status": "ok" if ok else mine[0]["status"],
                     "step_ms": round(statistics.mean(ok), 3) if ok else None,
                     "steps": sum(g.get("steps", 0) for g in mine),
                     "ready_s": max(warm[id(h)]["ready_s"] for h in handles if h.run["arch"] == arch
                                    and (h not in leads or jobs == len(leads)))})
    return rows


# ------------------------------------------------------------------------------------------
# The choice.
# ------------------------------------------------------------------------------------------


def _times(rows: list[dict], mode: str) -> dict[str, dict[int, float]] | None:
    """{arch: {jobs: step_ms}} of ``mode`` where every architecture was measured alone and together."""
    got: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.get("mode") == mode and r.get("status") == "ok" and r.get("step_ms"):
            got.setdefault(r["arch"], {})[int(r["jobs"])] = float(r["step_ms"])
    return got if got and all(len(v) == 2 for v in got.values()) else None


def step_ms_at(times: dict[int, float], k: int) -> float:
    """A step's time with k jobs together: measured at 1 and K, linear between them."""
    (k1, t1), (kk, tk) = sorted(times.items())
    return t1 if kk == k1 else t1 + (tk - t1) * (min(k, kk) - k1) / (kk - k1)


def predict(rows: list[dict], expansion, mode: str, seeds: int, slots: int, overhead_s: float) -> float | None:
    """The study's wall time in seconds with ``seeds`` seeds and at most ``slots`` jobs at once
    (1: one after another; else in waves of ``slots`` runs, each as long as its slowest), or
    None where ``mode`` was not measured. A run: its start-up (``ready_s``: a worker that
    found the compile cache), its steps, its periodic and final evaluation batches (at the
    eval time measured alone, slowed as the steps are together)."""
    times = _times(rows, mode)
    if times is None:
        return None
    alone = {r["arch"]: float(r["eval_ms"]) for r in rows if r.get("jobs") == 1 and r.get("eval_ms")}
    ready = {r["arch"]: float(r["ready_s"]) for r in rows if r.get("mode") == mode and r.get("ready_s")
             and r.get("jobs") != 1}
    (task,) = _tasks(expansion)
    train = task.section.train
    jobs = seeds * len(times)
    k = min(slots, jobs)
    batches = train.steps // train.eval_every * train.eval_batches + final_eval_batches(expansion, task)
    per_run = {}
    for arch, t in times.items():
        t_step = step_ms_at(t, k) / 1e3
        slowdown = step_ms_at(t, k) / t[min(t)]
        per_run[arch] = ready.get(arch, 0.0) + train.steps * t_step + batches * alone.get(arch, 0.0) / 1e3 * slowdown
    runs_time = math.ceil(jobs / k) * max(per_run.values()) if k > 1 else seeds * sum(per_run.values())
    return round(overhead_s + runs_time, 1)


def _tasks(expansion) -> list:
    return list(expansion.tasks.values())


def final_eval_batches(expansion, task) -> int:
    """Batches of a run's final evaluation (its eval and test splits, whole or capped), from the
    prepared data's manifest; 0 where the data are not prepared."""
    try:
        splits = json.loads((expansion.data_dir(task.group) / "manifest.json").read_text())["splits"]
    except (OSError, ValueError, KeyError):
        return 0
    settings, train = task.section, task.section.train
    block = getattr(settings, "block_size", None)
    if block is None:
        return 0
    total = 0
    for split in (settings.eval_split, settings.test_split):
        tokens = int(splits.get(split, {}).get("tokens", 0)) - 1
        if settings.eval_max_tokens is not None:
            tokens = min(tokens, settings.eval_max_tokens)
        total += math.ceil(max(tokens, 0) / block / train.batch_size)
    return total


def choose(rows: list[dict], expansion, jobs: int, budget_s: float, overhead_s: float, margin: float = 0.9) -> dict:
    """The step, slots per GPU and seeds (module docstring): the most seeds whose predicted
    wall time fits ``margin`` x ``budget_s`` (a run that overruns the deadline is lost whole),
    then the shortest; seeds are cut before anything else. Where not even one seed fits, no
    seed (``fits`` false: nothing is started) and the option that came closest. A pure
    function of the measured rows and the budget: the same numbers choose the same on any host."""
    study, options = expansion.study, []
    for mode in MODES:
        for slots in sorted({1, jobs}):
            for seeds in range(len(study.seeds), 0, -1):
                wall = predict(rows, expansion, mode, seeds, slots, overhead_s)
                if wall is not None:
                    options.append({"mode": mode, "slots_per_gpu": slots, "seeds": seeds, "predicted_wall_s": wall})
    if not options:
        return {"measured": False, "fits": False, "compile": False, "slots_per_gpu": jobs, "seeds": [], "options": [],
                "budget_s": budget_s, "margin": margin, "overhead_s": overhead_s,
                "reason": "nothing was measured within the measurement's time: no run is started"}
    fits = [o for o in options if o["predicted_wall_s"] <= margin * budget_s]
    best = (max(fits, key=lambda o: (o["seeds"], -o["predicted_wall_s"])) if fits
            else min(options, key=lambda o: (o["seeds"], o["predicted_wall_s"])))
    times = _times(rows, best["mode"]) or {}
    gain = {arch: round(jobs * t[1] / t[jobs], 2) for arch, t in times.items() if 1 in t and jobs in t}
    return {"measured": True, "compile": best["mode"] == "compiled", "slots_per_gpu": best["slots_per_gpu"],
            "seeds": study.seeds[: best["seeds"]] if fits else [], "closest_seeds": best["seeds"],
            "predicted_wall_s": best["predicted_wall_s"], "fits": bool(fits),
            "budget_s": budget_s, "margin": margin, "overhead_s": overhead_s,
            # steps per second of K jobs together over one alone: the default SLOTS_PER_GPU follows it
            "packing_gain": gain, "recommended_slots_per_gpu": jobs if gain and min(gain.values()) > 1.0 else 1,
            "options": options}


SEEDS_LINE = re.compile(r"^(seeds: )\[[0-9, ]*\]( *#.*)?$", re.M)
COMPILE_LINE = re.compile(r"^(      compile: )(true|false)( *#.*)?$", re.M)
PACK_LINE = re.compile(r"^(      pack: )(true|false)( *#.*)?$", re.M)


def apply(path: str | os.PathLike, choice: dict) -> None:
    """Write the choice's seeds and step into the config file (its one ``seeds:`` line and its
    one ``compile:`` line), and check that the file now resolves to them. A ``pack:`` line is
    set false: the workers time one run per process, not seed packs, and the study must run
    what was timed (a pack's eager step launches 1.6-1.7x a run's kernels: tools/bench/time_model)."""
    from seqmix.expansion.validate import load_study

    text = Path(path).read_text()
    if len(SEEDS_LINE.findall(text)) != 1 or len(COMPILE_LINE.findall(text)) != 1 or len(PACK_LINE.findall(text)) > 1:
        raise ValueError(f"{path}: expected one 'seeds: [...]' line, one '      compile: true|false' line and at "
                         "most one '      pack: true|false' line to set")
    seeds = f"[{', '.join(map(str, choice['seeds']))}]"
    text = SEEDS_LINE.sub(lambda m: m.group(1) + seeds + (m.group(2) or ""), text)
    text = COMPILE_LINE.sub(lambda m: m.group(1) + ("true" if choice["compile"] else "false") + (m.group(3) or ""), text)
    text = PACK_LINE.sub(lambda m: m.group(1) + "false" + (m.group(3) or ""), text)
    Path(path).write_text(text)
    study = load_study(path)
    assert study.seeds == list(choice["seeds"]) and all(
        s.train.compile == choice["compile"] and not s.train.pack for s in study.tasks.values()), \
        f"{path} did not take the choice"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.packing", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config/paper-headline.yaml")
    p.add_argument("--jobs", type=int, default=6, help="K: the runs together (the study's, in order)")
    p.add_argument("--steps", type=int, default=30, help="steps (and evaluation batches) timed alone")
    p.add_argument("--window", type=float, default=8.0, help="seconds every job steps together")
    p.add_argument("--measure-budget-s", type=float, default=170.0, help="the whole measurement stops after this")
    p.add_argument("--budget-s", type=float, default=540.0, help="the study's time: the seeds must fit it")
    p.add_argument("--deadline", type=float, default=None,
                   help="the study must end by this Unix time: its budget is what is left when the measurement ends")
    p.add_argument("--overhead-s", type=float, default=50.0,
                   help="the study's time besides its runs' own (Snakemake, the evaluation jobs, recording): an allowance")
    p.add_argument("--margin", type=float, default=0.9, help="the predicted time must fit this share of the budget")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", default="packing.csv")
    p.add_argument("--choice", default="choice.json")
    p.add_argument("--apply", default=None, help="write the chosen seeds and step into this config file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        serve(json.loads(args.worker))
        return 0
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.io import write_csv, write_json

    expansion = expand(load_study(args.config))
    if len(_tasks(expansion)) != 1:
        p.error(f"{args.config}: the prediction is for a study of one task (the headline); this one has "
                f"{', '.join(expansion.tasks)}")
    budget_s = args.measure_budget_s if args.deadline is None else min(args.measure_budget_s, args.deadline - time.time())
    rows = measure(args.config, args.jobs, args.steps, args.window, max(budget_s, 0.0), tuple(args.modes.split(",")))
    write_csv(Path(args.out), rows, FIELDS)
    budget = args.budget_s if args.deadline is None else round(args.deadline - time.time(), 1)
    choice = choose(rows, expansion, args.jobs, budget, args.overhead_s, args.margin)
    write_json(Path(args.choice), choice)
    print(json.dumps({k: v for k, v in choice.items() if k != "options"}), flush=True)
    if args.apply and choice["fits"]:  # nothing that does not fit is started, nor written
        apply(args.apply, choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
