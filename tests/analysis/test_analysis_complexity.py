"""Complexity: the log-log fit recovers known exponents with honest intervals, the fit
table fits times on their minima and counts over the longest counted lengths, the growth
table puts time beside the counts per doubling, a tiny real measurement runs and counts
the same twice, and the three CSVs have exactly their row types' columns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqmix.analysis import complexity as cx
from seqmix.study.settings import ComplexitySettings


def synthetic(k: float, lengths, repeats: int, noise: float, rng) -> tuple[np.ndarray, np.ndarray]:
    L = np.repeat(np.asarray(lengths, float), repeats)
    return L, 0.01 * L**k * np.exp(noise * rng.standard_normal(L.size))


@pytest.mark.parametrize("k", [1.0, 1.5, 2.0])
def test_fit_exponent_recovers_known_exponent(k):
    rng = np.random.default_rng(0)
    fit = cx.fit_exponent(*synthetic(k, [256, 512, 1024, 2048], 3, 0.05, rng))
    assert fit["ci_low"] < k < fit["ci_high"]
    assert fit["ci_high"] - fit["ci_low"] < 0.2 and fit["points"] == 12 and fit["r2"] > 0.99
    exact = cx.fit_exponent(*synthetic(k, [64, 128, 256], 2, 0.0, rng))
    assert exact["slope"] == pytest.approx(k, abs=1e-12)


def test_fit_interval_has_its_nominal_coverage():
    # 400 synthetic measurements: a 95% interval should cover the truth ~380 times. The
    # bounds are the binomial 99.9% range, so a miscalibrated (e.g. z instead of t, or
    # stderr off by √2) interval fails while a correct one passes almost surely.
    rng = np.random.default_rng(1)
    hits = sum(
        (f := cx.fit_exponent(*synthetic(1.7, [512, 1024, 2048], 2, 0.1, rng)))["ci_low"] < 1.7 < f["ci_high"]
        for _ in range(400)
    )
    assert 360 <= hits <= 394


def test_fit_exponent_needs_three_points():
    fit = cx.fit_exponent(np.array([64.0, 128.0]), np.array([1.0, 2.0]))
    assert math.isnan(fit["slope"]) and fit["points"] == 2
    assert math.isnan(cx.fit_exponent(np.array([64.0] * 4), np.ones(4))["slope"])


def fake_rows(arch: str, k_time: float, k_flops: float, lengths, repeats: int = 2, timed_up_to=None) -> list[dict]:
    rows = []
    for L in lengths:
        counts = {"flops_fwd": float(L**k_flops), "flops_fwdbwd": 3.0 * L**k_flops, "bytes_written_fwd": 50 * L,
                  "bytes_written_fwdbwd": 200 * L + 1000, "peak_fwd_bytes": 40 * L, "peak_fwdbwd_bytes": 100 * L,
                  "flops_stated": float(L**k_flops), "count_mode": "fake"}
        if timed_up_to is not None and L > timed_up_to:
            rows.append({"arch": arch, "device": "cpu", "seq_len": L, "repeat": 0, "status": "counted",
                         "fwd_ms": float("nan"), "fwdbwd_ms": float("nan"), **counts})
            continue
        rows += [{"arch": arch, "device": "cpu", "seq_len": L, "repeat": r, "status": "ok", **counts,
                  "fwd_ms": 1e-3 * L**k_time * (1 + 0.5 * r), "fwdbwd_ms": 3e-3 * L**k_time * (1 + 0.01 * r)}
                 for r in range(repeats)]
    return rows


def test_fit_table_longest_lengths_min_of_repeats_and_counts_beside():
    rows = (fake_rows("quad", 2.0, 2.0, [64, 128, 256, 512, 1024])
            + fake_rows("lin", 1.0, 1.0, [64, 128, 256, 512, 1024, 2048], timed_up_to=512)
            + [{"arch": "lin", "device": "cpu", "seq_len": 4096, "status": "oom"}])
    for r in rows:
        if r["arch"] == "lin" and r.get("status") != "oom":
            r["flops_stated"] = float("nan")  # a mixer that states no FLOP count
    fits = {(f["arch"], f["measure"]): f for f in cx.fit_table(rows, longest=3)}
    q = fits["quad", "fwdbwd_ms"]
    assert (q["min_len"], q["max_len"], q["kind"]) == (256, 1024, "timed")
    assert q["slope"] == pytest.approx(2.0, abs=1e-9) and q["flops_slope"] == pytest.approx(2.0)
    assert q["value_at_max_len"] == pytest.approx(3e-3 * 1024**2)  # the minimum over the repeats
    assert q["ci_high"] - q["ci_low"] < 1e-6  # exact power law: a zero-width interval
    mem = fits["quad", "peak_fwdbwd_bytes"]
    assert mem["kind"] == "counted" and mem["slope"] == pytest.approx(1.0) and math.isnan(mem["ci_low"])
    assert mem["local_min"] == pytest.approx(1.0) and mem["local_max"] == pytest.approx(1.0)
    lin = fits["lin", "fwd_ms"]
    assert (lin["min_len"], lin["max_len"]) == (128, 512)  # timed lengths only
    counted = fits["lin", "bytes_written_fwdbwd"]
    assert (counted["min_len"], counted["max_len"]) == (512, 2048)  # counted further; the oom is not a point
    # 200 L + 1000: the constant makes the early doublings grow less than 2
    assert 0.98 < counted["local_min"] < counted["local_max"] < 1.0
    assert ("lin", "flops_stated") not in fits and lin["flops_slope"] == pytest.approx(1.0)
    assert all(set(f) <= set(cx.FIT_FIELDS) for f in fits.values())


def test_growth_table_puts_time_beside_the_counts_per_doubling():
    rows = fake_rows("lin", 1.5, 1.0, [256, 512, 1024, 2048], timed_up_to=1024)
    growth = cx.growth_table(rows)
    assert [(g["len_from"], g["len_to"]) for g in growth] == [(256, 512), (512, 1024), (1024, 2048)]
    assert all(g["growth_flops_fwdbwd"] == pytest.approx(2.0) for g in growth)
    assert all(g["growth_peak_fwdbwd_bytes"] == pytest.approx(2.0) for g in growth)
    assert growth[0]["growth_fwdbwd_ms"] == pytest.approx(2**1.5)
    assert math.isnan(growth[-1]["growth_fwdbwd_ms"])  # 2048 was not timed
    assert all(set(g) == set(cx.GROWTH_FIELDS) for g in growth)


def test_growth_is_per_doubling_when_lengths_are_not_powers_of_two():
    rows = fake_rows("quad", 2.0, 2.0, [100, 400])
    assert cx.growth_table(rows)[0]["growth_flops_fwdbwd"] == pytest.approx(4.0)


TINY = {"softmax": {"n_heads": 2}, "grassmann": {"rank": 4, "offsets": [1, 2]}}


def test_tiny_real_measurement():
    cfg = ComplexitySettings(lengths=[16, 8, 32], d_model=8, batch_size=1, repeats=2, warmup=1, max_seconds=1e9)
    rows = cx.run_complexity(["softmax", "grassmann"], cfg, torch.device("cpu"), TINY, progress=False)
    assert len(rows) == 2 * 3 * 2 and all(r["status"] == "ok" for r in rows)
    assert [r["seq_len"] for r in rows[:6]] == [8, 8, 16, 16, 32, 32]  # ascending
    assert all(r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["peak_fwdbwd_bytes"] > 0 for r in rows)
    assert all(r["flops_fwdbwd"] > r["flops_fwd"] > 0 and r["bytes_written_fwdbwd"] > 0 for r in rows)
    assert all(set(r) == set(cx.FIELDS) for r in rows)
    m = cx.build_mixer("softmax", 8, 32, TINY["softmax"], "cpu")
    assert [r["flops_stated"] for r in rows if r["arch"] == "softmax" and r["seq_len"] == 32][0] == m.flops(32)
    # The counts are exact: every repeat and a second run give the same numbers.
    again = cx.run_complexity(["softmax", "grassmann"], cfg, torch.device("cpu"), TINY, progress=False)
    for a, b in zip(rows, again):
        assert all(a[k] == b[k] for k in cx.COUNT_FIELDS)
    fits = cx.fit_table(rows)
    assert {f["arch"] for f in fits} == {"softmax", "grassmann"} and all(f["points"] == 3 for f in fits)


def test_time_cap_stops_timing_but_not_counting(monkeypatch):
    cfg = ComplexitySettings(lengths=[8, 16, 32], d_model=8, batch_size=1, repeats=1, warmup=0, max_seconds=1e-9)
    rows = cx.run_complexity(["softmax"], cfg, torch.device("cpu"), TINY, progress=False)
    assert [(r["seq_len"], r["status"]) for r in rows] == [(8, "ok"), (16, "counted"), (32, "counted")]
    assert all(r["flops_fwdbwd"] > 0 for r in rows) and math.isnan(rows[1]["fwdbwd_ms"])

    real = cx.count_mixer

    def flaky(mixer, L, *a, **k):
        if L >= 16:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1 GB")
        return real(mixer, L, *a, **k)

    monkeypatch.setattr(cx, "count_mixer", flaky)
    cfg = cfg.model_copy(update={"max_seconds": 1e9})  # no cap: the OOM decides
    rows = cx.run_complexity(["softmax"], cfg, torch.device("cpu"), TINY, progress=False)
    assert [(r["seq_len"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom")]

    def broken(*a, **k):
        raise RuntimeError("shape mismatch")  # a real bug is not an out-of-memory

    monkeypatch.setattr(cx, "count_mixer", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cx.run_complexity(["softmax"], cfg, torch.device("cpu"), {}, progress=False)


def test_a_timing_out_of_memory_leaves_the_counts(monkeypatch):
    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(cx, "time_mixer", oom)
    cfg = ComplexitySettings(lengths=[8, 16], d_model=8, batch_size=1, repeats=1, warmup=0, max_seconds=1e9)
    rows = cx.run_complexity(["softmax"], cfg, torch.device("cpu"), TINY, progress=False)
    assert [(r["seq_len"], r["status"]) for r in rows] == [(8, "counted"), (16, "counted")]


def test_auto_counts_fake_until_the_ops_grow_like_a_chunk_loop():
    row = lambda L, ops, mode="fake": {"seq_len": L, "ops_fwdbwd": ops, "count_mode": mode}  # noqa: E731
    assert cx.still_fake(True, None, row(128, 1000))
    assert cx.still_fake(True, row(128, 1000), row(256, 1100))  # vectorised: ops ~constant
    assert not cx.still_fake(True, row(2048, 3000), row(4096, 5800))  # ×1.93 per doubling: a loop
    assert not cx.still_fake(True, None, row(128, 1000, mode="real"))  # could not run fake
    assert not cx.still_fake(False, row(128, 1000), row(256, 1000))
    assert cx.still_fake(True, row(1024, 1000), row(4096, 2000))  # ×1.41 per doubling over two


def test_auto_switches_a_chunk_loop_to_real_tensors():
    cfg = ComplexitySettings(lengths=[64, 128, 256], d_model=8, repeats=1, warmup=0, max_seconds=1e-9,
                         count_tensors="auto")
    # GLA's chunkwise CPU form steps through its chunks in Python (chunk 2: one step per 2
    # tokens); Grassmann is vectorised. (Performer was the loop here until its chunks were
    # carried without one.)
    opts = {"grassmann": {"rank": 4, "offsets": [1, 2]}, "gla": {"chunk_size": 2, "n_heads": 2}}
    rows = cx.run_complexity(["grassmann", "gla"], cfg, torch.device("cpu"), opts, progress=False)
    modes = {(r["arch"], r["seq_len"]): r["count_mode"] for r in rows}
    assert {modes["grassmann", L] for L in cfg.lengths} == {"fake"}
    assert modes["gla", 64] == "fake" and modes["gla", 256] == "real"


def test_the_csvs_have_exactly_their_row_types_columns(tmp_path):
    import csv

    from seqmix.io import columns

    cfg = ComplexitySettings(lengths=[8, 16, 32], d_model=8, batch_size=1, repeats=1, warmup=0, max_seconds=1e9)
    paths = {t: tmp_path / f"{t.__name__}.csv" for t in (cx.ComplexityRow, cx.FitRow, cx.GrowthRow)}
    cx.write_complexity(["softmax"], cfg, TINY, *paths.values(), device="cpu", progress=False)
    for row_type, path in paths.items():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            assert reader.fieldnames == columns(row_type)
            assert all(v != "" for r in reader for k, v in r.items() if k != "r2")  # every column filled
