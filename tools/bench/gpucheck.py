"""``make gpu-check`` (``python -m tools.bench gpu-check``): what one available GPU can tell
this project, in one command that ends within 8 minutes on an H100.

Five parts, each with its own time budget (``BUDGETS_S``; a part that runs out records what it
had and the cases it did not reach, and the next part starts on time), each case of a part in a
worker process under its own time limit (``tools.bench.watchdog``: a hang or a crash costs
that case alone and is a row saying so, errors are printed verbatim), every file written into
``results/bench/<gpu>/`` (``<gpu>``: ``seqmix.device.device_slug`` of the device name):

- ``kernel_check.csv``: every Triton kernel of ``seqmix.mixers.triton_kernels()`` against its
  reference through the mixers that call it, fp32 and bf16, forward and every gradient, at
  awkward lengths (``tools.bench.kernel_check``), at the paper profile's width and options;
- ``kernels.csv``: ``python -m tools.bench kernels`` at L 1k-16k, bf16, batch 4 (the report's
  kernel table reads it), each case at most ``CASE_S["kernels"]`` s;
- ``train_probe.csv``: the paper profile's step time, memory and MFU per (task point,
  architecture) at the points of the committed H100 table (``tools.bench.train_probe``;
  ``python -m seqmix plan`` reads this file);
- ``compiled_step.csv``: the eager and the ``train.compile`` step side by side, WikiText-2's
  softmax first, then the slowest eager steps, as many as the budget allows;
- ``train_run.csv``: ``python -m seqmix data`` and ``python -m seqmix train`` on
  config/gpu-check.yaml (a tiny MQAR run, bf16), each architecture eager and compiled;
- ``summary.md``: each part's outcome, the kernels' coverage, the bench's ratios, and the step
  times beside the committed H100 table (read from its CSV), and ``meta.json``: the code,
  packages, device and budgets that produced them.

``--cpu-smoke``: the same parts at tiny sizes on the CPU, the kernels under
TRITON_INTERPRET=1 (the CLI sets it), fp32 (config/gpu-check-smoke.yaml), into a directory of
its own: the test that proves this script before GPU minutes are spent on it. Its numbers
mean nothing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from seqmix import REPO_ROOT, catalogue, plan
from seqmix.device import device_slug
from seqmix.expansion.table import expand
from seqmix.expansion.validate import load_study
from seqmix.io import write_csv, write_json, write_text
from seqmix.train.provenance import git_commit, package_versions
from tools.bench import kernel_check, kernels, train_probe
from tools.bench.watchdog import Case, Outcome, run_cases

BUDGETS_S = {"kernel_check": 80, "kernels": 70, "train_probe": 90, "compiled_step": 110, "train": 70}
SMOKE_BUDGETS_S = {"kernel_check": 120, "kernels": 60, "train_probe": 60, "compiled_step": 120, "train": 150}
CASE_S = {"kernel_check": 30, "kernels": 30, "train_probe": 40, "compiled_step": 90}
PAPER, TRAIN, SMOKE = (str(REPO_ROOT / "config" / name) for name in ("paper.yaml", "gpu-check.yaml",
                                                                       "gpu-check-smoke.yaml"))
LOG = "gpu-check.log"  # scripts/gpu-check.sh tees the whole output here
RUN_FIELDS = ["arch", "compile", "status", "steps", "wall_s", "train_loss_last", "eval_metric", "eval_value",
              "paths", "training_step"]


@dataclasses.dataclass
class Setup:
    """Where and at what sizes the check runs: the GPU's, or the CPU smoke's."""

    smoke: bool
    out: Path
    device: str
    shapes_config: str  # the kernel check's options and the probe's points
    train_config: str
    budgets: dict[str, float]

    @classmethod
    def make(cls, smoke: bool, out: Path | None) -> Setup:
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (Triton interpreter)"
        if smoke:
            return cls(True, out or Path("results/gpu-check-smoke/bench"), device, SMOKE, SMOKE, dict(SMOKE_BUDGETS_S))
        if not torch.cuda.is_available():
            raise RuntimeError("gpu-check needs a GPU (CUDA is not available); --cpu-smoke runs it on the CPU")
        return cls(False, out or Path("results/bench") / device_slug(device), device, PAPER, TRAIN,
                   dict(BUDGETS_S))


def _failed_rows(cases: list[Case], outcomes: dict[str, Outcome], keys: tuple[str, ...]) -> list[dict]:
    """Every case's rows; a case without any (timeout, crash, failure, skipped) is one row saying so."""
    rows = []
    for c in cases:
        o = outcomes[c.id]
        rows += o.rows if o.rows is not None else [{**{k: c.args[k] for k in keys if k in c.args}, "status": o.status}]
    return rows


