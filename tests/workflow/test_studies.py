"""Two studies in one working directory, as a user switches profiles: each study's figures,
tables and report are its own (<results_dir>/report/), so building one never leaves the
other's standing for it. Before they were, a second study's dry run said "Nothing to be
done": its report target, paper/report.pdf, existed with every figure and table under it,
and Snakemake runs the jobs below an existing, up-to-date target only when one of them has a
reason to (a newer input, changed params), which the notebooks' other output, never made
for that study, kept it from checking.

The first study is the shared one (tests/shared_study.py), which built the second one (MQAR only,
its own name, results and data folders) in its working directory and switched back to
itself, recording what each step planned and each report's digest."""

from __future__ import annotations

from tests.helpers import pdf_text


def test_a_second_studys_dry_run_lists_its_own_jobs(shared_study):
    seen = shared_study.seen["switch"]
    assert seen["b planned"] == seen["b forced"], seen["b planned"]
    assert seen["b planned"]["train"] == 2 and seen["b planned"]["report"] == 1, seen["b planned"]


def test_each_study_builds_its_own_report_and_leaves_the_others_byte_for_byte(shared_study):
    seen = shared_study.seen["switch"]
    assert seen["a"] is not None and seen["b"] is not None, "a study built no report of its own"
    assert seen["a after b"] == seen["a again"] == seen["a"]
    assert seen["b after a"] == seen["b"]
    b = pdf_text(shared_study.work / "results-b" / "report" / "report.pdf")
    assert "study-b" in b and "study-a" not in b
    assert "study-a" in pdf_text(shared_study.report / "report.pdf")


def test_switching_back_copies_the_first_studys_report_and_runs_nothing_else(shared_study):
    seen = shared_study.seen["switch"]
    assert seen["a planned again"] == {"latest_report": 1, "all": 1}, seen["a planned again"]
    # paper/report.pdf is the report of the study built last.
    assert seen["copy after b"] == seen["b"] is not None and seen["copy after a"] == seen["a"] is not None
