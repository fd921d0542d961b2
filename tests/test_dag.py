"""The Snakemake DAG end to end on a tiny config in a temporary directory: it produces a
PDF from this run's results; asking for one figure reruns only its notebook; a bad config
fails before any job runs."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

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


def read_macros(path: Path) -> dict[str, str]:
    """{command name: body} of a generated macros file."""
    return dict(re.findall(r"^\\newcommand\{\\(\w+)\}\{(.*)\}$", path.read_text(), re.M))


def run_results(work: Path, row) -> tuple[dict, dict]:
    """metrics.json and eval.json of a runs.csv row's run directory."""
    run = work / row.run_dir
    return json.loads((run / "metrics.json").read_text()), json.loads((run / "eval.json").read_text())


def test_the_dag_builds_a_report_from_this_runs_results(full_run):
    src, work = full_run
    pdf = work / "paper" / "report.pdf"
    assert pdf.exists() and pdf.stat().st_size > 10_000
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    runs_csv = pd.read_csv(work / "results" / "summary" / "runs.csv")
    assert len(runs_csv) == 3 * 2  # 3 tasks x 2 archs x 1 seed
    # The quality table prints this run's parameter counts.
    assert all(f"{p:,}" in text for p in runs_csv.params)
    assert "undefined" not in (work / "paper" / "report.log").read_text(errors="replace").lower()
    # Generated LaTeX spells math symbols as LaTeX, not as Unicode pdflatex cannot set.
    from seqmix.report.latex import UNICODE

    tables = sorted((work / "paper" / "tables").glob("*.tex"))
    assert len(tables) == sum(len(nb["tables"]) for nb in notebook_outputs().values())
    for tex in tables:
        assert not set(tex.read_text()) & set(UNICODE), tex


def test_runs_csv_holds_each_runs_own_evaluation(full_run):
    # Every row against its run directory: the eval columns from the eval split, the test
    # columns from the test split, never the other way round, never a stale number.
    _, work = full_run
    runs_csv = pd.read_csv(work / "results" / "summary" / "runs.csv")
    for row in runs_csv.itertuples():
        metrics, ev = run_results(work, row)
        assert (row.task, row.arch, row.seed, row.status) == (metrics["task"], metrics["arch"], metrics["seed"], "ok")
        assert (row.eval_split, row.test_split) == ("validation", "test")
        for prefix, split in (("eval", "validation"), ("test", "test")):
            result = ev["splits"][split]
            assert getattr(row, f"{prefix}_value") == pytest.approx(result[metrics["metric"]], rel=1e-12)
            assert getattr(row, f"{prefix}_loss") == pytest.approx(result["loss"], rel=1e-12)
            assert getattr(row, f"{prefix}_scored") == result["scored"]
        assert row.params == metrics["params"] and row.steps_completed == metrics["steps_completed"] == 6


def test_the_reports_numbers_are_the_runs_numbers(full_run):
    # The quality macros hold each run's test metric as eval.json has it (one seed: no
    # interval), formatted as the report prints it: perplexity to 0.1, accuracy to 0.001.
    from seqmix.report.latex import macro_name

    _, work = full_run
    macros = read_macros(work / "paper" / "tables" / "quality-macros.tex")
    runs_csv = pd.read_csv(work / "results" / "summary" / "runs.csv")
    for row in runs_csv.itertuples():
        metrics, ev = run_results(work, row)
        value = ev["splits"]["test"][metrics["metric"]]
        expected = f"{value:.1f}" if metrics["metric"] == "ppl" else f"{value:.3f}"
        assert macros[macro_name("q", f"{row.task}-{row.arch}-test")] == expected, (row.task, row.arch)
    assert macros["qNumRuns"] == "6" and macros["qNumArchs"] == "2" and macros["qNumSeeds"] == "1"


def test_the_claims_table_is_the_evaluator_on_this_runs_results(full_run):
    from seqmix.report.claims import evaluate_claims, load_claims
    from seqmix.report.latex import escape, macro_name

    src, work = full_run
    claims_file = src / "paper" / "claims.yaml"
    macros = read_macros(work / "paper" / "tables" / "claims-macros.tex")
    claims = evaluate_claims(claims_file, work / "results")
    assert macros["clNumClaims"] == str(len(claims)) == str(len(load_claims(claims_file)))
    for r in claims.itertuples():
        assert macros[macro_name("cl", f"{r.id}-ours")] == escape(r.ours), r.id
        assert macros[macro_name("cl", f"{r.id}-verdict")] == r.verdict, r.id
    # ... and the Grassmann gap is this run's: 100 (ppl_grassmann / ppl_softmax - 1) on the
    # claim's split, from the two runs' eval.json (one seed: the value itself).
    gap = {c["id"]: c for c in load_claims(claims_file)}["grassmann-wikitext-gap"]
    runs_csv = pd.read_csv(work / "results" / "summary" / "runs.csv")
    split = "validation" if gap.get("split", "test") == "eval" else "test"
    ppl = {}
    for row in runs_csv[runs_csv.task == gap["task"]].itertuples():
        ppl[row.arch] = run_results(work, row)[1]["splits"][split]["ppl"]
    value = 100 * (ppl[gap["arch"]] / ppl[gap["baseline"]] - 1)
    row = claims.set_index("id").loc["grassmann-wikitext-gap"]
    assert row.value == pytest.approx(value, rel=1e-9) and row.ours == f"{value:.3g}"
    assert row.verdict == "not testable"  # a tiny run is not the claim's scale


