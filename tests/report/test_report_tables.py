"""The notebooks' tables and macros (seqmix/report/*_tables.py) on small results files
written by hand, so that every cell they should print is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from seqmix.report import (
    claims_tables,
    complexity_tables,
    geometry_tables,
    quality_tables,
    recall_tables,
    sparsity_tables,
    throughput_tables,
)
from seqmix.report.summary import summarise

# --- complexity --------------------------------------------------------------------------------

LENGTHS = (8, 16, 32)


def complexity_files(tmp_path) -> complexity_tables.Complexity:
    """Softmax (counts x4 per doubling, a quadratic) and linear (x2), each timed twice per
    length; linear's bytes written grow x2 then x2.5 (an exponent range 1.00--1.32)."""
    written = {"softmax": [100, 400, 1600], "linear": [100, 200, 500]}
    rows, growth = [], []
    for arch, k in (("softmax", 2), ("linear", 1)):
        for i, L in enumerate(LENGTHS):
            for repeat, ms in enumerate((3.0 * 2**i, 2.0 * 2**i)):  # the fastest repeat is 2 * 2^i
                rows.append(dict(arch=arch, device="cpu", device_name="Test CPU", d_model=16, batch=1, seq_len=L,
                                 repeat=repeat, fwdbwd_ms=ms, flops_fwdbwd=10 * L**k, bytes_written_fwdbwd=written[arch][i],
                                 peak_fwdbwd_bytes=50 * L**k, count_mode="fake", status="ok"))
        for i in range(len(LENGTHS) - 1):
            growth.append(dict(arch=arch, device="cpu", len_from=LENGTHS[i], len_to=LENGTHS[i + 1], growth_fwdbwd_ms=2.0,
                               growth_flops_fwdbwd=2.0**k, growth_bytes_written_fwdbwd=written[arch][i + 1] / written[arch][i],
                               growth_peak_fwdbwd_bytes=2.0**k))
    fits = []
    for arch, k in (("softmax", 2), ("linear", 1)):
        for measure, lo, hi in (("flops_fwdbwd", k, k), ("bytes_written_fwdbwd", k, k if arch == "softmax" else math.log2(2.5)),
                                ("peak_fwdbwd_bytes", k, k)):
            fits.append(dict(arch=arch, measure=measure, kind="counted", min_len=8, max_len=32, slope=k, ci_low=k, ci_high=k,
                             local_min=lo, local_max=hi, flops_slope=k))
        fits.append(dict(arch=arch, measure="fwdbwd_ms", kind="timed", min_len=8, max_len=32, slope=1.0, ci_low=0.9,
                         ci_high=1.1, local_min=1.0, local_max=1.0, flops_slope=k))
    (tmp_path / "analysis").mkdir()
    for name, frame in (("complexity", rows), ("complexity_fit", fits), ("complexity_growth", growth)):
        pd.DataFrame(frame).to_csv(tmp_path / "analysis" / f"{name}.csv", index=False)
    return complexity_tables.Complexity.read(tmp_path)


def test_complexity_setting_and_fastest_repeat(tmp_path):
    c = complexity_files(tmp_path)
    assert (c.device_name, c.d_model, c.batch, c.count_modes, c.repeats, c.count_range) == ("Test CPU", 16, 1, "fake", 2, "8--32")
    per = c.per_length().set_index(["arch", "seq_len"])
    assert per.loc[("softmax", 32), "fwdbwd_ms"] == 8.0  # min of 12 and 8
    assert per.loc[("softmax", 32), "flops"] == 10 * 32**2


def test_complexity_table_prints_each_exponent_and_the_last_doubling(tmp_path):
    c = complexity_files(tmp_path)
    tex = complexity_tables.complexity_table(c)
    rows = {line.split(" & ")[0]: line.split(" & ") for line in tex.splitlines() if " & " in line}
    assert list(rows)[1:] == ["Softmax", "Linear (elu+1)"]  # header first, then catalogue order
    assert rows["Softmax"][1:5] == ["$L^2$", "2.00", "2.00", "2.00"]
    assert rows["Linear (elu+1)"][1:5] == ["$L$", "1.00", "1.00--1.32", "1.00"]  # a range where it changes
    assert rows["Softmax"][5:7] == ["1.00 [0.90, 1.10]", "8--32"]
    assert rows["Linear (elu+1)"][7].startswith("16$\\to$32: $\\times$2.00 / $\\times$2.50")
    assert "fastest of 2 calls" in tex and "over $L$ = 8--32" in tex and "$d=16$" in tex


