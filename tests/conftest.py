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


def tiny_config(root: Path, mirror: Path | None, archs=("softmax", "grassmann"), seeds=(0,)) -> dict:
    """A complete config sized for tests: seconds per run on one CPU core."""
    model = {"d_model": 16, "n_layers": 1, "dropout": 0.0, "budget": {"params": None}}
    train = {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 3,
             "eval_batches": 2, "log_every": 2, "checkpoint_every": 3, "threads": 1}
    cfg = {
        "profile": "test",
        "results_dir": str(root / "results"),
        "data": {"dir": str(root / "data"), "mirror": str(mirror) if mirror else None,
                 "source": "mirror" if mirror else "auto"},
        # Trained on the (1 MB) validation split to keep the test fast; recorded as such.
        "tokenizer": {"kind": "trained", "vocab_size": 256, "train_split": "validation"},
        "architectures": list(archs),
        "seeds": list(seeds),
        "tasks": {
            "mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "num_train": 64,
                     "num_test": 16, "model": model, "train": train},
        },
        "mixers": {"grassmann": {"rank": 4, "offsets": [1, 2]}},
        "analysis": {
            "complexity": {"lengths": [8, 16, 32], "d_model": 16, "repeats": 2, "warmup": 0},
            "sparsity": {"task": "wikitext2" if mirror else "mqar", "num_sequences": 2},
        },
    }
    if mirror:
        cfg["tasks"]["wikitext2"] = {"block_size": 16, "eval_max_tokens": 256, "model": model, "train": train}
        cfg["tasks"]["snli"] = {"train_file": "train_head_1024", "max_sentence_tokens": 8,
                                "eval_max_examples": 32, "model": model, "train": train}
    return cfg


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, mirror) -> dict:
    """Tiny config with every task's data prepared once for the session (from the mirror)."""
    from seqmix.config import data_spec, validate_config
    from seqmix.data.prepare import prepare

    root = tmp_path_factory.mktemp("seqmix")
    cfg = validate_config(tiny_config(root, mirror))
    for task in ("tokenizer", "wikitext2", "snli", "mqar"):
        prepare(task, data_spec(cfg, task))
    return cfg
