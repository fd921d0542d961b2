"""The throughput benchmark (seqmix/analysis/throughput.py): what it measures and writes, not
how fast anything is (speed targets live in the benchmark's output, never in a test)."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml

from seqmix.analysis import throughput
from seqmix.cli import main
from seqmix.study.settings import ThroughputSettings
from tests.conftest import REPO

TINY = {"lengths": [8, 12], "d_model": 16, "vocab_size": 32, "tokens_per_batch": 24,
        "warmup": 0, "steps": 1, "repeats": 2}


def test_rows_pair_every_causal_mixer_with_softmax():
    spec = ThroughputSettings(**TINY)
    threads = torch.get_num_threads()
    rows = throughput.throughput_rows(["linear", "linformer"], spec, {}, progress=False)
    assert torch.get_num_threads() == threads, "the benchmark restores the thread count"
    # softmax is added (the baseline), linformer dropped (no causal form)
    assert [(r["arch"], r["seq_len"]) for r in rows] == [
        ("softmax", 8), ("linear", 8), ("softmax", 12), ("linear", 12)]
    for r in rows:
        assert r["batch"] == 24 // r["seq_len"] and r["threads"] == 1 and r["repeats"] == 2
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert r["tokens_per_s"] > 0 and r["params"] > 0
        if r["arch"] == "softmax":
            assert r["ratio_to_softmax"] == 1.0
    assert "linear" in throughput.format_table(rows)


def test_cli_writes_the_csv_from_the_config_section(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["architectures"] = ["softmax", "tssa", "linformer"]
    cfg["analysis"]["throughput"] = {**TINY, "lengths": [8]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "throughput.csv"
    assert main(["throughput", "--config", str(path), "--out", str(out), "--quiet"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["arch"] for r in rows] == ["softmax", "tssa"]
    assert set(throughput.FIELDS) == set(rows[0])
    # A median of per-round ratios: between the slowest and the fastest pairing of the rounds.
    (soft, tssa), ratio = rows, float(rows[1]["ratio_to_softmax"])
    lo = float(tssa["tokens_per_s_min"]) / float(soft["tokens_per_s_max"])
    hi = float(tssa["tokens_per_s_max"]) / float(soft["tokens_per_s_min"])
    assert lo <= ratio <= hi, (lo, ratio, hi)


def test_a_missing_gpu_is_named_before_any_work(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on any machine, one with a GPU too
    with pytest.raises(RuntimeError, match="'analysis.throughput.device' is 'cuda' but no GPU is visible"):
        throughput.resolve_device("cuda", "analysis.throughput.device")