def test_complexity_macros(tmp_path):
    c = complexity_files(tmp_path)
    m = complexity_tables.complexity_macros(c, num_bench=0)
    assert (m["softmax-flops-exp"], m["linear-bytes-exp"], m["linear-time-ci"]) == ("2.00", "1.00--1.32", "[0.90, 1.10]")
    # The regime change read at linear-cost mixers only (softmax's quadratic growth is not in it).
    assert (m["growthLens"], m["timeGrowth"], m["bytesGrowth"], m["flopsGrowth"]) == ("32", "2.00", "2.50", "2.00")
    assert (m["maxLen"], m["numBench"], m["device"]) == ("32", "0", "Test CPU")
    assert complexity_tables.spread([1.0, np.nan, 1.234]) == "1.00--1.23" and complexity_tables.spread([]) == "--"


def test_kernel_table_from_a_benchmark_and_without_one(tmp_path):
    assert complexity_tables.read_kernel_benchmarks(tmp_path) == (None, 0)
    assert "No GPU benchmark was committed" in complexity_tables.kernels_table(None)
    rows = [dict(device="H100", op="gla", L=L, **{"pass": "fwd"}, impl=impl, time_ms=t, roofline_frac=0.5 if impl == "triton" else None,
                 status="ok") for L in (512, 1024) for impl, t in (("triton", 1.0), ("reference", 4.0))]
    rows.append(dict(device="H100", op="attention", L=1024, **{"pass": "fwd"}, impl="sdpa", time_ms=0.5, status="ok"))
    (tmp_path / "h100").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "h100" / "kernels.csv", index=False)
    bench, n = complexity_tables.read_kernel_benchmarks(tmp_path)
    tex = complexity_tables.kernels_table(bench)
    body = [line for line in tex.splitlines() if line.startswith("H100")]
    assert n == 1 and len(body) == 1  # L 512 is not a length the table shows; SDPA alone is no row
    assert body[0].split(" & ")[2:] == ["1,024", "fwd", "1.000", "4.00$\\times$", "0.50$\\times$", "--",
                                        "50.0\\% \\\\"]


# --- quality -----------------------------------------------------------------------------------


def runs_csv(tmp_path, statuses=("ok", "ok")) -> pd.DataFrame:
    """Two mixers x two seeds on MQAR; each run directory with the files the setup table reads."""
    rows = []
    for arch, acc in (("softmax", 0.9), ("grassmann", 0.5)):
        for seed, status in enumerate(statuses):
            run = tmp_path / arch / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "config.json").write_text(json.dumps({"train": {"steps": 1000, "batch_size": 8}}))
            (run / "provenance.json").write_text(json.dumps({"device": {"name": "Test CPU"}, "packages": {"torch": "2.x"},
                                                             "git": {"commit": "0123456789abcdef"}}))
            rows.append(dict(profile="test", task="mqar", kind="mqar", group="mqar", sweep="{}", arch=arch, seed=seed, status=status,
                             metric="accuracy", higher_is_better=True, params=1234, d_model=16, n_layers=2,
                             eval_value=acc + seed / 100, test_value=acc + seed / 100, eval_split="validation",
                             test_split="test", run_dir=str(run), train_data="synthetic",
                             eval_data="synthetic val", test_data="synthetic test", eval_scored=100, test_scored=200,
                             scored_unit="queries", tokenizer=None, wall_time_s=1800.0,
                             commit="0123456789abcdef", dirty=False, code_changed=""))
    return pd.DataFrame(rows)


def test_quality_table_marks_the_best_and_names_every_task(tmp_path):
    runs = runs_csv(tmp_path)
    tex = quality_tables.quality_table(runs, summarise(runs))
    rows = [line.split(" & ") for line in tex.splitlines() if line.startswith("MQAR")]
    assert [r[1] for r in rows] == ["Softmax", "Grassmann"]
    assert rows[0][2:5] == ["1{,}234", "16/2", "2/2"] and rows[0][6].startswith("\\textbf{0.905")
    assert not rows[1][6].startswith("\\textbf")
    assert "MQAR: accuracy" in tex and "diverged" not in tex


