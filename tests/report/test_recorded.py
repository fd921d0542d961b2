"""Recorded runs (seqmix.report.recorded): `python -m seqmix record` copies a finished tiny
study's small outputs with a meta.json and refuses an unfinished one; a report refuses a
recorded run whose config is not the headline study's now, naming the first difference; the
claims row of the Grassmann gap is decided on the recorded runs and says where they came
from. The DAG test (tests/workflow/test_dag.py) runs the notebooks on a recording."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from seqmix.cli import main as cli
from seqmix.report import recorded as recorded_module
from seqmix.report.claims import evaluate_claims, judge
from seqmix.report.claims_file import AgreeIf
from seqmix.report.recorded import (
    RUN_FILES,
    account,
    first_difference,
    read_recordings,
    without_locations,
)
from seqmix.report.summary import mean_ci
from tests.conftest import REPO

CLAIMS = REPO / "paper" / "claims.yaml"
GAP = "grassmann-wikitext-gap"


def headline_config(prepared: dict, root: Path, seeds=(0, 1), **train) -> dict:
    """The tiny config's WikiText-2 task alone, as the claim's two architectures, as a study
    of its own: the test's "headline" study (its data are the session's prepared data)."""
    cfg = copy.deepcopy(prepared)
    gap = {c["id"]: c for c in yaml.safe_load(CLAIMS.read_text())["claims"]}[GAP]
    task = cfg["tasks"][gap["task"]]
    task["train"] = {**task["train"], **train}
    cfg.update(profile="tiny-headline", results_dir=str(root / "results"), architectures=[gap["baseline"], gap["arch"]],
               seeds=list(seeds), tasks={gap["task"]: task})
    cfg["analysis"]["sparsity"]["tasks"] = [gap["task"]]
    return cfg


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def study(prepared, tmp_path_factory) -> Path:
    """The tiny headline study trained and evaluated (two architectures x two seeds); its config file."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.train.evaluate import evaluate_run
    from seqmix.train.loop import train

    root = tmp_path_factory.mktemp("headline")
    config = write_config(root / "headline.yaml", headline_config(prepared, root))
    expansion = expand(load_study(config))
    for r in expansion.runs:
        spec = expansion.run_spec(r.task, r.arch, r.seed)
        train(spec, progress=False)
        evaluate_run(spec.run_dir, device="cpu")
    return config


@pytest.fixture(scope="module")
def recorded(study, tmp_path_factory) -> Path:
    """The tiny study recorded with the command; the recordings' directory."""
    out = tmp_path_factory.mktemp("recorded")
    assert cli(["record", "--config", str(study), "--out", str(out), "--made-by", "pytest"]) == 0
    return out


def test_record_copies_each_runs_small_outputs_under_study_device_and_date(study, recorded):
    from seqmix.device import device_slug

    cfg = yaml.safe_load(study.read_text())
    (where,) = list((recorded / cfg["profile"]).iterdir())
    meta = json.loads((where / "meta.json").read_text())
    assert where.name == f"{device_slug(meta['device'])}-{meta['date']}"
    runs = sorted(p.parent for p in (where / "runs").rglob("config.json"))
    assert [str(r.relative_to(where / "runs")) for r in runs] == sorted(
        f"{t}/{a}/seed{s}" for t in cfg["tasks"] for a in cfg["architectures"] for s in cfg["seeds"])
    results = Path(cfg["results_dir"]) / "runs"
    for run in runs:
        # The small files, byte for byte; no weights, no checkpoints. Provenance and metrics
        # without the recording machine's paths: the checkout's relative, others by their last
        # name (the data mirror, the shim's cache).
        assert sorted(p.name for p in run.iterdir()) == sorted(RUN_FILES)
        made = results / run.relative_to(where / "runs")
        for name in set(RUN_FILES) - {"provenance.json", "metrics.json"}:
            assert (run / name).read_bytes() == (made / name).read_bytes()
        kept, original = (json.loads((d / "provenance.json").read_text()) for d in (run, made))
        assert kept["code"]["seqmix"] == "src/seqmix" and kept["code"]["kernels"] == "kernels"
        assert original["code"]["seqmix"].startswith("/") and not re.search(r'": "/', json.dumps(kept))
        assert kept["code"]["digest"] == original["code"]["digest"] and kept["git"] == original["git"]
        metrics = json.loads((made / "metrics.json").read_text())
        assert json.loads((run / "metrics.json").read_text()) == without_locations(metrics)

    prov = json.loads((runs[0] / "provenance.json").read_text())
    assert meta["study"] == {"config": str(study), "profile": "tiny-headline", "results_dir": cfg["results_dir"]}
    assert meta["git"] == {**prov["git"], "from": "provenance"} and meta["device"] == prov["device"]["name"] and meta["host"] == prov["host"]
    assert meta["command"] == f"python -m seqmix record --config {study} --out {recorded}"
    assert meta["made_by"] == "pytest"
    for row in meta["runs"]:
        metrics = json.loads((results / row["run"] / "metrics.json").read_text())
        assert (row["status"], row["wall_time_s"], row["steps_completed"]) == (
            metrics["status"], metrics["wall_time_s"], metrics["steps_completed"])


