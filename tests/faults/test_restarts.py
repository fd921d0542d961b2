"""Fault injection, restarts: over a checkpoint of other settings or a bad one, the
train-loss window across a resume, and one process per run directory (the atomic
writer under two processes)."""


from __future__ import annotations

import csv
import socket
from pathlib import Path

import pytest
import torch

from seqmix.cli import main as cli
from seqmix.io import read_json, write_json
from seqmix.train import checkpoint, loop
from tests.faults.conftest import (
    OUTPUTS,
    damaged,
    held,
    holding_trainer,
    stop_after_checkpoint,
)
from tests.helpers import (
    assert_same_run,
    digest,
    log_rows,
    run_spec_in,
)

# ------------------------------------------------------------------------------------------
# Restarts: other settings, a corrupt checkpoint, the train-loss window, train_loss_last.
# ------------------------------------------------------------------------------------------


def test_a_restart_over_a_checkpoint_of_other_settings_equals_a_fresh_run(study, tmp_path, monkeypatch, capsys):
    other = run_spec_in(study, tmp_path / "shared", lr=1e-2)
    stop_after_checkpoint(monkeypatch, other)
    mine = run_spec_in(study, tmp_path / "shared", lr=3e-3)
    loop.train(mine, progress=False)
    assert f"ignoring {Path(mine.run_dir) / loop.CHECKPOINT}: written with other settings or other code" in capsys.readouterr().err
    fresh = run_spec_in(study, tmp_path / "fresh", lr=3e-3)
    loop.train(fresh, progress=False)
    assert_same_run(Path(mine.run_dir), Path(fresh.run_dir))


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "not a checkpoint"])
def test_a_bad_last_checkpoint_is_moved_aside_and_the_run_starts_afresh(study, tmp_path, monkeypatch, capsys, damage):
    spec = run_spec_in(study, tmp_path / "bad")
    stop_after_checkpoint(monkeypatch, spec)
    ckpt = Path(spec.run_dir) / loop.CHECKPOINT
    if damage == "not a checkpoint":
        checkpoint.save_atomic({"weights": torch.zeros(1)}, ckpt)
    else:
        damaged(ckpt, damage)
    capsys.readouterr()
    loop.train(spec, progress=False)  # the rerun does not fail (nor would every later one)
    err = capsys.readouterr().err
    reason = ("is not a seqmix checkpoint: it lacks identity" if damage == "not a checkpoint"
              else "cannot be read: it is truncated or corrupted (")
    assert f"warning: {ckpt} {reason}" in err and "moved it to" in err and "not resuming from it" in err
    assert len(list(ckpt.parent.glob("last.pt.bad-*"))) == 1, "the bad checkpoint is kept aside for inspection"
    fresh = run_spec_in(study, tmp_path / "fresh")
    loop.train(fresh, progress=False)
    assert_same_run(Path(spec.run_dir), Path(fresh.run_dir))


def test_a_bad_final_checkpoint_trains_the_run_again(study, tmp_path, capsys):
    spec = run_spec_in(study, tmp_path)
    loop.train(spec, progress=False)
    run_dir = Path(spec.run_dir)
    before = digest(run_dir / "model.pt")
    damaged(run_dir / loop.FINAL, "corrupted")
    for name in OUTPUTS:
        (run_dir / name).unlink()
    capsys.readouterr()
    loop.train(spec, progress=False)
    assert f"warning: {run_dir / loop.FINAL} cannot be read" in capsys.readouterr().err
    assert digest(run_dir / "model.pt") == before


def test_the_train_loss_window_survives_a_resume(study, tmp_path, monkeypatch):
    settings = dict(steps=12, log_every=4, checkpoint_every=6, eval_every=12)  # 4 does not divide 6
    resumed = run_spec_in(study, tmp_path / "resumed", **settings)
    stop_after_checkpoint(monkeypatch, resumed)
    loop.train(resumed, progress=False)
    clean = run_spec_in(study, tmp_path / "clean", **settings)
    loop.train(clean, progress=False)
    assert read_json(Path(resumed.run_dir) / "metrics.json")["resumed_from_steps"] == [6]
    assert log_rows(Path(resumed.run_dir)) == log_rows(Path(clean.run_dir))  # the row at step 8 averages 4 losses


def test_train_loss_last_is_the_last_train_loss_not_an_evaluation(study, tmp_path):
    spec = run_spec_in(study, tmp_path, steps=6, log_every=2, eval_every=3)  # step 6 logs train, then eval
    metrics = loop.train(spec, progress=False)
    rows = list(csv.DictReader(open(Path(spec.run_dir) / "log.csv")))
    assert rows[-1]["phase"] == "eval"
    last_train = [r for r in rows if r["phase"] == "train"][-1]
    assert metrics["train_loss_last"] == pytest.approx(float(last_train["loss"]), rel=1e-12)
    assert metrics["train_loss_last"] != metrics["last_eval"]["loss"]


# ------------------------------------------------------------------------------------------
# One process per run directory; the atomic writer under two processes.
# ------------------------------------------------------------------------------------------


def test_a_second_trainer_on_a_busy_run_directory_fails_at_once(study, tmp_path, capsys):
    first = run_spec_in(study, tmp_path, lr=3e-3)
    second = run_spec_in(study, tmp_path, lr=1e-3)
    run_dir = Path(first.run_dir)
    a = holding_trainer(first, tmp_path / "held")  # it holds the run directory, past its first checkpoint
    try:
        held(a, tmp_path / "held")
        before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "checkpoints"}
        capsys.readouterr()
        status = cli(["train", "--quiet", "--spec", second.model_dump_json()])
        assert a.poll() is None, a.stderr.read()
    finally:
        a.kill()
        a.wait()
    assert status == 4
    assert capsys.readouterr().err.strip() == (
        f"error: run directory {run_dir} is in use by process {a.pid} on {socket.gethostname()} "
        f"(lock {run_dir / loop.LOCK}); wait for it to finish, or stop that process and rerun")
    # The second trainer wrote nothing: every file is the first one's, and no metrics.json.
    after = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "checkpoints"}
    assert after == before and "metrics.json" not in after
    assert read_json(run_dir / "config.json")["spec_hash"] == loop.spec_hash(first)


def _hammer(path: str, writer: int, count: int, queue) -> None:
    """Write and read one JSON file ``count`` times; report the errors met."""
    errors = []
    for i in range(count):
        try:
            write_json(path, {"writer": writer, "i": i, "pad": "x" * 2000})
            got = read_json(path)
            assert set(got) == {"writer", "i", "pad"}
        except Exception as e:  # noqa: BLE001 - counted, not raised: the test reports them all
            errors.append(f"{type(e).__name__}: {e}")
    queue.put(errors)


def test_the_atomic_writer_under_two_process_stress(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    path = str(tmp_path / "metrics.json")
    procs = [ctx.Process(target=_hammer, args=(path, k, 1500, queue)) for k in range(2)]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in queue.get(timeout=300)]
    for p in procs:
        p.join()
    assert errors == [], f"{len(errors)} errors in 3,000 writes, e.g. {errors[:3]}"
    assert not list(tmp_path.glob(".*.tmp"))