def test_quality_setup_table_and_macros_read_the_runs(tmp_path):
    runs = runs_csv(tmp_path)
    setup = quality_tables.setup_table(runs)
    assert "synthetic val (100 queries scored)" in setup and "1{,}000 $\\times$ 8" in setup
    m = quality_tables.quality_macros(runs, summarise(runs), scope="a test")
    assert (m["numRuns"], m["numArchs"], m["architectures"], m["trainHours"]) == ("4", "2", "Softmax and Grassmann", "2.00")
    assert (m["device"], m["commit"], m["tokenizer"], m["unfinished"]) == (
        "Test CPU", "at commit \\texttt{0123456789}", "synthetic only", "")
    assert m["mqar-softmax-params"] == "1{,}234"
    assert m["code"] == ("The code of each run: 4 runs at \\texttt{0123456789}. "
                         "Every run's recorded sources are this checkout's.")
    # Runs from two commits, one from a dirty tree and one made by other code: the title points
    # to the appendix, and the setup names the commits, the dirty run and the changed run.
    runs.loc[0, ["commit", "dirty"]] = ["fedcba9876543210", True]
    runs.loc[1, "code_changed"] = "src/seqmix/mixers/softmax.py"
    m = quality_tables.quality_macros(runs, summarise(runs), scope="a test")
    assert m["commit"] == "at the commits listed in Appendix~\\ref{app:provenance}"
    assert "3 runs at \\texttt{0123456789}" in m["code"] and "1 run at \\texttt{fedcba9876} (1 with uncommitted" in m["code"]
    assert "Made by other code than this checkout's" in m["code"] and "mqar/softmax/seed1" in m["code"]


def test_a_task_whose_runs_all_diverged_is_said_so(tmp_path):
    runs = runs_csv(tmp_path, statuses=("diverged", "diverged"))
    assert quality_tables.unfinished_text(runs) == "every run of MQAR diverged, so it has no quality result"
    assert "(not evaluated: every run diverged)" in quality_tables.setup_table(runs)


# --- recall ------------------------------------------------------------------------------------


def test_binned_accuracy_by_distance():
    rows = pd.DataFrame({"value": [1, 2, 3, 4], "correct": [1, 0, 1, 1], "scored": [1, 1, 1, 1]})
    b = recall_tables.binned(rows, np.array([0, 2, 4]))
    assert b.distance.tolist() == [2, 4] and b.accuracy.tolist() == [0.5, 1.0]


def test_recall_table_without_a_width_sweep_says_so():
    assert "no task swept over model width" in recall_tables.recall_table(pd.DataFrame(), {})
    assert recall_tables.recall_macros({}, pd.DataFrame()) == {"numGroups": "0"}


def test_recall_table_spans_every_width_of_every_group():
    rule = '{"after": 800, "min_gain": 0.01, "window": 400}'
    runs = pd.DataFrame({"group": ["a", "a", "b"], "task": ["a/d8", "a/d16", "b/d32"], "arch": ["softmax"] * 3,
                         "seed": [0, 0, 0], "status": ["ok"] * 3, "test_value": [0.5, 0.75, 1.0], "lr": [1e-3] * 3,
                         "train_data": ["x", "x", "y"], "steps_completed": [1000, 700, 900],
                         "ended": ["plateau", "solved", "budget"], "plateau_rule": [rule] * 3,
                         "sweep": [json.dumps({"model.d_model": d}) for d in (8, 16, 32)]})
    best = {"a": pd.DataFrame({"task": ["a/d8", "a/d16"], "arch": ["softmax", "softmax"], "per_value": [8.0, 16.0],
                               "test_mean": [0.5, 0.75]}),
            "b": pd.DataFrame({"task": ["b/d32"], "arch": ["softmax"], "per_value": [32.0], "test_mean": [1.0]})}
    tex = recall_tables.recall_table(runs, best)
    assert "Seed & $d=8$ & $d=16$ & $d=32$" in tex
    cell = "{}\\,{{\\scriptsize {}}}".format
    assert f"a & Softmax & 0 & {cell('0.500', '1000p')} & {cell('0.750', '700s')} & --" in tex
    assert f"b & Softmax & 0 & -- & -- & {cell('1.000', '900b')}" in tex
    assert "from step 800, the best validation accuracy of the last 400 steps beat the best before them by less than 0.01" in tex
    assert recall_tables.recall_macros(best, runs) == {"a-softmax-d8": "0.500", "a-softmax-d16": "0.750",
                                                       "b-softmax-d32": "1.000", "numGroups": "2",
                                                       "selection": "one learning rate, 0.001"}


