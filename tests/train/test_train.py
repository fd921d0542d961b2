"""Training runs: outputs, resume after a kill, divergence, budgets, evaluation."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.models.budget import solve_budget
from seqmix.tasks import make_task
from seqmix.train.evaluate import evaluate_run
from seqmix.train.loop import LOG_FIELDS, train
from tests.helpers import run_spec_in

# What the tiny config's final evaluation scores on each split: WikiText-2 stops at its cap
# (eval_max_tokens 256 = 16 windows of 16), SNLI at eval_max_examples 32, MQAR scores the
# whole split (16 test examples x 2 queries).
SCORED = {"wikitext2": {"validation": 256, "test": 256}, "snli": {"validation": 32, "test": 32},
          "mqar": {"validation": 32, "test": 32}}


def prepared_for(request, task: str) -> dict:
    """MQAR needs no mirror; the other tasks use the mirror's data."""
    return request.getfixturevalue("prepared_mqar" if task == "mqar" else "prepared")


def check_evaluation(result: dict, metric: str, scored: int, split_size: int) -> None:
    """One split's evaluation: what it scored, and metrics consistent with its loss."""
    assert result["scored"] == scored and result["split_size"] == split_size
    assert math.isfinite(result["loss"]) and result["loss"] >= 0
    if metric == "ppl":
        assert result["ppl"] == pytest.approx(math.exp(result["loss"]), rel=1e-12) and result["ppl"] >= 1
    else:
        correct = result[metric] * scored
        assert 0 <= result[metric] <= 1 and correct == pytest.approx(round(correct), abs=1e-6)


@pytest.mark.parametrize("task", ["mqar", "wikitext2", "snli"])
def test_a_run_writes_its_results(request, tmp_path, task):
    spec = run_spec_in(prepared_for(request, task), tmp_path, task, "grassmann")
    metrics = train(spec, progress=False)
    run = Path(spec.run_dir)
    for name in ("metrics.json", "log.csv", "config.json", "provenance.json", "model.pt"):
        assert (run / name).exists(), name
    assert not (run / "checkpoints" / "last.pt").exists()  # removed once complete
    assert metrics["status"] == "ok" and metrics["steps_completed"] == 6
    assert metrics["params"] > 0 and metrics["data"]["splits"]
    rows = list(csv.DictReader(open(run / "log.csv")))
    assert list(rows[0]) == LOG_FIELDS
    assert [r["step"] for r in rows if r["phase"] == "eval"] == ["3", "6"]
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["seed"] == 0 and prov["packages"]["torch"] and prov["device"]["type"] == "cpu"
    ev = evaluate_run(run, device="cpu")
    assert set(ev["splits"]) == {"validation", "test"} == set(SCORED[task])
    sizes = split_sizes(spec)
    for split, result in ev["splits"].items():
        check_evaluation(result, metrics["metric"], SCORED[task][split], sizes[split])


def split_sizes(spec) -> dict[str, int]:
    """Scored units of each held-out split, counted from the prepared files (not by the task)."""
    data = Path(spec.data_dir)
    if spec.kind == "wikitext2":
        return {s: len(np.load(data / f"{s}.npy")) - 1 for s in ("validation", "test")}
    if spec.kind == "snli":
        return {s: int((np.load(data / f"{s}.npz")["labels"] >= 0).sum()) for s in ("validation", "test")}
    return {s: int((np.load(data / f"{s}.npz")["labels"] != -100).sum()) for s in ("validation", "test")}


@pytest.mark.parametrize("task", ["mqar", "wikitext2", "snli"])
def test_an_uncapped_evaluation_scores_the_whole_split(request, tmp_path, task):
    # The final evaluation of the paper profile: no cap, every scored unit of the split once.
    # An untrained model is enough: what is scored does not depend on the weights.
    cfg = copy.deepcopy(prepared_for(request, task))
    cfg["results_dir"] = str(tmp_path)
    cfg["tasks"][task].pop("eval_max_tokens", None)
    cfg["tasks"][task].pop("eval_max_examples", None)
    spec = expand(validate_study(cfg)).run_spec(task, "softmax", 0)
    t = make_task(spec)
    model = t.build_model(16, 1).eval()
    sizes = split_sizes(spec)
    for split in ("validation", "test"):
        check_evaluation(t.evaluate(model, split, 512, "cpu"), t.metric, sizes[split], sizes[split])


