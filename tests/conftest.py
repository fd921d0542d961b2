"""Shared fixtures: the local data mirror and tiny configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def mirror_path() -> Path | None:
    env = os.environ.get("SEQMIX_DATA_MIRROR")
    for candidate in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if (candidate / "wikitext-2-raw").is_dir():
            return candidate.resolve()
    return None


@pytest.fixture(scope="session")
def mirror() -> Path:
    path = mirror_path()
    if path is None:
        pytest.skip("no data mirror: set SEQMIX_DATA_MIRROR to a copy of shared/data")
    return path
