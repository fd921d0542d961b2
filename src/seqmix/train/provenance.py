"""Provenance: what produced a result (code version, packages, hardware, implementation of
the mixers' fast paths, seed, time)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

import torch

from seqmix import REPO_ROOT
from seqmix.mixers import dispatch
from seqmix.sources import Code

PACKAGES = ("torch", "triton", "numpy", "datasets", "tokenizers", "snakemake", "seqmix")


# What only the environment tells, set once per process by the CLI (seqmix.cli.read_environment):
# the GPU slot the job holds (seqmix.slots: "<gpu>/<slot index>") and, in a copy of the
# checkout without git's data (a GPU machine's), the commit it was made from.
SETTINGS: dict[str, str | None] = {"gpu_slot": None, "commit": None}


def configure(gpu_slot: str | None = None, commit: str | None = None) -> None:
    SETTINGS.update(gpu_slot=gpu_slot or None, commit=commit or None)


def git_commit() -> dict:
    """The checkout's commit and whether its files differ from it; in a copy without git's
    data, the commit ``configure`` was given (scripts/gpu-headline.sh passes the one it was
    sent from, $SEQMIX_GIT_COMMIT) with ``dirty`` unknown (None)."""
    def run(*args):
        proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        return proc.stdout.strip() if proc.returncode == 0 else None

    try:
        commit = run("rev-parse", "HEAD")
        if commit:
            return {"commit": commit, "dirty": bool(run("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": SETTINGS["commit"], "dirty": None}


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_record(device: torch.device) -> dict:
    rec = {"type": device.type, "cpu": cpu_name(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
        rec["cuda"] = torch.version.cuda
    rec["name"] = rec.get("gpu", rec["cpu"])
    if SETTINGS["gpu_slot"]:  # the GPU slot the job held (seqmix.slots): <gpu>/<slot index>
        rec["gpu_slot"] = SETTINGS["gpu_slot"]
    return rec


def code_record(code: Code | None = None) -> dict:
    """The folders seqmix and its kernels were imported from (the checkout that ran), the
    digest of the code that made the result and each of its files' (seqmix.sources)."""
    import seqmix

    # Found, not imported: importing the kernels' package would make it code of every run.
    kernels = importlib.util.find_spec("seqmix.kernels")
    return {"seqmix": str(Path(seqmix.__file__).parent), "kernels": str(Path(kernels.origin).parent),
            "digest": code.digest if code else None, "sources": code.sources() if code else {}}


def provenance(device: torch.device, seed: int | None = None, code: Code | None = None, **extra) -> dict:
    """``code``: the code that made the result (``code.digest``, ``code.sources``).
    ``implementation``: the dispatch setting and the path each mixer fast path took in the
    current block (a training run: ``train`` opens one), e.g. {"grassmann": "triton"}."""
    return {
        "git": git_commit(),
        "code": code_record(code),
        "packages": package_versions(),
        "device": device_record(device),
        "implementation": dispatch.provenance(),
        "host": platform.node(),
        "platform": platform.platform(),
        "seed": seed,
        **extra,
    }
