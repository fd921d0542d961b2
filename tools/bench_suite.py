"""How long the test suite takes (`make test`'s pytest command), in two checkouts one after the
other on this machine, and where its CPU time goes: a ratio above 1 is the second checkout's
suite being slower. Hosts of the same kind run at different speeds from day to day (the first
checkout's suite has taken 1,059 s on one 2-core host and 1,504 s on another), so a target for
the suite's time is checked here as a ratio against a checkout measured beside it.

Per checkout: the wall time, the machine's busy and idle CPU seconds over the run (from
/proc/stat, both cores: the suite is CPU-bound when idle is small), and per test file the CPU
seconds of the pytest worker and of every process it waited for (the Snakemake runs, jobs and
notebooks a test starts), summed over the file's tests. What a worker's session does outside
any test (the shared study's background build, reaped at the session's end) is its own row.

    git worktree add /tmp/before <commit>
    python -m tools.bench_suite /tmp/before . [--workers 2] [--select "-k scan"] [--markdown docs/costs/test-suite.md]

Each checkout runs with its own ``.venv/bin/python`` where it has one (an editable install
names one checkout), else this interpreter with ``PYTHONPATH=<checkout>/src``. The
environment is this one: `.ci/run`'s ``SEQMIX_REQUIRE_*`` variables make missing tools fail
instead of skip. ``--markdown`` puts the tables, headed by both commits and the machine, into
that page's generated block (tools.docs). Two full suites: about an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seqmix import numerics
from tools.bench_dry_run import commit
from tools.docs import splice

# A pytest plugin, written to a folder on PYTHONPATH (the first checkout may predate this file):
# per test, the CPU seconds of the worker and of the children it waited for.
PLUGIN = """
import os, resource, time
import pytest

def _cpu():
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime

def _write(name, line):
    with open(os.path.join(os.environ["BENCH_SUITE_OUT"], name), "a") as f:
        f.write(line)

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, waited, start = *_cpu(), time.monotonic()
    yield
    own2, waited2 = _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _write(worker + ".tests", f"{item.nodeid}\\t{own2 - own:.3f}\\t{waited2 - waited:.3f}\\t{time.monotonic() - start:.3f}\\n")

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if os.environ.get("BENCH_SUITE_WORKERS", "0") != "0" and "PYTEST_XDIST_WORKER" not in os.environ:
        return  # xdist's controller: its waited-for children are the workers, counted by themselves
    own, waited = _cpu()
    _write(os.environ.get("PYTEST_XDIST_WORKER", "main") + ".session", f"{own:.3f}\\t{waited:.3f}\\n")
"""
PLUGIN_NAME = "bench_suite_cpu"


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the machine since boot, all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / ticks, (idle + iowait) / ticks


def make_test_command(checkout: Path, workers: int) -> list[str]:
    """The pytest arguments of ``checkout``'s `make test` (its Makefile's recipe), ``workers`` workers."""
    makefile = checkout / "Makefile"
    found = re.search(r"^test:.*\n\tpython -m pytest (.*)$", makefile.read_text(), re.M) if makefile.exists() else None
    if not found:
        sys.exit(f"error: {makefile} has no `test:` recipe running `python -m pytest`")
    return found.group(1).replace("$(TEST_WORKERS)", str(workers)).split()


def run_suite(checkout: Path, workers: int, select: list[str]) -> dict:
    """The suite of ``checkout`` (or the tests ``select`` names), timed, with its per-test CPU (PLUGIN)."""
    venv = checkout / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    # Not a test's variables: run from a test (tests/tools/test_bench_suite.py, itself under a
    # worker), the inner controller would take PYTEST_XDIST_WORKER for its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        plugin_dir, out = Path(tmp) / "plugin", Path(tmp) / "out"
        plugin_dir.mkdir()
        out.mkdir()
        (plugin_dir / f"{PLUGIN_NAME}.py").write_text(PLUGIN)
        paths = [str(plugin_dir)] + ([] if venv.exists() else [str(checkout / "src")])
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        env["BENCH_SUITE_OUT"], env["BENCH_SUITE_WORKERS"] = str(out), str(workers)
        # make test's command, with the plugin; -p no:cacheprovider leaves the checkout as it was.
        command = [python, "-m", "pytest",
                   *make_test_command(checkout, workers), *select, "-p", PLUGIN_NAME, "-p", "no:cacheprovider"]
        busy, idle, start = *machine_cpu(), time.monotonic()
        proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        busy2, idle2 = machine_cpu()
        tests = [row for f in sorted(out.glob("*.tests")) for row in csv.reader(f.open(), delimiter="\t")]
        sessions = [[float(v) for v in f.read_text().split()] for f in sorted(out.glob("*.session"))]
    # pytest's last line: "N passed, ...", "N failed, ...", "N errors in ..." (with -q no "=").
    summary = re.findall(r"^=* ?(\d+ \w+.*?) in [\d.]+s", proc.stdout, re.M)
    if proc.returncode != 0:  # what failed: the output is not kept anywhere else
        print(proc.stdout[-6000:] + proc.stderr[-2000:], file=sys.stderr)
    return {"checkout": checkout, "commit": commit(checkout), "returncode": proc.returncode,
            "summary": summary[-1] if summary else f"no pytest summary (exit {proc.returncode})",
            "wall": wall, "busy": busy2 - busy, "idle": idle2 - idle, "tests": tests, "sessions": sessions}


def session_cpu(result: dict) -> float:
    """CPU seconds of the workers' whole sessions, their waited-for children included."""
    return sum(own + waited for own, waited in result["sessions"])


