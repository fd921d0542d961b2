"""Benchmark cases in worker processes, each under a time limit, so that one case that hangs
(a kernel compiling for minutes, an import that blocks) or kills its process (an assertion
in a compiler) costs that case alone.

``run_cases(cases, budget_s)`` starts ``python -m tools.bench.watchdog`` and hands it the
cases; the worker runs them in order, announcing each (``@@start <id>``) and returning its rows
(``@@done <id> <json>``); anything else it prints is passed through as it comes, so compiler
errors appear verbatim. A case that runs past its ``timeout_s``, or past the budget of the whole
call, is killed with its worker (the process group), and a fresh worker takes the cases left;
so is one whose worker dies. Each case ends with an ``Outcome``: its rows, or why it has none
(``timeout …``, ``crashed …``, ``skipped …``), and its seconds.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

START, DONE = "@@start ", "@@done "
WORKER_START_S = 120.0  # importing torch and seqmix on a cold machine; counted against the budget


@dataclasses.dataclass(frozen=True)
class Case:
    """``fn`` ("module:function") called with ``args`` (JSON values) in a worker; it returns a
    list of rows (dicts of JSON values)."""

    id: str
    fn: str
    args: dict
    timeout_s: float

    def __post_init__(self):
        if not self.id or any(c.isspace() for c in self.id):
            raise ValueError(f"a case id is one word: {self.id!r}")


@dataclasses.dataclass
class Outcome:
    rows: list[dict] | None  # None: the case returned nothing (status says why)
    status: str  # "ok", or why there are no rows
    seconds: float


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class _Run:
    """One call of ``run_cases``: the cases left, the outcomes so far, the deadline."""

    def __init__(self, cases: list[Case], budget_s: float, echo: Callable[[str], None]):
        self.left = list(cases)
        self.outcomes: dict[str, Outcome] = {}
        self.deadline = time.monotonic() + budget_s
        self.budget_s = budget_s
        self.echo = echo

    def end(self, case_id: str, rows: list[dict] | None, status: str, seconds: float) -> None:
        self.outcomes[case_id] = Outcome(rows, status, round(seconds, 3))
        self.left = [c for c in self.left if c.id != case_id]

    def worker(self) -> None:
        """Run the cases left in one worker until they are done, or until one hangs, kills
        the worker or runs out of budget (it is killed then and ends that way)."""
        proc = subprocess.Popen([sys.executable, "-m", "tools.bench.watchdog"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        proc.stdin.write(json.dumps([dataclasses.asdict(c) for c in self.left]))
        proc.stdin.close()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        by_id = {c.id: c for c in self.left}
        current, started = None, time.monotonic()
        limit = min(self.deadline, started + WORKER_START_S)
        while True:
            try:
                line = lines.get(timeout=max(0.0, limit - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                self._timed_out(current, started)
                return
            if line is None:  # the worker exited
                code = proc.wait()
                if current is not None:
                    self.end(current.id, None, f"crashed: its worker process exited with code {code}",
                             time.monotonic() - started)
                elif code != 0 and self.left:  # died before its first case: nothing would ever run
                    for c in list(self.left):
                        self.end(c.id, None, f"crashed: the worker process exited with code {code} before it", 0.0)
                return
            if line.startswith(START):
                current, started = by_id[line[len(START):].strip()], time.monotonic()
                limit = min(self.deadline, started + current.timeout_s)
            elif line.startswith(DONE):
                case_id, _, payload = line[len(DONE):].partition(" ")
                result = json.loads(payload)
                self.end(case_id, result["rows"], result["status"], time.monotonic() - started)
                current, limit = None, min(self.deadline, time.monotonic() + WORKER_START_S)
            else:
                self.echo(line)

    def _timed_out(self, current: Case | None, started: float) -> None:
        took = time.monotonic() - started
        over_budget = time.monotonic() >= self.deadline
        if current is None:
            current = self.left[0]
            why = "the worker printed nothing"
        else:
            why = "no result"
        if over_budget and took < current.timeout_s:
            status = f"timeout: {why} when the budget of {self.budget_s:.0f} s ran out ({took:.0f} s into it)"
        else:
            status = f"timeout: {why} in {took:.0f} s (limit {current.timeout_s:.0f} s)"
        self.end(current.id, None, status, took)


def run_cases(cases: list[Case], budget_s: float, echo: Callable[[str], None] | None = None) -> dict[str, Outcome]:
    """Every case's outcome, by id (module docstring); cases the budget did not reach are
    ``skipped``. ``echo`` gets the workers' other output, line by line (default: stdout)."""
    run = _Run(cases, budget_s, echo or (lambda line: print(line, end="", flush=True)))
    while run.left and time.monotonic() < run.deadline:
        run.worker()
    for c in run.left:
        run.end(c.id, None, f"skipped: the budget of {budget_s:.0f} s was spent before it", 0.0)
    return {c.id: run.outcomes[c.id] for c in cases}


# ------------------------------------------------------------------------------------------
# The worker: python -m tools.bench.watchdog, the cases as JSON on stdin.
# ------------------------------------------------------------------------------------------


def call_case(fn: str, args: dict) -> tuple[list[dict] | None, str]:
    """(rows, "ok"), or (None, "failed: …") with the traceback printed verbatim to stderr."""
    module, _, name = fn.partition(":")
    try:
        rows = getattr(importlib.import_module(module), name)(**args)
        return rows, "ok"
    except Exception as err:  # noqa: BLE001 - a case's failure is its result; the next case runs
        traceback.print_exception(err)
        return None, f"failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    for case in json.loads(sys.stdin.read()):
        print(START + case["id"], flush=True)
        rows, status = call_case(case["fn"], case["args"])
        sys.stderr.flush()
        print(DONE + case["id"] + " " + json.dumps({"rows": rows, "status": status}, default=str), flush=True)


if __name__ == "__main__":
    main()