def test_the_recall_captions_say_how_each_widths_run_was_chosen():
    # One learning rate: nothing is selected, and the caption says which; several: the best
    # of them per width, on validation (Zoology's protocol).
    def runs(lrs):
        return pd.DataFrame([dict(group="a", task=f"a/d{d}-lr{lr:g}", arch=arch, lr=lr, metric="accuracy",
                                  sweep=json.dumps({"model.d_model": d, **({"train.lr": lr} if len(lrs) > 1 else {})}))
                             for arch in ("gla", "h3") for d in (8, 16) for lr in lrs])
    assert recall_tables.selection_text(runs([3e-3]), ["a"]) == "one learning rate, 0.003"
    assert recall_tables.selection_text(runs([1e-3, 3e-3, 1e-2]), ["a"]) == (
        "the best of 3 learning rates per width, by validation accuracy")


def test_the_recall_table_gives_every_seed_and_the_macros_the_majority():
    # Three seeds at each width, listed in seed order with their own endings; a diverged seed
    # is left out. The macro is what more than half of the seeds reach: the median of three.
    rows = [("d8", 8, s, v, n, e) for s, v, n, e in ((2, 0.9, 1200, "solved"), (0, 0.2, 800, "plateau"), (1, 0.95, 900, "solved"))]
    rows += [("d16", 16, s, v, n, e) for s, v, n, e in ((0, 1.0, 500, "solved"), (1, 1.0, 400, "solved"), (2, 0.3, 1500, "budget"))]
    runs = pd.DataFrame([dict(group="a", task=f"a/{t}", arch="gla", seed=s, status="ok", test_value=v, lr=1e-3,
                              train_data="x", steps_completed=n, ended=e, plateau_rule="{}",
                              sweep=json.dumps({"model.d_model": d})) for t, d, s, v, n, e in rows])
    runs = pd.concat([runs, runs.iloc[:1].assign(seed=3, status="diverged", test_value=float("nan"))])
    best = {"a": pd.DataFrame({"task": ["a/d8", "a/d16"], "arch": ["gla", "gla"], "per_value": [8.0, 16.0]})}
    points = recall_tables.seed_points(runs, best["a"])
    assert points.seed.tolist() == [0, 1, 2, 0, 1, 2] and points.majority.tolist() == [0.9] * 3 + [1.0] * 3
    tex = recall_tables.recall_table(runs, best)
    cell = "{}\\,{{\\scriptsize {}}}".format
    assert f"a & GLA & 0 & {cell('0.200', '800p')} & {cell('1.000', '500s')}" in tex
    assert f" &  & 2 & {cell('0.900', '1200s')} & {cell('0.300', '1500b')}" in tex
    assert "& 3 &" not in tex and "fewer seeds" not in tex
    assert recall_tables.recall_macros(best, runs) == {"selection": "one learning rate, 0.001", "a-gla-d8": "0.900",
                                                       "a-gla-d16": "1.000", "numGroups": "1"}
    # A mixer with one seed beside it is named in the note.
    runs = pd.concat([runs, runs.iloc[:1].assign(arch="softmax", seed=0)])
    best["a"] = pd.concat([best["a"], best["a"].iloc[:1].assign(arch="softmax")])
    tex = recall_tables.recall_table(runs, best)
    assert "Trained with fewer seeds than the others' 3 (this profile's seeds per architecture): Softmax (1)." in tex


