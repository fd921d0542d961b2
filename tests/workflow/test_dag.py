"""The Snakemake DAG end to end on the tiny study (tests/shared_study.py) in a temporary directory:
it produces a PDF from this run's results; asking for one figure reruns only its notebook;
editing one task reruns that task's jobs and what reads them, nothing else; parsing the DAG
imports no torch; a bad config fails before any job runs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import tiny_config
from tests.helpers import (
    REPO,
    copy_workflow,
    pdf_text,
    planned_jobs,
    planned_wildcards,
    read_macros,
    snakemake,
    tool_env,
)
from tests.shared_study import DATA, DIVERGE, INJECTED, RESULTS

# The study's runs, counted by hand: MQAR three architectures, its diverging copy and
# WikiText-2 and SNLI two each, the MQAR variant two architectures x two widths (one seed).
STUDY_RUNS = 3 + 2 + 2 + 2 + 2 * 2


def runs_of(study) -> pd.DataFrame:
    return pd.read_csv(study.results / "summary" / "runs.csv")


def finished(study) -> pd.DataFrame:
    runs = runs_of(study)
    return runs[runs.task != DIVERGE]


def run_results(study, row) -> tuple[dict, dict]:
    """metrics.json and eval.json of a runs.csv row's run directory."""
    run = study.work / row.run_dir
    return json.loads((run / "metrics.json").read_text()), json.loads((run / "eval.json").read_text())


def notebook_outputs() -> dict:
    return yaml.safe_load((REPO / "notebooks" / "outputs.yaml").read_text())


def test_the_dag_builds_a_report_from_this_runs_results(shared_study):
    pdf = shared_study.report / "report.pdf"  # the study's own
    assert pdf.exists() and pdf.stat().st_size > 10_000
    assert (shared_study.work / "paper" / "report.pdf").read_bytes() == pdf.read_bytes()  # and its copy
    text = pdf_text(pdf)
    runs = runs_of(shared_study)
    assert len(runs) == STUDY_RUNS
    # The quality table prints this run's parameter counts.
    assert all(f"{p:,}" in text for p in finished(shared_study).params)
    assert "undefined" not in (shared_study.report / "report.log").read_text(errors="replace").lower()
    # Generated LaTeX spells math symbols as LaTeX, not as Unicode pdflatex cannot set.
    from seqmix.report.latex import UNICODE

    tables = sorted((shared_study.report / "tables").glob("*.tex"))
    assert len(tables) == sum(len(nb["tables"]) for nb in notebook_outputs().values())
    for tex in tables:
        assert not set(tex.read_text()) & set(UNICODE), tex


def test_runs_csv_holds_each_runs_own_evaluation(shared_study):
    # Every row against its run directory: the eval columns from the eval split, the test
    # columns from the test split, never the other way round, never a stale number.
    for row in finished(shared_study).itertuples():
        metrics, ev = run_results(shared_study, row)
        assert (row.task, row.arch, row.seed, row.status) == (metrics["task"], metrics["arch"], metrics["seed"], "ok")
        assert (row.eval_split, row.test_split) == ("validation", "test")
        for prefix, split in (("eval", "validation"), ("test", "test")):
            result = ev["splits"][split]
            assert getattr(row, f"{prefix}_value") == pytest.approx(result[metrics["metric"]], rel=1e-12)
            assert getattr(row, f"{prefix}_loss") == pytest.approx(result["loss"], rel=1e-12)
            assert getattr(row, f"{prefix}_scored") == result["scored"]
        assert row.params == metrics["params"] and row.steps_completed == metrics["steps_completed"] == 6


def test_the_reports_numbers_are_the_runs_numbers(shared_study):
    # The quality macros hold each run's test metric as eval.json has it (one seed: no
    # interval), formatted as the report prints it: perplexity to 0.1, accuracy to 0.001.
    from seqmix.report.latex import macro_name

    macros = read_macros(shared_study.report / "tables" / "quality-macros.tex")
    for row in finished(shared_study).itertuples():
        metrics, ev = run_results(shared_study, row)
        value = ev["splits"]["test"][metrics["metric"]]
        expected = f"{value:.1f}" if metrics["metric"] == "ppl" else f"{value:.3f}"
        assert macros[macro_name("q", f"{row.task}-{row.arch}-test")] == expected, (row.task, row.arch)
    assert (macros["qNumRuns"], macros["qNumArchs"], macros["qNumSeeds"]) == (str(STUDY_RUNS), "3", "1")