def test_a_diverging_run_is_recorded_and_exits_cleanly(prepared_mqar, tmp_path, capsys):
    from seqmix.cli import main as cli

    spec = run_spec_in(prepared_mqar, tmp_path, lr=1e6, grad_clip=0.0, steps=40, warmup_steps=0)
    assert cli(["train", "--quiet", "--spec", spec.model_dump_json()]) == 0
    assert "recording the run as diverged" in capsys.readouterr().err
    m = json.loads((Path(spec.run_dir) / "metrics.json").read_text())
    assert m["status"] == "diverged" and m["diverged_at_step"] is not None
    ev = evaluate_run(spec.run_dir)
    assert ev["status"] == "diverged" and ev["splits"] == {}


def test_budget_solver_matches_the_target_width():
    from seqmix.models.lm import CausalLM, LMConfig

    def build(d, n, f):
        return CausalLM(LMConfig(arch="softmax", vocab_size=1000, max_len=32, d_model=d, n_layers=n, d_ff_mult=f))

    d, n, _, count = dataclasses.astuple(solve_budget(build, d_model=64, n_layers=2, d_ff_mult=4.0, params=200_000,
                                                      width_step=16))
    counts = {w: solve_budget(build, d_model=w, n_layers=2, d_ff_mult=4.0, params=None).params for w in (d - 16, d, d + 16)}
    assert n == 2 and count == counts[d]
    assert abs(count - 200_000) <= min(abs(counts[d - 16] - 200_000), abs(counts[d + 16] - 200_000))


def test_zero_feed_forward_width_builds_a_mixer_only_stack():
    from seqmix.models.budget import count_params
    from seqmix.models.lm import CausalLM, LMConfig

    with_ffn = CausalLM(LMConfig(arch="softmax", vocab_size=100, max_len=16, d_model=32, n_layers=2))
    without = CausalLM(LMConfig(arch="softmax", vocab_size=100, max_len=16, d_model=32, n_layers=2, d_ff_mult=0))
    mlp_and_norm = 2 * (32 * 128 + 128 + 128 * 32 + 32 + 2 * 32)  # per layer: fc1, fc2, LayerNorm
    assert count_params(with_ffn) - count_params(without) == mlp_and_norm
    assert all(b.ffn is None for b in without.blocks)
    assert without(torch.randint(0, 100, (2, 16))).shape == (2, 16, 100)


def test_the_head_scores_only_positions_with_a_target():
    # MQAR scores a few query positions: the LM head (d × V) runs only there, and the loss
    # is the cross-entropy of the full logits at those positions.
    from seqmix.models.lm import CausalLM, LMConfig

    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch="softmax", vocab_size=40, max_len=12, d_model=16, n_layers=1, dropout=0.0))
    idx = torch.randint(0, 40, (3, 12))
    targets = torch.full((3, 12), -100)
    targets[0, 5], targets[1, 11], targets[2, 7] = 3, 17, 39
    full = model(idx)
    expected = torch.nn.functional.cross_entropy(full[targets != -100], targets[targets != -100])
    torch.testing.assert_close(model.loss(idx, targets), expected)
    torch.testing.assert_close(model.logits_at(idx, targets != -100), full[targets != -100])
    dense = torch.randint(0, 40, (3, 12))  # every position scored: the plain LM loss
    torch.testing.assert_close(model.loss(idx, dense),
                               torch.nn.functional.cross_entropy(full.reshape(-1, 40), dense.reshape(-1)))


