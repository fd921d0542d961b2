"""Fault injection (issue 15): what a job does when it is killed, when a file it reads is
missing, truncated or corrupted, when the disk is full or read-only, and when two trainers
share a run directory (config paths that hold shell metacharacters and a task whose every
run diverges, through the real DAG: tests/workflow/test_dag.py). Each test names the guarantee it keeps.

MQAR (synthetic) everywhere the mirror is not the point, so that the module runs without
one. Kills happen at events, never at moments: one training process is SIGKILLed once it
has saved a checkpoint (it holds there until killed: tests/harness/train.py); every other
interruption is an exception raised in this process at a chosen point (a step, a checkpoint,
a result file being written), with what a killed writer leaves behind put there. "Ends like
an uninterrupted run" means: model.pt byte for byte, log.csv and metrics.json equal except
wall-clock fields.

The tests are split by concern: killed and restarted jobs (test_killed.py,
test_restarts.py), failed writes and full or read-only disks (test_disk.py), and
missing, truncated or corrupted files and limits checked before work (test_files.py).
This module holds what they share: a tiny MQAR study and ways to break its runs.
"""


from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from seqmix import io as seqmix_io
from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.tasks import task_class
from seqmix.train import loop
from tests.conftest import tiny_config
from tests.helpers import (
    HARNESS,
    wait_until_held,
)

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