def test_the_claims_table_is_the_evaluator_on_this_runs_results(shared_study):
    from seqmix.report.claims import evaluate_claims, load_claims
    from seqmix.report.latex import escape, macro_name

    claims_file = shared_study.src / "paper" / "claims.yaml"
    macros = read_macros(shared_study.report / "tables" / "claims-macros.tex")
    claims = evaluate_claims(claims_file, shared_study.results)
    assert macros["clNumClaims"] == str(len(claims)) == str(len(load_claims(claims_file)))
    for r in claims.itertuples():
        assert macros[macro_name("cl", f"{r.id}-ours")] == escape(r.ours), r.id
        assert macros[macro_name("cl", f"{r.id}-verdict")] == r.verdict, r.id
    # ... and the Grassmann gap is this run's: 100 (ppl_grassmann / ppl_softmax - 1) on the
    # claim's split, from the two runs' eval.json (one seed: the value itself).
    gap = {c.id: c for c in load_claims(claims_file)}["grassmann-wikitext-gap"]
    runs = runs_of(shared_study)
    split = "validation" if gap.split == "eval" else "test"
    ppl = {row.arch: run_results(shared_study, row)[1]["splits"][split]["ppl"]
           for row in runs[runs.task == gap.task].itertuples()}
    value = 100 * (ppl[gap.arch] / ppl[gap.baseline] - 1)
    row = claims.set_index("id").loc["grassmann-wikitext-gap"]
    assert row.value == pytest.approx(value, rel=1e-9) and row.ours == f"{value:.3g}"
    assert row.verdict == "not testable"  # a tiny run is not the claim's scale


def test_the_report_draws_no_empty_figure_and_says_why_in_a_sentence(shared_study):
    # This study has no recorded study beside it (its recording was removed and the report
    # rebuilt): the PDF draws no empty frame for it and says why in one sentence. It sweeps an
    # MQAR task over width, so the recall figure is drawn, without the placeholder.
    text = " ".join(pdf_text(shared_study.report / "report.pdf").split())
    assert "no recorded study accepted" not in text and "no width sweep in this profile" not in text
    assert "No study recorded on another machine is drawn beside these curves" in text
    assert "recorded with python -m seqmix record" in text
    assert "This study sweeps no recall (MQAR) task over model width" not in text


