"""One way to write a result: atomically, so that a reader never sees half a file and two
writers never collide; and one way to say why a file could not be read or written.

Every writer goes through :func:`atomic_path`: the content is written to a temporary file
with a unique name in the destination's directory, flushed and fsynced, then renamed over
the destination (``os.replace`` is atomic on POSIX within one file system). A writer that
fails or is interrupted by an exception removes its temporary file; one killed outright
leaves a ``.<name>.*.tmp`` file behind, never a truncated destination, and the next job
that holds the directory's lock removes it (:func:`remove_stale_temps`).

A write that fails because the disk is full, the file system is read-only or the
directory is not writable raises :class:`FileError` naming the file, the cause and the
fix, instead of the writer's own message (torch's is "enforce fail at
inline_container.cc").

The temporary file is created as ``open`` creates any file, mode 0666 less the umask
(``tempfile.mkstemp`` makes it 0600: results nobody else could read on a shared file
system). :func:`exclusive_lock` makes a directory one process's at a time.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import json
import os
import secrets
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

TEMP_GLOB = ".*.tmp"  # what atomic_path's temporary files look like

# What a failed write means, by errno, and what to do about it.
WRITE_FAILURES = {
    errno.ENOSPC: ("disk full (no space left on device)",
                   "free space on that file system, or point results_dir / data.dir at another one"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or point results_dir / data.dir elsewhere"),
    errno.EROFS: ("read-only file system",
                  "point results_dir / data.dir at a writable directory, or remount it read-write"),
    errno.EACCES: ("permission denied",
                   "make the directory writable (chmod u+w) or point results_dir / data.dir at a writable one"),
    errno.EPERM: ("operation not permitted",
                  "make the directory writable or point results_dir / data.dir at a writable one"),
}


class FileError(RuntimeError):
    """A file that cannot be read or written; the message names it, says why and what to do."""


class Locked(FileError):
    """Another process holds the directory's lock."""


def write_failure(exc: OSError, path: str | os.PathLike | None = None) -> FileError | None:
    """The clear error for an OSError of a write (disk full, read-only, no permission), or
    None when the error is of another kind."""
    if exc.errno not in WRITE_FAILURES:
        return None
    why, fix = WRITE_FAILURES[exc.errno]
    where = path if path is not None else (exc.filename or "a file")
    return FileError(f"cannot write {where}: {why}; {fix}")


def new_temp(path: Path) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` beside ``path``, created as ``open`` creates
    any file: mode 0666 less the umask (mkstemp's 0600 would hide results from colleagues)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(path))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path`` atomically."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_temp(path)
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        clear = write_failure(exc, path) if isinstance(exc, OSError) else None
        if clear is not None:
            raise clear from exc
        raise


def remove_stale_temps(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files killed writers left in ``directory`` (not below it).
    Only safe while holding the directory's lock: a live writer's file looks the same."""
    removed = []
    for p in Path(directory).glob(TEMP_GLOB):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def exclusive_lock(lock_file: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_file`` (created if missing) or fail at
    once with :class:`Locked`, naming ``what`` and the holder. The kernel releases the lock
    when its process dies, so a killed job never leaves a stale lock behind."""
    lock_file = Path(lock_file)
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock_file, "a+")
    except OSError as exc:
        raise (write_failure(exc, lock_file) or exc) from exc
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise Locked(f"{what} is in use by {holder} (lock {lock_file}); wait for it to finish, "
                         "or stop that process and rerun") from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Indented, key-sorted JSON; values JSON does not know (paths, numpy scalars) as str."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_csv(path: str | os.PathLike, rows: Iterable[dict], fields: list[str]) -> Path:
    """A CSV with exactly ``fields`` as columns (keys of a row not in ``fields`` are dropped)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    return Path(path)


def read_json(path: str | os.PathLike, fix: str | None = None) -> Any:
    """The JSON in ``path``; a missing, truncated or corrupted file raises FileError naming
    it and ``fix`` (what produces the file again)."""
    path = Path(path)
    fix = f"; {fix}" if fix else ""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileError(f"{path} is missing{fix}") from None
    except UnicodeDecodeError as exc:
        raise FileError(f"{path} is corrupted (not UTF-8 text: {exc}){fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        state = "truncated or corrupted" if text.strip() else "empty"
        raise FileError(f"{path} is {state} (not valid JSON: {exc}){fix}") from None