def by_file(result: dict) -> dict[str, list[float]]:
    """{test file (its name): [tests, CPU s, wall s]}; the rest of the workers' sessions as
    "outside any test"."""
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for nodeid, own, waited, wall in result["tests"]:
        row = files[Path(nodeid.split("::")[0]).name]
        row[0] += 1
        row[1] += float(own) + float(waited)
        row[2] += float(wall)
    in_tests = sum(row[1] for row in files.values())
    files["outside any test"] = [0, session_cpu(result) - in_tests, 0.0]
    return dict(files)


def report(results: dict[str, dict], workers: int, rows: int) -> str:
    first, second = results["first"], results["second"]
    head = (f"The suite as each checkout's `make test` runs it ({workers} workers), each checkout in turn on "
            f"{numerics.cpu_model()} ({platform.node()}, {os.cpu_count()} cores), on "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}.")
    lines = ["| checkout | commit | tests | wall s | machine CPU busy s | idle s | CPU s in the workers' processes |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        result = r["summary"] if r["returncode"] == 0 else f"{r['summary']} (exit {r['returncode']})"
        lines.append(f"| {name} | {r['commit']} | {result} | {r['wall']:,.0f} | {r['busy']:,.0f} | "
                     f"{r['idle']:,.0f} | {session_cpu(r):,.0f} |")
    ratio = (f"second / first: wall {second['wall'] / first['wall']:.2f}, "
             f"machine CPU busy {second['busy'] / first['busy']:.2f}.")
    files = {name: by_file(r) for name, r in results.items()}
    order = sorted(set(files["first"]) | set(files["second"]),
                   key=lambda f: -max(files["second"].get(f, [0, 0])[1], files["first"].get(f, [0, 0])[1]))
    table = ["| test file | first: tests | CPU s | wall s | second: tests | CPU s | wall s |",
             "|---|---|---|---|---|---|---|"]
    for name in order[:rows]:
        cells = []
        for side in ("first", "second"):
            n, cpu, wall = files[side].get(name, [0, 0.0, 0.0])
            cells += [f"{n:.0f}", f"{cpu:,.0f}", f"{wall:,.0f}"]
        table.append(f"| {name} | " + " | ".join(cells) + " |")
    rest = [sum(files[side][f][1] for f in order[rows:] if f in files[side]) for side in ("first", "second")]
    table.append(f"| the other {max(len(order) - rows, 0)} files | | {rest[0]:,.0f} | | | {rest[1]:,.0f} | |")
    note = ("CPU s: the worker's own and that of every process it waited for, summed over the file's "
            "tests; wall s: summed over the file's tests (the two workers run side by side, so a "
            "file's wall time includes waiting for the cores).")
    return "\n".join([head, "", *lines, "", ratio, "", *table, "", note])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a checkout (e.g. a worktree of the commit before)")
    parser.add_argument("second", type=Path, help="another checkout (e.g. .)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test: TEST_WORKERS)")
    parser.add_argument("--rows", type=int, default=25, help="test files listed, the costliest first")
    parser.add_argument("--markdown", type=Path, help="a docs/ page whose generated block gets the tables")
    parser.add_argument("--select", default="", help="pytest arguments choosing tests (e.g. \"-k scan\"): part of the suite")
    args = parser.parse_args(argv)
    checkouts = {"first": args.first.resolve(), "second": args.second.resolve()}
    for path in checkouts.values():
        if not (path / "tests" / "conftest.py").is_file():
            sys.exit(f"error: {path} has no tests/conftest.py; give two checkouts of this repository")
    results = {}
    for name, path in checkouts.items():
        print(f"{name}: the suite of {path} ...", file=sys.stderr, flush=True)
        results[name] = run_suite(path, args.workers, shlex.split(args.select))
        print(f"{name}: {results[name]['summary']}, {results[name]['wall']:,.0f} s", file=sys.stderr, flush=True)
    text = report(results, args.workers, args.rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(splice(args.markdown.read_text(), text))
    return 0 if all(r["returncode"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
