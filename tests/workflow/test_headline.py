"""The headline study (config/paper-headline.yaml) and what runs it on one GPU: its runs are
the paper profile's WikiText-2 runs; its DAG target trains and evaluates them and nothing
else; the packing measurement's choice of step and seeds (scripts/gpu-headline.sh) cuts
seeds before anything else and is written into the config file. The headline smoke at its
exact shapes through the DAG and the GPU slots (tests/core/test_slots.py) is slow-marked
(``make paper-headline-smoke``: about 10 minutes on a 2-core CPU)."""

from __future__ import annotations

import json

import pytest
import yaml

from seqmix.expansion.table import expand
from seqmix.expansion.validate import load_study
from seqmix.preflight import solved_size
from seqmix.study.profile import read_config_file
from tests.conftest import REPO, tiny_config
from tests.helpers import copy_workflow, flatten, harness_env, planned_jobs, slot_env, snakemake
from tools.bench import packing

HEADLINE = REPO / "config" / "paper-headline.yaml"
SMOKE = REPO / "config" / "paper-headline-smoke.yaml"
PAPER = REPO / "config" / "paper.yaml"
# What may differ between a headline run's spec and the paper profile's run of the same
# architecture and seed: where it writes and reads (its own results_dir and data.dir), the
# profile's name, and the step (train.compile), which the GPU measurement turns on where it
# is faster: the same model, batches, optimiser and schedule; the losses differ by float
# rounding (fused, reordered sums) and dropout draws other masks (seqmix/train/step.py).
NOT_THE_TASK = {"profile", "run_dir", "data_dir", "tokenizer_dir", "data.dir", "train.compile"}


# ------------------------------------------------------------------------------------------
# The profile.
# ------------------------------------------------------------------------------------------


def test_the_headline_runs_are_the_paper_profiles_wikitext2_runs():
    headline, paper = load_study(HEADLINE), load_study(PAPER)
    assert headline.profile == "paper-headline" and headline.results_dir == "results/paper-headline"
    assert list(headline.tasks) == ["wikitext2"] and headline.architectures == ["softmax", "grassmann"]
    assert headline.seeds and headline.seeds == [0, 1, 2][: len(headline.seeds)]  # a cut keeps the first
    ours, papers = expand(headline), expand(paper)
    assert [(r.arch, r.seed) for r in ours.runs] == [(a, s) for a in headline.architectures for s in headline.seeds]
    for run in ours.runs:
        mine = flatten(json.loads(ours.run_spec(*run).model_dump_json()))
        theirs = flatten(json.loads(papers.run_spec(*run).model_dump_json()))
        assert set(mine) == set(theirs)
        differ = {k for k in mine if mine[k] != theirs[k]}
        assert differ <= NOT_THE_TASK, {k: (mine[k], theirs[k]) for k in differ - NOT_THE_TASK}
        assert mine["settings.block_size"] == 128 and mine["train.batch_size"] == 32
        assert mine["train.steps"] == 18000 and mine["settings.eval_max_tokens"] is None
    for arch in headline.architectures:  # the seed does not change the size
        size = solved_size(ours.run_spec("wikitext2", arch, headline.seeds[0]))
        assert abs(size.params - 13_000_000) <= 0.01 * 13_000_000, (arch, size.params)


def test_the_headline_smoke_is_the_headline_plus_its_cuts():
    """config/paper-headline-smoke.yaml resolves to the headline with the keys it lists
    changed and nothing else: every shape is the headline's."""
    cuts = {k for k in flatten(read_config_file(SMOKE)) if k != "extends"}
    got, base = flatten(load_study(SMOKE).model_dump(mode="json")), flatten(load_study(HEADLINE).model_dump(mode="json"))
    changed = {k for k in got if got.get(k) != base.get(k)}
    assert changed <= cuts, changed - cuts
    for key in ("tasks.wikitext2.block_size", "tasks.wikitext2.train.batch_size", "tasks.wikitext2.model.budget.params",
                "tokenizer.vocab_size", "architectures", "mixers.grassmann.rank"):
        assert got[key] == base[key], key


