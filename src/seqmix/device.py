"""A device's name as a folder name: ``results/bench/<slug>/`` (the GPU checks' measurements,
which the plan and the report read) and a recorded study's ``<slug>-<date>/``. Kept apart
from training's provenance, which records the name, so that no run depends on it."""

from __future__ import annotations

import re


def device_slug(name: str) -> str:
    """e.g. "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