def test_the_readme_results_block_is_this_finished_studys(shared_study, tmp_path):
    # `make readme-results` on a finished study: the claims table is the report's (each
    # verdict and value as its macros have them), the figures are PNGs the block links, the
    # block names the host and machine of the runs, and tools.docs puts it into the README.
    from seqmix.report.latex import escape, macro_name
    from tools.docs import generated, splice

    src, work = shared_study.src, shared_study.work
    env = tool_env({"PYTHONPATH": os.pathsep.join([str(src / "src"), str(REPO), shared_study.env["PYTHONPATH"]])})
    readme = tmp_path / "README.md"
    readme.write_text("# a\n\n## Results\n\n<!-- generated by `make readme-results` -->\nnone yet\n"
                      "<!-- end of generated -->\n\nmore\n")
    proc = subprocess.run([sys.executable, "-m", "tools.readme_results", "--config", str(shared_study.config_file),
                           "--claims", str(src / "paper" / "claims.yaml"), "--images", str(tmp_path / "docs" / "results"),
                           "--markdown", str(tmp_path / "block.md"), "--readme", str(readme)],
                          cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = (tmp_path / "block.md").read_text()
    macros = read_macros(shared_study.report / "tables" / "claims-macros.tex")
    rows = re.findall(r"^\| `([\w-]+)` \| \**([a-z ]+?)\** \| (.*?) \| (.*?) \|$", block, re.M)
    assert len(rows) == int(macros["clNumClaims"]) > 10
    for cid, verdict, ours, _ in rows:
        assert macros[macro_name("cl", f"{cid}-verdict")] == verdict and macros[macro_name("cl", f"{cid}-ours")] == escape(ours)
    provenance = json.loads(next((shared_study.results / "runs").rglob("provenance.json")).read_text())
    assert f"(host {provenance['host']})" in block and provenance["device"]["name"] in block.splitlines()[0]
    images = re.findall(r"!\[[^\]]+\]\((docs/results/[\w.]+\.png)\)", block)  # quality, and recall by width
    assert len(images) == 2 and all((tmp_path / image).read_bytes()[:4] == b"\x89PNG" for image in images)
    page = splice(readme.read_text(), block)
    assert generated(page) == block and page.endswith("<!-- end of generated -->\n\nmore\n")


def test_the_html_report_shows_every_figure_of_the_run(shared_study, tmp_path):
    html = tmp_path / "report.html"
    shared_study.snakemake("--report", str(html))
    text = html.read_text(errors="replace")
    figures = [f"{f}.pdf" for nb in notebook_outputs().values() for f in nb["figures"]]
    assert figures, "outputs.yaml lists no figure?"
    for name in figures:
        assert (shared_study.report / "figures" / name).exists(), f"{name} was not produced"
        assert name in text, f"{name} missing from the HTML report"
    assert "report.pdf" in text


def test_nothing_left_to_do_after_a_full_run(shared_study):
    assert shared_study.seen["nothing left"] == {}  # right after the build
    proc = shared_study.dry_run()  # and after everything tests/shared_study.py did with it
    assert planned_jobs(proc) == {}, proc.stdout[-2000:]


def edited(study, tmp_path: Path, edit) -> Path:
    """A copy of the study's config with ``edit`` applied to it (its tasks share their model
    and train sections, YAML anchors: replace one, do not update it in place)."""
    cfg = yaml.safe_load(study.config_file.read_text())
    edit(cfg)
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path / "edited.yaml"


def rerun_because(out: str, reason: str) -> set[str]:
    """The rules a dry run's summary lists under one reason (e.g. "params have changed")."""
    found = re.search(rf"^    {reason}[^\n]*:\n        (.*)$", out, re.M)
    return set(found.group(1).split(", ")) if found else set()


def output_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


# What reads every run: runs.csv, the notebooks on it or on every run's files, the report.
READ_EVERY_RUN = {"collect": 1, "notebook_quality": 1, "notebook_recall": 1, "notebook_claims": 1, "report": 1,
                  "latest_report": 1, "all": 1}


def test_adding_a_task_to_a_finished_study_runs_that_task_and_what_reads_every_run(shared_study, tmp_path):
    # Each job's params are its own spec: the analyses of other runs (complexity,
    # throughput, sparsity, geometry, the closed forms) do not hold the task list, so they
    # and their notebooks stay done. With the whole study in every job's params they would
    # all rerun ("Params have changed").
    config = edited(shared_study, tmp_path, lambda cfg: cfg["tasks"].update({"mqar/L32-kv3": {
        **cfg["tasks"]["mqar"], "vocab_size": 48, "seq_len": 32, "num_kv_pairs": 3}}))
    out = output_of(shared_study.dry_run(config=config))
    assert planned_jobs(out) == {"data_task": 1, "train": 3, "eval": 3, **READ_EVERY_RUN}, out[-3000:]
    assert set(re.findall(r"wildcards: (?:task|group)=([^,\n]+)", out)) == {"mqar/L32-kv3"}
    assert rerun_because(out, "params have changed") == {"collect"}  # its run list


def test_editing_one_tasks_training_reruns_its_runs_and_what_reads_them(shared_study, tmp_path):
    # MQAR's runs are the geometry analysis's (the config names it); WikiText-2's sparsity,
    # SNLI's runs, the other MQAR tasks' and every analysis that needs no training stay done.
    config = edited(shared_study, tmp_path, lambda cfg: cfg["tasks"]["mqar"].update(
        train={**cfg["tasks"]["mqar"]["train"], "lr": 1e-3}))
    out = output_of(shared_study.dry_run(config=config))
    assert planned_jobs(out) == {"train": 3, "eval": 3, "geometry": 1, "notebook_geometry": 1, **READ_EVERY_RUN}
    assert set(re.findall(r"wildcards: task=([^,\n]+)", out)) == {"mqar"}
    assert rerun_because(out, "params have changed") == {"train"}


def test_editing_one_mixer_reruns_its_runs_and_what_reads_them_nothing_else(shared_study):
    # Each job depends on its code (seqmix.sources): Grassmann's module trains, evaluates
    # and is timed in Grassmann's jobs only, and the analyses that build every mixer.
    out = shared_study.seen["after editing grassmann.py"]
    planned = planned_jobs(out)
    runs = runs_of(shared_study)
    assert planned["train"] == planned["eval"] == (runs.arch == "grassmann").sum(), planned
    for rule in ("train", "eval", "sparsity_run"):
        assert {w["arch"] for w in planned_wildcards(out, rule)} == {"grassmann"}, rule
    assert {"complexity", "throughput", "copy_probe"} <= set(planned)  # they build every mixer
    assert not {"data_task", "data_tokenizer", "sparsity_analytic"} & set(planned), planned


def test_editing_one_task_kind_reruns_its_data_and_runs_nothing_else(shared_study):
    out = shared_study.seen["after editing snli.py"]
    planned = planned_jobs(out)
    runs = runs_of(shared_study)
    assert planned["train"] == planned["eval"] == (runs.kind == "snli").sum(), planned
    assert {w["task"] for w in planned_wildcards(out, "train")} == {"snli"}
    assert [w["group"] for w in planned_wildcards(out, "data_task")] == ["snli"]
    assert not {"complexity", "throughput", "copy_probe", "sparsity_analytic", "data_tokenizer"} & set(planned), planned


def test_parsing_the_dag_again_reads_the_cached_job_table_and_imports_no_torch(shared_study):
    # The job table was made by a parse before (seqmix.study.dag); a dry run now reads it as it
    # is (no file rewritten) and the Snakemake process never imports torch.
    shared_study.dry_run()  # the table of the sources as they are
    tables = {p: p.stat().st_mtime_ns for p in (shared_study.work / ".snakemake" / "seqmix").glob("jobs-*.json")}
    assert tables
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "--snakefile",
                           str(shared_study.src / "Snakefile"), "--directory", str(shared_study.work), "--cores", "2",
                           "-n", "--configfile", str(shared_study.config_file)],
                          capture_output=True, text=True, env=tool_env(shared_study.env), cwd=shared_study.work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.M)
    assert "seqmix.study.dag" in imported and "snakemake" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")], "parsing the DAG imported torch"
    assert {p: p.stat().st_mtime_ns for p in tables} == tables


