"""Devices: the torch device a config names (``resolve_device``: training, evaluation and the
analyses alike) and a device's name as a folder name (``device_slug``: ``results/bench/<slug>/``
and a recorded study's ``<slug>-<date>/``). torch is imported only by what needs it, so that
the Snakefile's side reads slugs without it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """The torch device a config's ``auto | cpu | cuda`` names; ``key`` is named when the
    GPU it asks for is missing."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"config key '{key}' is 'cuda' but no GPU is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def device_slug(name: str) -> str:
    """e.g. "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
