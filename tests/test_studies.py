"""Two studies in one working directory, as a user switches profiles: each study's figures,
tables and report are its own (<results_dir>/report/), so building one never leaves the
other's standing for it. Before they were, a second study's dry run said "Nothing to be
done": its report target, paper/report.pdf, existed with every figure and table under it,
and Snakemake runs the jobs below an existing, up-to-date target only when one of them has a
reason to (a newer input, changed params), which the notebooks' other output, never made
for that study, kept it from checking."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from .conftest import tiny_config
from .test_dag import copy_workflow, planned_jobs, snakemake


def read(path) -> bytes | None:
    return path.read_bytes() if path.exists() else None  # None: no report there (an assertion says so)


def pdf_text(pdf) -> str:
    return " ".join(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout.split())


@pytest.fixture(scope="module")
def switched(tmp_path_factory):
    """One working directory: study A run to its report, then study B (the same study but for
    its name, results and data folders; MQAR only, so no data mirror is needed), then A
    again; what each step planned and left behind."""
    root = tmp_path_factory.mktemp("studies")
    src, work = copy_workflow(root / "src"), root / "work"
    work.mkdir()
    configs = {}
    for name in ("a", "b"):
        cfg = tiny_config(work, None)
        cfg.update(profile=f"study-{name}", results_dir=f"results-{name}")
        cfg["data"]["dir"] = f"data-{name}"
        configs[name] = str(work / f"{name}.yaml")
        (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    report = {name: work / f"results-{name}" / "report" / "report.pdf" for name in configs}
    seen = {}
    snakemake(src, work, "--configfile", configs["a"])
    seen["a"] = read(report["a"])
    # B has its own data folder too, so its dry run must list what --forceall would run.
    seen["b planned"] = planned_jobs(snakemake(src, work, "-n", "--configfile", configs["b"]))
    seen["b forced"] = planned_jobs(snakemake(src, work, "-n", "--forceall", "--configfile", configs["b"]))
    snakemake(src, work, "--configfile", configs["b"])
    seen["a after b"], seen["b"] = read(report["a"]), read(report["b"])
    seen["copy after b"] = read(work / "paper" / "report.pdf")
    seen["a planned again"] = planned_jobs(snakemake(src, work, "-n", "--configfile", configs["a"]))
    snakemake(src, work, "--configfile", configs["a"])
    seen["a again"], seen["b after a"] = read(report["a"]), read(report["b"])
    seen["copy after a"] = read(work / "paper" / "report.pdf")
    return report, seen


def test_a_second_studys_dry_run_lists_its_own_jobs(switched):
    _, seen = switched
    assert seen["b planned"] == seen["b forced"], seen["b planned"]
    assert seen["b planned"]["train"] == 2 and seen["b planned"]["report"] == 1, seen["b planned"]


def test_each_study_builds_its_own_report_and_leaves_the_others_byte_for_byte(switched):
    report, seen = switched
    assert seen["a"] is not None and seen["b"] is not None, "a study built no report of its own"
    assert seen["a after b"] == seen["a again"] == seen["a"]
    assert seen["b after a"] == seen["b"]
    assert "study-b" in pdf_text(report["b"]) and "study-a" not in pdf_text(report["b"])
    assert "study-a" in pdf_text(report["a"])


def test_switching_back_copies_the_first_studys_report_and_runs_nothing_else(switched):
    _, seen = switched
    assert seen["a planned again"] == {"latest_report": 1, "all": 1}, seen["a planned again"]
    # paper/report.pdf is the report of the study built last.
    assert seen["copy after b"] == seen["b"] is not None and seen["copy after a"] == seen["a"] is not None
