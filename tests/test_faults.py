"""Fault injection (issue 15): what a job does when it is killed, when a file it reads is
missing, truncated or corrupted, when the disk is full or read-only, when two trainers
share a run directory, when config paths hold shell metacharacters, and when every run of
a task diverges. Each test names the guarantee it keeps.

MQAR (synthetic) everywhere the mirror is not the point, so that the module runs without
one. Kills are SIGKILL at random moments drawn from a seeded generator (the seed is in
each test), and "ends like an uninterrupted run" means: model.pt byte for byte, log.csv
and metrics.json equal except wall-clock fields.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from seqmix import io as seqmix_io
from seqmix.cli import main as cli
from seqmix.data.manifest import DataError, read_manifest, write_manifest
from seqmix.data.sources import RAW_FILES, mirror_file, resolve_source
from seqmix.io import FileError, read_json, write_json
from seqmix.study.load import ConfigError, validate_study
from seqmix.study.settings import MIRROR_ENV, DataSettings
from seqmix.study.table import expand
from seqmix.tasks import task_class
from seqmix.train import checkpoint, loop
from seqmix.train.evaluate import evaluate_run

from .conftest import skip_or_fail, tiny_config

TIME_FIELDS = {"wall_time_s", "resumed_from_steps"}  # metrics.json fields that hold wall-clock facts
REQUIRE_NAMESPACE_ENV = "SEQMIX_REQUIRE_NAMESPACE"  # CI sets it: a real full disk must be tested there
OUTPUTS = ("metrics.json", "model.pt", "log.csv", "provenance.json", "config.json")  # the train rule's


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


def spec_of(cfg: dict, results: Path, **train):
    """The run spec of softmax/seed0 with ``train`` overrides, its run directory in ``results``."""
    cfg = json.loads(json.dumps(cfg))
    cfg["results_dir"] = str(results)
    cfg["tasks"]["mqar"]["train"].update(train)
    return expand(validate_study(cfg)).run_spec("mqar", "softmax", 0)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    """The MQAR config with its data prepared once for the module."""
    root = tmp_path_factory.mktemp("faults")
    cfg = mqar_config(root)
    job = expand(validate_study(cfg)).data_job("mqar")
    task_class(job.kind).prepare(job)
    return cfg


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def log_rows(run_dir: Path) -> list[dict]:
    """log.csv without its wall-clock column."""
    with open(run_dir / "log.csv") as f:
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in csv.DictReader(f)]


def assert_same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same results: weights byte for byte, the same log and
    metrics (wall-clock fields aside)."""
    assert digest(a / "model.pt") == digest(b / "model.pt")
    assert log_rows(a) == log_rows(b)
    ma, mb = read_json(a / "metrics.json"), read_json(b / "metrics.json")
    assert {k: v for k, v in ma.items() if k not in TIME_FIELDS} == {k: v for k, v in mb.items() if k not in TIME_FIELDS}


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


class Interrupt(Exception):
    """Raised by a test to stop a run in process at a chosen point."""


def stop_after_first_checkpoint(monkeypatch, spec) -> None:
    """Train ``spec`` until its first checkpoint is written, then stop it (as a kill would,
    but at a known step)."""
    save = loop.save_checkpoint

    def save_then_stop(run):
        save(run)
        raise Interrupt

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)
    with pytest.raises(Interrupt):
        loop.train(spec, progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", save)


def seqmix_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "seqmix", *args]