def test_the_headline_target_plans_the_runs_and_their_evaluations_only(tmp_path):
    proc = snakemake(REPO, tmp_path, "-n", "-p", "--configfile", str(REPO / "config" / "paper-headline.yaml"),
                     "--resources", "gpu_slots=6", "--", "runs")
    study = load_study(HEADLINE)
    n = len(study.architectures) * len(study.seeds)
    # each architecture's seeds train as one seed pack (train.pack: the headline packs on a GPU)
    assert planned_jobs(proc) == {"data_tokenizer": 1, "data_task": 1, "train_pack": len(study.architectures),
                                  "eval": n, "runs": 1}
    assert "python -m seqmix.slots python -m seqmix train-pack --spec" in proc.stdout


# ------------------------------------------------------------------------------------------
# The measurement's choice.
# ------------------------------------------------------------------------------------------


def rows(step_ms: dict[tuple[str, str, int], float], eval_ms: float = 8.0, ready_s: float = 20.0) -> list[dict]:
    return [{"arch": a, "mode": m, "jobs": k, "status": "ok", "step_ms": t, "eval_ms": eval_ms if k == 1 else None,
             "ready_s": ready_s} for (a, m, k), t in step_ms.items()]


def measured(eager: tuple[float, float, float, float], compiled: tuple[float, float, float, float] | None = None):
    """Rows for softmax and Grassmann: (softmax alone, softmax with 6, Grassmann alone, with 6) ms."""
    out = {}
    for mode, t in (("eager", eager), ("compiled", compiled)):
        if t:
            out.update({("softmax", mode, 1): t[0], ("softmax", mode, 6): t[1],
                        ("grassmann", mode, 1): t[2], ("grassmann", mode, 6): t[3]})
    return rows(out)


def test_the_choice_cuts_seeds_before_anything_else_and_takes_the_faster_step():
    study = load_study(HEADLINE)
    expansion = expand(study)
    # The committed H100 eager step times alone, and six together as slow as one alone:
    # 18,000 Grassmann steps alone take 7.9 min, so no seed fits 7 min; the choice says so and
    # starts nothing (its closest option: one seed).
    slow = measured((17.9, 17.9, 26.3, 26.3))
    choice = packing.choose(slow, expansion, 6, budget_s=420, overhead_s=40)
    assert not choice["fits"] and choice["seeds"] == [] and choice["closest_seeds"] == 1 and not choice["compile"]
    # A compiled step 3x faster, and packing that costs each run 50 %: three seeds fit.
    fast = measured((17.9, 17.9, 26.3, 26.3), (6.0, 9.0, 8.0, 12.0))
    choice = packing.choose(fast, expansion, 6, budget_s=420, overhead_s=40)
    assert choice["fits"] and choice["compile"] and choice["seeds"] == [0, 1, 2] and choice["slots_per_gpu"] == 6
    assert choice["packing_gain"] == {"softmax": 4.0, "grassmann": 4.0} and choice["recommended_slots_per_gpu"] == 6
    # Packing that slows each run down sixfold gains nothing: one at a time, and fewer seeds.
    crowded = measured((17.9, 107.4, 26.3, 157.8), (6.0, 36.0, 8.0, 48.0))
    choice = packing.choose(crowded, expansion, 6, budget_s=420, overhead_s=40)
    assert choice["recommended_slots_per_gpu"] == 1 and choice["closest_seeds"] == 1 and not choice["fits"]
    # The prediction: start-up, steps, periodic and final evaluations, at 1 and 6 jobs.
    one = packing.predict(fast, expansion, "compiled", seeds=1, slots=6, overhead_s=0)
    train = study.tasks["wikitext2"].train
    evals = train.steps // train.eval_every * train.eval_batches + packing.final_eval_batches(expansion, packing._tasks(expansion)[0])
    slowdown = packing.step_ms_at({1: 8.0, 6: 12.0}, 2) / 8.0
    assert one == pytest.approx(20.0 + 18000 * packing.step_ms_at({1: 8.0, 6: 12.0}, 2) / 1e3
                                + evals * 8.0 / 1e3 * slowdown, abs=0.1)
    # Fewer slots than runs: waves of that many runs, each as long as its slowest run.
    wave = packing.predict(fast, expansion, "compiled", seeds=1, slots=2, overhead_s=0)
    assert packing.predict(fast, expansion, "compiled", seeds=3, slots=2, overhead_s=0) == pytest.approx(3 * wave, abs=0.2)
    nothing = packing.choose([], expansion, 6, 420, 40)
    assert nothing["measured"] is False and nothing["fits"] is False and nothing["seeds"] == []
    # The same numbers choose the same whatever the host: a budget just above and just below
    # the best option's predicted time (at the margin) flips the choice, nothing else does.
    best = packing.predict(fast, expansion, "compiled", seeds=3, slots=6, overhead_s=40)
    assert packing.choose(fast, expansion, 6, budget_s=best / 0.9 + 0.1, overhead_s=40)["seeds"] == [0, 1, 2]
    assert packing.choose(fast, expansion, 6, budget_s=best / 0.9 - 0.1, overhead_s=40)["seeds"] != [0, 1, 2]