def test_paths_in_a_recording_are_the_checkouts_or_shortened_never_this_machines():
    from seqmix import REPO_ROOT

    made = {"source": "local mirror /srv/mirrors/data", "code": str(REPO_ROOT / "kernels"),
            "shim": "/home/u/.cache/seqmix/libseqmix_mkl_shim-7fbe.so", "nested": [{"at": f"in {REPO_ROOT}/src x"}],
            "kept": "1/8 of the tokens, and/or https://github.com/a/b", "n": 3}
    assert without_locations(made) == {
        "source": "local mirror .../data", "code": "kernels", "shim": ".../libseqmix_mkl_shim-7fbe.so",
        "nested": [{"at": "in src x"}], "kept": "1/8 of the tokens, and/or https://github.com/a/b", "n": 3}


def test_a_commit_given_fills_in_for_runs_made_without_git_and_never_overrides_theirs(study, tmp_path):
    from seqmix.report.recorded import Recording

    cfg = yaml.safe_load(study.read_text())
    shutil.copytree(cfg["results_dir"], tmp_path / "results")
    for prov in (tmp_path / "results").rglob("provenance.json"):  # as on a machine the checkout was copied to
        prov.write_text(json.dumps({**json.loads(prov.read_text()), "git": {"commit": None, "dirty": None}}))
    copied = write_config(tmp_path / "copied.yaml", {**cfg, "results_dir": str(tmp_path / "results")})
    for given, shown in ((None, "commit unknown (no git checkout)"), ("0123456789abcdef", "commit 0123456789 (tree state unknown)")):
        out = tmp_path / f"out-{given}"
        assert cli(["record", "--config", str(copied), "--out", str(out)] + (["--commit", given] if given else [])) == 0
        (where,) = out.glob("*/*/meta.json")
        meta = json.loads(where.read_text())
        assert meta["git"] == {"commit": given, "from": "--commit" if given else None, "dirty": None}
        assert Recording(where.parent, meta, [], []).describe().endswith(shown)
    out = tmp_path / "theirs"
    assert cli(["record", "--config", str(study), "--out", str(out), "--commit", "0123456789abcdef"]) == 0
    (where,) = out.glob("*/*/meta.json")
    assert json.loads(where.read_text())["git"]["from"] == "provenance"


def test_record_refuses_an_unfinished_study_naming_the_run_and_the_fix(prepared, study, tmp_path, capsys):
    # The same study with a third seed, never trained: refused before anything is written.
    cfg = yaml.safe_load(study.read_text())
    more = write_config(tmp_path / "more.yaml", {**cfg, "seeds": [0, 1, 2]})
    out = tmp_path / "recorded"
    assert cli(["record", "--config", str(more), "--out", str(out)]) == 4
    err = capsys.readouterr().err.strip()
    first = f"{next(iter(cfg['tasks']))}/{cfg['architectures'][0]}/seed2"
    assert err.count("\n") == 0 and err.startswith(f"error: run {first} of {more} has not finished")
    assert "no config.json, metrics.json, eval.json, log.csv, provenance.json" in err and "then record it" in err
    assert not out.exists()


def test_first_difference_walks_the_current_spec_in_order_and_skips_locations():
    now = {"task": "t", "train": {"steps": 9, "lr": 1.0}, "run_dir": "here", "data": {"dir": "d", "source": "mirror"}}
    assert first_difference({**now, "run_dir": "there", "data": {"dir": "e", "source": "mirror"},
                             "spec_hash": "x", "resolved_size": {}}, now) is None
    assert first_difference({**now, "train": {"steps": 6, "lr": 2.0}}, now) == ("train.steps", 6, 9)
    assert first_difference({**now, "train": {"lr": 1.0}}, now) == ("train.steps", "(absent)", 9)
    assert first_difference({**now, "extra": [1, 2]}, now) == ("extra", [1, 2], "(absent)")
    assert first_difference({**now, "data": {"dir": "d", "source": "hub"}}, now) == ("data.source", "hub", "mirror")


