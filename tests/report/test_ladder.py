"""Issue 49, items 3-5: the size-ladder and recall-seeds profiles, the gap_trend claim and its
figure, and grassmann-recall-reach decided on the copy probe (copy_beyond_reach)."""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
import yaml

from seqmix.expansion.table import expand
from seqmix.expansion.validate import load_study
from seqmix.preflight import solved_size
from seqmix.report.claims import evaluate_claims
from seqmix.report.claims_file import load_claims
from seqmix.report.trend import draw_gap_trend, fit_trend, ladder_gaps, trend_macros
from seqmix.study.settings import CopyProbeSettings
from tests.helpers import REPO, flatten

matplotlib.use("Agg")

QUICK = REPO / "config" / "config.yaml"
LADDER = REPO / "config" / "size-ladder.yaml"
RECALL_SEEDS = REPO / "config" / "recall-seeds.yaml"
CLAIMS = REPO / "paper" / "claims.yaml"
BASE = {"claim": "a claim", "source": "a paper", "reported": "a number"}


def evaluate(tmp_path, claims: list[dict], runs: list[dict] | None = None, probe: pd.DataFrame | None = None):
    (tmp_path / "summary").mkdir(parents=True, exist_ok=True)
    (tmp_path / "analysis").mkdir(exist_ok=True)
    if runs is not None:
        pd.DataFrame(runs).to_csv(tmp_path / "summary" / "runs.csv", index=False)
    if probe is not None:
        probe.to_csv(tmp_path / "analysis" / "copy_probe.csv", index=False)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": claims}))
    return evaluate_claims(path, tmp_path).set_index("id")


# --- gap_trend: the slope of the gap against log10(parameters) --------------------------------

TREND = {"id": "trend", "kind": "gap_trend", **BASE, "tasks": "wikitext2/ladder-*", "arch": "grassmann",
         "baseline": "softmax", "split": "eval", "unit": "pp per 10x", "agree_if": {"max": 0.0},
         "requires": {"min_sizes": 3, "min_span": 4.0}}


def ladder(gap_at: dict[float, list[float]], softmax_ppl: float = 100.0, task=lambda p: f"wikitext2/ladder-{p:g}") -> list[dict]:
    """runs.csv rows: at each size (parameters), softmax at ``softmax_ppl`` and Grassmann at the
    given gap (%) for each seed; a quick-profile wikitext2 row that the pattern must not take."""
    rows = []
    for params, gaps in gap_at.items():
        for seed, gap in enumerate(gaps):
            for arch, ppl in (("softmax", softmax_ppl), ("grassmann", softmax_ppl * (1 + gap / 100))):
                rows.append(dict(task=task(params), arch=arch, seed=seed, status="ok", params=params,
                                 eval_value=ppl, test_value=ppl))
    rows += [dict(task="wikitext2", arch=a, seed=0, status="ok", params=1e9, eval_value=v, test_value=v)
             for a, v in (("softmax", 100.0), ("grassmann", 500.0))]
    return rows


SIZES = (235_264, 500_000, 1_000_000)


def test_a_gap_that_narrows_with_size_agrees_and_says_narrows(tmp_path):
    runs = ladder({p: [g - 0.3, g, g + 0.3] for p, g in zip(SIZES, (16.0, 13.0, 10.0))})
    row = evaluate(tmp_path, [TREND], runs).loc["trend"]
    assert row.verdict == "agrees" and row.why.startswith("narrows")
    x = np.log10(np.repeat(SIZES, 3).astype(float))
    y = np.repeat([16.0, 13.0, 10.0], 3) + np.tile([-0.3, 0.0, 0.3], 3)
    assert row.value == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9) and row.value < -9
    assert "3 sizes of wikitext2/ladder-*, 9 seed pairs" in row.measured_on  # the wikitext2 row is not one


def test_a_gap_that_widens_with_size_disagrees_and_says_widens(tmp_path):
    runs = ladder({p: [g - 0.3, g, g + 0.3] for p, g in zip(SIZES, (15.0, 20.0, 25.0))})
    row = evaluate(tmp_path, [TREND], runs).loc["trend"]
    assert row.verdict == "disagrees" and row.why.startswith("widens") and row.value > 0