@pytest.mark.parametrize("config", [HEADLINE, SMOKE])
def test_the_choice_is_written_into_the_config_file(tmp_path, config):
    (tmp_path / "config").mkdir()
    for f in (HEADLINE, SMOKE):
        (tmp_path / "config" / f.name).write_text(f.read_text())
    path = tmp_path / "config" / config.name
    packing.apply(path, {"seeds": [0, 1], "compile": True})
    study = load_study(path)
    assert study.seeds == [0, 1] and study.tasks["wikitext2"].train.compile is True
    # The measurement timed one run per process: the study runs that, not seed packs (the
    # headline's file packs until then; the smoke's never does).
    original = load_study(config)
    assert original.tasks["wikitext2"].train.pack is (config == HEADLINE)
    assert study.tasks["wikitext2"].train.pack is False
    before = flatten(original.model_dump(mode="json"))
    after = flatten(study.model_dump(mode="json"))
    assert {k for k in after if after[k] != before[k]} == {"seeds", "tasks.wikitext2.train.compile"}
    assert path.read_text().count("#") == config.read_text().count("#")  # comments kept
    (tmp_path / "bad.yaml").write_text("seeds: [0]\n")
    with pytest.raises(ValueError, match="one '      compile: true\\|false' line"):
        packing.apply(tmp_path / "bad.yaml", {"seeds": [0], "compile": False})


# A one-task study as the headline's, tiny: the measurement builds its models without data.
TINY_LM = """\
profile: tiny
tokenizer: {kind: trained, vocab_size: 256}
architectures: [softmax, grassmann]
seeds: [0]
tasks:
  wikitext2:
    block_size: 16
    model: {d_model: 16, n_layers: 1, dropout: 0.0, budget: {params: null}}
    train:
      steps: 50
      batch_size: 4
      eval_every: 25
      eval_batches: 2
      compile: false
mixers:
  grassmann: {rank: 4, offsets: [1, 2]}
"""