def test_a_recall_cell_names_every_seed_that_ended_differently():
    runs = pd.DataFrame({"task": ["t"] * 3, "arch": ["gla"] * 3, "seed": [2, 0, 1],
                         "steps_completed": [800, 800, 1400], "ended": ["plateau", "plateau", "solved"]})
    assert recall_tables.ending(runs, "t", "gla") == "800p/1400s"
    # Flat in accuracy but not in loss: a plateau stop whose loss still fell over the window is "p*".
    falling = runs.assign(late_loss_drop=[0.2, 0.01, 0.2])
    assert recall_tables.ending(falling, "t", "gla") == "800p/1400s/800p*"  # seeds 0, 1, 2
    assert recall_tables.plateau_words(runs.assign(plateau_rule="{}")) == ""


def floor_run(arch, **kw):
    base = dict(task=f"m/{arch}", arch=arch, seed=0, test_split="test", chance=0.125, reach=float("nan"),
                blind_loss=math.log(128), first_eval_loss=4.9, last_eval_loss=4.85, grad_norm_first=0.4,
                grad_norm_last=0.15, steps_completed=800, ended="plateau")
    return pd.Series({**base, **kw})


def distance_rows(arch, by_distance):
    return pd.DataFrame([dict(task=f"m/{arch}", arch=arch, split="test", by="query_distance", value=str(d), correct=c,
                              scored=n) for d, (c, n) in by_distance.items()])


def test_each_run_below_chance_gets_the_first_reason_its_measurements_show():
    """Reach (recalls within, not beyond), then the copy probe, then a flat loss, else a loss
    above the informed-chance level; and each reason quotes its numbers."""
    reach = floor_run("grassmann", reach=32.0)
    near_only = distance_rows("grassmann", {10: (90, 100), 40: (1, 100)})
    split = recall_tables.run_reach_split(near_only, reach)
    assert split == (0.9, 0.01, 100)
    assert recall_tables.floor_reason(reach, split, None).startswith("receptive field: recalls keys within its reach of 32")
    # Within reach at chance too: the reach explains nothing; a flat loss does, with both halves quoted.
    flat = recall_tables.floor_reason(reach, recall_tables.run_reach_split(distance_rows("grassmann", {10: (1, 100), 40: (1, 100)}), reach), 0.92)
    assert flat.startswith("optimisation: validation loss at the blind level ln 128 = 4.85") and "0.15" in flat
    assert "0.010 on keys within its reach of 32 tokens, 0.010 on the 100 beyond" in flat
    assert recall_tables.floor_reason(floor_run("tssa", last_eval_loss=4.1), None, 0.03).startswith(
        "cannot carry one token's identity to another position: it copies the previous token at 0.030")
    assert recall_tables.floor_reason(floor_run("gla", last_eval_loss=2.5), None, 1.0).startswith(
        "had not learned which value a key holds when it ended: validation loss 4.90 $\\to$ 2.50, above the informed-chance level ln 8 = 2.08")


def test_the_floor_table_lists_the_points_a_majority_of_seeds_ended_below_chance():
    # ToST: two of three seeds below chance 0.125: listed, with every seed's accuracy and the
    # reason of the median seed (seed 2, 0.040). Softmax: one seed below chance only: not listed.
    runs = pd.DataFrame([floor_run("softmax", seed=0, test_value=0.99, last_eval_loss=0.02),
                         floor_run("softmax", seed=1, test_value=0.10, last_eval_loss=0.02),
                         floor_run("softmax", seed=2, test_value=0.99, last_eval_loss=0.02),
                         floor_run("tssa", seed=0, test_value=0.03, last_eval_loss=4.1),
                         floor_run("tssa", seed=1, test_value=0.50, last_eval_loss=1.0),
                         floor_run("tssa", seed=2, test_value=0.04, last_eval_loss=4.1, steps_completed=900)])
    best = {"m": pd.DataFrame({"task": ["m/softmax", "m/tssa"], "arch": ["softmax", "tssa"], "per_value": [64, 64]})}
    rows = recall_tables.floor_rows(runs, pd.DataFrame(columns=["task", "arch", "seed", "by", "split"]), best,
                                    pd.DataFrame({"arch": ["softmax", "tssa"], "accuracy": [1.0, 0.03]}))
    assert [(r["arch"], r["seed"], r["test"], r["ending"]) for r in rows] == [("tssa", 2, "0.030/0.500/0.040", "800p/800p/900p")]
    tex = recall_tables.floor_table(rows, has_probe=True)
    assert "ToST" in tex and "seed 2: cannot carry one token's identity" in tex and "Softmax" not in tex
    assert "No selected recall run ended below chance" in recall_tables.floor_table([], has_probe=False)


