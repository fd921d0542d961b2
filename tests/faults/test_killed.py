"""Fault injection, killed jobs: training SIGKILLed after a checkpoint or stopped anywhere,
evaluation and data preparation stopped while they write, each ends like an
uninterrupted run (tests/faults/conftest.py says what that means)."""


from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import yaml

from seqmix.cli import main as cli
from seqmix.io import read_json
from seqmix.tasks import task_class
from seqmix.train import checkpoint, loop
from seqmix.train.evaluate import evaluate_run
from tests.faults.conftest import (
    OUTPUTS,
    Interrupt,
    dies_writing,
    held,
    holding_trainer,
    mqar_config,
    stops_after_checkpoint,
)
from tests.helpers import (
    assert_same_run,
    digest,
    run_spec_in,
)

# ------------------------------------------------------------------------------------------
# Killed: SIGKILL once, at a checkpoint; in process at every other point. The rerun ends
# like an uninterrupted run.
# ------------------------------------------------------------------------------------------

# 3 does not divide 5: a kill between checkpoints leaves a half-filled train-loss window.
KILL_SETTINGS = dict(steps=24, checkpoint_every=5, eval_every=12, log_every=3)


@pytest.fixture(scope="module")
def uninterrupted(study, tmp_path_factory) -> Path:
    """The run of KILL_SETTINGS trained in one go: what every interrupted one must end as."""
    spec = run_spec_in(study, tmp_path_factory.mktemp("uninterrupted"), **KILL_SETTINGS)
    loop.train(spec, progress=False)
    return Path(spec.run_dir)


def test_training_sigkilled_after_a_checkpoint_resumes_and_ends_like_an_uninterrupted_run(study, tmp_path,
                                                                                       uninterrupted, capsys):
    # A real process, really killed: its lock and its open files die with it. It holds
    # after its third checkpoint (step 15) until the kill, so the kill lands mid-training
    # whatever the machine's load.
    spec = run_spec_in(study, tmp_path, **KILL_SETTINGS)
    run_dir, marker = Path(spec.run_dir), tmp_path / "held"
    proc = holding_trainer(spec, marker, after=3)
    try:
        step = held(proc, marker)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and step == 15
    assert not (run_dir / "metrics.json").exists()
    assert torch.load(run_dir / loop.CHECKPOINT, weights_only=True)["state"]["step"] == step
    capsys.readouterr()
    loop.train(spec, progress=False)
    assert f"resuming {run_dir} from step {step}" in capsys.readouterr().err
    assert read_json(run_dir / "metrics.json")["resumed_from_steps"] == [step]
    assert_same_run(run_dir, uninterrupted)


def stop_at_step(monkeypatch, step: int) -> None:
    """Stop training before it takes step ``step + 1``."""
    step_once = loop.train_step

    def step_or_stop(run):
        if run.state.step == step:
            raise Interrupt
        return step_once(run)

    monkeypatch.setattr(loop, "train_step", step_or_stop)


# Where a kill can land (checkpoints at steps 5, 10, 15, 20; final.pt after step 24), each
# an event: how to stop there, and the step the rerun resumes from (24: from final.pt).
STOPS = {
    "after checkpoint 2": (lambda mp: stops_after_checkpoint(mp, times=2), [10]),
    "between checkpoints (before step 14)": (lambda mp: stop_at_step(mp, 13), [10]),
    "while writing checkpoint 3": (lambda mp: dies_writing(mp, checkpoint, "last.pt", nth=3), [10]),
    "while writing checkpoints/final.pt": (lambda mp: dies_writing(mp, checkpoint, "final.pt"), [20]),
    "while writing its results (metrics.json)": (lambda mp: dies_writing(mp, loop, "metrics.json"), [24]),
}