def run_cmd(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def kill_at(cmd: list[str], delay: float, ready=None) -> bool:
    """Start ``cmd``; once ``ready(pid)`` holds (default: at once) wait ``delay`` seconds and
    SIGKILL it. True if it was killed, False if it ended first (then it must have succeeded)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while ready is not None and not ready(proc.pid) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    return False


def holds_lock(run_dir: Path):
    """ready(pid) for kill_at: process ``pid`` holds the run directory's lock (it is past its
    imports and training)."""
    def ready(pid: int) -> bool:
        try:
            return (run_dir / loop.LOCK).read_text().startswith(f"process {pid} ")
        except OSError:
            return False
    return ready


def has_checkpointed(run_dir: Path, times: int):
    """ready(pid) for kill_at: the run has saved its checkpoint ``times`` times (each save a new
    file renamed over the last; inodes are reused, so a save is told by its inode and mtime)
    and not yet finished: a moment counted in training steps, which no change in the
    machine's load can move past the end of the run."""
    seen: set[tuple[int, int]] = set()
    def ready(pid: int) -> bool:
        try:
            stat = (run_dir / loop.CHECKPOINT).stat()
            seen.add((stat.st_ino, stat.st_mtime_ns))
        except OSError:
            pass
        return len(seen) >= times and not (run_dir / loop.FINAL).exists()
    return ready


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
# SIGKILL at random moments; the rerun ends like an uninterrupted run.
# ------------------------------------------------------------------------------------------

KILL_SEED = 15  # seeds the kill moments; a failure names the moment


