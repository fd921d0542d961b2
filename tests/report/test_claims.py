"""Every kind of claim the evaluator knows, on results files written by hand so that the
right number and verdict are known: which rows it reads (split, status, kind of row,
paired seeds, the best point of a sweep chosen on the eval split), and its verdict at
the boundaries (a value exactly at a bound agrees: bounds are inclusive; no value at all
is "not testable", never a verdict)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml

from seqmix.report.claims import EVALUATORS, evaluate_claims, judge
from seqmix.report.claims_file import KINDS, AgreeIf

BASE = {"claim": "a claim", "source": "a paper", "reported": "a number", "requires": {}}


def claim(id: str, kind: str, **fields) -> dict:
    return {"id": id, "kind": kind, **BASE, **fields}


def run_row(task: str, arch: str, seed: int, eval_value: float, test_value: float, **extra) -> dict:
    """One runs.csv row with every column the evaluators read."""
    group = extra.pop("group", task)
    row = dict(profile="test", task=task, kind=task.split("/")[0], group=group, sweep="{}", arch=arch,
               seed=seed, status="ok", metric="accuracy", higher_is_better=True, params=1000, d_model=16,
               n_layers=2, lr=1e-3, steps_planned=100, steps_completed=100, seen=1, seen_unit="tokens",
               reach=float("nan"), chance=float("nan"), eval_split="validation", eval_value=eval_value,
               test_split="test", test_value=test_value, train_data="train data", train_complete=True)
    row.update(extra)
    return row


def evaluate(tmp_path, claims: list[dict], runs: list[dict] | None = None, **tables: pd.DataFrame) -> pd.DataFrame:
    """Write the claims and results files, evaluate, return the results indexed by claim id.
    ``tables``: analysis/<name>.csv or summary/<name>.csv (keyword: the file's stem)."""
    (tmp_path / "summary").mkdir(parents=True, exist_ok=True)
    (tmp_path / "analysis").mkdir(exist_ok=True)
    if runs is not None:
        pd.DataFrame(runs).to_csv(tmp_path / "summary" / "runs.csv", index=False)
    for name, table in tables.items():
        folder = "summary" if name == "breakdown" else "analysis"
        table.to_csv(tmp_path / folder / f"{name}.csv", index=False)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": claims}))
    return evaluate_claims(path, tmp_path).set_index("id")


def test_every_kind_has_a_test_here():
    tested = {"relative_gap", "accuracy_difference", "metric_threshold", "complexity_exponent", "su_closed_form",
              "measured_sparsity", "width_to_reach", "recall_beyond_reach",
              "copy_beyond_reach", "gap_trend"}  # these two: tests/report/test_ladder.py
    assert set(EVALUATORS) == set(KINDS) == tested, "a new claim kind needs its tests in this module"


# --- judge: the verdict of a value and its interval -------------------------------------------


def test_bounds_are_inclusive():
    band = AgreeIf(min=0.75, max=1.25)
    assert judge(0.75, float("nan"), band) == judge(1.25, float("nan"), band) == "agrees"
    assert judge(1.0, 0.25, band) == "agrees"  # [0.75, 1.25]: the interval ends on both bounds
    assert judge(1.5, 0.25, band) == "inconclusive"  # [1.25, 1.75] touches the bound
    assert judge(1.5, 0.125, band) == "disagrees"
    assert judge(0.0, 0.0, AgreeIf(max=0.0)) == judge(0.0, 0.0, AgreeIf(min=0.0)) == "agrees"


def test_no_value_is_not_testable():
    for band in (AgreeIf(min=0.8, max=1.3), AgreeIf(min=0.0), AgreeIf(max=0.0)):
        assert judge(float("nan"), float("nan"), band) == "not testable"
        assert judge(float("nan"), 0.1, band) == "not testable"


# --- relative_gap and accuracy_difference: paired seeds --------------------------------------

ACC = claim("acc", "accuracy_difference", task="snli", arch="grassmann", baseline="softmax", split="test",
            unit="accuracy difference", agree_if={"min": 0.0})


def test_accuracy_difference_pairs_seeds_by_seed_on_the_test_split(tmp_path):
    # Rows in different orders, a seed only one architecture ran, and eval values that
    # point the other way: only seed-paired test values give +0.01 at every seed.
    runs = [run_row("snli", "grassmann", 0, 0.10, 0.70), run_row("snli", "grassmann", 1, 0.10, 0.90),
            run_row("snli", "grassmann", 2, 0.10, 0.50),
            run_row("snli", "softmax", 1, 0.95, 0.89), run_row("snli", "softmax", 0, 0.95, 0.69)]
    row = evaluate(tmp_path, [ACC], runs).loc["acc"]
    assert row["values"] == pytest.approx([0.01, 0.01], abs=1e-12)
    assert row.value == pytest.approx(0.01, abs=1e-12) and row.verdict == "agrees"
    assert "2 seeds" in row.measured_on


def test_accuracy_difference_at_the_bound_agrees_and_below_it_disagrees(tmp_path):
    same = [run_row("snli", a, s, 0.5, v) for a in ("grassmann", "softmax") for s, v in ((0, 0.5), (1, 0.75))]
    assert evaluate(tmp_path, [ACC], same).loc["acc"].verdict == "agrees"
    worse = [run_row("snli", "grassmann", s, 0.5, v - 0.25) for s, v in ((0, 0.5), (1, 0.75))]
    worse += [run_row("snli", "softmax", s, 0.5, v) for s, v in ((0, 0.5), (1, 0.75))]
    row = evaluate(tmp_path, [ACC], worse).loc["acc"]
    assert row.verdict == "disagrees" and row.value == pytest.approx(-0.25)


def test_a_diverged_seed_leaves_the_pairs(tmp_path):
    runs = [run_row("snli", "grassmann", 0, 0.5, 0.6), run_row("snli", "softmax", 0, 0.5, 0.5),
            run_row("snli", "grassmann", 1, float("nan"), float("nan"), status="diverged"),
            run_row("snli", "softmax", 1, 0.5, 0.9)]
    row = evaluate(tmp_path, [ACC], runs).loc["acc"]
    assert row["values"] == pytest.approx([0.1]) and row.verdict == "agrees"


def test_paired_claims_without_a_pair_are_not_testable(tmp_path):
    diverged = [run_row("snli", "grassmann", 0, float("nan"), float("nan"), status="diverged"),
                run_row("snli", "softmax", 0, 0.5, 0.5)]
    row = evaluate(tmp_path, [ACC], diverged).loc["acc"]
    assert row.verdict == "not testable" and "no seed finished for both" in row.why
    alone = [run_row("snli", "softmax", 0, 0.5, 0.5)]
    row = evaluate(tmp_path, [ACC], alone).loc["acc"]
    assert row.verdict == "not testable" and "grassmann not trained on snli" in row.why


def test_relative_gap_is_per_seed_percent_on_the_claims_split(tmp_path):
    gap = claim("gap", "relative_gap", task="wikitext2", arch="grassmann", baseline="softmax", split="eval",
                unit="%", agree_if={"max": 15.0})
    runs = [run_row("wikitext2", "softmax", 0, 100.0, 1.0, metric="ppl", higher_is_better=False),
            run_row("wikitext2", "softmax", 1, 200.0, 1.0, metric="ppl", higher_is_better=False),
            run_row("wikitext2", "grassmann", 1, 230.0, 9.0, metric="ppl", higher_is_better=False),
            run_row("wikitext2", "grassmann", 0, 115.0, 9.0, metric="ppl", higher_is_better=False)]
    row = evaluate(tmp_path, [gap], runs).loc["gap"]
    assert row["values"] == pytest.approx([15.0, 15.0]) and row.verdict == "agrees"  # exactly at the bound


# --- metric_threshold ------------------------------------------------------------------------

THR = claim("thr", "metric_threshold", task="mqar", arch="softmax", split="test", unit="test accuracy",
            agree_if={"min": 0.99})


@pytest.mark.parametrize("tests,verdict", [((0.99, 0.99), "agrees"), ((0.98, 1.0), "inconclusive"),
                                           ((0.5, 0.5), "disagrees")])
def test_metric_threshold_on_the_test_split(tmp_path, tests, verdict):
    runs = [run_row("mqar", "softmax", s, 1.0 - v + 0.5, v) for s, v in enumerate(tests)]
    runs.append(run_row("mqar", "softmax", 9, 0.0, 0.0, status="diverged"))  # not a finished run
    row = evaluate(tmp_path, [THR], runs).loc["thr"]
    assert row.verdict == verdict and row.value == pytest.approx(sum(tests) / 2)


def test_metric_threshold_below_its_scale_or_without_a_run_is_not_testable(tmp_path):
    short = {**THR, "requires": {"min_steps": 5000}}
    row = evaluate(tmp_path, [short], [run_row("mqar", "softmax", 0, 1.0, 1.0)]).loc["thr"]
    assert row.verdict == "not testable" and "trained 100 steps" in row.why and row.ours == "1"
    diverged = [run_row("mqar", "softmax", 0, float("nan"), float("nan"), status="diverged")]
    row = evaluate(tmp_path, [THR], diverged).loc["thr"]
    assert row.verdict == "not testable" and math.isnan(row.value) and "no run of softmax finished" in row.why


def sweep_row(group: str, arch: str, d: int, lr: float, eval_value: float, test_value: float, **extra) -> dict:
    task, seed = f"{group}/d{d}-lr{lr:g}", extra.pop("seed", 0)
    return run_row(task, arch, seed, eval_value, test_value, group=group, lr=lr, d_model=d,
                   sweep=json.dumps({"model.d_model": d, "train.lr": lr}, sort_keys=True), **extra)


def test_threshold_per_width_takes_each_widths_best_point_by_eval(tmp_path):
    # At d 16 the learning rate with the best *eval* accuracy has test 0.95; the other one has
    # the better test accuracy (1.0), which must not be picked: the claim disagrees.
    per = {**THR, "task": "mqar/s", "per": "model.d_model"}
    runs = [sweep_row("mqar/s", "softmax", 8, 1e-3, 0.50, 0.50), sweep_row("mqar/s", "softmax", 8, 3e-3, 0.995, 0.995),
            sweep_row("mqar/s", "softmax", 16, 1e-3, 1.0, 0.95), sweep_row("mqar/s", "softmax", 16, 3e-3, 0.9, 1.0)]
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row["values"] == pytest.approx([0.995, 0.95])
    assert row.value == pytest.approx(0.95) and row.verdict == "disagrees"


def test_a_claim_listing_tasks_is_judged_on_the_first_one_this_profile_trained(tmp_path):
    # The quick profile's cell is listed first, the paper profile's second: a profile that
    # trained only the second is judged there, not reported as "not trained".
    per = {**THR, "task": ["mqar/quick", "mqar/paper"], "per": "model.d_model"}
    runs = [sweep_row("mqar/paper", "softmax", 8, 1e-3, 0.995, 0.995)]
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row.verdict == "agrees" and "mqar/paper" in row.measured_on
    row = evaluate(tmp_path, [{**per, "task": ["mqar/quick", "mqar/other"]}], runs).loc["thr"]
    assert row.verdict == "not testable" and "mqar/quick" in row.why


def test_threshold_per_width_is_not_testable_where_the_selected_run_was_still_learning(tmp_path):
    # d 16's selected run gained 0.10 accuracy over the last quarter of its steps: its budget
    # ran out before it settled, so the claim cannot be judged there; at most 0.02 it can.
    per = {**THR, "task": "mqar/s", "per": "model.d_model", "requires": {"max_final_gain": 0.02}}
    runs = [sweep_row("mqar/s", "softmax", 8, 1e-3, 0.995, 0.995, final_gain=0.0),
            sweep_row("mqar/s", "softmax", 16, 1e-3, 0.80, 0.80, final_gain=0.10)]
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row.verdict == "not testable" and "at d_model 16 softmax was still learning" in row.why
    runs[1]["final_gain"] = 0.02  # at the bound: settled, and 0.80 misses 0.99
    assert evaluate(tmp_path, [per], runs).loc["thr"].verdict == "disagrees"


def test_threshold_per_width_is_not_testable_where_the_selected_run_never_left_the_plateau(tmp_path):
    # d 8's run is flat (final gain 0) at chance 0.125: flat because it never started to
    # learn, not because it settled; 2 x chance is the line. At 0.30 it had left it and the
    # claim disagrees there.
    per = {**THR, "task": "mqar/s", "per": "model.d_model", "requires": {"max_final_gain": 0.02, "min_over_chance": 2.0}}
    runs = [sweep_row("mqar/s", "softmax", 8, 1e-3, 0.14, 0.14, final_gain=0.0, chance=0.125),
            sweep_row("mqar/s", "softmax", 16, 1e-3, 0.995, 0.995, final_gain=0.0, chance=0.125)]
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row.verdict == "not testable" and "at d_model 8 softmax had not left the initial plateau" in row.why
    runs[0].update(eval_value=0.30, test_value=0.30)
    assert evaluate(tmp_path, [per], runs).loc["thr"].verdict == "disagrees"


def test_threshold_per_width_on_each_seed_is_decided_by_the_worst_seed(tmp_path):
    # each_seed: every seed at every width must reach 0.99. Two seeds at 1.0 do not carry a
    # third at 0.985 (the mean, 0.995, would have agreed); at 0.99 it agrees.
    per = {**THR, "task": "mqar/s", "per": "model.d_model", "each_seed": True}
    runs = [sweep_row("mqar/s", "softmax", d, 1e-3, 1.0, 1.0, seed=s) for d in (8, 16) for s in (0, 1)]
    runs.append(sweep_row("mqar/s", "softmax", 16, 1e-3, 0.985, 0.985, seed=2))
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row.verdict == "disagrees" and row.value == pytest.approx(0.985)
    assert "d_model 16: 1.000/1.000/0.985 (each seed, in seed order)" in row.measured_on
    assert evaluate(tmp_path, [{**per, "each_seed": False}], runs).loc["thr"].verdict == "agrees"
    runs[-1].update(eval_value=0.99, test_value=0.99)
    assert evaluate(tmp_path, [per], runs).loc["thr"].verdict == "agrees"


def test_threshold_per_width_names_the_seed_that_was_still_learning(tmp_path):
    per = {**THR, "task": "mqar/s", "per": "model.d_model", "each_seed": True, "requires": {"max_final_gain": 0.02}}
    runs = [sweep_row("mqar/s", "softmax", 8, 1e-3, 0.995, 0.995, seed=s, final_gain=0.0) for s in (0, 1)]
    runs.append(sweep_row("mqar/s", "softmax", 8, 1e-3, 0.9, 0.9, seed=2, final_gain=0.05))
    row = evaluate(tmp_path, [per], runs).loc["thr"]
    assert row.verdict == "not testable" and "at d_model 8 softmax (seed 2) was still learning" in row.why


# --- width_to_reach ----------------------------------------------------------------------------

WIDTH = claim("width", "width_to_reach", task="mqar/s", arch="linear", baselines=["softmax"],
              per="model.d_model", threshold=0.9, unit="log2 width ratio", agree_if={"min": 1.0})


def widths(linear: dict[int, tuple[float, float]], softmax_reaches_at: int | None = 8) -> list[dict]:
    """softmax reaches 0.9 from ``softmax_reaches_at`` on; linear's (eval, test) per width."""
    rows = [sweep_row("mqar/s", "softmax", d, 1e-3, 0.95, 0.95 if softmax_reaches_at and d >= softmax_reaches_at else 0.5)
            for d in (8, 16, 32)]
    return rows + [sweep_row("mqar/s", "linear", d, 1e-3, e, t) for d, (e, t) in linear.items()]


def test_width_to_reach_is_the_log2_ratio_of_widths_selected_on_eval(tmp_path):
    # At d 16 a second learning rate reaches 0.9 on test but is worse on eval: not selected.
    runs = widths({8: (0.3, 0.3), 16: (0.6, 0.5), 32: (0.95, 0.95)})
    runs.append(sweep_row("mqar/s", "linear", 16, 3e-3, 0.5, 0.95))
    row = evaluate(tmp_path, [WIDTH], runs).loc["width"]
    assert row.value == pytest.approx(2.0) and row.verdict == "agrees"  # log2(32 / 8)


def test_width_to_reach_at_the_bound_and_beyond_the_sweep(tmp_path):
    at = evaluate(tmp_path, [WIDTH], widths({8: (0.3, 0.3), 16: (0.95, 0.95), 32: (0.95, 0.95)})).loc["width"]
    assert at.value == pytest.approx(1.0) and at.verdict == "agrees"
    never = evaluate(tmp_path, [WIDTH], widths({8: (0.3, 0.3), 16: (0.3, 0.3), 32: (0.3, 0.3)})).loc["width"]
    assert never.value == pytest.approx(3.0) and never.ours.startswith("≥") and "lower bound" in never.why
    # The baseline never reaches it: needs at least 64, so the ratio is at most log2(8 / 64),
    # which fails "at least 1" whatever the baseline's true need.
    no_base = evaluate(tmp_path, [WIDTH], widths({8: (0.95, 0.95)}, softmax_reaches_at=None)).loc["width"]
    assert no_base.value == pytest.approx(-3.0) and no_base.verdict == "disagrees"
    assert no_base.ours.startswith("≤") and "softmax never reached it: an upper bound" in no_base.why
    # The same upper bound under a criterion it meets decides nothing.
    loose = evaluate(tmp_path, [{**WIDTH, "agree_if": {"min": -5.0}}], widths({8: (0.95, 0.95)}, softmax_reaches_at=None)).loc["width"]
    assert loose.verdict == "not testable" and "at most -3, a bound that does not decide ≥ -5" in loose.why
    # Neither reaches it: two lower bounds say nothing about their ratio.
    neither = evaluate(tmp_path, [WIDTH], widths({8: (0.3, 0.3)}, softmax_reaches_at=None)).loc["width"]
    assert neither.verdict == "not testable" and "neither linear nor softmax reaches 0.9" in neither.why


def seeded(arch: str, per_width: dict[int, list[float]], loss: float = 0.1) -> list[dict]:
    """One row per (width, seed) of ``arch``: its test (= eval) accuracy, final validation loss
    ``loss``, chance 1/8."""
    return [sweep_row("mqar/s", arch, d, 1e-3, v, v, seed=s, eval_loss=loss, chance=0.125)
            for d, values in per_width.items() for s, v in enumerate(values)]


SEEDED = {**WIDTH, "arch": "h3", "baselines": ["gla", "mamba"], "reached_by": "majority", "learned_below": 0.95}


def test_a_width_is_reached_where_a_majority_of_its_seeds_reach_the_threshold(tmp_path):
    # H3 reaches 0.9 with 2 of 3 seeds only at d 32; GLA with 2 of 3 at d 8 (one seed at d 8
    # is not a majority for Mamba, which needs d 16): log2(32 / max(8, 16)) = 1. Each 2-of-3
    # split holds when any one seed is left out, so no seed decides it alone.
    runs = (seeded("h3", {8: [0.2, 0.2, 0.95], 16: [0.2, 0.95, 0.2], 32: [0.95, 0.95, 0.95]})
            + seeded("gla", {8: [0.95, 0.95, 0.95], 16: [0.95, 0.95, 0.95], 32: [0.95, 0.95, 0.95]})
            + seeded("mamba", {8: [0.95, 0.2, 0.2], 16: [0.95, 0.95, 0.95], 32: [0.95, 0.95, 0.95]}))
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.value == pytest.approx(1.0) and row.verdict == "agrees"
    assert "a width counts where more than half of its seeds reach test accuracy ≥ 0.9" in row.measured_on
    assert "h3 at d_model 32 (d_model 8: 1 of 3, d_model 16: 1 of 3, d_model 32: 3 of 3)" in row.measured_on


def test_a_verdict_that_one_seed_decides_is_inconclusive_and_names_it(tmp_path):
    # H3 reaches 0.9 at d 16 with seeds 0 and 1 (2 of 3): need 16; GLA at d 8 with seeds 1
    # and 2: need 8; log2(16 / 8) = 1, agrees. Without seed 0: H3 needs 32, GLA 8 (2, agrees);
    # without seed 1: 32 and 16 (1, agrees); without seed 2: 16 and 16 (0): it would disagree.
    runs = (seeded("h3", {8: [0.2, 0.2, 0.2], 16: [0.95, 0.95, 0.2], 32: [0.95, 0.95, 0.95]})
            + seeded("gla", {8: [0.2, 0.95, 0.95], 16: [0.95, 0.95, 0.95], 32: [0.95, 0.95, 0.95]}))
    claim_ = {**SEEDED, "baselines": ["gla"]}
    row = evaluate(tmp_path, [claim_], runs).loc["width"]
    assert row.value == pytest.approx(1.0) and row.verdict == "inconclusive"
    assert row.why.endswith("one seed decides it: without seed 2 it would disagree (0)")
    # With GLA's third seed reaching it too, no single seed changes the verdict.
    runs[9]["test_value"] = 0.95
    assert evaluate(tmp_path, [claim_], runs).loc["width"].verdict == "agrees"


def test_leaving_a_seed_out_keeps_the_mixers_that_have_no_other(tmp_path):
    # H3 and Mamba have seed 0 alone, GLA seeds 0-2 (a profile's seeds per architecture).
    # Leaving out seed 0 leaves out GLA's seed 0, not H3's and Mamba's only runs: the verdict
    # (log2(16 / 8) = 1) stands, rather than turning "not testable" for want of H3.
    runs = (seeded("h3", {8: [0.2], 16: [0.95]}) + seeded("mamba", {8: [0.95], 16: [0.95]})
            + seeded("gla", {8: [0.95] * 3, 16: [0.95] * 3}))
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.verdict == "agrees" and row.value == pytest.approx(1.0)


def test_a_mixer_that_did_not_learn_is_listed_not_counted_as_a_bound(tmp_path):
    # Mamba never reaches 0.9 and its final validation loss stays within 5% of ln 8 = 2.08 at
    # every width and seed: it did not learn the task, so only GLA's need (8) counts and H3's
    # 16 gives log2(16 / 8) = 1: agrees. Counted as a bound (needs >= 64) it would disagree.
    runs = (seeded("h3", {8: [0.2] * 3, 16: [0.95] * 3})
            + seeded("gla", {8: [0.95] * 3, 16: [0.95] * 3})
            + seeded("mamba", {8: [0.16] * 3, 16: [0.16] * 3}, loss=2.0))
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.verdict == "agrees" and row.value == pytest.approx(1.0)
    assert "mamba did not learn the task in this budget: final validation loss 2.00--2.00 at every width and seed (6 runs)" in row.measured_on
    assert "mamba did not learn the task (not counted)" in row.why
    # One Mamba seed whose loss fell below 0.95 ln 8 = 1.98 learned something: Mamba is a
    # bound again (the ratio at most log2(16 / 32): disagrees), but only through that seed.
    runs[-1]["eval_loss"] = 1.9
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.value == pytest.approx(-1.0) and "did not learn" not in row.measured_on
    assert row.verdict == "inconclusive" and row.why.endswith("without seed 2 it would agree (1)")
    # Without the key every mixer counts, as before.
    runs[-1]["eval_loss"] = 2.0
    assert evaluate(tmp_path, [{**SEEDED, "learned_below": None}], runs).loc["width"].verdict == "disagrees"


def test_the_width_claim_is_not_testable_when_its_own_mixer_or_every_baseline_did_not_learn(tmp_path):
    learner = {8: [0.95] * 3, 16: [0.95] * 3}
    idle = {8: [0.15] * 3, 16: [0.15] * 3}
    runs = seeded("h3", idle, loss=2.05) + seeded("gla", learner) + seeded("mamba", learner)
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.verdict == "not testable" and "h3 did not learn the task in this budget" in row.why
    runs = seeded("h3", learner) + seeded("gla", idle, loss=2.05) + seeded("mamba", idle, loss=2.1)
    row = evaluate(tmp_path, [SEEDED], runs).loc["width"]
    assert row.verdict == "not testable" and "no baseline learned the task in this budget (gla, mamba did not)" in row.why


# --- recall_beyond_reach ---------------------------------------------------------------------

RECALL = claim("recall", "recall_beyond_reach", task="mqar/s", arch="grassmann", unit="accuracy minus chance",
               agree_if={"max": 0.05}, requires={"min_accuracy_within_reach": 0.9})


def recall_results(within: tuple[int, int], beyond: tuple[int, int], reach=4.0):
    # Softmax at the same sweep point, listed first, has no finite reach: the claim must read
    # the architecture's own run, not the first row of its sweep point.
    runs = [sweep_row("mqar/s", "softmax", 16, 1e-3, 0.9, 0.9, reach=float("nan"), chance=0.25),
            sweep_row("mqar/s", "grassmann", 16, 1e-3, 0.6, 0.6, reach=reach, chance=0.25)]
    task = runs[0]["task"]
    rows = []
    for split, scale in (("test", 1), ("validation", 0)):  # validation rows must not count
        for distance, (correct, scored) in ((2, within), (4, within), (6, beyond), (9, beyond)):
            rows.append(dict(task=task, kind="mqar", group="mqar/s", sweep="{}", arch="grassmann", seed=0,
                             split=split, by="query_distance", value=distance,
                             correct=correct * scale, scored=scored))
    return runs, pd.DataFrame(rows)


def test_recall_beyond_reach_is_accuracy_beyond_it_minus_chance(tmp_path):
    runs, breakdown = recall_results(within=(990, 1000), beyond=(250, 1000))
    row = evaluate(tmp_path, [RECALL], runs, breakdown=breakdown).loc["recall"]
    assert row.value == pytest.approx(0.0, abs=1e-12)  # 500 of 2000 beyond reach, chance 1/4
    half = 1.96 * math.sqrt(0.25 * 0.75 / 2000)
    assert row.ours == f"{0.0:.3g} ± {half:.2g}" and row.verdict == "agrees"
    assert "accuracy 0.990 on 2,000 queries within reach" in row.measured_on


def test_recall_beyond_reach_gives_an_interval_over_seeds(tmp_path):
    # Three seeds: beyond reach 0.25, 0.30, 0.35 (chance 0.25): mean 0.05 with a t-interval
    # over the three (not a binomial one over their pooled queries), which straddles 0.
    runs, breakdown = recall_results(within=(990, 1000), beyond=(250, 1000))
    frames = [breakdown]
    for seed, correct in ((1, 300), (2, 350)):
        runs.append({**runs[1], "seed": seed})
        frames.append(breakdown.assign(seed=seed, correct=[c if d < 6 else correct * (s == "test")
                                                           for c, d, s in zip(breakdown.correct, breakdown.value, breakdown.split)]))
    row = evaluate(tmp_path, [RECALL], runs, breakdown=pd.concat(frames)).loc["recall"]
    half = 2 * 4.302653 * 0.05 / 2 / math.sqrt(3)  # t(0.975, 2) x sd 0.05 / sqrt(3)
    assert row["values"] == pytest.approx([0.0, 0.05, 0.10]) and row.value == pytest.approx(0.05)
    assert row.ours == f"{0.05:.3g} ± {half:.2g}" and row.verdict == "inconclusive"
    assert "95% interval over 3 seeds" in row.measured_on


def test_recall_beyond_reach_needs_recall_within_reach_and_a_finite_reach(tmp_path):
    runs, breakdown = recall_results(within=(500, 1000), beyond=(250, 1000))
    row = evaluate(tmp_path, [RECALL], runs, breakdown=breakdown).loc["recall"]
    assert row.verdict == "not testable" and "does not recall within its reach" in row.why
    runs, breakdown = recall_results(within=(990, 1000), beyond=(250, 1000), reach=float("nan"))
    row = evaluate(tmp_path, [RECALL], runs, breakdown=breakdown).loc["recall"]
    assert row.verdict == "not testable" and "no finite reach" in row.why
    runs, breakdown = recall_results(within=(990, 1000), beyond=(250, 1000), reach=20.0)
    row = evaluate(tmp_path, [RECALL], runs, breakdown=breakdown).loc["recall"]
    assert row.verdict == "not testable" and "no test query lies beyond" in row.why


# --- su_closed_form --------------------------------------------------------------------------

SU_MIN = claim("su", "su_closed_form", kernel="exp", statistic="min", unit="min S", agree_if={"max": 0.05})


def analytic(rows: list[tuple]) -> pd.DataFrame:
    """(kernel, method, beta, gamma, n, S, S_se) rows of sparsity_analytic.csv."""
    return pd.DataFrame(rows, columns=["kernel", "method", "beta", "gamma", "n", "S", "S_se"])


def test_su_min_at_the_bound_agrees_and_monte_carlo_must_match(tmp_path):
    inf = float("inf")
    table = [("exp", "closed_form", 0.0, g, inf, s, 0.0) for g, s in ((1.0, 0.6), (2.0, 0.05), (0.5, 0.9))]
    good_mc = ("exp", "monte_carlo", 0.0, 1.0, 1000, math.exp(-0.5) + 0.001, 0.001)
    row = evaluate(tmp_path, [SU_MIN], sparsity_analytic=analytic([*table, good_mc])).loc["su"]
    assert row.value == 0.05 and row.verdict == "agrees"
    far_mc = ("exp", "monte_carlo", 0.0, 1.0, 1000, math.exp(-0.5) + 0.01, 0.001)  # 10 standard errors off
    row = evaluate(tmp_path, [SU_MIN], sparsity_analytic=analytic([*table, far_mc])).loc["su"]
    assert row.verdict == "disagrees" and "Monte Carlo differs" in row.why
    above = [("exp", "closed_form", 0.0, 1.0, inf, 0.06, 0.0)]
    assert evaluate(tmp_path, [SU_MIN], sparsity_analytic=analytic(above)).loc["su"].verdict == "disagrees"


def test_su_at_beta_zero_reads_the_rows_nearest_beta_zero(tmp_path):
    at_zero = claim("r2", "su_closed_form", kernel="relu2", statistic="at_beta_zero", unit="S",
                    agree_if={"min": 0.4072, "max": 0.4092})
    inf = float("inf")
    rows = [("relu2", "closed_form", b, g, inf, s, 0.0)
            for b, s in ((-0.5, 0.2), (0.0, 0.4082), (0.5, 0.6)) for g in (0.5, 1.0)]
    row = evaluate(tmp_path, [at_zero], sparsity_analytic=analytic(rows)).loc["r2"]
    assert row.value == pytest.approx(0.4082) and row.verdict == "agrees"


def test_su_without_the_kernels_rows_is_not_testable(tmp_path):
    other = [("identity", "closed_form", 0.0, 1.0, float("inf"), 0.8, 0.0)]
    row = evaluate(tmp_path, [SU_MIN], sparsity_analytic=analytic(other)).loc["su"]
    assert row.verdict == "not testable" and math.isnan(row.value)
    assert evaluate(tmp_path / "none", [SU_MIN]).loc["su"].verdict == "not testable"


# --- measured_sparsity -----------------------------------------------------------------------

SPARSE = claim("sp", "measured_sparsity", task="wikitext2", arch="softmax", baseline="linear",
               unit="mean S difference", agree_if={"max": 0.0}, requires={"max_reference_sparsity": 0.95})


def sparsity(values: dict[tuple[str, int], list[float]], jacobian: float = 0.99) -> pd.DataFrame:
    """Attention rows (one per layer) per (arch, seed), plus Jacobian rows that must be ignored."""
    rows = []
    for (arch, seed), per_layer in values.items():
        for layer, s in enumerate(per_layer):
            rows.append(dict(task="wikitext2", arch=arch, seed=seed, kind="attention", layer=layer, head=0, S_mean=s))
            rows.append(dict(task="wikitext2", arch=arch, seed=seed, kind="jacobian", layer=layer, head=-1,
                             S_mean=jacobian))
    return pd.DataFrame(rows)


def test_measured_sparsity_pairs_seeds_of_attention_rows(tmp_path):
    sp = sparsity({("softmax", 0): [0.5, 0.7], ("softmax", 1): [0.6, 0.8], ("linear", 1): [0.9, 0.9],
                   ("linear", 2): [0.1, 0.1]})
    row = evaluate(tmp_path, [SPARSE], sparsity=sp).loc["sp"]
    assert row["values"] == pytest.approx([-0.2]) and row.verdict == "agrees"  # seed 1 only


def test_measured_sparsity_at_the_bound_and_before_attention_is_learned(tmp_path):
    equal = sparsity({("softmax", 0): [0.5], ("linear", 0): [0.5], ("softmax", 1): [0.75], ("linear", 1): [0.75]})
    row = evaluate(tmp_path, [SPARSE], sparsity=equal).loc["sp"]
    assert row.value == 0.0 and row.verdict == "agrees"
    uniform = sparsity({("softmax", 0): [0.97], ("linear", 0): [0.99]})
    row = evaluate(tmp_path, [SPARSE], sparsity=uniform).loc["sp"]
    assert row.verdict == "not testable" and "near-uniform" in row.why
    alone = sparsity({("softmax", 0): [0.5]})
    row = evaluate(tmp_path, [SPARSE], sparsity=alone).loc["sp"]
    assert row.verdict == "not testable" and "linear" in row.why


# --- complexity_exponent ---------------------------------------------------------------------


def test_a_complexity_claim_without_a_fitted_exponent_is_not_testable(tmp_path):
    lin = claim("lin", "complexity_exponent", arch="linear", measures=["fwdbwd_ms"], unit="exponent",
                agree_if={"min": 0.8, "max": 1.3}, requires={"min_length": 16})
    fits = pd.DataFrame([dict(arch="linear", device="cpu", measure="fwdbwd_ms", min_len=16, max_len=64, points=1,
                              slope=float("nan"), ci_low=float("nan"), ci_high=float("nan"))])
    row = evaluate(tmp_path, [lin], complexity_fit=fits).loc["lin"]
    assert row.verdict == "not testable"
    fits.loc[0, ["slope", "ci_low", "ci_high"]] = [1.3, 1.3, 1.3]
    assert evaluate(tmp_path, [lin], complexity_fit=fits).loc["lin"].verdict == "agrees"  # at the bound


def test_a_complexity_claim_measured_short_of_its_min_length_is_not_testable(tmp_path):
    # requires.min_length: the fit must reach that length; at it the exponent is judged, one
    # short of it the claim is not testable, and says how far the measurement went.
    lin = claim("lin", "complexity_exponent", arch="linear", measures=["fwdbwd_ms"], unit="exponent",
                agree_if={"min": 0.8, "max": 1.3}, requires={"min_length": 64})
    fits = pd.DataFrame([dict(arch="linear", device="cpu", measure="fwdbwd_ms", min_len=16, max_len=64, points=3,
                              slope=1.0, ci_low=1.0, ci_high=1.0)])
    assert evaluate(tmp_path, [lin], complexity_fit=fits).loc["lin"].verdict == "agrees"  # at min_length
    fits.loc[0, "max_len"] = 63
    row = evaluate(tmp_path, [lin], complexity_fit=fits).loc["lin"]
    assert row.verdict == "not testable" and row.why == "linear measured only up to L = 63"


# --- final_gain: how much a run was still improving when its budget ran out -------------------


def test_final_gain_is_the_last_quarters_improvement_in_the_better_direction(tmp_path):
    from seqmix.report.collect import final_gain

    log = "step,phase,metric_value\n10,train,\n25,eval,0.2\n50,eval,0.3\n75,eval,0.5\n100,eval,0.9\n"
    (tmp_path / "log.csv").write_text(log)
    m = {"steps_completed": 100, "higher_is_better": True}
    assert final_gain(tmp_path, m) == pytest.approx(0.9 - 0.5)  # last eval minus the one at 75 %
    assert final_gain(tmp_path, {**m, "higher_is_better": False}) == pytest.approx(0.5 - 0.9)
    assert final_gain(tmp_path, {**m, "stopped_early_at_step": 100}) == 0.0
    (tmp_path / "log.csv").write_text("step,phase,metric_value\n100,eval,0.9\n")
    assert final_gain(tmp_path, m) is None
