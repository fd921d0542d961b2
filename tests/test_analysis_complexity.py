"""Complexity: the log-log fit recovers known exponents with honest intervals, the fit
table puts the FLOP exponent beside the measured one, and a tiny real measurement runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqmix.analysis import complexity as cx
from seqmix.sections import ComplexitySpec


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


def fake_rows(arch: str, k_time: float, k_flops: float, lengths, repeats: int = 2) -> list[dict]:
    return [{"arch": arch, "device": "cpu", "seq_len": L, "repeat": r, "status": "ok",
             "fwd_ms": 1e-3 * L**k_time, "fwdbwd_ms": 3e-3 * L**k_time * (1 + 0.01 * r),
             "peak_fwdbwd_bytes": 100 * L, "flops_fwd": float(L**k_flops)}
            for L in lengths for r in range(repeats)]


def test_fit_table_longest_lengths_and_flops_beside():
    rows = (fake_rows("quad", 2.0, 2.0, [64, 128, 256, 512, 1024])
            + fake_rows("lin", 1.0, 1.0, [64, 128, 256, 512])
            + [{"arch": "lin", "device": "cpu", "seq_len": 2048, "status": "oom"}])
    for r in rows:
        if r["arch"] == "lin" and r.get("status") == "ok":
            r["flops_fwd"] = float("nan")  # a mixer that states no FLOP count
    fits = {(f["arch"], f["measure"]): f for f in cx.fit_table(rows, longest=3)}
    q = fits["quad", "fwdbwd_ms"]
    assert (q["min_len"], q["max_len"]) == (256, 1024)
    assert q["slope"] == pytest.approx(2.0, abs=1e-3) and q["flops_slope"] == pytest.approx(2.0)
    assert q["value_at_max_len"] == pytest.approx(3e-3 * 1024**2 * 1.005)
    assert fits["quad", "peak_fwdbwd_bytes"]["slope"] == pytest.approx(1.0)
    lin = fits["lin", "fwd_ms"]
    assert (lin["min_len"], lin["max_len"]) == (128, 512)  # the oom length is not a point
    assert lin["slope"] == pytest.approx(1.0) and math.isnan(lin["flops_slope"])
    assert ("lin", "flops_fwd") not in fits
    assert all(set(f) <= set(cx.FIT_FIELDS) for f in fits.values())


def test_tiny_real_measurement():
    cfg = ComplexitySpec(lengths=[16, 8, 32], d_model=8, batch_size=1, repeats=2, warmup=1, max_seconds=60.0)
    rows = cx.run_complexity(["softmax", "grassmann"], cfg, torch.device("cpu"),
                             {"softmax": {"n_heads": 2}, "grassmann": {"rank": 4, "offsets": [1, 2]}},
                             progress=False)
    assert len(rows) == 2 * 3 * 2 and all(r["status"] == "ok" for r in rows)
    assert [r["seq_len"] for r in rows[:6]] == [8, 8, 16, 16, 32, 32]  # ascending
    assert all(r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["peak_fwdbwd_bytes"] > 0 for r in rows)
    assert all(set(r) == set(cx.FIELDS) for r in rows)
    m = cx.build_mixer("softmax", 8, 32, {"n_heads": 2}, "cpu")
    assert [r["flops_fwd"] for r in rows if r["arch"] == "softmax" and r["seq_len"] == 32][0] == m.flops(32)
    fits = cx.fit_table(rows)
    assert {f["arch"] for f in fits} == {"softmax", "grassmann"} and all(f["points"] == 6 for f in fits)


def test_time_cap_and_out_of_memory_stop_growing(monkeypatch):
    cfg = ComplexitySpec(lengths=[8, 16, 32], d_model=8, batch_size=1, repeats=1, warmup=0, max_seconds=1e-9)
    rows = cx.run_complexity(["softmax"], cfg, torch.device("cpu"), {"softmax": {"n_heads": 2}}, progress=False)
    assert [r["seq_len"] for r in rows] == [8]  # over the cap at the first length

    real = cx.measure_mixer

    def flaky(arch, d, L, *a, **k):
        if L >= 16:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1 GB")
        return real(arch, d, L, *a, **k)

    monkeypatch.setattr(cx, "measure_mixer", flaky)
    cfg = cfg.model_copy(update={"max_seconds": 60.0})
    rows = cx.run_complexity(["softmax"], cfg, torch.device("cpu"), {"softmax": {"n_heads": 2}}, progress=False)
    assert [(r["seq_len"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom")]

    def broken(*a, **k):
        raise RuntimeError("shape mismatch")  # a real bug is not an out-of-memory

    monkeypatch.setattr(cx, "measure_mixer", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cx.run_complexity(["softmax"], cfg, torch.device("cpu"), {}, progress=False)
