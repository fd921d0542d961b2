"""What portable numerics cost against native: the quick profile's own training steps, per mixer.

    python -m tools.bench_numerics [--rounds 5] [--steps 2] [--markdown docs/costs/numerics-cost.md]

One worker process per numerics (seqmix.numerics: native leaves every library to the host;
portable pins ATen, oneDNN and oneMKL to AVX2, oneMKL on its AVX2 reproducibility branch in
STRICT mode, with oneMKL's shim loaded as the CLI loads it, seqmix/mkl_shim.py), and two beside
them: portable's oneMKL branch without STRICT (what STRICT costs), and oneMKL's
vendor-independent COMPATIBLE branch instead (SSE2: what portable cost before, no shim),
each building every (task, mixer) of config/config.yaml's runs as
training builds it (WikiText-2 and both MQAR widths; seed 0, the run's batch, one thread, a
made-up batch of the run's shapes). Round after round, each configuration takes ``--steps``
training steps (forward, backward, clipping, AdamW) in every worker, back to back, the order
rotating between rounds, so that other load on the machine falls on all alike. Step times are
medians over the rounds; a ratio is the median over rounds of a worker's time over native's,
with its range. A mixer's study ratio weighs its tasks by the steps the profile plans for them.
``--ops`` profiles the configurations that cost more than ``--target``: the time portable adds
per library, and the operators (with their shapes) whose time grew most.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from seqmix import mkl_shim, numerics

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python -m tools.bench_numerics"
TARGET = 1.10  # the bound on portable / native


# ------------------------------------------------------------------------------------------
# Worker: one numerics, every configuration built once, commands on stdin, JSON on stdout.
# ------------------------------------------------------------------------------------------


def _worker(shim: bool) -> int:
    if shim:  # as seqmix.cli.environment.pin_numerics does, before torch is imported
        mkl_shim.load()
    import torch

    from seqmix import fingerprint
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.train import provenance

    torch.set_num_threads(1)
    expansion = expand(load_study(REPO / "config" / "config.yaml"))
    planned: dict[tuple[str, str], int] = {}
    for r in expansion.runs:
        key = (r.task, r.arch)
        planned[key] = planned.get(key, 0) + expansion.run_spec(r.task, r.arch, r.seed).train.steps
    cases = [(task, arch, fingerprint.trainer(expansion.run_spec(task, arch, 0))) for task, arch in planned]
    provenance.configure(environment={k: os.environ[k] for k in numerics.VARIABLES if k in os.environ})
    state = provenance.numerics_record()
    _say({"cases": [{"task": t, "arch": a, "d_model": c.spec.model.d_model, "batch": c.spec.train.batch_size,
                     "planned_steps": planned[(t, a)]} for t, a, c in cases],
          "state": {k: state[k] for k in ("aten_capability", "mkl_branch", "mkl_max_isa", "onednn_max_isa", "threads",
                                          "pinned", "mkl_shim")}})
    for line in sys.stdin:
        request = json.loads(line)
        run = cases[request["case"]][2]
        if request["what"] == "time":
            times = []
            for _ in range(request["steps"]):
                t0 = time.perf_counter()
                run.step()
                times.append(time.perf_counter() - t0)
            _say({"times": times})
        else:
            _say({"ops": _op_times(run, request["steps"])})
    return 0


def _say(obj) -> None:
    print(json.dumps(obj), flush=True)


def _op_times(run, steps: int) -> dict[str, float]:
    """Self CPU time per step (ms) of each operator, by name and input shapes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            run.step()
    out: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        key = f"{e.key} {e.input_shapes}" if e.input_shapes else e.key
        out[key] = out.get(key, 0.0) + e.self_cpu_time_total / 1e3 / steps
    return out