def test_recorded_runs_of_the_headline_study_are_accepted_wherever_they_ran(prepared, study, recorded, tmp_path):
    # The headline config as this checkout has it, its results and data elsewhere: the
    # recorded runs are its runs (paths say where, not what).
    cfg = yaml.safe_load(study.read_text())
    here = write_config(tmp_path / "here.yaml", {**cfg, "results_dir": str(tmp_path / "elsewhere")})
    (rec,) = read_recordings(recorded, here)
    assert len(rec.accepted) == 4 and rec.refused == []
    assert account([rec], recorded).startswith(f"recorded study tiny-headline/{rec.path.name} ({rec.describe()}; 4 runs)")


def test_a_recorded_run_whose_config_moved_on_is_refused_naming_the_first_difference(prepared, study, recorded, tmp_path):
    moved = write_config(tmp_path / "moved.yaml", headline_config(prepared, tmp_path, steps=9))
    (rec,) = read_recordings(recorded, moved)
    assert rec.accepted == [] and len(rec.refused) == 4
    for refusal in rec.refused:
        line = refusal.line
        assert "\n" not in line
        assert line.startswith(f"recorded run tiny-headline/{rec.path.name}/{refusal.run} refused: config.json is "
                               f"not the headline study's run spec ({moved} at this checkout)")
        assert "first at train.steps, recorded 6, current 9" in line and "record the study again" in line
    # Seeds the headline study no longer has, and a checkout without its config.
    fewer = write_config(tmp_path / "fewer.yaml", {**yaml.safe_load(study.read_text()), "seeds": [0]})
    (rec,) = read_recordings(recorded, fewer)
    assert [r.run.endswith("seed1") for r in rec.refused] == [True, True] and len(rec.accepted) == 2
    assert "is not a run of the headline study" in rec.refused[0].reason
    # Without its config the headline's recordings are those under the file's name.
    absent = tmp_path / f"{rec.path.parent.name}.yaml"
    (rec,) = read_recordings(recorded, absent)
    assert rec.accepted == [] and f"{absent} does not exist" in rec.refused[0].reason


def test_the_headline_reads_its_own_recordings_only(study, recorded, tmp_path):
    # Another study's recording (the quick report's recall seeds, say) is not a headline run
    # to refuse: 46 such lines once filled the report's first pages.
    mine = shutil.copytree(recorded, tmp_path / "recorded")
    (rec,) = read_recordings(mine, study)
    shutil.copytree(rec.path, mine / "another-study" / rec.path.name)
    assert [r.path for r in read_recordings(mine, study)] == [rec.path]
    assert read_recordings(mine, tmp_path / "another-study.yaml")[0].path.parent.name == "another-study"


def test_a_headline_without_recordings_is_not_resolved(study, recorded, tmp_path, monkeypatch):
    # Every report's claims and quality notebooks ask; resolving the study costs seconds and
    # imports torch, for nothing where only other studies were recorded.
    others = tmp_path / "recorded"
    (rec,) = read_recordings(recorded, study)
    shutil.copytree(rec.path, others / "another-study" / rec.path.name)

    def resolved(*args, **kwargs):
        raise AssertionError("the headline study was resolved")

    monkeypatch.setattr(recorded_module, "Resolved", resolved)
    assert read_recordings(others, study) == []
    assert read_recordings(tmp_path / "nothing", study) == []


def recorded_gap(recorded: Path) -> list[float]:
    """The gap per seed from the recorded eval.json files themselves: 100 (ppl_arch / ppl_baseline - 1)
    on the claim's split."""
    gap = {c["id"]: c for c in yaml.safe_load(CLAIMS.read_text())["claims"]}[GAP]
    split = "validation" if gap["split"] == "eval" else "test"
    runs = next(recorded.glob("*/*/runs")) / gap["task"]
    ppl = {(p.parent.parent.name, p.parent.name): json.loads(p.read_text())["splits"][split]["ppl"]
           for p in runs.glob("*/seed*/eval.json")}
    return [100 * (ppl[gap["arch"], s] / ppl[gap["baseline"], s] - 1) for s in ("seed0", "seed1")]


