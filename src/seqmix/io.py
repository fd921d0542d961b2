"""One way to write a result: atomically (``atomic_path``: a temporary file beside the
destination, fsynced, then renamed over it), so that a reader never sees half a file and two
writers never collide; a killed writer's temporary file is removed by the next job that holds
the directory's lock. One way to say why a file could not be read or written: a
``FileError`` naming the file, the cause (disk full, read-only, no permission, found in the
exception chain where torch only says "enforce fail at inline_container.cc") and the fix.
And the CSV writer for typed rows, ``write_rows``, and one YAML reader, ``yaml_data``.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

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


# A writer's failure that carries no errno (torch's C++ zip writer writing to a path) is a
# full disk when the file system had less than this left at the moment it failed.
LOW_SPACE = 1 << 20
WRITER_FAILED = re.compile(r"inline_container|PytorchStreamWriter|file write failed")
ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")  # Python's and Rust's (tokenizers)


def chained(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it chains (``__cause__``, ``__context__``), once each."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            todo += [e.__cause__, e.__context__]
            yield e


def failed_errno(exc: BaseException) -> tuple[int, str | None] | None:
    """The errno of a failed write (a key of WRITE_FAILURES) in ``exc`` or its chain, and the
    file name its OSError carries; None when there is none."""
    for e in chained(exc):
        if isinstance(e, OSError) and e.errno in WRITE_FAILURES:
            return e.errno, e.filename
        for match in ERRNO_IN_TEXT.finditer(str(e)):
            if (number := int(match.group(1) or match.group(2))) in WRITE_FAILURES:
                return number, None
    return None


def _statvfs(path: str | os.PathLike) -> tuple[os.statvfs_result, Path] | None:
    """statvfs of the file system that holds ``path`` (or its nearest existing parent), and
    that file system's mount point."""
    here = Path(os.path.abspath(path))
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        st = os.statvfs(here)
    except OSError:
        return None
    while not os.path.ismount(here) and here != here.parent:
        here = here.parent
    return st, here


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged user may still write on the file system that holds ``path``."""
    found = _statvfs(path)
    return None if found is None else found[0].f_bavail * found[0].f_frsize


def human(n: float) -> str:
    """A byte count as people read it: 512 bytes, 12.0 KiB, 3.5 GiB."""
    if n < 1024:
        return f"{n:.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def space_left(path: str | os.PathLike) -> str:
    """'12.0 KiB free on /mnt (of 8.0 MiB)': what the file system holding ``path`` has left."""
    found = _statvfs(path)
    if found is None:
        return "free space unknown"
    st, mount = found
    return f"{human(st.f_bavail * st.f_frsize)} free on {mount} (of {human(st.f_blocks * st.f_frsize)})"


def write_failure(exc: BaseException, path: str | os.PathLike | None = None,
                  free_at_failure: int | None = None, written: int | None = None) -> FileError | None:
    """The clear error for a failed write of ``path`` (disk full or over quota, read-only,
    no permission), found in ``exc`` or the exceptions it chains; None when it failed for
    another reason. A writer's failure without an errno (torch's zip writer) is a full disk
    when the file system had under LOW_SPACE left when it failed (``free_at_failure``,
    measured before the partial file was removed); ``written``: bytes of the partial file."""
    found = failed_errno(exc)
    if found is None and free_at_failure is not None and free_at_failure < LOW_SPACE and any(
            WRITER_FAILED.search(str(e)) for e in chained(exc)):
        found = errno.ENOSPC, None
    if found is None:
        return None
    number, filename = found
    where = path if path is not None else filename
    why, fix = WRITE_FAILURES[number]
    if number == errno.ENOSPC and where is not None:  # how much it needed, and how much is left
        why += (f": it stopped after {human(written)} of this file; " if written else ": ") + space_left(where)
    return FileError(f"cannot write {where or 'a file'}: {why}; {fix}")


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
    """Yield a temporary path to write; on success it replaces ``path`` atomically. On any
    failure the temporary file is removed; a failed write raises FileError naming ``path``."""
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
        free, written = free_bytes(path.parent), None  # measured before the partial file goes
        if tmp is not None:
            with contextlib.suppress(OSError):
                written = tmp.stat().st_size
            tmp.unlink(missing_ok=True)
        clear = write_failure(exc, path, free, written) if isinstance(exc, Exception) else None
        if clear is not None:
            raise clear from exc
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """:func:`atomic_path`, opened: for writers that take a file object (torch.save; numpy's
    save and savez, which append their suffix to a path that lacks it)."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


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
        f = open(lock_file, "a+b", buffering=0)  # unbuffered: a failed write is not retried at close
    except OSError as exc:
        raise (write_failure(exc, lock_file) or exc) from exc
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().decode(errors="replace").strip() or "another process"
            raise Locked(f"{what} is in use by {holder} (lock {lock_file}); wait for it to finish, "
                         "or stop that process and rerun") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        except OSError as exc:  # a full disk has no room for the holder's name
            raise (write_failure(exc, lock_file) or exc) from exc
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


def columns(row_type: type) -> list[str]:
    """The CSV columns a row type (a TypedDict whose keys are the schema) declares, in order."""
    return list(row_type.__annotations__)


def write_rows(path: str | os.PathLike, rows: Iterable[Mapping], row_type: type) -> Path:
    """A CSV whose columns are exactly ``row_type``'s; a key a row lacks is an empty cell.
    A row holding a key the type does not declare raises ValueError: the writer and its
    schema have drifted apart, and the value would otherwise be dropped unseen."""
    fields = columns(row_type)
    rows = list(rows)
    for row in rows:
        if extra := row.keys() - set(fields):
            raise ValueError(f"{row_type.__name__} declares no column {', '.join(sorted(extra))}: "
                             f"add it to {row_type.__module__}.{row_type.__name__} or leave it out of the rows")
    return write_csv(path, rows, fields)


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


def concat_csvs(inputs: list[str | os.PathLike], out: str | os.PathLike) -> int:
    """Write the rows of CSVs with the same columns as one CSV (per-run analysis tables into
    one); the number of rows. A file with other columns is a ValueError naming it."""
    import pandas as pd

    frames = [pd.read_csv(p) for p in inputs]
    header = list(frames[0].columns)
    for p, f in zip(inputs, frames):
        if list(f.columns) != header:
            raise ValueError(f"{p} has columns {list(f.columns)}, expected {header}")
    write_text(out, pd.concat(frames, ignore_index=True).to_csv(index=False))
    return sum(len(f) for f in frames)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's bytes, read in chunks (the one file digest: data manifests, the
    job table's cache, a job's non-Python code)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def yaml_data(text: str) -> Any:
    """YAML text as plain data (safe: no Python objects), parsed by libyaml where PyYAML was
    built with it: ten times faster than the pure-Python parser, and the Snakefile's parse
    reads the config files and notebooks/outputs.yaml every time."""
    import yaml  # here, so that writing results needs no YAML

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