def test_the_seeds_of_a_point_share_its_data_and_differ_in_init_and_batches(prepared_mqar, tmp_path):
    # A seed changes the initialisation and the order of the batches, never the cell: every
    # seed reads the same data directory, generated once from the task's data_seed.
    cfg = copy.deepcopy(prepared_mqar)
    cfg["results_dir"], cfg["seeds"] = str(tmp_path), [0, 1]
    expansion = expand(validate_study(cfg))
    specs = [expansion.run_spec("mqar", "softmax", s) for s in (0, 1)]
    assert specs[0].data_dir == specs[1].data_dir and specs[0].settings == specs[1].settings
    assert specs[0].settings["data_seed"] == 1234 and specs[0].run_dir != specs[1].run_dir
    tasks = [make_task(s) for s in specs]
    assert all(torch.equal(a, b) for a, b in zip(tasks[0].split("train"), tasks[1].split("train")))
    assert not torch.equal(tasks[0].train_batch(5, 4, "cpu")[0], tasks[1].train_batch(5, 4, "cpu")[0])
    from seqmix.train.loop import build_for_spec

    w0, w1 = (build_for_spec(s, t)[0].tok_emb.weight for s, t in zip(specs, tasks))
    assert not torch.equal(w0, w1)


def test_mqar_query_distance_points_at_the_key():
    from seqmix.data.mqar import multiquery_ar
    from seqmix.tasks.mqar import MQAR, MQARSettings

    task = MQAR.__new__(MQAR)  # the distance logic only
    task.settings = MQARSettings(vocab_size=64, seq_len=32, num_kv_pairs=4)
    x, y = map(torch.from_numpy, multiquery_ar(64, 50, 32, 4, seed=3))
    d = task.query_distance(x, y)
    rows, cols = (y != -100).nonzero(as_tuple=True)
    assert len(d) == 50 * 4 and bool((d >= 2).all())
    assert torch.equal(x[rows, cols - d], x[rows, cols])  # the token d back is the queried key
    assert bool(((cols - d) < 2 * 4).all())  # ... and it lies in the context


def test_collect_writes_each_runs_own_evaluation(prepared_mqar, tmp_path):
    # runs.csv against the run directory it names: eval columns from the eval split, test
    # columns from the test split, and breakdown.csv summing to what was scored.
    import pandas as pd

    from seqmix.io import columns
    from seqmix.report.collect import BreakdownRow, RunRow, collect

    spec = run_spec_in(prepared_mqar, tmp_path, "mqar", "softmax", steps=30, eval_every=15, checkpoint_every=15)
    train(spec, progress=False)
    ev = evaluate_run(spec.run_dir, device="cpu")
    assert ev["splits"]["validation"]["loss"] != ev["splits"]["test"]["loss"]  # else a swap could not show
    out, breakdown = tmp_path / "runs.csv", tmp_path / "breakdown.csv"
    assert collect([Path(spec.run_dir)], out, breakdown) == 1
    assert list(pd.read_csv(out).columns) == columns(RunRow)
    assert list(pd.read_csv(breakdown).columns) == columns(BreakdownRow)
    row = pd.read_csv(out).iloc[0]
    assert (row.task, row.arch, row.seed, row.status) == ("mqar", "softmax", 0, "ok")
    for prefix, split in (("eval", "validation"), ("test", "test")):
        assert row[f"{prefix}_split"] == split
        result = ev["splits"][split]
        assert row[f"{prefix}_value"] == pytest.approx(result["accuracy"], rel=1e-12)
        assert row[f"{prefix}_loss"] == pytest.approx(result["loss"], rel=1e-12)
        assert row[f"{prefix}_scored"] == result["scored"] == 32
    metrics = json.loads((Path(spec.run_dir) / "metrics.json").read_text())
    assert (row.params, row.steps_completed, row.lr) == (metrics["params"], 30, 3e-3)
    table = pd.read_csv(breakdown)
    for split, part in table.groupby("split"):
        assert part.scored.sum() == ev["splits"][split]["scored"]
        assert part.correct.sum() == round(ev["splits"][split]["accuracy"] * ev["splits"][split]["scored"])


def test_a_run_ends_solved_on_a_plateau_or_at_its_budget_and_says_which(request, tmp_path):
    prepared = prepared_for(request, "mqar")
    rule = {"after": 10, "window": 5, "min_gain": 1.0}  # no run gains 1.0 in accuracy: stops at step 10
    cases = {"budget": ({}, 20), "solved": ({"early_stop": 0.0}, 5), "plateau": ({"plateau": rule}, 10)}
    for why, (overrides, step) in cases.items():
        spec = run_spec_in(prepared, tmp_path / why, "mqar", "softmax", steps=20, eval_every=5, **overrides)
        metrics = train(spec, progress=False)
        assert (metrics["ended"], metrics["steps_completed"]) == (why, step), why
    assert metrics["plateau"] == rule and metrics["plateau_at_step"] == 10