def test_the_gap_claim_is_decided_on_the_recorded_runs_and_says_where_they_came_from(study, recorded, tmp_path):
    (rec,) = read_recordings(recorded, study)
    row = evaluate_claims(CLAIMS, tmp_path / "no-results", [rec]).set_index("id").loc[GAP]
    print(f"\n{GAP}: ours {row.ours} | measured on {row.measured_on} | {row.verdict}: {row.why}")
    values = recorded_gap(recorded)
    mean, half, n = mean_ci(values)
    assert n == 2 and row["values"] == pytest.approx(values, rel=1e-12) and row.value == pytest.approx(mean, rel=1e-12)
    assert row.ours == f"{mean:.3g} ± {half:.2g}"
    meta = rec.meta
    assert row.measured_on.startswith(f"recorded on {meta['device']}, {meta['date']}, commit {meta['git']['commit'][:10]}")
    assert f"({rec.name}): wikitext2: " in row.measured_on and "2 seeds" in row.measured_on
    # A 0.01M-parameter, 6-step study is not the claim's scale: the value is shown, not judged.
    assert row.verdict == "not testable" and "parameters, the claim is about ≥ 10M" in row.why
    # Where the scale is met, the same numbers decide: the claim's criterion on that interval.
    claims = yaml.safe_load(CLAIMS.read_text())
    for c in claims["claims"]:
        if c["id"] == GAP:
            c["requires"] = {}
    loose = write_config(tmp_path / "claims.yaml", claims)
    judged = evaluate_claims(loose, tmp_path / "no-results", [rec]).set_index("id").loc[GAP]
    gap = {c["id"]: c for c in claims["claims"]}[GAP]
    assert judged.verdict == judge(mean, half, AgreeIf(**gap["agree_if"])) and judged.ours == row.ours


def test_without_an_accepted_recording_the_profiles_runs_decide_and_the_row_says_why(
        prepared, study, recorded, tmp_path):
    # This profile's own runs: the recorded study's, read as a profile (runs.csv).
    from seqmix.report.collect import collect

    cfg = yaml.safe_load(study.read_text())
    dirs = sorted(p.parent for p in (Path(cfg["results_dir"]) / "runs").rglob("metrics.json"))
    collect(dirs, tmp_path / "results" / "summary" / "runs.csv")
    own = evaluate_claims(CLAIMS, tmp_path / "results").set_index("id").loc[GAP]
    none = evaluate_claims(CLAIMS, tmp_path / "results", []).set_index("id").loc[GAP]
    assert (none.ours, none.measured_on, none.verdict) == (own.ours, own.measured_on, own.verdict)
    assert none.why == f"{own.why} (this profile's runs: no study recorded (python -m seqmix record))"
    moved = write_config(tmp_path / "moved.yaml", headline_config(prepared, tmp_path, lr=1e-3))
    refused = evaluate_claims(CLAIMS, tmp_path / "results", read_recordings(recorded, moved)).set_index("id").loc[GAP]
    assert refused.ours == own.ours and not refused.measured_on.startswith("recorded")
    assert "of tiny-headline/" in refused.why and "refused: config.json is not the headline study's run spec" in refused.why
    assert "first at train.lr, recorded 0.003, current 0.001" in refused.why


def test_the_quality_numbers_of_a_recording_are_its_runs(study, recorded):
    from seqmix.report.quality_tables import curves_title, read_logs, recorded_macros

    (rec,) = read_recordings(recorded, study)
    runs = rec.runs()
    logs = read_logs(runs)
    assert set(zip(logs.arch, logs.seed)) == set(zip(runs.arch, runs.seed)) and (logs.phase == "eval").any()
    task = runs.task.iloc[0]
    assert "0.01M params, 6 steps, 2 seeds" in curves_title(runs, task, "recorded")
    assert recorded_macros([rec], recorded)["recorded"].startswith("recorded study tiny-headline/")
    # The report draws the recorded curves only where there is a recording to draw.
    assert recorded_macros([rec], recorded)["recordedDrawn"] == "1" and recorded_macros([], recorded)["recordedDrawn"] == "0"
    assert pd.Series(runs.run_dir).map(lambda d: Path(d).is_relative_to(rec.path)).all()