def test_the_measurement_runs_its_workers_and_chooses(tmp_path):
    """The measurement end to end on the CPU (tiny model, eager steps only, two workers): its
    rows, and a choice that is ``choose`` of those rows and the budget it had (whether it fits
    depends on this host's speed, which the test does not assume), the config written only
    where it fits. About 15 s here."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_LM)
    out, choice = tmp_path / "packing.csv", tmp_path / "choice.json"
    assert packing.main(["--config", str(path), "--jobs", "2", "--steps", "2", "--window", "1", "--modes", "eager",
                         "--measure-budget-s", "240", "--budget-s", "600", "--overhead-s", "5", "--out", str(out),
                         "--choice", str(choice), "--apply", str(path)]) == 0
    import csv

    got = list(csv.DictReader(open(out)))
    assert {(r["arch"], r["mode"], r["jobs"], r["status"]) for r in got} == {
        (a, "eager", k, "ok") for a in ("softmax", "grassmann") for k in ("1", "2")}
    made = json.loads(choice.read_text())
    rows_back = [{**r, "jobs": int(r["jobs"])} for r in got]
    expansion = expand(load_study(path))
    again = packing.choose(rows_back, expansion, 2, made["budget_s"], made["overhead_s"], made["margin"])
    assert json.loads(json.dumps(again)) == made and made["measured"] and made["compile"] is False
    assert made["seeds"] == ([0] if made["fits"] else [])
    assert load_study(path).seeds == [0]  # as it was, or set to the one seed that fits


# ------------------------------------------------------------------------------------------
# The headline at its exact shapes on a CPU, through the DAG and the slots.
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_headline_smoke_runs_through_the_dag_on_one_fake_gpu(tmp_path, mirror):
    """`make paper-headline-smoke`'s DAG part: config/paper-headline-smoke.yaml (the exact
    shapes, 2 steps) to the `runs` target, three jobs at once on one fake GPU (the first
    three training jobs each held, once they have a slot, until all three have one:
    tests/harness/train.py), in a working directory where another study was built first.
    About 10 minutes on a 2-core CPU."""
    src = copy_workflow(tmp_path / "src")
    work = tmp_path / "work"
    work.mkdir()
    other = tiny_config(work / "other", None)
    other["results_dir"], other["data"]["dir"] = "results/other", "data/other"
    (work / "other.yaml").write_text(yaml.safe_dump(other))
    env = slot_env(tmp_path, SEQMIX_GPUS="fake0", SEQMIX_DATA_MIRROR=str(mirror))
    snakemake(src, work, "--configfile", str(work / "other.yaml"), "--", "runs", env=env)
    held = tmp_path / "held"
    snakemake(src, work, "--cores", "3", "--resources", "gpu_slots=3", "--set-threads", "train=1", "eval=1",
              "--configfile", str(src / "config" / "paper-headline-smoke.yaml"), "--", "runs",
              env={**env, **harness_env(SEQMIX_TEST_BARRIER=str(held), SEQMIX_TEST_BARRIER_COUNT="3")})
    study = load_study(SMOKE)
    results = work / study.results_dir / "runs" / "wikitext2"
    slots = []
    for run in expand(study).runs:
        d = results / run.arch / f"seed{run.seed}"
        metrics, prov = (json.loads((d / f).read_text()) for f in ("metrics.json", "provenance.json"))
        assert metrics["status"] == "ok" and metrics["steps_completed"] == 2
        assert abs(metrics["params"] - 13_000_000) <= 130_000  # the 13.0M budget within 1 %
        assert (d / "eval.json").exists()
        slots.append(prov["device"]["gpu_slot"])
    # The three held jobs shared the fake GPU, one slot each.
    assert sorted((held / str(k)).read_text() for k in range(3)) == ["fake0/0", "fake0/1", "fake0/2"], slots


def test_a_copy_without_git_records_the_commit_it_was_sent_from(tmp_path, monkeypatch):
    """A GPU machine gets the working tree without .git: provenance then records the commit
    scripts/gpu-headline.sh was given ($SEQMIX_GIT_COMMIT, through the CLI), dirty unknown."""
    from seqmix.train import provenance

    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(provenance, "CONFIGURED", dict(provenance.CONFIGURED))
    assert provenance.git_commit() == {"commit": None, "dirty": None}
    provenance.configure(commit="0123abc")
    assert provenance.git_commit() == {"commit": "0123abc", "dirty": None}