def test_a_flat_gap_with_spread_shows_no_trend(tmp_path):
    runs = ladder({p: [10.0, 15.0, 20.0] for p in SIZES})
    row = evaluate(tmp_path, [TREND], runs).loc["trend"]
    assert row.verdict == "inconclusive" and row.why.startswith("no trend shown")
    assert row.value == pytest.approx(0.0, abs=1e-9)


def test_the_trend_needs_its_sizes_seeds_and_span(tmp_path):
    two = evaluate(tmp_path, [TREND], ladder({p: [16.0, 15.0] for p in SIZES[:2]})).loc["trend"]
    assert two.verdict == "not testable" and "2 size(s) with two or more seed pairs, the trend needs ≥ 3" in two.why
    narrow = evaluate(tmp_path, [TREND], ladder({p: [16.0 - i, 15.0 - i] for i, p in enumerate((1e6, 1.5e6, 2e6))})).loc["trend"]
    assert narrow.verdict == "not testable" and "span 2.0x in parameters, the trend needs ≥ 4x" in narrow.why
    one_seed = evaluate(tmp_path, [TREND], ladder({p: [16.0 - i] for i, p in enumerate(SIZES)})).loc["trend"]
    assert one_seed.verdict == "not testable" and "0 size(s)" in one_seed.why


def test_without_ladder_runs_the_trend_is_not_testable_and_says_why(tmp_path):
    row = evaluate(tmp_path, [TREND], ladder({}, task=str)).loc["trend"]
    assert row.verdict == "not testable" and math.isnan(row.value)
    assert "size-ladder study is not recorded yet" in row.why


def test_fit_trend_is_least_squares_on_log10_params_with_a_t_interval():
    from scipy import stats

    rng = np.random.default_rng(0)
    params = np.repeat(SIZES, 3).astype(float)
    gaps = 20 - 4 * np.log10(params / 1e5) + rng.normal(0, 0.5, len(params))
    trend = fit_trend(pd.DataFrame({"task": "t", "seed": 0, "params": params, "gap": gaps}))
    fit = stats.linregress(np.log10(params), gaps)
    assert trend.slope == pytest.approx(fit.slope) and trend.half == pytest.approx(stats.t.ppf(0.975, 7) * fit.stderr)
    assert (trend.points, trend.sizes) == (9, 3) and trend.span == pytest.approx(1_000_000 / 235_264)


def test_ladder_gaps_pair_seeds_within_a_size_and_skip_unfinished_runs():
    runs = pd.DataFrame(ladder({1e5: [10.0, 20.0], 4e5: [5.0]}))
    runs.loc[(runs.arch == "grassmann") & (runs.seed == 1), "status"] = "diverged"
    gaps = ladder_gaps(runs, "wikitext2/ladder-*", "grassmann", "softmax")
    assert list(zip(gaps.params, gaps.seed)) == [(1e5, 0), (4e5, 0)]
    assert list(gaps.gap) == pytest.approx([10.0, 5.0])


def test_the_gap_figure_builds_from_a_tiny_table(tmp_path):
    import matplotlib.pyplot as plt

    claim = next(c for c in load_claims(CLAIMS) if c.kind == "gap_trend")
    gaps = ladder_gaps(pd.DataFrame(ladder({p: [16.0, 15.0] for p in SIZES})), claim.tasks, claim.arch, claim.baseline)
    fig, ax = plt.subplots()
    draw_gap_trend(ax, gaps, fit_trend(gaps), claim, "C0")
    fig.savefig(tmp_path / "gap_trend.pdf")
    assert (tmp_path / "gap_trend.pdf").stat().st_size > 0 and ax.get_xscale() == "log"
    labels = ax.get_legend_handles_labels()[1]
    assert any(lbl.startswith("grassmann-wikitext-gap: 10-15 %") for lbl in labels)  # the band, from claims.yaml
    assert {"Arledge (test): 22.6 %", "kanenorman (validation): 43.4 %"} <= set(labels)
    assert trend_macros(claim, gaps)["gapTrendDrawn"] == "1"
    skipped = trend_macros(claim, gaps.iloc[:0])
    assert skipped["gapTrendDrawn"] == "0" and "not drawn" in skipped["gapTrendSkipped"]