def test_editing_a_notebook_reruns_only_that_notebook(shared_study):
    # A bare `touch` is not a change for Snakemake >= 8: it compares the checksums of small
    # inputs, so an unchanged notebook is not rerun. tests/shared_study.py edits it, as a researcher would.
    assert shared_study.seen["notebook edited, one figure"] == {"notebook_complexity": 1}
    assert shared_study.seen["notebook edited"] == {"notebook_complexity": 1, "report": 1, "latest_report": 1, "all": 1}


def test_a_committed_recording_reruns_the_notebooks_that_read_it_and_they_report_it(shared_study):
    # The study, recorded into the scratch repository with its config at the headline
    # study's path (seqmix.report.recorded.HEADLINE_CONFIG): the recording is read by the
    # quality and claims notebooks alone, so committing it reruns those and the report; run,
    # they decide the gap claim on it, naming where it came from, and draw its curves.
    from seqmix.report.latex import escape

    planned = shared_study.seen["recording committed"]
    assert planned["after"] == {**planned["before"], "notebook_quality": 1, "notebook_claims": 1, "report": 1,
                                "latest_report": 1, "all": 1}
    seen = shared_study.seen["recording"]
    meta = seen["meta"]
    where = escape(f"recorded on {meta['device']}, {meta['date']}, commit ")  # (this scratch copy has no git)
    assert where in seen["claims.tex"]
    assert seen["qRecorded"].startswith(escape("recorded study study-a/")) and "refused" not in seen["qRecorded"]
    assert seen["quality_recorded.pdf bytes"] > 5_000