class Worker:
    """A worker process running under ``variables`` (and none of the numerics ones of ours), with
    oneMKL's shim (seqmix.mkl_shim) loaded before torch where ``shim``."""

    def __init__(self, name: str, variables: dict[str, str], shim: bool = False):
        env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"}
        env.update(variables)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH")]))
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.bench_numerics", "--worker", *(["--shim"] if shim else [])],
                                     cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (status {self.proc.wait()})")
        return json.loads(line)

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ------------------------------------------------------------------------------------------
# The measurement and its page.
# ------------------------------------------------------------------------------------------

NATIVE, PORTABLE = "native", "portable"
# Beside portable: its oneMKL branch without STRICT (what STRICT costs), and oneMKL's
# vendor-independent COMPATIBLE branch (SSE2), which needs no shim (what portable cost before).
NOT_STRICT = "oneMKL AVX2, not STRICT"
COMPATIBLE = "oneMKL COMPATIBLE"


def settings() -> dict[str, tuple[dict[str, str], bool]]:
    """The variables of every worker and whether it loads oneMKL's shim: native, portable (as the
    CLI runs it) and the variants beside it."""
    portable = numerics.environment(PORTABLE)
    return {NATIVE: ({}, False), PORTABLE: (portable, True),
            NOT_STRICT: ({**portable, "MKL_CBWR": "AVX2"}, True),
            COMPATIBLE: ({**portable, "MKL_CBWR": "COMPATIBLE"}, False)}


def measure(workers: dict[str, Worker], rounds: int, steps: int, only: list[str] | None = None,
            progress=print) -> list[dict]:
    """Rows of the table (``only``: the configurations whose task/mixer contains one of these):
    per worker its median step time, and per worker but native the ratio to native."""
    cases = workers[NATIVE].hello["cases"]
    chosen = [i for i, c in enumerate(cases) if not only or any(o in f"{c['task']}/{c['arch']}" for o in only)]
    names = list(workers)
    times = {m: {i: [] for i in chosen} for m in names}
    for i in chosen:  # one untimed step each: caches, first-call paths
        for w in workers.values():
            w.ask(what="time", case=i, steps=1)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # each takes every place in turn
        for i in chosen:
            for m in order:
                times[m][i].append(statistics.median(workers[m].ask(what="time", case=i, steps=steps)["times"]))
        progress(f"round {r + 1}/{rounds} done")
    rows = []
    for i in chosen:
        row = {**cases[i], "case": i, "ms": {m: 1e3 * statistics.median(times[m][i]) for m in names}, "ratio": {}}
        for m in names[1:]:
            ratios = [a / n for a, n in zip(times[m][i], times[NATIVE][i])]
            row["ratio"][m] = (statistics.median(ratios), min(ratios), max(ratios))
        rows.append(row)
    return rows


# Which library an operator's self time is spent in (the rest is ATen's own kernels).
MKL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_fft_",
           "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::linalg_", "aten::_linalg_")
ONEDNN_OPS = ("aten::gelu", "aten::mkldnn_", "aten::convolution_backward", "aten::_convolution")


def library(op: str) -> str:
    name = op.split(" ", 1)[0]
    if name.startswith(MKL_OPS):
        return "oneMKL"
    return "oneDNN" if name.startswith(ONEDNN_OPS) else "ATen"


def where_it_goes(workers: dict[str, Worker], rows: list[dict], steps: int, repeats: int, top: int,
                  target: float) -> list[dict]:
    """For each configuration above ``target``: the added time per library and the operators
    whose time grew most; each operator's time the least of ``repeats`` profiles (a profile
    that other load interrupted counts for nothing)."""
    found = []
    for row in (r for r in rows if r["ratio"][PORTABLE][0] > target):
        ops = {}
        for m in (NATIVE, PORTABLE):
            runs = [workers[m].ask(what="ops", case=row["case"], steps=steps)["ops"] for _ in range(repeats)]
            ops[m] = {k: min(r.get(k, 0.0) for r in runs) for k in {k for r in runs for k in r}}
        keys = {*ops[NATIVE], *ops[PORTABLE]}
        added = {k: ops[PORTABLE].get(k, 0.0) - ops[NATIVE].get(k, 0.0) for k in keys}
        by_library = {lib: sum(v for k, v in added.items() if library(k) == lib) for lib in ("oneMKL", "oneDNN", "ATen")}
        grown = sorted(keys, key=lambda k: -added[k])[:top]
        found.append({**row, "by_library": by_library,
                      "ops": [(k, library(k), ops[NATIVE].get(k, 0.0), ops[PORTABLE].get(k, 0.0)) for k in grown]})
    return found