def test_the_reproductions_are_data_with_their_sources():
    claim = next(c for c in load_claims(CLAIMS) if c.kind == "gap_trend")
    refs = {r.label: r for r in claim.references}
    assert refs["Arledge"].gap == pytest.approx(100 * (242.94 / 198.17 - 1)) and round(refs["Arledge"].gap, 1) == 22.6
    assert round(refs["kanenorman"].gap) == 43
    assert all(r.url.startswith("https://github.com/") and r.source for r in claim.references)
    assert claim.band.claim in {c.id for c in load_claims(CLAIMS)}


# --- grassmann-recall-reach on the copy probe -------------------------------------------------

REACH = {"id": "reach", "kind": "copy_beyond_reach", **BASE, "arch": "grassmann", "unit": "acc - chance",
         "agree_if": {"max": 0.0}, "requires": {"min_accuracy_within_reach": 0.25}}


def probe_rows(within: float, beyond: float | None, reach: float = 32.0, arch: str = "grassmann") -> pd.DataFrame:
    lags = [(1, within)] + ([(40, beyond)] if beyond is not None else [])
    return pd.DataFrame([dict(arch=arch, d_model=64, n_layers=2, seq_len=48, vocab_size=256, steps=300, batch_size=128,
                              lr=3e-3, seed=0, lag=lag, reach=reach, scored=1024 * (48 - lag), accuracy=acc, loss=1.0,
                              chance=1 / 256, seconds=1.0) for lag, acc in lags])


def test_copying_beyond_reach_at_chance_and_within_it_clearly_above_agrees(tmp_path):
    row = evaluate(tmp_path, [REACH], probe=probe_rows(within=0.95, beyond=0.0)).loc["reach"]
    assert row.verdict == "agrees" and row.value == pytest.approx(-1 / 256)
    assert "reach 32 tokens" in row.measured_on and "lag 40 (beyond): 0.000" in row.measured_on


def test_copying_beyond_reach_above_chance_disagrees(tmp_path):
    row = evaluate(tmp_path, [REACH], probe=probe_rows(within=0.95, beyond=0.2)).loc["reach"]
    assert row.verdict == "disagrees" and row.value == pytest.approx(0.2 - 1 / 256)
    half = 1.96 * math.sqrt(0.2 * 0.8 / (1024 * 8))
    assert row.ours == f"{0.2 - 1 / 256:.3g} ± {half:.2g}"


def test_the_reach_is_not_testable_without_copying_within_it_or_a_lag_beyond_it(tmp_path):
    weak = evaluate(tmp_path, [REACH], probe=probe_rows(within=0.1, beyond=0.0)).loc["reach"]
    assert weak.verdict == "not testable" and "does not copy within its reach (accuracy 0.100" in weak.why
    none = evaluate(tmp_path, [REACH], probe=probe_rows(within=0.95, beyond=None)).loc["reach"]
    assert none.verdict == "not testable" and "add one to analysis.copy_probe.lags" in none.why
    old = evaluate(tmp_path, [REACH], probe=probe_rows(0.95, 0.0).drop(columns=["lag", "reach", "scored"])).loc["reach"]
    assert old.verdict == "not testable" and "predates the probe's lags" in old.why
    assert evaluate(tmp_path, [REACH]).loc["reach"].verdict == "not testable"  # no probe at all


def test_the_reach_claim_keeps_its_criterion_and_reads_the_copy_probe():
    claim = next(c for c in load_claims(CLAIMS) if c.id == "grassmann-recall-reach")
    assert claim.kind == "copy_beyond_reach" and claim.arch == "grassmann"
    assert (claim.agree_if.min, claim.agree_if.max) == (None, 0.0)
    assert claim.requires.min_accuracy_within_reach == 0.25
    assert "0.030--0.032" in claim.claim and "copy probe" in claim.claim


def test_the_copy_probe_copies_the_token_a_lag_back_and_probes_far_lags_only_where_reach_is_finite():
    from seqmix.analysis.copy_probe import copy_batch, lags_of
    from seqmix.expansion.table import expand as expanded

    x, y = copy_batch(__import__("torch").arange(10).reshape(1, 10), lag=3)
    assert y[0, :3].tolist() == [-100] * 3 and y[0, 3:].tolist() == list(range(7))
    job = expanded(load_study(QUICK)).copy_probe_job()
    assert job.copy_probe.lags == [1, 40]
    assert lags_of(job, "grassmann") == [1, 40] and lags_of(job, "softmax") == [1]


