"""Training runs: outputs, resume after a kill, divergence, budgets, evaluation."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seqmix.config import validate_config
from seqmix.models.budget import solve_budget
from seqmix.study import run_spec
from seqmix.train.evaluate import evaluate_run
from seqmix.train.loop import LOG_FIELDS, train

TIME_FIELDS = {"wall_time_s", "resumed_from_steps"}


def spec_for(prepared: dict, task: str, arch: str, root: Path, **train_overrides):
    cfg = copy.deepcopy(prepared)
    cfg["results_dir"] = str(root)
    cfg["tasks"][task]["train"].update(train_overrides)
    return run_spec(validate_config(cfg), task, arch, 0)


@pytest.mark.parametrize("task", ["mqar", "wikitext2", "snli"])
def test_a_run_writes_its_results(prepared, tmp_path, task):
    spec = spec_for(prepared, task, "grassmann", tmp_path)
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
    split = "validation"
    assert ev["splits"][split][metrics["metric"]] is not None
    assert set(ev["splits"]) == {split, "test"}


def _run_cli(spec: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "seqmix", "train", "--quiet", "--spec", spec.model_dump_json()],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_run_resumes_and_ends_like_an_uninterrupted_one(prepared, tmp_path):
    # Long enough to be killed after its first checkpoint and before its end.
    settings = dict(steps=400, checkpoint_every=20, eval_every=100, log_every=20)
    killed = spec_for(prepared, "mqar", "softmax", tmp_path / "killed", **settings)
    clean = spec_for(prepared, "mqar", "softmax", tmp_path / "clean", **settings)
    ckpt = Path(killed.run_dir) / "checkpoints" / "last.pt"

    proc = _run_cli(killed)
    deadline = time.time() + 120
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert ckpt.exists() and not (Path(killed.run_dir) / "metrics.json").exists()
    saved_step = torch.load(ckpt, weights_only=True)["state"]["step"]

    resumed = _run_cli(killed)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"resuming {killed.run_dir} from step {saved_step}" in err
    uninterrupted = _run_cli(clean)
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err

    a = json.loads((Path(killed.run_dir) / "metrics.json").read_text())
    b = json.loads((Path(clean.run_dir) / "metrics.json").read_text())
    assert a["resumed_from_steps"] == [saved_step] and b["resumed_from_steps"] == []
    strip = lambda m: {k: v for k, v in m.items() if k not in TIME_FIELDS}  # noqa: E731
    assert strip(a) == strip(b)
    wa = torch.load(Path(killed.run_dir) / "model.pt", weights_only=True)["model"]
    wb = torch.load(Path(clean.run_dir) / "model.pt", weights_only=True)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_diverging_run_is_recorded_and_exits_cleanly(prepared, tmp_path):
    spec = spec_for(prepared, "mqar", "softmax", tmp_path, lr=1e6, grad_clip=0.0, steps=40, warmup_steps=0)
    proc = _run_cli(spec)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    m = json.loads((Path(spec.run_dir) / "metrics.json").read_text())
    assert m["status"] == "diverged" and m["diverged_at_step"] is not None
    assert "recording the run as diverged" in err
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