def notebook_outputs() -> dict:
    return yaml.safe_load((REPO / "notebooks" / "outputs.yaml").read_text())


def test_the_html_report_shows_every_figure_of_the_run(full_run):
    src, work = full_run
    html = work / "paper" / "report.html"
    snakemake(src, work, "--report", str(html), "--configfile", str(work / "tiny.yaml"))
    text = html.read_text(errors="replace")
    figures = [f"{f}.pdf" for nb in notebook_outputs().values() for f in nb["figures"]]
    assert figures, "outputs.yaml lists no figure?"
    for name in figures:
        assert (work / "paper" / "figures" / name).exists(), f"{name} was not produced"
        assert name in text, f"{name} missing from the HTML report"
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


def implied_runs(raw: dict) -> int:
    """Runs a config file trains, counted from the file itself: per task, its (or the
    study's) architectures, without the non-causal-only ones on a language-model task,
    times its sweep's grid points, times its (or the study's) seeds."""
    from seqmix.mixers import mixer_class
    from seqmix.tasks import task_class

    total = 0
    for name, section in raw["tasks"].items():
        archs = section.get("architectures") or raw["architectures"]
        if task_class(name.split("/")[0]).is_language_model:
            archs = [a for a in archs if mixer_class(a).supports_causal]
        points = math.prod(len(values) for values in (section.get("sweep") or {}).values())
        total += len(archs) * points * len(section.get("seeds") or raw["seeds"])
    return total


def dry_run_jobs(src: Path, work: Path, config: Path) -> dict[str, int]:
    return planned_jobs(snakemake(src, work, "-n", "--configfile", str(config)))


def test_dry_run_plans_the_jobs_a_config_implies(tmp_path):
    # Counted by hand: mqar trains softmax and grassmann (linformer has no causal form) x 3
    # seeds = 6; its variant one architecture x a 2 x 2 sweep x 1 seed = 4; snli all three
    # architectures x 3 seeds = 9.
    src = copy_workflow(tmp_path / "src")
    cfg = {"architectures": ["softmax", "grassmann", "linformer"], "seeds": [0, 1, 2],
           "tasks": {"mqar": {}, "mqar/v": {"architectures": ["softmax"], "seeds": [0],
                                            "sweep": {"model.d_model": [8, 16], "train.lr": [1e-3, 3e-3]}},
                     "snli": {}},
           "analysis": {"sparsity": {"tasks": ["mqar"]}, "geometry": {"task": "mqar"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    jobs = dry_run_jobs(src, tmp_path, tmp_path / "c.yaml")
    assert jobs["train"] == jobs["eval"] == 6 + 4 + 9 == implied_runs(cfg)
    assert jobs["data_task"] == 3 and jobs["data_tokenizer"] == 1  # one data directory per task as written
    assert all(jobs[f"notebook_{name}"] == 1 for name in notebook_outputs())
    assert jobs["collect"] == jobs["report"] == jobs["all"] == 1


def test_dry_run_of_the_quick_config_trains_what_it_says(tmp_path):
    src = copy_workflow(tmp_path / "src")
    config = REPO / "config" / "config.yaml"
    jobs = dry_run_jobs(src, tmp_path, config)
    raw = yaml.safe_load(config.read_text())
    assert jobs["train"] == jobs["eval"] == implied_runs(raw)
    assert jobs["data_task"] == len(raw["tasks"])


def test_a_bad_config_fails_before_any_job_naming_the_key(tmp_path):
    src = copy_workflow(tmp_path / "src")
    bad = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    bad["tasks"]["wikitext2"]["train"]["learning_rate"] = 0.1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = snakemake(src, tmp_path, "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert proc.returncode != 0
    assert "unknown key(s) 'learning_rate' under 'tasks.wikitext2.train'" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists() and not (tmp_path / "data").exists()
