"""hashes.json: the sha256 of a run's final weights and of its optimiser state, among its
small files, so that a recorded run (whose weights are not kept) can be trained again on
another host and compared bit for bit (``python -m seqmix verify``).

The digest is of the tensors themselves (name, dtype, shape, bytes, in key order), not of
a torch.save file: the same state hashes the same whatever the serialisation's version.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from seqmix.io import write_json

HASHES = "hashes.json"


def state_sha256(state: Any) -> str:
    """sha256 of a (nested) state dict: dicts in sorted key order, tensors by dtype, shape
    and bytes, everything else by its JSON."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(f"dict {len(obj)}\n".encode())
        for key in sorted(obj, key=str):
            h.update(f"key {json.dumps(str(key))}\n".encode())
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"list {len(obj)}\n".encode())
        for item in obj:
            _feed(h, item)
    else:
        h.update(f"value {json.dumps(obj, sort_keys=True)}\n".encode())


def final_hashes(model_state: dict, optimizer_state: dict | None) -> dict:
    """What hashes.json holds for a run ending with these weights and this optimiser state
    (None: unknown, a final checkpoint written before hashes were kept)."""
    return {"weights_sha256": state_sha256(model_state),
            "optimizer_sha256": None if optimizer_state is None else state_sha256(optimizer_state)}


def write_hashes(run_dir: str | Path, hashes: dict) -> None:
    """The run's hashes.json (the single run writes it in seqmix.train.loop.finish; a seed
    pack writes each member's through the same function)."""
    write_json(Path(run_dir) / HASHES, hashes)