def study_ratios(rows: list[dict], name: str) -> dict[str, float]:
    """Per mixer (and ``all``, last): ``name`` / native over its runs' planned steps."""
    out: dict[str, list[float]] = {}
    for r in rows:
        for key in (r["arch"], "all"):
            n, p = out.setdefault(key, [0.0, 0.0])
            out[key] = [n + r["ms"][NATIVE] * r["planned_steps"], p + r["ms"][name] * r["planned_steps"]]
    ratios = {k: p / n for k, (n, p) in out.items()}
    return {**{k: v for k, v in ratios.items() if k != "all"}, "all": ratios["all"]}


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" + edits" if git("status", "--porcelain", "--", "src", "tools") else "")


def state_text(state: dict) -> str:
    return (f"ATen {state['aten_capability']}, oneMKL {state['mkl_branch']} (cap {state['mkl_max_isa'] or 'none'}, "
            f"shim {'loaded' if state['mkl_shim'] else 'not loaded'}), oneDNN cap "
            f"{state['onednn_max_isa'] or 'none'}, {state['threads']} thread")


def markdown(rows: list[dict], states: dict, ops: list[dict], a, load: tuple, wall_s: float) -> str:
    import torch

    flags = numerics.cpu_flags()
    isa = " ".join(f for f in flags if f.startswith(("avx", "fma", "amx")))
    names = list(states)
    variants = names[2:]
    shared = max(load) > 0.5 * (os.cpu_count() or 1)
    lines = [
        "# What portable numerics cost",
        "",
        f"<!-- generated by `{COMMAND} --rounds {a.rounds} --steps {a.steps} --markdown docs/costs/numerics-cost.md`; "
        "do not edit by hand -->",
        f"Measured at commit {commit()} on {numerics.cpu_model()} ({numerics.cpu_vendor()}, {platform.node()}, "
        f"{os.cpu_count()} CPUs), {datetime.date.today().isoformat()}, torch {torch.__version__}, one thread. "
        f"The host's widest vector instruction set: {numerics.vector_isa(flags)} (flags: {isa}). Load average "
        f"{load[0]:.1f} before and {load[1]:.1f} after on {os.cpu_count()} CPUs, {wall_s / 60:.1f} minutes: "
        + ("**the machine was shared with other work**, so single times are noisy; read the ratios (each of steps "
           "taken back to back) and their ranges, and rerun this command on a quiet machine for the record."
           if shared else "a quiet machine."),
        "",
        "What each worker ran (as its libraries reported): "
        + "; ".join(f"{m}: {state_text(st)}" for m, st in states.items()) + ".",
        "",
        f"Every (task, mixer) of `config/config.yaml`, built as training builds it (seed 0, its batch, a made-up "
        f"batch of its shapes), {a.rounds} rounds of {a.steps} training steps (forward, backward, clipping, AdamW) "
        "in each worker, the order rotating between rounds. Times are medians (ms per step); a ratio is to native, "
        f"the median over rounds, with its range. Target: portable / native <= {a.target:.2f}. "
        + (f"Beside portable: '{NOT_STRICT}' is portable without oneMKL's STRICT mode (what STRICT costs)"
           if NOT_STRICT in variants else "")
        + (f"; '{COMPATIBLE}' is portable with oneMKL's vendor-independent COMPATIBLE branch (SSE2) instead of its "
           "AVX2 one, without the shim (portable before)" if COMPATIBLE in variants else "") + ".",
        "",
        "| task | mixer | d | batch | native ms | portable ms | portable / native | range | "
        + " | ".join(variants) + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(variants),
    ]
    for r in rows:
        med, lo, hi = r["ratio"][PORTABLE]
        lines.append(f"| {r['task']} | {r['arch']} | {r['d_model']} | {r['batch']} | {r['ms'][NATIVE]:.0f} | "
                     f"{r['ms'][PORTABLE]:.0f} | {med:.2f} | {lo:.2f}-{hi:.2f} | "
                     + " | ".join(f"{r['ratio'][v][0]:.2f}" for v in variants) + " |")
    ratios = {m: study_ratios(rows, m) for m in names[1:]}
    lines += ["", "Per mixer, over the steps the profile plans for its runs (every seed; MQAR runs that stop early "
              "train fewer), the ratio to native:", "",
              "| mixer | portable | " + " | ".join(variants) + " |", "|---|---|" + "---|" * len(variants)]
    lines += [f"| {k} | {v:.2f} | " + " | ".join(f"{ratios[m][k]:.2f}" for m in variants) + " |"
              for k, v in ratios[PORTABLE].items()]
    if ops:
        lines += ["", f"## Where the cost is (configurations above {a.target:.2f})", "",
                  "Self CPU time per step added by portable, per library (aten::mm, addmm, bmm, the FFTs and CPU "
                  "flash attention's blocks are oneMKL's; GELU and conv1d oneDNN's; the rest ATen's kernels), and "
                  f"the {a.ops} operators whose time grew most, with their input shapes (torch.profiler, each "
                  f"operator's least of {a.profiles} profiles of {a.steps} steps).", "",
                  "| task | mixer | ratio | oneMKL ms | oneDNN ms | ATen ms |", "|---|---|---|---|---|---|"]
        lines += [f"| {o['task']} | {o['arch']} | {o['ratio'][PORTABLE][0]:.2f} | "
                  + " | ".join(f"{o['by_library'][lib]:+.1f}" for lib in ("oneMKL", "oneDNN", "ATen")) + " |"
                  for o in ops]
        for o in ops:
            lines += ["", f"**{o['task']} / {o['arch']}** ({o['ratio'][PORTABLE][0]:.2f}):", "",
                      "| operator | library | native ms | portable ms |", "|---|---|---|---|"]
            lines += [f"| `{k}` | {lib} | {n:.1f} | {p:.1f} |" for k, lib, n, p in o["ops"]]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="training steps per configuration, worker and round")
    p.add_argument("--target", type=float, default=TARGET)
    p.add_argument("--ops", type=int, default=6, help="operators to name per configuration above the target (0: none)")
    p.add_argument("--profiles", type=int, default=3, help="profiles per configuration and numerics (the least counts)")
    p.add_argument("--no-variants", action="store_true", help="native and portable only")
    p.add_argument("--only", action="append", help="only the configurations whose <task>/<mixer> contains this (repeatable)")
    p.add_argument("--markdown", type=Path, default=None, help="write the page here (docs/costs/numerics-cost.md)")
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.shim)
    load0, t0 = os.getloadavg()[0], time.time()
    chosen = settings()
    if a.no_variants:
        chosen = {k: v for k, v in chosen.items() if k in (NATIVE, PORTABLE)}
    workers = {m: Worker(m, variables, shim) for m, (variables, shim) in chosen.items()}
    try:
        rows = measure(workers, a.rounds, a.steps, a.only, progress=lambda m: print(m, file=sys.stderr))
        ops = where_it_goes(workers, rows, a.steps, a.profiles, a.ops, a.target) if a.ops else []
        states = {m: w.hello["state"] for m, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    text = markdown(rows, states, ops, a, (load0, os.getloadavg()[0]), time.time() - t0)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