def test_training_killed_at_random_moments_ends_like_an_uninterrupted_run(study, tmp_path):
    settings = dict(steps=200, checkpoint_every=7, eval_every=50, log_every=3)  # 3 does not divide 7
    clean = spec_of(study, tmp_path / "clean", **settings)
    # The uninterrupted run, timed from the moment it holds its lock (past its imports) to its
    # exit, in a process like the ones that are killed.
    proc = subprocess.Popen(seqmix_cmd("train", "--quiet", "--spec", clean.model_dump_json()),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ready = holds_lock(Path(clean.run_dir))
    while not ready(proc.pid) and proc.poll() is None:
        time.sleep(0.005)
    started = time.time()
    while not (Path(clean.run_dir) / loop.FINAL).exists() and proc.poll() is None:
        time.sleep(0.005)
    training = time.time() - started  # then the results are written (provenance runs git)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    span = time.time() - started
    killed = spec_of(study, tmp_path / "killed", **settings)
    run_dir = Path(killed.run_dir)
    cmd = seqmix_cmd("train", "--quiet", "--spec", killed.model_dump_json())
    rng = random.Random(KILL_SEED)
    # The first kill while it trains, after its n-th checkpoint (n counted, not timed: a
    # lock-timed kill once landed past the end on a loaded machine). The others anywhere, past
    # the end too: while results are written, or while a finished run writes them again from
    # checkpoints/final.pt.
    saves = rng.randint(1, 200 // settings["checkpoint_every"] - 2)
    moments = [round(span * rng.uniform(0, 1.2), 3) for _ in range(2)]
    landed = [kill_at(cmd, 0, ready=has_checkpointed(run_dir, saves)),
              *(kill_at(cmd, m, ready=holds_lock(run_dir)) for m in moments)]
    if landed[-1]:
        rerun = run_cmd(cmd)
        assert rerun.returncode == 0, rerun.stderr
    resumed = read_json(run_dir / "metrics.json")["resumed_from_steps"]
    assert any(0 < step < 200 for step in resumed), (
        f"no kill (after checkpoint {saves}, then {moments} s after the lock; training took {training:.2f} s) landed mid-training, "
        "after a checkpoint: lengthen the run")
    assert_same_run(run_dir, Path(clean.run_dir))


def test_evaluation_killed_at_random_moments_ends_like_an_uninterrupted_one(study, tmp_path):
    spec = spec_of(study, tmp_path, steps=6)
    loop.train(spec, progress=False)
    run_dir = Path(spec.run_dir)
    cmd = seqmix_cmd("eval", "--run", str(run_dir), "--device", "cpu")
    started = time.time()
    assert run_cmd(cmd).returncode == 0
    span = time.time() - started
    clean = read_json(run_dir / "eval.json")
    (run_dir / "eval.json").unlink()
    rng = random.Random(KILL_SEED)
    assert any([kill_at(cmd, rng.uniform(0, span)) for _ in range(2)])
    assert run_cmd(cmd).returncode == 0
    again = read_json(run_dir / "eval.json")
    assert {k: v for k, v in again.items() if k != "eval_time_s"} == {k: v for k, v in clean.items() if k != "eval_time_s"}


def test_data_preparation_killed_at_random_moments_ends_like_an_uninterrupted_one(tmp_path):
    cfg = mqar_config(tmp_path)
    cfg["tasks"]["mqar"].update(num_train=10_000, num_test=1000)  # seconds of work to interrupt
    files = ("manifest.json", "train.npz", "validation.npz", "test.npz")
    results = {}
    for name in ("clean", "killed"):
        cfg["data"]["dir"] = str(tmp_path / name)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        cmd = seqmix_cmd("data", "mqar", "--config", str(tmp_path / f"{name}.yaml"))
        if name == "clean":
            started = time.time()
            assert run_cmd(cmd).returncode == 0
            span = time.time() - started
        else:
            rng = random.Random(KILL_SEED)
            assert any([kill_at(cmd, rng.uniform(0, span)) for _ in range(2)])
            (tmp_path / name / "mqar" / "manifest.json").unlink(missing_ok=True)  # as Snakemake does
            assert run_cmd(cmd).returncode == 0
            assert not list((tmp_path / name / "mqar").glob(".*.tmp")), "temporary files of the killed runs left"
        results[name] = {f: digest(tmp_path / name / "mqar" / f) for f in files[1:]}
        results[name]["manifest"] = {k: v for k, v in read_json(tmp_path / name / "mqar" / files[0]).items()}
    assert results["killed"] == results["clean"]


def test_a_kill_after_the_results_are_written_does_not_train_again(study, tmp_path):
    # The window between the checkpoint's removal and the process's exit: Snakemake sees a
    # killed job, deletes its outputs and reruns it. The rerun writes the same results from
    # checkpoints/final.pt instead of training from scratch.
    spec = spec_of(study, tmp_path, steps=12)
    run_dir = Path(spec.run_dir)
    driver = ("import os, signal, sys; from seqmix.cli import main; code = main(sys.argv[1:]); "
              "os.kill(os.getpid(), signal.SIGKILL)")
    proc = run_cmd([sys.executable, "-c", driver, "train", "--quiet", "--spec", spec.model_dump_json()])
    assert proc.returncode == -signal.SIGKILL
    weights = digest(run_dir / "model.pt")
    for name in OUTPUTS:
        (run_dir / name).unlink()
    rerun = run_cmd(seqmix_cmd("train", "--quiet", "--spec", spec.model_dump_json()))
    assert rerun.returncode == 0, rerun.stderr
    assert f"{run_dir} finished at step 12 (checkpoints/final.pt): writing its results again without training" in rerun.stderr
    assert digest(run_dir / "model.pt") == weights
    clean = spec_of(study, tmp_path / "clean", steps=12)
    loop.train(clean, progress=False)
    assert_same_run(run_dir, Path(clean.run_dir))


# ------------------------------------------------------------------------------------------
# Restarts: other settings, a corrupt checkpoint, the train-loss window, train_loss_last.
# ------------------------------------------------------------------------------------------


def test_a_restart_over_a_checkpoint_of_other_settings_equals_a_fresh_run(study, tmp_path, monkeypatch, capsys):
    other = spec_of(study, tmp_path / "shared", lr=1e-2)
    stop_after_first_checkpoint(monkeypatch, other)
    mine = spec_of(study, tmp_path / "shared", lr=3e-3)
    loop.train(mine, progress=False)
    assert f"ignoring {Path(mine.run_dir) / loop.CHECKPOINT}: written with other settings or other code" in capsys.readouterr().err
    fresh = spec_of(study, tmp_path / "fresh", lr=3e-3)
    loop.train(fresh, progress=False)
    assert_same_run(Path(mine.run_dir), Path(fresh.run_dir))


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "not a checkpoint"])
def test_a_bad_last_checkpoint_is_moved_aside_and_the_run_starts_afresh(study, tmp_path, monkeypatch, capsys, damage):
    spec = spec_of(study, tmp_path / "bad")
    stop_after_first_checkpoint(monkeypatch, spec)
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
    fresh = spec_of(study, tmp_path / "fresh")
    loop.train(fresh, progress=False)
    assert_same_run(Path(spec.run_dir), Path(fresh.run_dir))