# -- faults in the real DAG (issue 15): paths with spaces, quotes and shell metacharacters; a
# task whose every run diverges before its first evaluation (tests/shared_study.py's config) --------


def test_hostile_paths_run_the_dag_and_inject_nothing(shared_study):
    assert '"' in RESULTS and "'" in RESULTS and "$(" in RESULTS and "`" in RESULTS and ";" in DATA and " " in DATA
    assert not list(shared_study.root.rglob(f"{INJECTED}*")), "a path in the config ran as a shell command"
    assert (shared_study.results / "runs" / "mqar" / "grassmann" / "seed0" / "eval.json").exists()
    assert (shared_study.data / "mqar" / "manifest.json").exists()
    assert (shared_study.report / "report.pdf").stat().st_size > 10_000


def test_a_task_whose_every_run_diverged_is_reported_as_such(shared_study):
    runs = runs_of(shared_study)
    diverged = runs[runs.task == DIVERGE]
    assert len(diverged) == 2 and (diverged.status == "diverged").all() and (diverged.diverged_at_step < 3).all()
    text = pdf_text(shared_study.report / "report.pdf")
    assert "every run of MQAR diverge diverged, so it has no quality result" in text  # abstract and table note
    assert "(not evaluated: every run diverged)" in text  # the setup table
    # The abstract names this study's architectures (not "ten alternatives").
    assert "We train 3 sequence-mixing architectures (Softmax, Grassmann and My mixer)" in text


def implied_runs(raw: dict) -> int:
    """Runs a config file trains, counted from the file itself: per task, its (or the
    study's) architectures, without the non-causal-only ones on a language-model task,
    times its sweep's grid points, times its (or the study's) seeds, per architecture where
    the task gives them so."""
    from seqmix.mixers import mixer_class
    from seqmix.tasks import task_class

    total = 0
    for name, section in raw["tasks"].items():
        archs = section.get("architectures") or raw["architectures"]
        if task_class(name.split("/")[0]).is_language_model:
            archs = [a for a in archs if mixer_class(a).supports_causal]
        points = math.prod(len(values) for values in (section.get("sweep") or {}).values())
        seeds = section.get("seeds") or raw["seeds"]
        if isinstance(seeds, dict):  # per architecture: its own, else the task's default, else the study's
            total += points * sum(len(seeds.get(a, seeds.get("default", raw["seeds"]))) for a in archs)
        else:
            total += len(archs) * points * len(seeds)
    return total


def dry_run_jobs(work: Path, config: Path) -> dict[str, int]:
    """The jobs a dry run of the checkout's own workflow plans for ``config`` in ``work``
    (a dry run writes nothing beside the Snakefile: no copy of it is needed)."""
    return planned_jobs(snakemake(REPO, work, "-n", "--configfile", str(config)))


