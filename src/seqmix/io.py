"""One way to write a result: atomically, so that a reader never sees half a file and two
writers never collide.

Every writer goes through :func:`atomic_path`: the content is written to a temporary file
with a unique name in the destination's directory, flushed and fsynced, then renamed over
the destination (``os.replace`` is atomic on POSIX within one file system). A writer that
fails or is interrupted by an exception removes its temporary file; one killed outright
leaves a ``.<name>.*.tmp`` file behind, never a truncated destination.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())
