"""Manifests: every prepared data file with its sha256 and counts, checked before use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqmix.io import FileError, read_json, sha256_file, write_json

MANIFEST = "manifest.json"


class DataError(RuntimeError):
    """Missing or corrupted data; the message names the file and the fix."""


def check_sha256(path: str | Path, expected: str, fix: str) -> None:
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {path} is missing (expected sha256 {expected}); {fix}")
    got = sha256_file(path)
    if got != expected:
        raise DataError(
            f"data file {path} has sha256 {got}, expected {expected}: it is corrupted or not "
            f"the file this pipeline was built for; {fix}"
        )


def write_manifest(directory: str | Path, files: dict[str, dict[str, Any]], info: dict[str, Any]) -> Path:
    """Write ``directory/manifest.json`` with sha256 and byte size of every file plus ``info``."""
    directory = Path(directory)
    entries = {}
    for name, counts in files.items():
        p = directory / name
        entries[name] = {"sha256": sha256_file(p), "bytes": p.stat().st_size, **counts}
    return write_json(directory / MANIFEST, {**info, "files": entries})


def read_manifest(directory: str | Path, task: str, verify: bool = True) -> dict[str, Any]:
    """Read a task's manifest and (by default) check every file against its sha256."""
    directory = Path(directory)
    fix = f"rerun `python -m seqmix data {task}` (or delete {directory} and rerun the DAG)"
    path = directory / MANIFEST
    if not path.exists():
        raise DataError(f"{path} is missing: the {task} data has not been prepared; {fix}")
    try:
        manifest = read_json(path)
    except FileError as e:
        raise DataError(f"{e}; {fix}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise DataError(f"{path} is not a data manifest (no 'files' entry); {fix}")
    if verify:
        for name, entry in manifest["files"].items():
            check_sha256(directory / name, entry["sha256"], fix)
    return manifest
