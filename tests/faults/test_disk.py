"""Fault injection, the disk: a failed write leaves no temporary file, a full disk (simulated
and a real small tmpfs) is one clear error naming the file, results get the umask's
mode, and a read-only directory is named."""


from __future__ import annotations

import csv
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from seqmix import io as seqmix_io
from seqmix.cli import main as cli
from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.io import FileError, read_json
from seqmix.tasks import task_class
from seqmix.train import checkpoint, loop
from seqmix.train.evaluate import evaluate_run
from tests.conftest import skip_or_fail
from tests.faults.conftest import (
    in_namespace,
    mqar_config,
    namespace_available,
    run_cmd,
    seqmix_cmd,
)
from tests.helpers import (
    assert_same_run,
    run_spec_in,
)

REQUIRE_NAMESPACE_ENV = "SEQMIX_REQUIRE_NAMESPACE"  # CI sets it: a real full disk must be tested there

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


