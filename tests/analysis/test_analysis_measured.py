"""Measured sparsity: the Jacobian effective attention a_{t,s} = ‖∂y_t/∂x_s‖_F on mixers
whose answer is known by hand, its agreement with the full Jacobian on real mixers, and the
rows sparsity.csv gets from a tiny language model.

All checks run in float64, where the batched backward and the full Jacobian compute the
same sums in a different order: 1e-10 absolute leaves ~5 orders of margin above rounding.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from seqmix import mixers
from seqmix.analysis.jacobian import effective_attention, effective_attention_reference
from seqmix.analysis.sparsity import FIELDS, model_sparsity, row_stats, su_sparsity
from seqmix.models.lm import CausalLM, LMConfig
from tests.conftest import TINY_OPTIONS, tiny_mixer

D = 8


class FixedMix(nn.Module):
    """y = M x W with a fixed (L, L) mixing matrix M: ∂y_t/∂x_s = M_ts Wᵀ, so the effective
    attention is |M_ts|·‖W‖_F exactly."""

    causal = True

    def __init__(self, M: torch.Tensor, W: torch.Tensor):
        super().__init__()
        self.M, self.W = M, W

    def forward(self, x):  # (B, L, d)
        return self.M @ x @ self.W


def causal_average(L: int) -> torch.Tensor:
    return torch.ones(L, L, dtype=torch.float64).tril() / torch.arange(1, L + 1, dtype=torch.float64)[:, None]


@pytest.mark.parametrize("batched", [True, False])
def test_effective_attention_of_a_causal_average(batched):
    L = 9
    torch.manual_seed(0)
    W = torch.randn(D, D, dtype=torch.float64)
    mix = FixedMix(causal_average(L), W)
    x = torch.randn(2, L, D, dtype=torch.float64)
    a = effective_attention(mix, x, chunk=7, batched=batched)
    expected = causal_average(L) * torch.linalg.norm(W)
    torch.testing.assert_close(a, expected.expand(2, L, L), atol=1e-12, rtol=0)
    assert (a.triu(1) == 0).all()
    # An average over the visible prefix is a uniform row: S = 1 for every row.
    S = su_sparsity(a, mask=torch.ones(L, L, dtype=torch.bool).tril().expand(2, L, L))
    torch.testing.assert_close(S, torch.ones(2, L, dtype=torch.float64))


def test_effective_attention_of_fixed_softmax_weights():
    # y_t = Σ_s A_ts x_s with input-independent softmax weights: a_{t,s} = A_ts·‖I‖_F = A_ts·√d.
    L = 7
    torch.manual_seed(1)
    logits = torch.randn(L, L, dtype=torch.float64).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf)
    A = torch.softmax(3.0 * logits, dim=-1)
    mix = FixedMix(A, torch.eye(D, dtype=torch.float64))
    a = effective_attention(mix, torch.randn(1, L, D, dtype=torch.float64))
    torch.testing.assert_close(a[0], A * math.sqrt(D), atol=1e-12, rtol=0)
    # row_stats over these rows against Su's S = mean(a) / sqrt(mean(a²)) of each row t over
    # its t + 1 visible keys, written out here.
    stats = row_stats(a[:, None], causal=True, min_row_len=1)[0]
    by_hand = [A[t, : t + 1].mean() / A[t, : t + 1].pow(2).mean().sqrt() for t in range(L)]
    assert stats["rows"] == L
    assert stats["S_mean"] == pytest.approx(torch.stack(by_hand).mean().item(), abs=1e-12)
    assert stats["S_onehot_mean"] == pytest.approx(sum(1 / math.sqrt(t + 1) for t in range(L)) / L, abs=1e-12)


@pytest.mark.parametrize("name", mixers.names())
def test_batched_and_copies_equal_the_full_jacobian(name):
    m = tiny_mixer(name, max_len=12)
    x = torch.randn(1, 9, D, dtype=torch.float64)  # 9 > the chunk sizes above: crosses chunks
    ref = effective_attention_reference(m, x)
    torch.testing.assert_close(effective_attention(m, x, chunk=16), ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(effective_attention(m, x, chunk=16, batched=False), ref, atol=1e-10, rtol=0)
    if m.causal:  # zero above the diagonal (up to FFT rounding, for h3's long convolution)
        assert ref.triu(1).abs().max() <= 1e-12 * ref.abs().max(), f"{name}: output depends on later inputs"
        assert (ref.diagonal(dim1=-2, dim2=-1) > 0).all()


def test_positions_subset():
    m = tiny_mixer("softmax", max_len=12)
    x = torch.randn(1, 10, D, dtype=torch.float64)
    full = effective_attention(m, x)
    part = effective_attention(m, x, positions=[3, 7, 9], chunk=5)
    torch.testing.assert_close(part[:, [3, 7, 9]], full[:, [3, 7, 9]], atol=1e-12, rtol=0)
    assert torch.isnan(part[:, [0, 1, 2, 4, 5, 6, 8]]).all()


def test_grassmann_effective_attention_lives_on_its_offsets():
    # y_t reads x_t and x_{t-Δ} for Δ in the offsets, nothing else: a sparse row by design.
    m = tiny_mixer("grassmann", max_len=12)
    L = 10
    a = effective_attention(m, torch.randn(1, L, D, dtype=torch.float64))[0]
    support = torch.zeros(L, L, dtype=torch.bool)
    for t in range(L):
        for s in [t] + [t - o for o in m.options.offsets if t - o >= 0]:
            support[t, s] = True
    assert (a[~support] == 0).all() and (a[support] > 0).all()


def test_softmax_jacobian_is_not_its_attention():
    # The calibration the CSV reports: even for softmax the two row sets differ, because the
    # scores depend on x_s too (the report's "Attention sparsity" section derives it).
    m = tiny_mixer("softmax", max_len=12)
    x = 3.0 * torch.randn(1, 10, D, dtype=torch.float64)
    a = effective_attention(m, x)[0]
    A = m.scores(x)[0].mean(0)  # head-averaged exp scores
    a_rows, A_rows = a / a.sum(-1, keepdim=True), A / A.sum(-1, keepdim=True)
    assert (a_rows - A_rows).abs().max() > 1e-2


def mixer_inputs(model, *args) -> list[torch.Tensor]:
    """What each block's mixer reads when ``model(*args)`` runs (hooks of this test's own)."""
    seen = []
    hooks = [b.mixer.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach())) for b in model.blocks]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return seen


def mean_row_S(a: torch.Tensor, first: int, causal: bool = True) -> float:
    """Su's S = mean(a) / sqrt(mean(a²)) of each row t ≥ ``first`` of (B, L, L) weights, over
    its visible keys (s ≤ t when causal), averaged over the rows: written out, one row at a time."""
    S = [a[b, t, : t + 1 if causal else None] for b in range(a.shape[0]) for t in range(first, a.shape[1])]
    return torch.stack([r.mean() / r.pow(2).mean().sqrt() for r in S]).mean().item()


@pytest.mark.parametrize("name", ["softmax", "grassmann"])
def test_model_sparsity_rows(name):
    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch=name, vocab_size=50, max_len=12, d_model=8, n_layers=2,
                              mixer_options=TINY_OPTIONS.get(name, {}))).double()
    seqs = torch.randint(0, 50, (3, 12))
    rows = model_sparsity(model, seqs, min_row_len=4, jacobian_sequences=2, chunk=32)
    assert all(set(r) <= set(FIELDS) for r in rows)
    jac = [r for r in rows if r["kind"] == "jacobian"]
    att = [r for r in rows if r["kind"] == "attention"]
    assert [r["layer"] for r in jac] == [0, 1] and all(r["head"] == -1 for r in jac)
    assert all(r["rows"] == 2 * (12 - 4 + 1) and r["sequences"] == 2 for r in jac)
    # Each layer's S is its own mixer's, on what that mixer read: from the full Jacobian
    # (jacobian rows), from the attention probabilities (attention rows), rows t ≥ 3.
    h = mixer_inputs(model, seqs)
    for r in jac:
        mixer = model.blocks[r["layer"]].mixer
        assert r["S_mean"] == pytest.approx(mean_row_S(effective_attention_reference(mixer, h[r["layer"]][:2]), 3),
                                            abs=1e-10), r
    if mixers.mixer_class(name).has_scores:
        assert len(att) == 2 * TINY_OPTIONS[name]["n_heads"] and all(r["rows"] == 3 * 9 for r in att)
        for r in att:
            mixer = model.blocks[r["layer"]].mixer
            q, k, _ = mixer._heads(h[r["layer"]])
            logits = (q @ k.transpose(-1, -2) / math.sqrt(mixer.d_head))[:, r["head"]]
            probs = torch.softmax(logits.masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf), -1)
            assert r["S_mean"] == pytest.approx(mean_row_S(probs, 3), abs=1e-10), r
    else:
        assert att == []


def test_jacobian_positions_take_exact_rows_at_fewer_queries():
    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch="grassmann", vocab_size=50, max_len=12, d_model=8, n_layers=1,
                              mixer_options=TINY_OPTIONS.get("grassmann", {})))
    seqs = torch.randint(0, 50, (2, 12))
    full = model_sparsity(model, seqs, min_row_len=4, jacobian_sequences=2, chunk=32)
    some = model_sparsity(model, seqs, min_row_len=4, jacobian_sequences=2, chunk=32, jacobian_positions=3)
    jf = next(r for r in full if r["kind"] == "jacobian")
    js = next(r for r in some if r["kind"] == "jacobian")
    assert jf["rows"] == 2 * 9 and js["rows"] == 2 * 3
    # Positions 3, 7, 11 (evenly over 3..11): one-hot S and row lengths of those rows only.
    assert js["row_len_mean"] == pytest.approx((4 + 8 + 12) / 3)
    assert js["S_onehot_mean"] == pytest.approx(sum(1 / math.sqrt(n) for n in (4, 8, 12)) / 3)


def test_model_sparsity_reads_a_noncausal_pair_classifier():
    # Linformer has no causal form: it is measured on its SNLI encoder, every row over all
    # L positions (no padding in the cropped pairs).
    from seqmix.models.classifier import ClassifierConfig, PairClassifier

    torch.manual_seed(0)
    model = PairClassifier(ClassifierConfig(arch="linformer", vocab_size=50, max_len=10, d_model=8, n_layers=2,
                                            mixer_options=TINY_OPTIONS["linformer"])).double()
    ids = torch.randint(0, 50, (3, 10))
    seg = (torch.arange(10) >= 6).long().expand(3, 10)
    rows = model_sparsity(model, (ids, seg, torch.ones_like(ids, dtype=torch.bool)), min_row_len=4,
                          jacobian_sequences=2, chunk=32)
    jac = [r for r in rows if r["kind"] == "jacobian"]
    assert [r["layer"] for r in jac] == [0, 1]
    assert all(r["rows"] == 2 * 10 and r["row_len_mean"] == 10 and r["seq_len"] == 10 for r in jac)
    # Every row whole (non-causal), on what each layer's mixer read inside the classifier.
    h = mixer_inputs(model, ids, seg, torch.ones_like(ids, dtype=torch.bool))
    for r in jac:
        a = effective_attention_reference(model.blocks[r["layer"]].mixer, h[r["layer"]][:2])
        assert r["S_mean"] == pytest.approx(mean_row_S(a, 0, causal=False), abs=1e-10), r


def test_sparsity_measures_every_architecture_of_the_quick_config():
    import yaml

    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import validate_study
    from tests.conftest import REPO

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    study = validate_study(raw)
    measured = expand(study).sparsity_runs
    assert {r.arch for r in measured} == set(study.architectures)
    tasks = study.analysis.sparsity.tasks
    assert all(r.task in tasks for r in measured if mixers.mixer_class(r.arch).supports_causal)
    # The quick profile trains causal mixers only; with a non-causal one (Linformer) and an
    # encoder task (SNLI) added, the non-causal mixer is measured on its SNLI runs (the
    # fallback task), and only then.
    raw["architectures"] = [*raw["architectures"], "linformer"]
    raw["tasks"]["snli"] = {"train_file": "train_sample_1pct"}
    study = validate_study(raw)
    measured = expand(study).sparsity_runs
    noncausal = {r.arch for r in measured if not mixers.mixer_class(r.arch).supports_causal}
    assert noncausal == {"linformer"} and {(r.task, r.seed) for r in measured if r.arch in noncausal} == {
        ("snli", s) for s in study.seeds}
    without = study.model_copy(update={"analysis": study.analysis.model_copy(update={
        "sparsity": study.analysis.sparsity.model_copy(update={"fallback_task": None})})})
    assert not noncausal & {r.arch for r in expand(without).sparsity_runs}


def test_heldout_pairs_are_cropped_without_padding():
    import numpy as np

    from seqmix.tasks.snli import SNLI

    task = SNLI.__new__(SNLI)  # the collate logic only: arrays and special ids
    task.specials = {"[CLS]": 1, "[SEP]": 2, "[PAD]": 0}
    task.spec = type("Spec", (), {"task": "snli"})()
    premise_lens, hyp_lens = [3, 6, 2, 5], [2, 3, 1, 4]  # rows of 8, 12, 6, 12 tokens
    task.arrays = {"validation": {
        "premise": np.arange(10, 10 + sum(premise_lens)), "premise_offsets": np.cumsum([0, *premise_lens]),
        "hypothesis": np.arange(50, 50 + sum(hyp_lens)), "hypothesis_offsets": np.cumsum([0, *hyp_lens]),
        "labels": np.zeros(4, np.int64)}}
    ids, seg, mask = task.heldout_inputs("validation", num=5, crop_len=10)
    assert ids.shape == (2, 10) and bool(mask.all()) and not bool((ids == 0).any())
    assert ids[0, 0] == 1 and ids[0, 7] == 2  # [CLS] + 6 premise tokens + [SEP] of pair 1
    assert seg[0].tolist() == [0] * 8 + [1] * 2
    with pytest.raises(ValueError, match="crop_len"):
        task.heldout_inputs("validation", num=5, crop_len=13)


def test_row_stats_measures_only_the_scored_rows():
    # Two rows per sequence: one uniform, one one-hot; scoring only the one-hot rows gives
    # S = 1/sqrt(row length) exactly, scoring all rows the mean of both.
    L = 8
    scores = torch.ones(2, 1, L, L, dtype=torch.float64).tril()
    scores[:, 0, 6] = 0.0
    scores[:, 0, 6, 3] = 1.0  # row 6 is one-hot over its 7 visible keys
    scored = torch.zeros(2, L, dtype=torch.bool)
    scored[:, 6] = True
    (only,) = row_stats(scores, causal=True, min_row_len=2, rows=scored)
    assert only["rows"] == 2 and only["S_mean"] == pytest.approx(1 / math.sqrt(7))
    (every,) = row_stats(scores, causal=True, min_row_len=2)
    assert every["rows"] == 2 * (L - 1) and every["S_mean"] > 0.9


def test_model_sparsity_at_scored_rows_computes_only_their_jacobians():
    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch="softmax", vocab_size=50, max_len=12, d_model=8, n_layers=1,
                              mixer_options=TINY_OPTIONS["softmax"]))
    seqs = torch.randint(0, 50, (2, 12))
    scored = torch.zeros(2, 12, dtype=torch.bool)
    scored[0, 9], scored[1, 4], scored[1, 11] = True, True, True
    rows = model_sparsity(model, (seqs,), min_row_len=4, jacobian_sequences=2, chunk=64, rows=scored)
    jac = [r for r in rows if r["kind"] == "jacobian"]
    att = [r for r in rows if r["kind"] == "attention"]
    assert all(r["positions"] == "scored" for r in rows)
    assert all(r["rows"] == 3 for r in jac) and all(r["rows"] == 3 for r in att) and len(att) == 2


def test_effective_attention_with_no_position_asked_is_all_nan():
    # A sequence in which no query row reaches min_row_len asks for no position: the rows
    # stay NaN (not measured) instead of an IndexError from an empty float index.
    from seqmix.analysis.jacobian import effective_attention

    layer = torch.nn.Linear(4, 4)
    out = effective_attention(layer, torch.randn(2, 5, 4), positions=[])
    assert out.shape == (2, 5, 5) and torch.isnan(out).all()


def test_sparsity_csv_has_exactly_its_row_types_columns(tmp_path, monkeypatch):
    # write_sparsity over one run directory, its trained model replaced by a tiny one.
    import csv
    import json
    from types import SimpleNamespace

    from seqmix.analysis.sparsity import SparsityRow, write_sparsity
    from seqmix.io import columns
    from seqmix.study.settings import SparsitySettings
    from seqmix.train import evaluate

    torch.manual_seed(0)
    lm = CausalLM(LMConfig(arch="softmax", vocab_size=50, max_len=12, d_model=8, n_layers=1,
                           mixer_options=TINY_OPTIONS.get("softmax", {})))
    task = SimpleNamespace(heldout_inputs=lambda split, n, crop_len: (torch.randint(0, 50, (n, 12)),),
                           heldout_rows=lambda split, n: None)
    run = SimpleNamespace(task="wikitext2", arch="softmax", seed=0)
    monkeypatch.setattr(evaluate, "load_run", lambda run_dir: (lm, task, run))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"status": "ok"}))
    out = tmp_path / "sparsity.csv"
    spec = SparsitySettings(num_sequences=2, min_row_len=4, jacobian_sequences=1)
    assert write_sparsity([tmp_path / "run"], spec, out) > 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == columns(SparsityRow)
        assert all(v != "" for r in reader for v in r.values())
