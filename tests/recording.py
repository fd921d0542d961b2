"""A tiny recorded study for the tests of recordings and of `seqmix verify`: the tiny MQAR
study (two mixers, one seed) trained and evaluated by `python -m seqmix` processes, as the
workflow runs them (so its numerics are pinned portable, as a recording to verify must be),
then recorded with `python -m seqmix record`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from seqmix.cli import main as cli
from tests.conftest import REPO, tiny_config

PROFILE = "tiny-recorded"


def seqmix(*argv: str) -> None:
    done = subprocess.run([sys.executable, "-m", "seqmix", *argv], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, f"python -m seqmix {' '.join(argv)} failed:\n{done.stderr[-2000:]}"


def tiny_study(root: Path, **train) -> Path:
    """The tiny MQAR study's config in ``root``, its data prepared, every run trained and evaluated."""
    cfg = tiny_config(root, None)
    cfg["profile"] = PROFILE
    cfg["tasks"]["mqar"]["train"].update(train)
    config = root / f"{PROFILE}.yaml"
    config.write_text(yaml.safe_dump(cfg))
    seqmix("data", "mqar", "--config", str(config))
    for arch in cfg["architectures"]:
        seqmix("train", "--config", str(config), "--task", "mqar", "--arch", arch, "--seed", "0", "--quiet")
        seqmix("eval", "--run", str(root / "results" / "runs" / "mqar" / arch / "seed0"))
    return config


def record(config: Path, out: Path) -> Path:
    """The study recorded under ``out``; the recording's directory."""
    assert cli(["record", "--config", str(config), "--out", str(out), "--made-by", "pytest"]) == 0
    (meta,) = out.glob("*/*/meta.json")
    return meta.parent


def rehash(recording: Path) -> None:
    """meta.json's sha256 made to match the files as they are now (a recording edited and then
    passed off as recorded so: what only retraining can catch)."""
    from seqmix.report.recorded import sha256_file

    meta = json.loads((recording / "meta.json").read_text())
    meta["sha256"] = {name: sha256_file(recording / name) for name in meta["sha256"]}
    (recording / "meta.json").write_text(json.dumps(meta, indent=2))