def test_dry_run_plans_the_jobs_a_config_implies(tmp_path):
    # Counted by hand: mqar trains softmax and grassmann (linformer has no causal form) x 3
    # seeds = 6; its variant one architecture x a 2 x 2 sweep x 1 seed = 4; snli all three
    # architectures x 3 seeds = 9.
    cfg = {"architectures": ["softmax", "grassmann", "linformer"], "seeds": [0, 1, 2],
           "tasks": {"mqar": {}, "mqar/v": {"architectures": ["softmax"], "seeds": [0],
                                            "sweep": {"model.d_model": [8, 16], "train.lr": [1e-3, 3e-3]}},
                     "snli": {}},
           "analysis": {"sparsity": {"tasks": ["mqar"]}, "geometry": {"task": "mqar"}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    jobs = dry_run_jobs(tmp_path, tmp_path / "c.yaml")
    assert jobs["train"] == jobs["eval"] == 6 + 4 + 9 == implied_runs(cfg)
    assert jobs["data_task"] == 3 and jobs["data_tokenizer"] == 1  # one data directory per task as written
    assert all(jobs[f"notebook_{name}"] == 1 for name in notebook_outputs())
    assert jobs["collect"] == jobs["report"] == jobs["all"] == 1
    assert jobs["copy_probe"] == 1  # one job for every architecture, on the first MQAR task's model


def test_dry_run_of_the_quick_config_trains_what_it_says(tmp_path):
    config = REPO / "config" / "config.yaml"
    jobs = dry_run_jobs(tmp_path, config)
    raw = yaml.safe_load(config.read_text())
    assert jobs["train"] == jobs["eval"] == implied_runs(raw)
    assert jobs["data_task"] == len(raw["tasks"])


def test_a_bad_config_fails_before_any_job_naming_the_key(tmp_path):
    bad = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    bad["tasks"]["wikitext2"]["train"]["learning_rate"] = 0.1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = snakemake(REPO, tmp_path, "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert proc.returncode != 0
    assert "unknown key(s) 'learning_rate' under 'tasks.wikitext2.train'" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists() and not (tmp_path / "data").exists()


# -- seqmix.study.dag: the job table the Snakefile reads -----------------------------------------


def test_a_malformed_claim_is_refused_before_any_job_naming_the_claim_and_key(tmp_path):
    # The report's claims file is validated when the Snakefile is parsed: a claim with a split
    # its kind does not have stops `snakemake` (a dry run too) before any data or run exists.
    src = copy_workflow(tmp_path / "src")
    claims = yaml.safe_load((src / "paper" / "claims.yaml").read_text())
    gap = next(c for c in claims["claims"] if c["id"] == "grassmann-wikitext-gap")
    gap["split"] = "validation"
    (src / "paper" / "claims.yaml").write_text(yaml.safe_dump(claims, sort_keys=False))
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, None)))
    line = (f"error: {src / 'paper' / 'claims.yaml'}: claim 'grassmann-wikitext-gap': key 'split': "
            "'validation' is not one of the allowed values: eval or test")
    for args in (["-n"], []):
        proc = snakemake(src, tmp_path, *args, "--configfile", str(tmp_path / "tiny.yaml"), check=False)
        assert proc.returncode != 0 and line in (proc.stderr + proc.stdout).splitlines(), proc.stderr[-2000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "data").exists()


def test_the_job_table_is_made_once_and_again_when_a_file_it_read_changes(tmp_path, monkeypatch):
    from seqmix.study import dag

    made = []
    resolve = dag._resolve
    monkeypatch.setattr(dag, "_resolve", lambda command: made.append(command) or resolve(command))
    config, cache = tmp_path / "c.yaml", tmp_path / "cache"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path, None)))
    first = dag.read_jobs({}, [config], cache)
    assert dag.read_jobs({}, [config], cache).table == first.table and len(made) == 1  # read from the cache
    read = json.loads(next(cache.glob("jobs-*.json")).read_text())["read"]
    assert {str(config), str(REPO / "src" / "seqmix" / "study" / "profile.py"),
            str(REPO / "src" / "seqmix" / "expansion" / "validate.py"),
            str(REPO / "src" / "seqmix" / "mixers" / "grassmann.py")} <= set(read)
    config.write_text(yaml.safe_dump(tiny_config(tmp_path, None, seeds=(0, 1))))
    again = dag.read_jobs({}, [config], cache)
    assert len(made) == 2 and len(again.table["runs"]) == 2 * len(first.table["runs"])
    # Snakemake's --config on top of the file is another table, made once too.
    assert dag.read_jobs({"seeds": [3]}, [config], cache).table["study"]["seeds"] == [3] and len(made) == 3