def _as_task(rows: list[dict]) -> list[dict]:
    """Rows whose case named its task point ``point`` (a failed case's row), with it as ``task``."""
    return [{("task" if k == "point" else k): v for k, v in r.items()} for r in rows]


def part_kernel_check(s: Setup) -> tuple[list[dict], list[str]]:
    study = load_study(s.shapes_config)
    d_model = 16 if s.smoke else 256
    dtypes, lengths = (["fp32"], kernel_check.SMOKE_LENGTHS) if s.smoke else (["fp32", "bf16"], kernel_check.LENGTHS)
    setting = "triton" if s.smoke else "auto"
    cases = [Case(f"{arch}/{form}/{dtype}/L{L}", "tools.bench.kernel_check:check_case",
                  {"config": s.shapes_config, "arch": arch, "form": form, "dtype": dtype, "L": L, "d_model": d_model,
                   "batch": 2, "setting": setting}, CASE_S["kernel_check"])
             for arch, form in kernel_check.cases(list(study.mixers) if s.smoke else None)
             for dtype in dtypes for L in lengths]
    outcomes = run_cases(cases, s.budgets["kernel_check"])
    rows = _failed_rows(cases, outcomes, ("arch", "form", "dtype", "L", "d_model", "batch", "setting"))
    write_csv(s.out / "kernel_check.csv", rows, kernel_check.FIELDS)
    return rows, kernel_check.coverage(rows)


def part_kernels(s: Setup) -> tuple[list[dict], list[str]]:
    lengths, batch, dtype = ([19], 1, "fp32") if s.smoke else ([1024, 4096, 16384], 4, "bf16")
    _, rows = kernels.run_sweep(lengths, s.out / "kernels.csv", batch, dtype, None, CASE_S["kernels"],
                                s.budgets["kernels"], smoke=s.smoke)
    return rows, kernels.summarize(rows)


def probe_points(s: Setup, baseline: list[dict]) -> list[tuple[str, str]]:
    """(task point, arch): the committed H100 table's points (the study's, in its order) on the
    GPU; every point of the smoke config in the smoke."""
    expansion = expand(load_study(s.shapes_config))
    wanted = {r["task"] for r in baseline}
    return [(task.name, arch) for task in expansion.tasks.values() if s.smoke or task.name in wanted
            for arch in task.architectures]


def part_train_probe(s: Setup, baseline: list[dict]) -> tuple[list[dict], list[str]]:
    cases = [Case(f"{point}/{arch}", "tools.bench.train_probe:probe_case",
                  {"config": s.shapes_config, "point": point, "arch": arch}, CASE_S["train_probe"])
             for point, arch in probe_points(s, baseline)]
    outcomes = run_cases(cases, s.budgets["train_probe"])
    rows = _as_task(_failed_rows(cases, outcomes, ("point", "arch")))
    write_csv(s.out / "train_probe.csv", rows, train_probe.FIELDS)
    return rows, []


def part_compiled_step(s: Setup, probe: list[dict]) -> tuple[list[dict], list[str]]:
    ok = [r for r in probe if r.get("status") == "ok"]
    if not ok:
        return [], ["no eager step time was measured: nothing to compile against"]
    point = ok[0]["task"]
    eager = sorted((r for r in ok if r["task"] == point), key=lambda r: -float(r["step_ms"]))
    order = [catalogue.BASELINE] + [r["arch"] for r in eager if r["arch"] != catalogue.BASELINE]
    archs = [a for a in order if any(r["arch"] == a for r in eager)][: 1 if s.smoke else None]
    cases = [Case(f"{point}/{arch}/compiled", "tools.bench.train_probe:compiled_case",
                  {"config": s.shapes_config, "point": point, "arch": arch}, CASE_S["compiled_step"]) for arch in archs]
    outcomes = run_cases(cases, s.budgets["compiled_step"])
    rows = _as_task(_failed_rows(cases, outcomes, ("point", "arch")))
    write_csv(s.out / "compiled_step.csv", rows, train_probe.COMPILED_FIELDS)
    return rows, []


def _command(argv: list[str], deadline: float) -> str:
    """``python -m seqmix <argv>`` until ``deadline``: "ok", "exit code N" or "timeout" (its
    process group killed); its output goes to the log as it comes."""
    import os
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "seqmix", *argv], start_new_session=True)
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout: the part's budget ran out"
    return "ok" if code == 0 else f"exit code {code}"