def test_copy_probe_lags_are_checked_and_left_out_of_specs_at_their_default():
    assert "lags" not in json.loads(CopyProbeSettings().model_dump_json())  # the specs of every other profile
    assert json.loads(CopyProbeSettings(lags=[1, 40]).model_dump_json())["lags"] == [1, 40]
    for bad in ([1, 1], [0], [48]):
        with pytest.raises(ValueError):
            CopyProbeSettings(lags=bad)


# --- the profiles -----------------------------------------------------------------------------

# What may differ between a recorded run's spec and the quick profile's run of the same task,
# architecture and seed: the study's name and where it writes.
NOT_THE_RUN = {"profile", "run_dir"}


def test_recall_seeds_are_the_quick_profiles_runs_for_seeds_one_and_two():
    quick, mine = load_study(QUICK), load_study(RECALL_SEEDS)
    assert mine.profile == "recall-seeds" and mine.numerics == "portable" and mine.results_dir != quick.results_dir
    theirs, ours = expand(quick), expand(mine)
    one_seed = sorted({r.arch for r in theirs.runs if r.task.startswith("mqar/")}
                      - {r.arch for r in theirs.runs if r.task.startswith("mqar/") and r.seed > 0})
    assert one_seed == sorted(["performer", "sliding_window", "bigbird", "h3", "mamba", "tssa", "crate"])
    mqar = sorted({r.task for r in theirs.runs if r.task.startswith("mqar/")})
    assert sorted((r.task, r.arch, r.seed) for r in ours.runs) == sorted(
        (t, a, s) for t in mqar for a in one_seed for s in (1, 2))
    for run in ours.runs:
        got = flatten(json.loads(ours.run_spec(*run).model_dump_json()))
        want = flatten(json.loads(theirs.run_spec(*run).model_dump_json()))
        assert set(got) == set(want)
        differ = {k for k in got if got[k] != want[k]}
        assert differ <= NOT_THE_RUN, {k: (got[k], want[k]) for k in differ - NOT_THE_RUN}


def test_the_size_ladder_follows_its_one_rule():
    study = load_study(LADDER)
    assert study.profile == "size-ladder" and study.numerics == "portable"
    assert study.architectures == ["softmax", "grassmann"] and study.seeds == [0, 1, 2]
    ladder_, quick = expand(study), expand(load_study(QUICK))
    sizes = {}
    for task in study.tasks:
        params = {a: solved_size(ladder_.run_spec(task, a, 0)).params for a in study.architectures}
        spec = ladder_.run_spec(task, "softmax", 0)
        sizes[task] = (params["softmax"], spec)
        # size-matched: Grassmann solved to the same budget
        assert abs(params["grassmann"] - params["softmax"]) <= 0.05 * params["softmax"], (task, params)
    smallest = min(sizes.values(), key=lambda v: v[0])
    assert smallest[0] == solved_size(quick.run_spec("wikitext2", "softmax", 0)).params
    assert max(v[0] for v in sizes.values()) >= 4 * smallest[0]
    base = smallest[1]
    for params, spec in sizes.values():
        # tokens seen in proportion to parameters: steps grow with them, batch and block fixed
        scale = params / smallest[0]  # the Transformer's solved parameters
        assert spec.train.steps == 4 * round(base.train.steps * scale / 4)  # nearest multiple of 4: quarters
        assert spec.train.batch_size == base.train.batch_size and spec.settings["block_size"] == base.settings["block_size"]
        assert spec.train.warmup_steps == round(spec.train.steps / 10)
        assert spec.train.eval_every == spec.train.steps // 4 == spec.train.checkpoint_every
    # The smallest rung is the quick profile's wikitext2 runs but for its name and place.
    for arch in study.architectures:
        for seed in study.seeds:
            task = next(t for t, v in sizes.items() if v[0] == smallest[0])
            got = flatten(json.loads(ladder_.run_spec(task, arch, seed).model_dump_json()))
            want = flatten(json.loads(quick.run_spec("wikitext2", arch, seed).model_dump_json()))
            differ = {k for k in got if got[k] != want.get(k)}
            assert differ <= {"profile", "task", "group", "run_dir", "data_dir"}, differ
