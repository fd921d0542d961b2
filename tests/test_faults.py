"""Fault injection (issue 15): what a job does when it is killed, when a file it reads is
missing, truncated or corrupted, when the disk is full or read-only, and when two trainers
share a run directory (config paths that hold shell metacharacters and a task whose every
run diverges, through the real DAG: tests/test_dag.py). Each test names the guarantee it keeps.

MQAR (synthetic) everywhere the mirror is not the point, so that the module runs without
one. Kills happen at events, never at moments: one training process is SIGKILLed once it
has saved a checkpoint (it holds there until killed: tests/harness/train.py); every other
interruption is an exception raised in this process at a chosen point (a step, a checkpoint,
a result file being written), with what a killed writer leaves behind put there. "Ends like
an uninterrupted run" means: model.pt byte for byte, log.csv and metrics.json equal except
wall-clock fields.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from seqmix import io as seqmix_io
from seqmix.cli import main as cli
from seqmix.data.manifest import DataError, read_manifest, write_manifest
from seqmix.data.raw import RAW_FILES, mirror_file, resolve_source
from seqmix.expansion.table import expand
from seqmix.expansion.validate import ConfigError, validate_study
from seqmix.io import FileError, read_json, write_json
from seqmix.study.settings import MIRROR_ENV, DataSettings
from seqmix.tasks import task_class
from seqmix.train import checkpoint, loop
from seqmix.train.evaluate import evaluate_run

from .conftest import skip_or_fail, tiny_config
from .helpers import HARNESS, REPO, assert_same_run, digest, log_rows, run_spec_in, wait_until_held

REQUIRE_NAMESPACE_ENV = "SEQMIX_REQUIRE_NAMESPACE"  # CI sets it: a real full disk must be tested there
OUTPUTS = ("metrics.json", "model.pt", "log.csv", "provenance.json", "config.json")  # the train rule's
HOLDING_TRAINER = HARNESS / "train.py"


# ------------------------------------------------------------------------------------------
# Helpers: a tiny MQAR study, its runs, and ways to compare and to break them.
# ------------------------------------------------------------------------------------------


def mqar_config(root: Path, **train) -> dict:
    """A one-task MQAR study in ``root`` (dropout on, so that the dropout stream matters), native:
    its runs trained in this process, which imported torch before it could pin the libraries,
    are compared with `python -m seqmix` runs, which pin them under portable."""
    cfg = tiny_config(root, None, archs=("softmax",))
    cfg["numerics"] = "native"
    cfg["tasks"]["mqar"]["model"]["dropout"] = 0.1
    cfg["tasks"]["mqar"]["train"].update(train)
    return cfg


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    """The MQAR config with its data prepared once for the module."""
    root = tmp_path_factory.mktemp("faults")
    cfg = mqar_config(root)
    job = expand(validate_study(cfg)).data_job("mqar")
    task_class(job.kind).prepare(job)
    return cfg


def damaged(path: Path, how: str) -> None:
    """Delete ``path``, cut it in half, or flip one byte of its content (for a zip archive:
    in its largest member's data, where a reader that skips the CRC-32 would load it)."""
    data = bytearray(path.read_bytes())
    if how == "missing":
        path.unlink()
        return
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
        return
    at = len(data) // 2
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            member = max(z.infolist(), key=lambda i: i.compress_size)
        off = member.header_offset  # local header: 30 bytes, then the name and the extra field
        start = off + 30 + int.from_bytes(data[off + 26 : off + 28], "little") + int.from_bytes(data[off + 28 : off + 30], "little")
        at = start + member.compress_size // 2
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


class Interrupt(BaseException):
    """Raised by a test to stop a run in process at a chosen point, as a kill would: not an
    Exception, so that nothing on its way out handles it as a failure of the run."""


def stops_after_checkpoint(monkeypatch, times: int = 1) -> None:
    """Training stops once it has written its ``times``-th checkpoint."""
    save, saved = loop.save_checkpoint, []

    def save_then_stop(run):
        save(run)
        saved.append(run.state.step)
        if len(saved) == times:
            raise Interrupt

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)