def _train_row(spec, compiled: bool, status: str, wall_s: float) -> dict:
    run = Path(spec.run_dir)
    row = {"arch": spec.arch, "compile": compiled, "status": status, "wall_s": round(wall_s, 1)}
    if status != "ok" or not (run / "metrics.json").exists():
        return row
    m = json.loads((run / "metrics.json").read_text())
    prov = json.loads((run / "provenance.json").read_text())
    best = m.get("best_eval") or {}
    return {**row, "status": m["status"], "steps": m["steps_completed"], "train_loss_last": m["train_loss_last"],
            "eval_metric": m["metric"], "eval_value": best.get(m["metric"]),
            "paths": "; ".join(f"{k}: {v}" for k, v in prov["implementation"]["paths"].items()),
            "training_step": json.dumps(prov.get("training_step"), sort_keys=True)}


def part_train(s: Setup) -> tuple[list[dict], list[str]]:
    """``python -m seqmix data`` and ``train`` on the tiny training config, each architecture
    with its eager step and with ``train.compile``."""
    import shutil

    deadline = time.monotonic() + s.budgets["train"]
    expansion = expand(load_study(s.train_config))
    for group in expansion.groups:
        status = _command(["data", group, "--config", s.train_config], deadline)
        if status != "ok":
            return [{"status": f"data {group}: {status}"}], []
    rows = []
    for task in expansion.tasks.values():
        for arch in task.architectures[: 1 if s.smoke else None]:  # the smoke: one, for time
            for compiled in (False, True):
                spec = expansion.run_spec(task.name, arch, 0)
                spec = spec.model_copy(update={"train": spec.train.model_copy(update={"compile": compiled}),
                                               "run_dir": spec.run_dir + ("-compiled" if compiled else "")})
                shutil.rmtree(spec.run_dir, ignore_errors=True)  # a fresh run: its wall time is this one's
                t0 = time.monotonic()
                status = _command(["train", "--quiet", "--spec", spec.model_dump_json()], deadline)
                rows.append(_train_row(spec, compiled, status, time.monotonic() - t0))
    write_csv(s.out / "train_run.csv", rows, RUN_FIELDS)
    return rows, []


# ------------------------------------------------------------------------------------------
# The summary.
# ------------------------------------------------------------------------------------------


def _table(heads: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)] + [
        "| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]


def _by_task(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["task"], r["arch"]): r for r in rows if r.get("status") == "ok"}


def _ratio(a, b) -> str:
    return f"{float(a) / float(b):.2f}" if a not in (None, "") and b not in (None, "") else ""


def step_time_lines(probe: list[dict], baseline: list[dict], baseline_name: str) -> list[str]:
    """The step times measured now beside the committed table's, and each one's × softmax."""
    now, then = _by_task(probe), _by_task(baseline)
    rows = []
    for r in probe:
        task, arch = r["task"], r["arch"]
        mine, theirs = now.get((task, arch)), then.get((task, arch))
        base_now, base_then = now.get((task, catalogue.BASELINE)), then.get((task, catalogue.BASELINE))
        rows.append([task, catalogue.title(arch), mine["step_ms"] if mine else r.get("status", "")[:80],
                     _ratio(mine["step_ms"], base_now["step_ms"]) if mine and base_now else "",
                     f"{float(mine['mfu']):.1%}" if mine and mine["mfu"] not in ("", None) else "",
                     theirs["step_ms"] if theirs else "", _ratio(theirs["step_ms"], base_then["step_ms"])
                     if theirs and base_then else "", _ratio(mine["step_ms"], theirs["step_ms"]) if mine and theirs else ""])
    return [f"Step times against {baseline_name} (read from its CSV):", "",
            *_table(["task", "architecture", "ms/step", "× softmax", "MFU", "table ms/step", "table × softmax",
                     "now / table"], rows)]