def test_a_profile_that_extends_another_is_read_with_it(tmp_path, monkeypatch):
    """The files the job table lists as read, for the cache, are those of the profile's one
    reading: the file and what it extends, each read once (seqmix.study.profile)."""
    from seqmix.study import profile

    config = REPO / "config"
    opened = []
    read = profile.read_config_file
    monkeypatch.setattr(profile, "read_config_file", lambda path: opened.append(Path(path).resolve()) or read(path))
    assert profile.read_profile(config / "paper-smoke.yaml").files == (config / "paper-smoke.yaml", config / "paper.yaml")
    assert opened == [config / "paper-smoke.yaml", config / "paper.yaml"]
    assert profile.read_profile(json.dumps({"extends": str(config / "paper.yaml")})).files == (config / "paper.yaml",)


@pytest.fixture(scope="module")
def tiny_jobs(tmp_path_factory):
    from seqmix.expansion.table import expand, job_table
    from seqmix.expansion.validate import validate_study
    from seqmix.study.dag import Jobs

    root = tmp_path_factory.mktemp("jobs")
    return Jobs(json.loads(json.dumps(job_table(expand(validate_study(tiny_config(root, None)))))))


def test_outputs_yaml_references_name_results_runs_sources_and_settings(tiny_jobs):
    from seqmix.study.dag import StudyError

    results = tiny_jobs.results
    assert tiny_jobs.reference("summary/runs.csv") == f"{results}/summary/runs.csv"
    assert tiny_jobs.reference("runs:log.csv") == [f"{results}/runs/mqar/{a}/seed0/log.csv" for a in ("softmax", "grassmann")]
    assert tiny_jobs.reference("repo:paper/claims.yaml") == str(REPO / "paper" / "claims.yaml")
    assert tiny_jobs.reference("repo:paper/*.yaml") == sorted(str(p) for p in (REPO / "paper").glob("*.yaml"))
    assert tiny_jobs.reference("repo:results/bench/no-such-*.csv") == []
    assert tiny_jobs.reference("config:profile", param=True) == "test"
    with pytest.raises(StudyError, match="'bench:kernels.csv' is not a reference"):
        tiny_jobs.reference("bench:kernels.csv")
    with pytest.raises(StudyError, match="a file of the repository is repo:paper/claims.yaml"):
        tiny_jobs.reference("src:paper/claims.yaml")  # the prefix's old name, refused with the new one
    with pytest.raises(StudyError, match="is not a reference"):
        tiny_jobs.reference("config:profile")  # a setting is a parameter, not a file
    with pytest.raises(StudyError, match="'report.nothing' is not a setting"):
        tiny_jobs.reference("config:report.nothing", param=True)


def test_every_notebook_of_outputs_yaml_resolves(tiny_jobs):
    notebooks = tiny_jobs.notebooks(REPO / "notebooks" / "outputs.yaml")
    assert set(notebooks) == set(notebook_outputs())
    for nb in notebooks.values():
        assert nb.inputs and all(isinstance(f, str) for f in nb.inputs), nb.name
        assert nb.params["results_dir"] == tiny_jobs.results
    assert notebooks["claims"].params["claims_file"] == str(REPO / "paper" / "claims.yaml")
    assert notebooks["complexity"].params["bench_dir"] == str(REPO / "results" / "bench")
    assert f"{tiny_jobs.results}/runs/mqar/softmax/seed0/config.json" in notebooks["quality"].inputs


def test_each_analysis_job_holds_only_what_it_reads(tiny_jobs):
    # Its spec, not the study: no task list, no other analysis's settings.
    for name in ("complexity", "throughput", "sparsity_analytic", "geometry", "copy_probe"):
        spec = json.loads(tiny_jobs.spec(name))
        assert "tasks" not in spec and "analysis" not in spec, name
    assert set(json.loads(tiny_jobs.spec("complexity"))) == {"numerics", "architectures", "mixers", "complexity"}
    assert json.loads(tiny_jobs.spec("collect"))["run_dirs"] == [
        f"{tiny_jobs.results}/runs/mqar/{a}/seed0" for a in ("softmax", "grassmann")]
    (task, arch, seed), *_ = tiny_jobs.sparsity_runs()
    assert json.loads(tiny_jobs.sparsity_spec(task, arch, seed))["run_dirs"] == [tiny_jobs.run_file("", task, arch, seed)[:-1]]