@pytest.mark.parametrize("where", list(STOPS))
def test_training_stopped_anywhere_resumes_and_ends_like_an_uninterrupted_run(study, tmp_path, uninterrupted,
                                                                               monkeypatch, where):
    spec = run_spec_in(study, tmp_path, **KILL_SETTINGS)
    run_dir = Path(spec.run_dir)
    stop, resumed_from = STOPS[where]
    stop(monkeypatch)
    with pytest.raises(Interrupt):
        loop.train(spec, progress=False)
    monkeypatch.undo()
    assert not (run_dir / "metrics.json").exists()
    loop.train(spec, progress=False)
    assert read_json(run_dir / "metrics.json")["resumed_from_steps"] == resumed_from
    assert not list(run_dir.rglob("*.tmp")), "the rerun left what the killed writer left"
    assert_same_run(run_dir, uninterrupted)


def test_results_deleted_after_a_finished_run_are_written_again_without_training(study, tmp_path, uninterrupted,
                                                                                 monkeypatch, capsys):
    # Killed after its results are written (before the process exits), Snakemake sees a
    # failed job, deletes its outputs and reruns it: the rerun writes the same results from
    # checkpoints/final.pt instead of training again.
    spec = run_spec_in(study, tmp_path, **KILL_SETTINGS)
    run_dir = Path(spec.run_dir)
    loop.train(spec, progress=False)
    for name in OUTPUTS:
        (run_dir / name).unlink()
    monkeypatch.setattr(loop, "train_step", lambda run: pytest.fail("the rerun trained"))
    capsys.readouterr()
    loop.train(spec, progress=False)
    assert (f"{run_dir} finished at step 24 (checkpoints/final.pt): writing its results again without training"
            in capsys.readouterr().err)
    assert_same_run(run_dir, uninterrupted)


def test_evaluation_stopped_while_it_scores_ends_like_an_uninterrupted_one(study, tmp_path, monkeypatch):
    spec = run_spec_in(study, tmp_path, steps=6)
    loop.train(spec, progress=False)
    run_dir = Path(spec.run_dir)
    clean = evaluate_run(run_dir, device="cpu")
    (run_dir / "eval.json").unlink()
    task = task_class("mqar")
    score, scored = task.evaluate, []

    def score_then_stop(self, model, split, *args, **kwargs):
        scored.append(split)
        if len(scored) == 2:  # the eval split done, the test split begun
            raise Interrupt
        return score(self, model, split, *args, **kwargs)

    monkeypatch.setattr(task, "evaluate", score_then_stop)
    with pytest.raises(Interrupt):
        evaluate_run(run_dir, device="cpu")
    monkeypatch.undo()
    assert not (run_dir / "eval.json").exists()
    again = evaluate_run(run_dir, device="cpu")
    assert read_json(run_dir / "eval.json") == again
    assert {k: v for k, v in again.items() if k != "eval_time_s"} == {k: v for k, v in clean.items() if k != "eval_time_s"}


def test_data_preparation_killed_while_writing_ends_like_an_uninterrupted_one(tmp_path, monkeypatch):
    from seqmix.data import mqar as mqar_data

    files = ("train.npz", "validation.npz", "test.npz")
    made = {}
    for name in ("clean", "killed"):
        cfg = mqar_config(tmp_path)
        cfg["data"]["dir"] = str(tmp_path / name)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        args = ["data", "mqar", "--config", str(tmp_path / f"{name}.yaml")]
        if name == "killed":
            dies_writing(monkeypatch, mqar_data, "validation.npz")  # train.npz written, then killed
            with pytest.raises(Interrupt):
                cli(args)
            monkeypatch.undo()
            out = tmp_path / name / "mqar"
            assert (out / "train.npz").exists() and list(out.glob(".validation.npz.*.tmp"))
            (out / "manifest.json").unlink(missing_ok=True)  # as Snakemake does with a failed job's output
        assert cli(args) == 0
        out = tmp_path / name / "mqar"
        assert not list(out.glob(".*.tmp")), "the temporary file of the killed writer was left"
        made[name] = {f: digest(out / f) for f in files} | {"manifest": read_json(out / "manifest.json")}
    assert made["killed"] == made["clean"]