def test_the_plateau_rule_compares_the_window_with_the_best_before_it():
    from types import SimpleNamespace

    from seqmix.study.settings import PlateauRule
    from seqmix.train.loop import reached_plateau

    rule = PlateauRule(after=400, window=200, min_gain=0.01)

    def run(step, values, higher=True):
        log = [{"phase": "eval", "step": 100 * (i + 1), "metric_value": v} for i, v in enumerate(values)]
        return SimpleNamespace(spec=SimpleNamespace(train=SimpleNamespace(plateau=rule)),
                               state=SimpleNamespace(step=step, log=log), task=SimpleNamespace(higher_is_better=higher))

    assert not reached_plateau(run(300, [0.1, 0.1, 0.1]))  # before `after`
    assert reached_plateau(run(400, [0.1, 0.14, 0.145, 0.149]))  # best 0.149 vs 0.14 before step 200
    assert not reached_plateau(run(400, [0.1, 0.14, 0.13, 0.2]))  # gained 0.06 in the window
    assert not reached_plateau(run(400, [0.9, 0.5, 0.45, 0.3], higher=False))  # a loss falling: still improving
    assert reached_plateau(run(400, [0.9, 0.5, 0.5, 0.495], higher=False))


def test_a_plateau_window_that_holds_no_evaluation_is_refused(prepared_mqar):
    from seqmix.expansion.validate import ConfigError

    cfg = copy.deepcopy(prepared_mqar)
    cfg["tasks"]["mqar"]["train"].update(eval_every=100, plateau={"after": 500, "window": 50, "min_gain": 0.01})
    with pytest.raises(ConfigError, match="plateau.window \\(50\\) is shorter than eval_every \\(100\\)"):
        validate_study(cfg)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_step_gives_the_losses_of_eager_steps(prepared_mqar, tmp_path, monkeypatch, backend):
    """``train.compile`` (torch.compile of the loss computation, fused AdamW) against the eager
    step over 20 steps of one run, every step's loss logged. Mamba: its fused CPU scan is a
    dispatch fast path, so the compiled steps take it as an opaque call (dispatch docstring).
    aot_eager traces the step (Dynamo) and its backward (AOTAutograd) as inductor does,
    without inductor's C++ code generation (a minute on a cold 2-core machine); the slow
    variant compiles with inductor itself, as training does. Tolerance rtol 1e-5: the two
    steps compute the same sums in other orders (inductor's fused kernels, the fused AdamW
    update), a few fp32 ulps (1.2e-7) apart per step, and 20 steps at lr 3e-3 do not amplify
    that a hundredfold; a real difference (a skipped or doubled update, another learning
    rate, a wrong gradient) moves the loss by more than the 1e-3 by which it falls per step
    here."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: compile_(
        fn, **kw, **({"mode": mode} if backend == "inductor" else {"backend": backend})))
    losses, records = {}, {}
    prepared = {**copy.deepcopy(prepared_mqar), "architectures": ["mamba"]}
    for compiled in (False, True):
        spec = run_spec_in(prepared, tmp_path / f"compiled{int(compiled)}", "mqar", "mamba", steps=20, log_every=1,
                        eval_every=20, checkpoint_every=20, compile=compiled)
        train(spec, progress=False)
        rows = list(csv.DictReader(open(Path(spec.run_dir) / "log.csv")))
        losses[compiled] = np.array([float(r["loss"]) for r in rows if r["phase"] == "train"])
        records[compiled] = json.loads((Path(spec.run_dir) / "provenance.json").read_text())
    eager, compiled = losses[False], losses[True]
    assert len(eager) == len(compiled) == 20
    assert eager[0] - eager[-1] > 1e-3 * 19  # the losses move: a wrong step would show
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=0)
    step = records[True]["training_step"]
    assert records[False]["training_step"] == {"compiled": False}
    assert step["compiled"] and step["fused_adamw"] and step["graphs"] >= 1 and step["first_compiled_step_s"] > 0
    assert records[True]["implementation"]["paths"] == records[False]["implementation"]["paths"] == {
        "mamba": "fused_cpu"}
