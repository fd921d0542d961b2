"""Seed packs as a study setting (issue 48 phase B): `train.pack` in a task's train settings,
refused before any job where a mixer or task cannot be vectorised; one `train_pack` job per
(task, arch) whose outputs are its members' `train` outputs, so that evaluation, collection
and recording read them unchanged; `python -m seqmix train-pack`; a pack whose member lost its
files trained again by the DAG from its checkpoints; `record --partial` on the command line
and the report's account of a partial headline; `plan`'s hours with and without packs.

A tiny MQAR study (no mirror), two architectures, two seeds: a few minutes on a 2-core CPU,
most of it the DAG's process starts."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seqmix.errors import ConfigError
from seqmix.expansion.table import PACK_STEP, expand
from seqmix.expansion.validate import validate_study
from seqmix.study.jobs import PackJob
from tests.conftest import tiny_config
from tests.helpers import REPO, copy_workflow, planned_jobs, snakemake

SEEDS = (0, 1)
MEMBER_FILES = ("metrics.json", "model.pt", "log.csv", "provenance.json", "config.json", "hashes.json")


def packed_config(root: Path, pack=True, archs=("softmax", "grassmann")) -> dict:
    cfg = tiny_config(root, None, archs=archs, seeds=SEEDS)
    cfg["tasks"]["mqar"]["train"] = {**cfg["tasks"]["mqar"]["train"], "steps": 4, "checkpoint_every": 2,
                                     "eval_every": 2, "pack": pack}
    return cfg


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def seqmix(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seqmix", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


# ------------------------------------------------------------------------------------------
# The setting and its validation.
# ------------------------------------------------------------------------------------------


def test_pack_is_a_setting_refused_where_it_cannot_vectorise(tmp_path):
    expansion = expand(validate_study(packed_config(tmp_path)))
    assert expansion.packs == (("mqar", "softmax", SEEDS), ("mqar", "grassmann", SEEDS))
    job = expansion.pack_job("mqar", "grassmann")
    assert job.name == "mqar/grassmann/pack0-1" and [s.seed for s in job.specs] == list(SEEDS)
    assert all(s.train.pack is True for s in job.specs)
    assert PackJob.model_validate_json(job.model_dump_json()) == job
    # unpacked: the spec is the one it was before packs existed (no `pack` key written)
    plain = expand(validate_study(packed_config(tmp_path, pack=False)))
    assert plain.packs == () and "pack" not in json.loads(plain.run_spec("mqar", "softmax", 0).model_dump_json())["train"]
    with pytest.raises(ConfigError, match="does not train as a seed pack"):
        plain.pack_job("mqar", "softmax")
    # a mixer that cannot be vectorised: the key, the reason and the fix
    with pytest.raises(ConfigError, match=r"tasks\.mqar\.train\.pack': h3 cannot train in a seed pack: its FFT .*"
                                          r"set it false for h3 \(pack: \{default: true, h3: false\}\)"):
        validate_study(packed_config(tmp_path, archs=("softmax", "h3")))
    per_arch = expand(validate_study(packed_config(tmp_path, pack={"default": True, "h3": False},
                                                   archs=("softmax", "h3"))))
    assert per_arch.packs == (("mqar", "softmax", SEEDS),)
    # a task whose batches vary in shape (SNLI pads each batch to its longest pair)
    cfg = packed_config(tmp_path)
    cfg["tasks"]["snli"] = {"train_file": "train_head_1024", "max_sentence_tokens": 8,
                            "train": {"steps": 2, "pack": True}}
    with pytest.raises(ConfigError, match=r"tasks\.snli\.train\.pack': a snli task cannot train in seed packs"):
        validate_study(cfg)


def test_the_pack_code_is_the_modules_that_train_it():
    from seqmix.train import pack

    assert PACK_STEP == pack.STEP


# ------------------------------------------------------------------------------------------
# The DAG: one train_pack job per (task, arch), its members' train outputs as its outputs.
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("packs-dag") / "src")


def test_the_dag_plans_one_pack_job_per_architecture_with_its_members_outputs(workflow, tmp_path):
    config = write_config(tmp_path / "packed.yaml", packed_config(tmp_path / "study"))
    proc = snakemake(workflow, tmp_path, "-n", "-p", "--configfile", str(config), "--", "runs")
    assert planned_jobs(proc) == {"data_task": 1, "train_pack": 2, "eval": 4, "runs": 1}
    assert "python -m seqmix.slots python -m seqmix train-pack --spec" in proc.stdout
    results = tmp_path / "study" / "results" / "runs" / "mqar"
    for arch in ("softmax", "grassmann"):
        outputs = sorted(str(results / arch / f"seed{s}" / f) for s in SEEDS for f in MEMBER_FILES)
        block = next(b for b in proc.stdout.split("\n\n") if "rule train_pack:" in b and f"/{arch}/seed0/" in b)
        assert sorted(next(line for line in block.splitlines() if line.strip().startswith("output:"))
                      .split(":", 1)[1].strip().split(", ")) == outputs
    unpacked = write_config(tmp_path / "unpacked.yaml", packed_config(tmp_path / "study", pack=False))
    proc = snakemake(workflow, tmp_path, "-n", "--configfile", str(unpacked), "--", "runs")
    assert planned_jobs(proc) == {"data_task": 1, "train": 4, "eval": 4, "runs": 1}


def test_a_packed_study_trains_through_the_dag_and_is_read_unchanged(workflow, tmp_path):
    """snakemake trains each pack, every member has a single run's files, collect reads them;
    a member whose outputs were removed is made again by its pack's job, from its checkpoints;
    `record --partial` records the finished members and names the others."""
    config = write_config(tmp_path / "packed.yaml", packed_config(tmp_path / "study"))
    summary = tmp_path / "study" / "results" / "summary" / "runs.csv"
    proc = snakemake(workflow, tmp_path, "--configfile", str(config), "--", str(summary))
    print(proc.stdout[-1500:] + proc.stderr[-1500:])
    assert planned_jobs(proc.stdout + proc.stderr)["train_pack"] == 2
    runs = tmp_path / "study" / "results" / "runs" / "mqar"
    for arch in ("softmax", "grassmann"):
        for s in SEEDS:
            d = runs / arch / f"seed{s}"
            assert all((d / f).is_file() for f in [*MEMBER_FILES, "eval.json"]), sorted(p.name for p in d.iterdir())
            provenance = json.loads((d / "provenance.json").read_text())
            assert provenance["pack"]["seeds"] == list(SEEDS) and provenance["pack"]["member"] == s
            assert json.loads((d / "config.json").read_text())["train"]["pack"] is True
    rows = list(csv.DictReader(summary.open()))
    assert sorted((r["arch"], r["seed"], r["status"]) for r in rows) == sorted(
        (a, str(s), "ok") for a in ("softmax", "grassmann") for s in SEEDS)

    # One member's file gone and asked for: its pack's job again (Snakemake removes the pack's
    # outputs first), which writes its members' results from their final checkpoints without
    # training; the other pack is left alone.
    kept = (runs / "softmax" / "seed0" / "model.pt").read_bytes()
    lost = runs / "grassmann" / "seed1" / "metrics.json"
    before = json.loads(lost.read_text())
    lost.unlink()
    proc = snakemake(workflow, tmp_path, "--configfile", str(config), "--", str(lost))
    jobs = planned_jobs(proc.stdout + proc.stderr)
    assert jobs == {"train_pack": 1}, jobs
    after = json.loads(lost.read_text())
    assert after["status"] == "ok" and after["steps_completed"] == before["steps_completed"] == 4
    assert after["best_eval"] == before["best_eval"]
    log = (tmp_path / "study" / "results" / "logs" / "train_pack" / "mqar" / "grassmann" / "pack0-1.log").read_text()
    assert "writing its results again without training" in log
    assert (runs / "softmax" / "seed0" / "model.pt").read_bytes() == kept

    # `record --partial`: one run without its evaluation is named unfinished
    (runs / "grassmann" / "seed1" / "eval.json").unlink()
    proc = seqmix("record", "--config", str(config), "--out", str(tmp_path / "recorded"), "--partial")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(next((tmp_path / "recorded").glob("test/*/meta.json")).read_text())
    assert meta["unfinished"] == ["mqar/grassmann/seed1"] and "--partial" in meta["command"]
    proc = seqmix("record", "--config", str(config), "--out", str(tmp_path / "recorded"))
    assert proc.returncode == 4 and "has not finished" in proc.stderr


def test_train_pack_on_the_command_line_refuses_an_unpacked_run(tmp_path):
    config = write_config(tmp_path / "unpacked.yaml", packed_config(tmp_path / "study", pack=False))
    proc = seqmix("train-pack", "--config", str(config), "--task", "mqar", "--arch", "softmax")
    assert proc.returncode == 2 and "does not train as a seed pack" in proc.stderr
    assert "train.pack" in proc.stderr


# ------------------------------------------------------------------------------------------
# The report on a partial headline, and the plan with packs.
# ------------------------------------------------------------------------------------------


def test_a_partial_recording_says_how_many_seeds_decided_the_claim():
    from seqmix.report.claims import ClaimResult, partial_note
    from seqmix.report.recorded import Recording

    result = ClaimResult("c", "", "", "", "", 1.0, "", "agrees", "", values=[10.0, 12.0])
    whole = Recording(Path("r/p/d"), {"unfinished": []}, [], [])
    partial = Recording(Path("r/p/d"), {"unfinished": ["wikitext2/grassmann/seed2"]}, [], [])
    assert partial_note(whole, result) == ""
    assert partial_note(partial, result) == ("; partial recording: decided by 2 seeds (1 run unfinished: "
                                             "wikitext2/grassmann/seed2)")


def test_the_plan_gives_hours_with_and_without_packs(tmp_path):
    from seqmix import plan

    expansion = expand(validate_study(packed_config(tmp_path)))
    counts = {"softmax": {"single": 100, "packed": 250, "members": 3, "host_ratio": 2.0}}
    notes: list[str] = []
    rows = {r["arch"]: r for r in plan.plan_rows(expansion, mfu=0.5, peak=1e12, pack_counts=counts, notes=notes)}
    # two seeds: launches 100 + 150 / 2 = 175, x host ratio 2: 3.5 single steps for the pack
    assert plan.pack_factor(counts["softmax"], 2) == pytest.approx(3.5)
    assert rows["softmax"]["packed_hours"] == pytest.approx(rows["softmax"]["h100_hours"] * 3.5 / 2)
    assert rows["grassmann"]["packed_hours"] == pytest.approx(rows["grassmann"]["h100_hours"])
    assert any("no launch count" in n and "grassmann" in n for n in notes)
    text = plan.markdown(list(rows.values()), 0.5, 1e12, None, notes)
    assert "With the study's seed packs" in text and "predicted by the time model" in text
    unpacked = plan.plan_rows(expand(validate_study(packed_config(tmp_path, pack=False))), mfu=0.5, peak=1e12,
                              pack_counts=counts)
    assert all(r["packed_hours"] == pytest.approx(r["h100_hours"]) for r in unpacked)
    assert "seed packs" not in plan.markdown(unpacked, 0.5, 1e12)


def test_the_paper_profiles_pack_on_the_gpu_only():
    from seqmix.expansion.validate import load_study

    headline = expand(load_study(REPO / "config" / "paper-headline.yaml"))
    assert [(t, a) for t, a, _ in headline.packs] == [("wikitext2", "softmax"), ("wikitext2", "grassmann")]
    paper = expand(load_study(REPO / "config" / "paper.yaml"))
    assert {t for t, _, _ in paper.packs} == {"wikitext2"}
    assert {"performer", "bigbird", "h3"}.isdisjoint(a for _, a, _ in paper.packs)
    for cpu in ("config.yaml", "paper-smoke.yaml", "paper-headline-smoke.yaml", "fingerprint.yaml",
                "gpu-check-smoke.yaml"):
        assert expand(load_study(REPO / "config" / cpu)).packs == (), cpu
