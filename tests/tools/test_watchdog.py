"""tools.bench.watchdog: cases in worker processes under time limits. A case that hangs or
kills its worker costs that case alone, and is a row saying so; what a case prints reaches
the log verbatim. The helpers below are the cases (the workers import this module, which
therefore imports nothing heavy)."""

from __future__ import annotations

import os
import re
import sys
import time

from tools.bench.watchdog import Case, run_cases

HERE = "tests.tools.test_watchdog"


def rows(n: int) -> list[dict]:
    print(f"making {n} rows")
    return [{"i": i} for i in range(n)]


def sleep(seconds: float) -> list[dict]:
    time.sleep(seconds)
    return [{"slept": seconds}]


def die(code: int) -> list[dict]:
    print("python3: ScanOpToLLVM.cpp:265: Assertion failed", file=sys.stderr, flush=True)
    os._exit(code)


def fail() -> list[dict]:
    raise RuntimeError("PassManager::run failed")


def case(case_id: str, fn: str, timeout_s: float = 30.0, **args) -> Case:
    return Case(case_id, f"{HERE}:{fn}", args, timeout_s)


def test_a_hang_a_crash_and_an_error_cost_their_own_case_only(monkeypatch, capfd):
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)  # the workers import this module from the checkout
    cases = [case("first", "rows", n=2), case("hangs", "sleep", timeout_s=3.0, seconds=600),
             case("after-hang", "rows", n=1), case("crashes", "die", code=134), case("errs", "fail"),
             case("last", "sleep", seconds=0.1)]
    out = run_cases(cases, budget_s=600)
    assert list(out) == [c.id for c in cases]
    assert (out["first"].rows, out["first"].status) == ([{"i": 0}, {"i": 1}], "ok")
    # Cut at its limit, not at the end of its 600 s sleep (the status names the limit; the
    # seconds it reports are at least the limit, however loaded the machine).
    hang = re.fullmatch(r"timeout: no result in (\d+) s \(limit 3 s\)", out["hangs"].status)
    assert out["hangs"].rows is None and hang and int(hang[1]) >= 3 and out["hangs"].seconds >= 3, out["hangs"]
    assert out["after-hang"].rows == [{"i": 0}]  # a fresh worker took the cases left
    assert out["crashes"].status == "crashed: its worker process exited with code 134"
    assert out["errs"].status == "failed: RuntimeError: PassManager::run failed"
    assert out["last"].rows == [{"slept": 0.1}]
    printed = capfd.readouterr()
    assert "making 2 rows" in printed.out and "Assertion failed" in printed.err  # verbatim
    assert "RuntimeError: PassManager::run failed" in printed.err  # the traceback, in full


def test_the_budget_ends_a_case_and_skips_the_rest(monkeypatch):
    # A case that would run past the budget is ended when the budget runs out (while it runs,
    # or while its worker starts: both are the budget's end), and the cases after it are not
    # started. No case here finishes in time by luck: none can finish before the budget.
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)
    out = run_cases([case("b", "sleep", seconds=600, timeout_s=500), case("c", "rows", n=1)], budget_s=5)
    assert re.fullmatch(r"timeout: (no result|the worker printed nothing) when the budget of 5 s ran out .*",
                        out["b"].status), out["b"]
    assert out["b"].rows is None
    assert out["c"].status == "skipped: the budget of 5 s was spent before it"
