"""Checkpoints: written atomically (seqmix.io: a killed job never leaves a half-written file,
and a full disk is one FileError naming the file and the space left) and read back with
``weights_only=True`` (no arbitrary code runs on load). A file that cannot be read back
raises :class:`CorruptCheckpoint` naming it.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from seqmix.io import FileError, atomic_file


class CorruptCheckpoint(FileError):
    """A checkpoint file that cannot be read back, or lacks what it should hold."""


def save_atomic(obj: Any, path: str | Path) -> None:
    # Through a Python file object, so that a full disk raises OSError(ENOSPC), or torch's
    # "enforce fail at inline_container.cc" chained to it, which seqmix.io recognises.
    with atomic_file(path) as f:
        torch.save(obj, f)


def load(path: str | Path, map_location="cpu", keys: tuple[str, ...] = ()) -> Any:
    """The object saved in ``path``; CorruptCheckpoint (naming the file) when it cannot be
    read or is not a mapping holding every key of ``keys``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing")
    try:
        # torch.load does not check the archive's CRC-32s: a flipped byte would load as a wrong weight.
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # the first member whose CRC-32 does not match, or None
        if bad is not None:
            raise ValueError(f"checksum mismatch in {bad}")
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # zipfile and torch raise many kinds for a damaged file
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise CorruptCheckpoint(f"{path} cannot be read: it is truncated or corrupted "
                                f"({type(exc).__name__}: {detail})") from exc
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise CorruptCheckpoint(f"{path} is not a seqmix checkpoint: it lacks {', '.join(missing)}")
    return obj


def move_aside(path: str | Path) -> Path:
    """Rename a bad checkpoint to ``<name>.bad-<unix time>`` beside it (kept for inspection,
    never read again) and return the new path."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
    path.replace(aside)
    return aside


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