# --- sparsity, geometry, claims, throughput ----------------------------------------------------


def test_sparsity_table_and_macros():
    sp = pd.DataFrame([dict(arch=arch, task=task, seed=seed, kind=kind, layer=0, S_mean=s + seed / 10, S_onehot_mean=0.25,
                            min_row_len=4, seq_len=16)
                       for arch, task, s in (("softmax", "wikitext2", 0.5), ("linear", "wikitext2", 0.6),
                                             ("linformer", "snli", 0.7))
                       for seed in (0, 1) for kind in ("attention", "jacobian")])
    tex = sparsity_tables.sparsity_table(sp)
    assert "Softmax & WikiText-2 & 0.550 $\\pm$ 0.635" in tex  # seeds 0.5 and 0.6: t interval of two
    # Measured on its encoder task, which the legend says; the others on the main task.
    assert [sparsity_tables.measured_title(sp, a) for a in ("linformer", "softmax")] == ["Linformer (SNLI)", "Softmax"]
    assert "Linformer & SNLI & 0.750" in tex
    an = pd.DataFrame([dict(method="closed_form", kernel=k, beta=b, gamma=g, S=s) for k, s in (("identity", 0.9), ("exp", 0.1),
                       ("relu2", 0.3)) for b in (-1.0, 0.0) for g in (0.5, 1.0)] + [dict(method="monte_carlo", kernel="exp", n=100)])
    analytic = sparsity_tables.Analytic.of(an)
    assert (analytic.beta0, analytic.gamma1) == (0.0, 1.0)
    m = sparsity_tables.sparsity_macros(sp, analytic)
    assert m["softmax-attention"] == "0.550 $\\pm$ 0.635"
    assert (m["identityFloor"], m["expMin"], m["mcN"], m["relu2AtZero"]) == ("0.900", "0.100", "100", "0.300")


def test_geometry_table_pools_layers():
    geo = pd.DataFrame([dict(arch="grassmann", quantity=q, stat=s, offset=0, seed=seed, layer=layer, value=v + layer)
                        for q, s, v in (("pair_angle", "q50", 30.0), ("plane_angle_1", "q50", 10.0),
                                        ("plane_angle_2", "q50", 60.0), ("plucker_residual_used", "max", 1e-7))
                        for seed in (0, 1) for layer in (0, 1)]
                       + [dict(arch="tssa", quantity="compression_term", stat="mean", offset=0, seed=0, layer=0, value=2.0)])
    gr = geometry_tables.grassmann_rows(geo)
    assert len(geometry_tables.compression_rows(geo)) == 1 and set(gr.arch) == {"grassmann"}
    assert "1 & 1.0e+00 & 31.0 & 11.0 & 61.0" in geometry_tables.geometry_table(gr)
    m = geometry_tables.geometry_macros(gr)
    assert (m["layer1-pair"], m["layer0-plane2"], m["numLayers"]) == ("31.0", "60.0", "2")
    assert geometry_tables.pooled(gr, "pair_angle", "q50")["mean"].tolist() == [30.0, 31.0]


def test_claims_table_and_macros():
    claims = pd.DataFrame([dict(id="c1", claim="x_1", source="a paper", reported="1", ours="2 ± 1", measured_on="m",
                                verdict="agrees", why="fine"),
                           dict(id="c2", claim="y", source="b", reported="1", ours="--", measured_on="m",
                                verdict="not testable", why="too small")])
    tex = claims_tables.claims_table(claims)
    assert "\\textbf{c1}: x\\_1 \\emph{(a paper)}" in tex and "\\textcolor{untestable}{not testable}: too small" in tex
    m = claims_tables.claims_macros(claims)
    assert (m["numClaims"], m["numAgree"], m["numUntestable"], m["c1-ours"]) == ("2", "1", "1", "2 $\\pm$ 1")
    assert m["disagreeing"] == "none"
    lost = claims_tables.claims_macros(claims.assign(verdict=["disagrees", "disagrees"], why=["widens", "50 % > 15"]))
    assert lost["disagreeing"] == "\\texttt{c1} (widens); \\texttt{c2} (50 \\% > 15)"