def stop_after_checkpoint(monkeypatch, spec, times: int = 1) -> None:
    """Train ``spec`` until it has written its ``times``-th checkpoint, then stop it there."""
    with monkeypatch.context() as m:
        stops_after_checkpoint(m, times)
        with pytest.raises(Interrupt):
            loop.train(spec, progress=False)


def dies_writing(monkeypatch, module, name: str, nth: int = 1) -> None:
    """The ``nth`` time ``module`` writes a file named ``name`` (through its ``atomic_file``,
    or its ``write_json``), the writer dies: its temporary file is left half written beside
    the file, as a SIGKILL leaves it (no cleanup runs), and Interrupt is raised. Every other
    write goes through."""
    seen = []

    def dies_here(path) -> bool:
        if Path(path).name != name:
            return False
        seen.append(path)
        if len(seen) < nth:
            return False
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        seqmix_io.new_temp(Path(path)).write_bytes(b"half a file")
        raise Interrupt

    if hasattr(module, "atomic_file"):
        real_file = module.atomic_file

        @contextlib.contextmanager
        def atomic_file(path, mode="wb"):
            dies_here(path)
            with real_file(path, mode) as f:
                yield f

        monkeypatch.setattr(module, "atomic_file", atomic_file)
    if hasattr(module, "write_json"):
        real_json = module.write_json
        monkeypatch.setattr(module, "write_json", lambda path, *a, **kw: dies_here(path) or real_json(path, *a, **kw))


def seqmix_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "seqmix", *args]