def _statuses(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        key = str(r.get("status", "")).split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no rows"


def summary(s: Setup, parts: dict[str, dict], results: dict[str, tuple[list, list]], baseline: list[dict],
            meta: dict) -> str:
    git = meta["git"]
    lines = [f"# gpu-check: {s.device}" + (" (CPU smoke: the numbers mean nothing)" if s.smoke else ""), "",
             f"{meta['started']}; seqmix {git['commit']}{' (uncommitted changes)' if git['dirty'] else ''}; "
             + ", ".join(f"{k} {v}" for k, v in meta["packages"].items() if v) + ".", "",
             *_table(["part", "outcome", "seconds", "budget s", "rows"],
                     [[name, p["status"], p["seconds"], s.budgets[name], _statuses(results.get(name, ([], []))[0])]
                      for name, p in parts.items()]), ""]
    titles = {"kernel_check": "Kernels against their references (kernel_check.csv)",
              "kernels": "Kernel bench (kernels.csv)", "compiled_step": "Compiled step (compiled_step.csv)"}
    for name, title in titles.items():
        rows, notes = results.get(name, ([], []))
        lines += [f"## {title}", "", *[f"- {n}" for n in notes]]
        if name == "compiled_step" and rows:
            lines += _table(["task", "architecture", "eager ms", "compiled ms", "speedup", "first compiled step s",
                             "graphs", "breaks", "max loss diff"],
                            [[r["task"], catalogue.title(r["arch"]), r.get("eager_ms"), r.get("compiled_ms") or
                              r["status"][:80], r.get("speedup"), r.get("first_compiled_step_s"), r.get("graphs"),
                              r.get("graph_breaks"), r.get("max_loss_rel_diff")] for r in rows])
        lines.append("")
    lines += ["## Step times (train_probe.csv)", "",
              *step_time_lines(results.get("train_probe", ([], []))[0], baseline, str(plan.MEASURED_DIR)), "",
              "## Training run (train_run.csv)", "",
              *_table(["architecture", "compile", "status", "steps", "wall s", "train loss", "eval", "paths"],
                      [[catalogue.title(r["arch"]) if "arch" in r else "", r.get("compile"), r["status"], r.get("steps"),
                        r.get("wall_s"), r.get("train_loss_last"),
                        f"{r.get('eval_metric')} {r.get('eval_value')}" if r.get("eval_metric") else "", r.get("paths")]
                       for r in results.get("train", ([], []))[0]]), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# The command.
# ------------------------------------------------------------------------------------------


def _part(name: str, fn, *args) -> tuple[dict, tuple[list, list]]:
    """Run one part; a part that raises is recorded (its traceback printed) and the rest run."""
    import traceback

    print(f"== {name} ({datetime.now(UTC):%H:%M:%S} UTC)", flush=True)
    t0 = time.monotonic()
    try:
        result, status = fn(*args), "done"
    except Exception as err:  # noqa: BLE001 - one part's failure must not cost the others
        traceback.print_exception(err)
        result, status = ([], []), f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
    seconds = round(time.monotonic() - t0, 1)
    print(f"== {name}: {status} in {seconds} s", flush=True)
    return {"status": status, "seconds": seconds}, result


def run(smoke: bool = False, out: Path | None = None) -> int:
    """Every part in turn, then summary.md and meta.json; 0 unless a part failed outright."""
    s = Setup.make(smoke, out)
    baseline = plan.read_step_times(plan.MEASURED_DIR)  # before this run can write over it
    s.out.mkdir(parents=True, exist_ok=True)
    for old in s.out.iterdir():  # the directory is one measurement: this one (git keeps the last)
        if old.is_file() and old.name != LOG:
            old.unlink()
    meta = {"device": s.device, "smoke": s.smoke, "started": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "git": git_commit(), "packages": {**package_versions(), "fla": kernels.versions()["fla"] or None},
            "budgets_s": s.budgets, "case_limits_s": CASE_S, "command": " ".join(sys.argv)}
    print(f"gpu-check on {s.device} into {s.out}; budgets {s.budgets} s", flush=True)
    t0 = time.monotonic()
    parts, results = {}, {}
    parts["kernel_check"], results["kernel_check"] = _part("kernel_check", part_kernel_check, s)
    parts["kernels"], results["kernels"] = _part("kernels", part_kernels, s)
    parts["train_probe"], results["train_probe"] = _part("train_probe", part_train_probe, s, baseline)
    parts["compiled_step"], results["compiled_step"] = _part("compiled_step", part_compiled_step, s,
                                                             results["train_probe"][0])
    parts["train"], results["train"] = _part("train", part_train, s)
    meta.update(seconds=round(time.monotonic() - t0, 1), parts=parts)
    write_json(s.out / "meta.json", meta)
    text = summary(s, parts, results, baseline, meta)
    write_text(s.out / "summary.md", text)
    print(text, flush=True)
    return 0 if all(p["status"] == "done" for p in parts.values()) else 1
