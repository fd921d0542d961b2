"""The Snakemake DAG end to end on a tiny config in a temporary directory: it produces a
PDF from this run's results; asking for one figure reruns only its notebook; a bad config
fails before any job runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seqmix.config import load_config
from seqmix.study import runs

from .conftest import REPO, tiny_config

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_workflow(dst: Path) -> Path:
    """The workflow sources (not results) in a scratch copy, so tests can touch them."""
    dst.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("Snakefile", "workflow", "notebooks", "src", "config", "envs", "requirements.txt"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore)
        else:
            shutil.copy2(src, dst / name)
    (dst / "paper").mkdir()
    shutil.copy2(REPO / "paper" / "report.tex", dst / "paper" / "report.tex")
    shutil.copytree(REPO / "paper" / "sections", dst / "paper" / "sections")
    for extra in (REPO / "paper").glob("*.yaml"):
        shutil.copy2(extra, dst / "paper" / extra.name)
    return dst


def snakemake(src: Path, work: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    cmd = [*SNAKEMAKE, "--snakefile", str(src / "Snakefile"), "--directory", str(work),
           "--cores", "2", "--rerun-incomplete", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The job-count table of a dry run: {rule: count}."""
    out = proc.stdout + proc.stderr
    table = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, mirror):
    root = tmp_path_factory.mktemp("dag")
    src = copy_workflow(root / "src")
    work = root / "work"
    work.mkdir()
    cfg = tiny_config(work, mirror)
    cfg["results_dir"], cfg["data"]["dir"] = "results", "data"
    (work / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(src, work, "--configfile", str(work / "tiny.yaml"))
    return src, work


def test_the_dag_builds_a_report_from_this_runs_results(full_run):
    src, work = full_run
    pdf = work / "paper" / "report.pdf"
    assert pdf.exists() and pdf.stat().st_size > 10_000
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    runs_csv = (work / "results" / "summary" / "runs.csv").read_text()
    assert runs_csv.count("\n") == 1 + 3 * 2  # header + (3 tasks x 2 archs x 1 seed)
    # The quality table prints this run's parameter counts.
    import pandas as pd

    params = pd.read_csv(work / "results" / "summary" / "runs.csv").params
    assert all(f"{p:,}" in text for p in params)
    assert "undefined" not in (work / "paper" / "report.log").read_text(errors="replace").lower()
    # Generated LaTeX spells math symbols as LaTeX, not as Unicode pdflatex cannot set.
    from seqmix.report.latex import UNICODE

    for tex in (work / "paper" / "tables").glob("*.tex"):
        assert not set(tex.read_text()) & set(UNICODE), tex


def test_the_html_report_shows_every_figure_of_the_run(full_run):
    src, work = full_run
    html = work / "paper" / "report.html"
    snakemake(src, work, "--report", str(html), "--configfile", str(work / "tiny.yaml"))
    text = html.read_text(errors="replace")
    for fig in (work / "paper" / "figures").glob("*.pdf"):
        assert fig.name in text, f"{fig.name} missing from the HTML report"
    assert "report.pdf" in text


def test_nothing_left_to_do_after_a_full_run(full_run):
    src, work = full_run
    proc = snakemake(src, work, "-n", "--configfile", str(work / "tiny.yaml"))
    assert planned_jobs(proc) == {}, proc.stdout[-2000:]


def test_editing_a_notebook_reruns_only_that_notebook(full_run):
    src, work = full_run
    nb = src / "notebooks" / "complexity.ipynb"
    # A bare `touch` is not a change for Snakemake >= 8: it compares the checksums of small
    # inputs, so an unchanged notebook is not rerun. Edit it, as a researcher would.
    content = json.loads(nb.read_text())
    content["metadata"]["edited_by_test"] = True
    nb.write_text(json.dumps(content))
    one = snakemake(src, work, "-n", "paper/figures/complexity_time.pdf", "--configfile", str(work / "tiny.yaml"))
    assert planned_jobs(one) == {"notebook_complexity": 1}
    everything = snakemake(src, work, "-n", "--configfile", str(work / "tiny.yaml"))
    assert planned_jobs(everything) == {"notebook_complexity": 1, "report": 1, "all": 1}


def test_dry_run_lists_one_train_job_per_run_of_the_quick_config(tmp_path):
    src = copy_workflow(tmp_path / "src")
    proc = snakemake(src, tmp_path, "-n", "--configfile", str(REPO / "config" / "config.yaml"))
    expected = len(runs(load_config(REPO / "config" / "config.yaml")))
    assert planned_jobs(proc)["train"] == expected


def test_a_bad_config_fails_before_any_job_naming_the_key(tmp_path):
    src = copy_workflow(tmp_path / "src")
    bad = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    bad["tasks"]["wikitext2"]["train"]["learning_rate"] = 0.1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = snakemake(src, tmp_path, "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert proc.returncode != 0
    assert "unknown key(s) 'learning_rate' under 'tasks.wikitext2.train'" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists() and not (tmp_path / "data").exists()