def test_a_bad_final_checkpoint_trains_the_run_again(study, tmp_path, capsys):
    spec = spec_of(study, tmp_path)
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
    resumed = spec_of(study, tmp_path / "resumed", **settings)
    stop_after_first_checkpoint(monkeypatch, resumed)
    loop.train(resumed, progress=False)
    clean = spec_of(study, tmp_path / "clean", **settings)
    loop.train(clean, progress=False)
    assert read_json(Path(resumed.run_dir) / "metrics.json")["resumed_from_steps"] == [6]
    assert log_rows(Path(resumed.run_dir)) == log_rows(Path(clean.run_dir))  # the row at step 8 averages 4 losses


def test_train_loss_last_is_the_last_train_loss_not_an_evaluation(study, tmp_path):
    spec = spec_of(study, tmp_path, steps=6, log_every=2, eval_every=3)  # step 6 logs train, then eval
    metrics = loop.train(spec, progress=False)
    rows = list(csv.DictReader(open(Path(spec.run_dir) / "log.csv")))
    assert rows[-1]["phase"] == "eval"
    last_train = [r for r in rows if r["phase"] == "train"][-1]
    assert metrics["train_loss_last"] == pytest.approx(float(last_train["loss"]), rel=1e-12)
    assert metrics["train_loss_last"] != metrics["last_eval"]["loss"]


# ------------------------------------------------------------------------------------------
# One process per run directory; the atomic writer under two processes.
# ------------------------------------------------------------------------------------------


def test_a_second_trainer_on_a_busy_run_directory_fails_at_once(study, tmp_path):
    first = spec_of(study, tmp_path, steps=1_000_000, checkpoint_every=50, lr=3e-3)  # busy until killed
    second = spec_of(study, tmp_path, steps=6, lr=1e-3)
    run_dir = Path(first.run_dir)
    a = subprocess.Popen(seqmix_cmd("train", "--quiet", "--spec", first.model_dump_json()),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ready = holds_lock(run_dir)
        while not ready(a.pid) and a.poll() is None:
            time.sleep(0.01)
        while not (run_dir / "config.json").exists() and a.poll() is None:
            time.sleep(0.01)
        before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "checkpoints"}
        b = run_cmd(seqmix_cmd("train", "--quiet", "--spec", second.model_dump_json()))
        assert a.poll() is None, a.stderr.read()
    finally:
        a.kill()
        a.wait()
    assert b.returncode == 4
    assert b.stderr.strip() == (f"error: run directory {run_dir} is in use by process {a.pid} on "
                                f"{socket.gethostname()} (lock {run_dir / loop.LOCK}); wait for it to "
                                "finish, or stop that process and rerun")
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
    spec = spec_of(study, tmp_path)
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
    spec = spec_of(study, tmp_path)
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
    clean = spec_of(study, tmp_path / "clean")
    loop.train(clean, progress=False)
    outcome = {}
    for kb in FREE_KB:
        mount = tmp_path / f"free{kb}"
        spec = spec_of(study, mount / "results")
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
        spec = spec_of(study, tmp_path / "results")
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
        pytest.skip("root ignores file modes and no mount namespace is available")
    directory.chmod(0o555)
    try:
        return run_cmd(cmd)
    finally:
        directory.chmod(0o755)


def test_a_read_only_results_directory_is_named(study, tmp_path):
    spec = spec_of(study, tmp_path / "results")
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
    spec = spec_of(study, tmp_path)
    other = json.loads(spec.model_dump_json())
    other["settings"]["num_kv_pairs"] = 3  # the config changed; the data did not
    with pytest.raises(DataError) as e:
        loop.train(type(spec).model_validate(other), progress=False)
    assert str(e.value).startswith(f"{Path(spec.data_dir) / 'manifest.json'} was generated with num_kv_pairs 2 (config: 3)")
    assert not (Path(spec.run_dir) / "config.json").exists()