def run_cmd(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def holding_trainer(spec, marker: Path, after: int = 1) -> subprocess.Popen:
    """`python -m seqmix train` on ``spec`` that holds once it has saved its ``after``-th
    checkpoint, having written ``marker``; the caller waits for it (``held``) and kills it."""
    env = {**os.environ, "SEQMIX_TEST_HOLD": str(marker), "SEQMIX_TEST_HOLD_AFTER": str(after)}
    return subprocess.Popen([sys.executable, str(HOLDING_TRAINER), "train", "--quiet", "--spec", spec.model_dump_json()],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def held(proc: subprocess.Popen, marker: Path) -> int:
    """The step at which ``proc`` holds, once it has written ``marker`` (it fails the test if
    the process ends instead)."""
    wait_until_held(proc, marker, "the trainer")
    return int(marker.read_text())


def namespace_available() -> bool:
    """Whether `unshare -rm` can give a test a private mount namespace (user namespaces:
    no root needed), where it may mount a tmpfs or a read-only bind."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def in_namespace(mounts: str, cmd: list[str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` after the shell commands ``mounts`` in a private mount namespace."""
    return run_cmd(["unshare", "-rm", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd])


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


# ------------------------------------------------------------------------------------------
# Failed writes: temp files removed, a full disk and a read-only directory named.
# ------------------------------------------------------------------------------------------


def test_a_failed_checkpoint_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def half_then_fail(obj, f):
        if isinstance(f, (str, os.PathLike)):
            Path(f).write_bytes(b"half a checkpoint")
        else:
            f.write(b"half a checkpoint")
        raise RuntimeError("the writer failed")

    monkeypatch.setattr(checkpoint.torch, "save", half_then_fail)
    with pytest.raises(RuntimeError, match="the writer failed"):
        checkpoint.save_atomic({"x": 1}, tmp_path / "checkpoints" / "last.pt")
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_temporary_files_of_killed_writers_are_removed_by_the_next_run(study, tmp_path):
    spec = run_spec_in(study, tmp_path)
    run_dir = Path(spec.run_dir)
    stale = [run_dir / ".metrics.json.k1ll3d.tmp", run_dir / "checkpoints" / ".last.pt.k1ll3d.tmp"]
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"left by a SIGKILL")
    loop.train(spec, progress=False)
    assert not any(p.exists() for p in stale)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["final.pt"]


# The one line a full disk prints (seqmix.io.write_failure): the file, what the file system
# has left, and the fix.
DISK_FULL = re.compile(
    r"error: cannot write (?P<file>\S+): disk full \(no space left on device\): "
    r"(it stopped after [\d.]+ (bytes|KiB|MiB|GiB) of this file; )?"
    r"(?P<free>[\d.]+ (bytes|KiB|MiB|GiB|TiB)) free on (?P<mount>\S+) \(of [\d.]+ (bytes|KiB|MiB|GiB|TiB)\); "
    r"free space on that file system, or point results_dir / data.dir at another one")


TORCH_SAVE = torch.save  # the real one, whatever a test patches


class FullDisk:
    """A file that takes ``room`` more bytes, then fails as a full disk does: the bytes that
    fit are written, then OSError(ENOSPC)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        data = bytes(data)
        fits = data[: self.room]
        self.f.write(fits)
        self.room -= len(fits)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def flush(self) -> None:
        self.f.flush()


def torch_save_into(room: int, seen: list):
    """A torch.save that writes into a disk with ``room`` bytes left (the real torch.save,
    so torch's own wrapping of the error happens); what it raised is appended to ``seen``."""
    def save_into_full_disk(obj, f):
        try:
            TORCH_SAVE(obj, FullDisk(f, room))
        except Exception as e:
            seen.append(e)
            raise
    return save_into_full_disk


@pytest.mark.parametrize("how", ["OSError", "RuntimeError chained to it (torch)"])
def test_a_full_disk_names_the_file_and_says_disk_full(study, tmp_path, monkeypatch, capsys, how):
    # Simulated: the first torch.save meets ENOSPC at once, or after 2000 bytes, where torch
    # raises "enforce fail at inline_container.cc ... unexpected pos" with the OSError as its
    # context (the real disk below needs a mount namespace).
    def no_space(obj, f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    seen = []
    monkeypatch.setattr(checkpoint.torch, "save", no_space if how == "OSError" else torch_save_into(2000, seen))
    spec = run_spec_in(study, tmp_path)
    assert cli(["train", "--quiet", "--spec", spec.model_dump_json()]) == 4
    ckpt = Path(spec.run_dir) / loop.CHECKPOINT
    err = capsys.readouterr().err
    line = DISK_FULL.fullmatch(err.rstrip("\n"))
    assert line and line["file"] == str(ckpt) and err.count("\n") == 1, err
    assert not list(ckpt.parent.glob(".*.tmp"))
    if how != "OSError":
        assert isinstance(seen[0], RuntimeError) and "inline_container" in str(seen[0]), seen


def test_a_full_disk_anywhere_in_torchs_writer_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    obj = {"model": torch.nn.Linear(16, 64).state_dict(), "step": 3}
    path = tmp_path / "checkpoints" / "last.pt"
    raised = {}
    for room in (0, 40, 64, 500, 2000, 4100):  # inside the header, data.pkl and the tensor records
        seen = []
        monkeypatch.setattr(checkpoint.torch, "save", torch_save_into(room, seen))
        with pytest.raises(FileError) as e:
            checkpoint.save_atomic(obj, path)
        assert DISK_FULL.fullmatch(f"error: {e.value}") and str(path) in str(e.value), e.value
        assert not path.parent.exists() or list(path.parent.iterdir()) == [], "a partial file was left"
        raised[room] = type(seen[0]).__name__
    # The test means something only while torch wraps the error at some of these sizes.
    assert "RuntimeError" in raised.values(), f"torch raised {raised}: choose sizes where it wraps ENOSPC"


@pytest.mark.parametrize("error, why", [
    # torch writing to a path itself (C++): no errno at all; the space left decides
    (RuntimeError("[enforce fail at inline_container.cc:588] . PytorchStreamWriter failed writing file data/0: "
                  "file write failed"), "disk full (no space left on device)"),
    # tokenizers (Rust) and other libraries that keep only the text of the OSError
    (Exception("No space left on device (os error 28)"), "disk full (no space left on device)"),
    (ValueError("could not save: [Errno 122] Disk quota exceeded"), "disk quota exceeded"),
])
def test_a_full_disk_behind_another_exception_is_recognised(tmp_path, monkeypatch, error, why):
    monkeypatch.setattr(seqmix_io, "free_bytes", lambda path: 4096)  # as a full disk has left
    path = tmp_path / "out.bin"
    with pytest.raises(FileError) as e:
        with seqmix_io.atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise error
    assert str(e.value).startswith(f"cannot write {path}: {why}") and e.value.__cause__ is error
    assert list(tmp_path.iterdir()) == []


def test_a_torch_write_failure_with_room_left_is_not_called_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(seqmix_io, "free_bytes", lambda path: 10 << 30)
    error = RuntimeError("[enforce fail at inline_container.cc:588] . PytorchStreamWriter failed writing file")
    with pytest.raises(RuntimeError) as e:
        with seqmix_io.atomic_path(tmp_path / "out.bin"):
            raise error
    assert e.value is error and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def namespace() -> None:
    """A private mount namespace for a real small file system; skipped on a developer's
    machine without one, failed in CI ($SEQMIX_REQUIRE_NAMESPACE=1)."""
    if not namespace_available():
        skip_or_fail("no mount namespace here (`unshare -rm` fails): the simulated full-disk tests cover "
                     "the writers, not a real file system", REQUIRE_NAMESPACE_ENV, "a real full disk")


def on_full_tmpfs(mount: Path, free_kb: int, cmd: list[str], keep: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` with an 8 MiB tmpfs on ``mount`` filled to ``free_kb`` KiB free; what it
    left there is copied to ``keep`` (the tmpfs goes with the namespace)."""
    mount.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True)
    fill = (f"mount -t tmpfs -o size=8m tmpfs '{mount}' && avail=$(df -k --output=avail '{mount}' | tail -1) && "
            f"fallocate -l $((avail - {free_kb}))K '{mount}/.filler'")
    return in_namespace(fill, ["sh", "-c", 'keep=$1; shift; "$@"; code=$?; rm "$0/.filler"; cp -a "$0/." "$keep"; '
                               'exit $code', str(mount), str(keep), *cmd])


def unreadable_files(directory: Path) -> list[str]:
    """Files under ``directory`` a rerun could be misled by: temporary files, and results or
    checkpoints that do not read back whole."""
    bad = []
    for p in sorted(directory.rglob("*")):
        try:
            if p.name.endswith(".tmp"):
                bad.append(f"{p.name}: a temporary file")
            elif p.suffix == ".pt":
                checkpoint.load(p)
            elif p.suffix == ".json":
                read_json(p)
            elif p.suffix == ".csv":
                list(csv.DictReader(open(p)))
        except Exception as e:  # noqa: BLE001 - reported, with every other bad file
            bad.append(f"{p.name}: {e}")
    return bad


FREE_KB = (0, 4, 12, 20, 60, 100, 150, 250)  # issue 27's levels, and those of the tiny run's first writes


def test_training_on_a_full_tmpfs_ends_in_one_clear_error_and_a_rerun_like_a_clean_run(study, tmp_path, namespace):
    clean = run_spec_in(study, tmp_path / "clean")
    loop.train(clean, progress=False)
    outcome = {}
    for kb in FREE_KB:
        mount = tmp_path / f"free{kb}"
        spec = run_spec_in(study, mount / "results")
        proc = on_full_tmpfs(mount, kb, seqmix_cmd("train", "--quiet", "--spec", spec.model_dump_json()),
                             tmp_path / f"left{kb}")
        left = tmp_path / f"left{kb}"
        where = f"{kb} KiB free: rc {proc.returncode}, {proc.stderr!r}"
        assert proc.returncode in (0, 4), where
        if proc.returncode == 4:
            line = DISK_FULL.fullmatch(proc.stderr.rstrip("\n"))
            assert line and proc.stderr.count("\n") == 1 and line["mount"] == str(mount), where
            named = Path(line["file"])
            if named.name != loop.LOCK:  # the final name never holds half a file
                assert not (left / named.relative_to(mount)).exists(), where
            outcome[kb] = named.name
        else:
            assert "error" not in proc.stderr and "Traceback" not in proc.stderr, where
            outcome[kb] = "ok"
        assert unreadable_files(left) == [], where
        # Space freed: the rerun takes what was left and ends like a clean run.
        shutil.copytree(left, mount, dirs_exist_ok=True)
        loop.train(spec, progress=False)
        assert_same_run(Path(spec.run_dir), Path(clean.run_dir))
    # The levels reach inside torch's checkpoint writer and past the run's end; else resize.
    assert any(name.endswith(".pt") for name in outcome.values()) and "ok" in outcome.values(), outcome


@pytest.mark.parametrize("writer", ["data preparation (numpy)", "concat (pandas)"])
def test_other_writers_on_a_full_tmpfs_end_in_one_clear_error(tmp_path, namespace, writer):
    mount, left = tmp_path / "small", tmp_path / "left"
    if writer.startswith("data"):
        cfg = mqar_config(tmp_path)
        cfg["data"]["dir"] = str(mount / "data")
        cfg["tasks"]["mqar"].update(num_train=10_000, num_test=1000)  # train.npz: 2.4 MiB
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
        cmd, named, kb = seqmix_cmd("data", "mqar", "--config", str(tmp_path / "c.yaml")), mount / "data" / "mqar" / "train.npz", 250
    else:
        table = tmp_path / "table.csv"
        table.write_text("a,b\n" + "".join(f"{i},{i / 7}\n" for i in range(20_000)))  # 0.5 MiB
        cmd, named, kb = seqmix_cmd("concat", str(table), str(table), "--out", str(mount / "all.csv")), mount / "all.csv", 100
    proc = on_full_tmpfs(mount, kb, cmd, left)
    assert proc.returncode == 4, proc.stderr
    line = DISK_FULL.fullmatch(proc.stderr.rstrip("\n"))
    assert line and line["file"] == str(named) and line["mount"] == str(mount), proc.stderr
    assert sorted(p.name for p in left.rglob("*") if p.is_file()) == ([".prepare.lock"] if writer.startswith("data") else [])


# ------------------------------------------------------------------------------------------
# Results are written with the mode the user's umask gives any file (not mkstemp's 0600).
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_results_have_the_mode_the_umask_gives(study, tmp_path, umask):
    old = os.umask(umask)
    try:
        spec = run_spec_in(study, tmp_path / "results")
        loop.train(spec, progress=False)
        evaluate_run(Path(spec.run_dir), device="cpu")
        cfg = mqar_config(tmp_path)
        job = expand(validate_study(cfg)).data_job("mqar")
        task_class(job.kind).prepare(job)
        with seqmix_io.exclusive_lock(tmp_path / "data" / "mqar" / ".prepare.lock", "data"):
            pass
        seqmix_io.write_csv(tmp_path / "results" / "summary" / "runs.csv", [{"a": 1}], ["a"])
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): (p.stat().st_mode & 0o777, p.is_dir()) for p in tmp_path.rglob("*")}
    wrong = {p: oct(m) for p, (m, is_dir) in modes.items() if m != (0o777 if is_dir else 0o666) & ~umask}
    assert wrong == {}, f"under umask {umask:03o}: {wrong}"
    assert {"model.pt", "metrics.json", "eval.json", "runs.csv", "manifest.json", "train.npz", "train.lock"} <= {
        Path(p).name for p in modes}


def read_only(directory: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` with ``directory`` read-only: a read-only bind mount in a private mount
    namespace, or (without one) chmod for a user other than root."""
    if namespace_available():
        return in_namespace(f"mount --bind {directory} {directory} && mount -o remount,bind,ro {directory}", cmd)
    if os.geteuid() == 0:
        skip_or_fail("root ignores file modes and no mount namespace is available", REQUIRE_NAMESPACE_ENV)
    directory.chmod(0o555)
    try:
        return run_cmd(cmd)
    finally:
        directory.chmod(0o755)


def test_a_read_only_results_directory_is_named(study, tmp_path):
    spec = run_spec_in(study, tmp_path / "results")
    (tmp_path / "results").mkdir()
    proc = read_only(tmp_path / "results", seqmix_cmd("train", "--quiet", "--spec", spec.model_dump_json()))
    assert proc.returncode == 4
    why = "read-only file system" if namespace_available() else "permission denied"
    assert proc.stderr.startswith(f"error: cannot write {Path(spec.run_dir) / loop.LOCK}: {why}; "), proc.stderr


def test_a_read_only_data_directory_is_named(tmp_path):
    cfg = mqar_config(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "data").mkdir()
    proc = read_only(tmp_path / "data", seqmix_cmd("data", "mqar", "--config", str(tmp_path / "c.yaml")))
    assert proc.returncode == 4
    why = "read-only file system" if namespace_available() else "permission denied"
    assert proc.stderr.startswith(f"error: cannot write {tmp_path / 'data' / 'mqar' / '.prepare.lock'}: {why}; "), proc.stderr


# ------------------------------------------------------------------------------------------
# Missing, truncated and corrupted files of each kind: the exact error.
# ------------------------------------------------------------------------------------------


@pytest.fixture
def prepared_copy(study, tmp_path) -> Path:
    """A private copy of the module's prepared MQAR data directory."""
    src = Path(study["data"]["dir"]) / "mqar"
    dst = tmp_path / "data" / "mqar"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_raw_data_of_the_mirror(tmp_path, monkeypatch, how):
    # A stand-in for the official file, registered with its own digest: intact, it passes.
    key, good = ("wikitext2", "validation"), b" = Homarus gammarus = \n" * 1000
    raw = dataclasses.replace(RAW_FILES[key], sha256=hashlib.sha256(good).hexdigest())
    monkeypatch.setitem(RAW_FILES, key, raw)
    mirror = tmp_path / "mirror"
    target = mirror / raw.paths[0]
    target.parent.mkdir(parents=True)
    target.write_bytes(good)
    source = resolve_source(DataSettings(mirror=str(mirror), source="mirror"))
    assert mirror_file(source, *key) == target
    damaged(target, how)
    fix = ("copy the official file there (the mirror's SHA256SUMS lists every digest) or point the config key "
           "'data.mirror' at a mirror that has a good copy")
    with pytest.raises(DataError) as e:
        mirror_file(source, *key)
    if how == "missing":
        names = " or ".join(str(mirror / p) for p in raw.paths)
        assert str(e.value) == (f"data file {names} is missing from the mirror ({raw.description}; "
                                f"expected sha256 {raw.sha256}); {fix}.")
    else:
        assert str(e.value) == (f"data file {target} has sha256 {digest(target)}, expected {raw.sha256}: it is "
                                f"corrupted or not the file this pipeline was built for; {fix}")


def test_the_mirror_fix_names_the_setting_in_force(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    from_env = resolve_source(DataSettings(source="mirror"), env_mirror=str(mirror))  # as the CLI passes it
    from_config = resolve_source(DataSettings(mirror=str(mirror), source="mirror"))
    with pytest.raises(DataError, match=f"point the environment variable {MIRROR_ENV} at a mirror"):
        mirror_file(from_env, "snli", "validation")
    with pytest.raises(DataError, match="point the config key 'data.mirror' at a mirror") as e:
        mirror_file(from_config, "snli", "validation")
    assert MIRROR_ENV not in str(e.value)


def test_snli_train_has_no_digest_and_the_message_says_so(tmp_path):
    (tmp_path / "snli").mkdir()
    source = resolve_source(DataSettings(mirror=str(tmp_path), source="mirror"))
    with pytest.raises(DataError) as e:
        mirror_file(source, "snli", "train")
    msg = str(e.value)
    assert "no published sha256 exists for a converted snli/train.jsonl.gz, so it is used unchecked" in msg
    assert "ee95dfbc57800f7b1f62b7602ad2b176c2b983210435a49238e660324a01e963 as published by others; not checked here" in msg
    assert "train_sample_1pct" in msg


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_prepared_data(prepared_copy, how):
    target = prepared_copy / "train.npz"
    expected = read_manifest(prepared_copy, "mqar", verify=False)["files"]["train.npz"]["sha256"]
    damaged(target, how)
    fix = f"rerun `python -m seqmix data mqar` (or delete {prepared_copy} and rerun the DAG)"
    with pytest.raises(DataError) as e:
        read_manifest(prepared_copy, "mqar")
    if how == "missing":
        assert str(e.value) == f"data file {target} is missing (expected sha256 {expected}); {fix}"
    else:
        assert str(e.value) == (f"data file {target} has sha256 {digest(target)}, expected {expected}: it is "
                                f"corrupted or not the file this pipeline was built for; {fix}")


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted", "not a manifest"])
def test_manifest(prepared_copy, how):
    path = prepared_copy / "manifest.json"
    fix = f"rerun `python -m seqmix data mqar` (or delete {prepared_copy} and rerun the DAG)"
    if how == "corrupted":
        path.write_bytes(path.read_bytes().replace(b'"files"', b'"fi\xffes"'))
    elif how == "not a manifest":
        path.write_text("[1, 2]")
    else:
        damaged(path, how)
    with pytest.raises(DataError) as e:
        read_manifest(prepared_copy, "mqar")
    expected = {
        "missing": f"{path} is missing: the mqar data has not been prepared; {fix}",
        "truncated": f"{path} is truncated or corrupted (not valid JSON: ",
        "corrupted": f"{path} is corrupted (not UTF-8 text: ",
        "not a manifest": f"{path} is not a data manifest (no 'files' entry); {fix}",
    }[how]
    assert str(e.value).startswith(expected) and str(e.value).endswith(fix)


def test_data_prepared_with_other_settings_is_refused_before_step_one(study, tmp_path):
    spec = run_spec_in(study, tmp_path)
    other = json.loads(spec.model_dump_json())
    other["settings"]["num_kv_pairs"] = 3  # the config changed; the data did not
    with pytest.raises(DataError) as e:
        loop.train(type(spec).model_validate(other), progress=False)
    assert str(e.value).startswith(f"{Path(spec.data_dir) / 'manifest.json'} was generated with num_kv_pairs 2 (config: 3)")
    assert not (Path(spec.run_dir) / "config.json").exists()


@pytest.mark.parametrize("name", ["metrics.json", "config.json", "model.pt"])
@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_run_files_read_by_evaluation(study, tmp_path, name, how):
    spec = run_spec_in(study, tmp_path, steps=3)
    loop.train(spec, progress=False)
    run_dir = Path(spec.run_dir)
    damaged(run_dir / name, how)
    fix = f"train the run again: delete {run_dir} and rerun the DAG, or run `python -m seqmix train` with its spec"
    with pytest.raises(FileError) as e:
        evaluate_run(run_dir, device="cpu")
    msg, path = str(e.value), run_dir / name
    assert msg.endswith(fix), msg
    if how == "missing":
        assert msg.startswith(f"{path} is missing; ")
    elif name == "model.pt":
        assert msg.startswith(f"{path} cannot be read: it is truncated or corrupted (")
    elif how == "truncated":
        assert msg.startswith(f"{path} is truncated or corrupted (not valid JSON: ")
    else:
        assert msg.startswith(f"{path} is corrupted (not UTF-8 text: ")


def test_a_bad_spec_is_named_before_any_work(tmp_path, capsys):
    assert cli(["train", "--spec", '{"profile": "quick"']) == 2
    assert capsys.readouterr().err.startswith("error: --spec is not a valid TrainJob (Invalid JSON")
    assert cli(["train", "--spec", json.dumps({"profile": "quick", "task": "mqar"})]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --spec is not a valid TrainJob (key 'kind' is required; key 'group' is required; ")
    assert "pass the JSON the Snakefile writes" in err
    assert cli(["data", "mqar", "--spec", "{}"]) == 2
    assert "error: --spec is not a valid DataJob (key 'kind' is required" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Limits the data or the config decide, checked before work starts.
# ------------------------------------------------------------------------------------------


def fake_wikitext(directory: Path, tokens: dict[str, int]) -> None:
    """A prepared WikiText-2 directory with token streams of the given lengths (the check
    reads only the manifest; the streams make its digests real)."""
    directory.mkdir(parents=True)
    for split, n in tokens.items():
        np.save(directory / f"{split}.npy", np.arange(n, dtype=np.int32) % 64)
    write_manifest(directory, {f"{s}.npy": {"tokens": n} for s, n in tokens.items()},
                   {"dataset": "fake", "source": "test", "tokenizer": {"vocab_size": 64},
                    "splits": {s: {"tokens": n} for s, n in tokens.items()}})


@pytest.mark.parametrize("block, short, key, need", [(60, "train", "train_split", 62), (16, "validation", "eval_split", 17)])
def test_a_block_longer_than_a_wikitext_split_fails_before_step_one(tmp_path, capsys, block, short, key, need):
    fake_wikitext(tmp_path / "data" / "wikitext2", {"train": 50, "validation": 10, "test": 30})
    cfg = tiny_config(tmp_path, None, archs=("softmax",))
    cfg["tasks"] = {"wikitext2": {"block_size": block, **{k: cfg["tasks"]["mqar"][k] for k in ("model", "train")}}}
    cfg["analysis"]["sparsity"]["tasks"] = ["wikitext2"]
    spec = expand(validate_study(cfg)).run_spec("wikitext2", "softmax", 0)
    assert cli(["train", "--quiet", "--spec", spec.model_dump_json()]) == 3
    tokens = {"train": 50, "validation": 10}[short]
    manifest = tmp_path / "data" / "wikitext2" / "manifest.json"
    assert capsys.readouterr().err == (
        f"error: config key 'tasks.wikitext2.block_size' ({block}) is too long for the {short} split ({key}): "
        f"it has {tokens} tokens ({manifest}) and needs at least {need}; set block_size <= "
        f"{tokens - (need - block)}, or choose a longer split for '{key}'\n")
    assert not (Path(spec.run_dir) / "log.csv").exists() and not (Path(spec.run_dir) / "checkpoints").exists()


@pytest.mark.parametrize("settings, message", [
    ({"seq_len": 15}, "config key 'tasks.mqar': seq_len must be even, got 15"),
    ({"seq_len": 16, "vocab_size": 16}, "config key 'tasks.mqar': vocab_size (16) must exceed seq_len (16)"),
    ({"seq_len": 16, "num_kv_pairs": 5}, "config key 'tasks.mqar': num_kv_pairs * 4 (20) must be <= seq_len (16)"),
])
def test_mqar_generator_limits_fail_at_validation(tmp_path, settings, message):
    # (The generator's fourth limit, distinct keys: num_kv_pairs <= vocab_size/2 - 1, follows
    # from these three.)
    cfg = tiny_config(tmp_path, None, archs=("softmax",))
    cfg["tasks"]["mqar"].update(settings)
    with pytest.raises(ConfigError) as e:
        validate_study(cfg)
    assert message in str(e.value)


@pytest.mark.parametrize("key", ["results_dir", "data.dir"])
@pytest.mark.parametrize("value, why", [
    ("runs/{seed}", "'runs/{seed}' contains '{' and '}': Snakemake reads {...} in a path as a wildcard; choose a path without it"),
    ("runs/<x>", "'runs/<x>' contains '<' and '>': Snakemake reads <...> in a path as a path variable; choose a path without it"),
    ("~/results", "'~/results' starts with '~', which is not expanded here (it would make a directory named '~'); write the full path"),
    ("  ", "is empty; give a directory (e.g. 'results'): an empty one would put files at the file system root"),
])
def test_paths_the_workflow_cannot_use_are_refused_with_the_reason(tmp_path, key, value, why):
    cfg = tiny_config(tmp_path, None)
    if key == "results_dir":
        cfg["results_dir"] = value
    else:
        cfg["data"]["dir"] = value
    with pytest.raises(ConfigError) as e:
        validate_study(cfg)
    assert f"config key '{key}': {why}" in str(e.value)


# ------------------------------------------------------------------------------------------
# The report's words for a task whose every run diverged (its run through the DAG, and paths
# with shell metacharacters, are tests/test_dag.py's, on the shared study).
# ------------------------------------------------------------------------------------------


def test_the_report_words_come_from_the_runs():
    import pandas as pd

    from seqmix.report.latex import series
    from seqmix.report.summary import unfinished_tasks

    assert [series(x) for x in (["A"], ["A", "B"], ["A", "B", "C"])] == ["A", "A and B", "A, B and C"]
    runs = pd.DataFrame({"task": ["t1", "t1", "t2", "t2", "t3"], "status": ["ok", "diverged", "diverged", "diverged", "ok"]})
    assert unfinished_tasks(runs) == ["t2"]
    abstract = (REPO / "paper" / "sections" / "abstract.tex").read_text()
    assert "\\qArchitectures" in abstract and "\\qUnfinished" in abstract and "ten " not in abstract