def test_throughput_table_fills_missing_lengths():
    tp = pd.DataFrame([dict(arch=a, seq_len=L, batch=64 // L, tokens_per_s=t, ratio_to_softmax=r, device_name="CPU", threads=1,
                            d_model=16, n_layers=2, d_ff_mult=0.0, vocab_size=64, repeats=3, steps=2)
                       for a, L, t, r in (("softmax", 8, 1000.0, 1.0), ("softmax", 16, 900.0, 1.0), ("linear", 8, 1500.0, 1.5))])
    assert throughput_tables.setting(tp) == "CPU, 1 thread; $d=16$, 2 layers, no feed-forward, vocabulary 64"
    tex = throughput_tables.throughput_table(tp)
    assert "Softmax & 1,000 & 1.00 & 900 & 1.00" in tex and "Linear (elu+1) & 1,500 & 1.50 & -- & --" in tex
    assert "$L=16$ ($B=4$)" in tex


@pytest.mark.parametrize("module", [claims_tables, complexity_tables, geometry_tables, quality_tables, recall_tables,
                                    sparsity_tables, throughput_tables])
def test_report_tables_do_not_import_torch(module):
    # The notebooks' library code reads results files only: no model, no torch.
    import subprocess
    import sys

    code = f"import sys, {module.__name__}; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_each_notebooks_code_holds_the_modules_that_compute_its_tables():
    """A notebook's tables are computed in its seqmix.report modules: they are its code (found
    from its cells' imports, seqmix.sources), so that editing one reruns the notebook; and
    notebooks/outputs.yaml lists no code by hand."""
    import re

    import yaml

    from seqmix.sources import closure, shown
    from tests.conftest import REPO

    outputs = yaml.safe_load((REPO / "notebooks" / "outputs.yaml").read_text())
    for name, entry in outputs.items():
        notebook = REPO / "notebooks" / f"{name}.ipynb"
        code = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        modules = set(re.findall(r"from seqmix\.report\.(\w+) import", code))
        assert {m for m in modules if m.endswith("_tables")}, f"{name}.ipynb computes its tables itself"
        found = {shown(p) for p in closure([notebook])}
        assert {f"src/seqmix/report/{m}.py" for m in modules} <= found, name
        assert not [i for i in entry["inputs"] if i.endswith(".py")], name
    # The verdicts are the claims notebook's code, as its own tables are.
    assert "src/seqmix/report/claims.py" in {shown(p) for p in closure([REPO / "notebooks" / "claims.ipynb"])}


def test_curve_ends_reads_the_first_and_last_evaluation_and_gradient_norms(tmp_path):
    from seqmix.report.collect import GRAD_ROWS, curve_ends

    rows = ["step,phase,loss,metric,metric_value,lr,grad_norm,seen,elapsed_s"]
    rows += [f"{s},train,{5 - s / 100},,,0.001,{s / 10},0,0" for s in range(1, 11)]
    rows += ["5,eval,4.8,accuracy,0.1,,,0,0", "10,eval,4.5,accuracy,0.2,,,0,0"]
    (tmp_path / "log.csv").write_text("\n".join(rows) + "\n")
    ends = curve_ends(tmp_path)
    assert (ends["first_eval_loss"], ends["last_eval_loss"]) == (4.8, 4.5)
    assert ends["late_loss_drop"] == pytest.approx(0.3 / 4.8)  # the last quarter: steps 8-10, from the eval at 5
    assert curve_ends(tmp_path, window=6)["late_loss_drop"] is None  # no evaluation 6 steps before the end
    assert ends["grad_norm_first"] == pytest.approx(sum(range(1, GRAD_ROWS + 1)) / 10 / GRAD_ROWS)
    assert ends["grad_norm_last"] == pytest.approx(sum(range(11 - GRAD_ROWS, 11)) / 10 / GRAD_ROWS)
