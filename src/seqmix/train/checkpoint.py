"""Checkpoints: written atomically (seqmix.io: a killed job never leaves a half-written
file) and read back with ``weights_only=True`` (no arbitrary code runs on load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from seqmix.io import atomic_path


def save_atomic(obj: Any, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def load(path: str | Path, map_location="cpu") -> Any:
    return torch.load(path, map_location=map_location, weights_only=True)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