@pytest.mark.parametrize("name", ["metrics.json", "config.json", "model.pt"])
@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_run_files_read_by_evaluation(study, tmp_path, name, how):
    spec = spec_of(study, tmp_path, steps=3)
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
# The real tiny DAG: paths with spaces, quotes and shell metacharacters; a task whose every
# run diverges before its first evaluation.
# ------------------------------------------------------------------------------------------

INJECTED = "PWNED"


@pytest.fixture(scope="module")
def hostile_dag(tmp_path_factory):
    from .test_dag import copy_workflow, snakemake

    root = tmp_path_factory.mktemp("hostile")
    src = copy_workflow(root / "src")
    work = root / "work"
    work.mkdir()
    marker = root / INJECTED
    cfg = tiny_config(work, None)
    cfg["results_dir"] = str(root / f"""my results/it's "q" $(touch {marker}1) `touch {marker}2`""")
    cfg["data"]["dir"] = str(root / f"inj;touch {marker}3;#" / "da ta")
    cfg["analysis"]["sparsity"]["min_row_len"] = 4  # MQAR's queries lie before position 16
    diverge = json.loads(json.dumps(cfg["tasks"]["mqar"]))
    diverge["train"].update(lr=1e6, grad_clip=0.0, warmup_steps=0)  # NaN at step 1 or 2; first eval at 3
    cfg["tasks"] = {"mqar/diverge": diverge, "mqar": cfg["tasks"]["mqar"]}  # first: its legend panel too
    (work / "hostile.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = snakemake(src, work, "--configfile", str(work / "hostile.yaml"), check=False)
    return root, work, cfg, proc


def test_the_report_words_come_from_the_runs():
    import pandas as pd

    from seqmix.report.latex import series
    from seqmix.report.summary import unfinished_tasks

    assert [series(x) for x in (["A"], ["A", "B"], ["A", "B", "C"])] == ["A", "A and B", "A, B and C"]
    runs = pd.DataFrame({"task": ["t1", "t1", "t2", "t2", "t3"], "status": ["ok", "diverged", "diverged", "diverged", "ok"]})
    assert unfinished_tasks(runs) == ["t2"]
    abstract = (Path(__file__).resolve().parents[1] / "paper" / "sections" / "abstract.tex").read_text()
    assert "\\qArchitectures" in abstract and "\\qUnfinished" in abstract and "ten " not in abstract


def test_hostile_paths_run_the_dag_and_inject_nothing(hostile_dag):
    root, work, cfg, proc = hostile_dag
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(root.glob(f"{INJECTED}*")), "a path in the config ran as a shell command"
    results, data = Path(cfg["results_dir"]), Path(cfg["data"]["dir"])
    assert (results / "runs" / "mqar" / "grassmann" / "seed0" / "eval.json").exists()
    assert (data / "mqar" / "manifest.json").exists()
    assert (results / "report" / "report.pdf").stat().st_size > 10_000


def test_a_task_whose_every_run_diverged_is_reported_as_such(hostile_dag):
    root, work, cfg, proc = hostile_dag
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = list(csv.DictReader(open(Path(cfg["results_dir"]) / "summary" / "runs.csv")))
    diverged = [r for r in runs if r["task"] == "mqar/diverge"]
    assert len(diverged) == 2 and all(r["status"] == "diverged" and int(r["diverged_at_step"]) < 3 for r in diverged)
    text = " ".join(run_cmd(["pdftotext", str(Path(cfg["results_dir"]) / "report" / "report.pdf"), "-"]).stdout.split())
    assert "every run of MQAR diverge diverged, so it has no quality result" in text  # abstract and table note
    assert "(not evaluated: every run diverged)" in text  # the setup table
    # The abstract names this study's architectures (not "ten alternatives").
    assert "We train 2 sequence-mixing architectures (Softmax and Grassmann)" in text
