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

from seqmix import REPO_ROOT, mkl_shim, numerics
from seqmix.mixers import dispatch
from seqmix.sources import Code

PACKAGES = ("torch", "triton", "numpy", "datasets", "tokenizers", "snakemake", "seqmix")


# What only the environment tells, set once per process by the CLI (seqmix.cli.environment.configure):
# the GPU slot the job holds (seqmix.slots: "<gpu>/<slot index>"), in a copy of the checkout
# without git's data (a GPU machine's) the commit it was made from, the numerics the command
# asked for (seqmix.numerics) and the process's values of the variables that pin them.
CONFIGURED: dict = {"gpu_slot": None, "commit": None, "numerics": None, "environment": {}}


def configure(gpu_slot: str | None = None, commit: str | None = None, numerics: str | None = None,
              environment: dict[str, str] | None = None) -> None:
    CONFIGURED.update(gpu_slot=gpu_slot or None, commit=commit or None, numerics=numerics,
                    environment=dict(environment or {}))


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
    return {"commit": CONFIGURED["commit"], "dirty": None}


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_name() -> str:
    return numerics.cpu_model()


# oneMKL's conditional-numerical-reproducibility branches, as mkl_cbwr_get returns them
# (mkl_cbwr.h; each read back after setting MKL_CBWR on this wheel's oneMKL 2024.2)
MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
                14: "AVX512_E1"}
MKL_CBWR_ALL, MKL_CBWR_STRICT = -1, 0x10000  # mkl_cbwr_get's "every setting", and its strict-mode bit


def mkl_branch() -> str | None:
    """The oneMKL code branch this process runs, as ``MKL_CBWR`` names it (``AVX2,STRICT``):
    what oneMKL reports after choosing (on a non-Intel CPU without seqmix.mkl_shim's shim an
    Intel-only branch reads AUTO); None without oneMKL."""
    import ctypes

    try:
        get = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_int
    code = get(MKL_CBWR_ALL)
    if code < 0:  # an error code: this oneMKL reads the branch alone
        code = get(1)  # MKL_CBWR_BRANCH
    return MKL_BRANCHES.get(code & 0xFFFF, str(code & 0xFFFF)) + (",STRICT" if code > 0 and code & MKL_CBWR_STRICT else "")


def numerics_record() -> dict:
    """The numerics this process runs: the mode its command asked for (seqmix.numerics),
    whether each library took the pinned path (ATen's capability and oneMKL's branch read
    from the libraries, oneMKL's and oneDNN's caps from the environment), the file of oneMKL's
    shim where it is loaded (seqmix.mkl_shim), the threads, and the CPU with its vendor and
    flags. ``pinned``: every pin in effect, so that the run's bits are those of any other host
    with AVX2 and FMA (docs/reference/hosts.md)."""
    env = CONFIGURED["environment"]
    effective = {"aten_capability": torch.backends.cpu.get_cpu_capability(), "mkl_branch": mkl_branch(),
                 "mkl_max_isa": env.get("MKL_ENABLE_INSTRUCTIONS"), "onednn_max_isa": env.get("ONEDNN_MAX_CPU_ISA"),
                 "threads": torch.get_num_threads(), numerics.SHIM: mkl_shim.loaded()}
    flags = numerics.cpu_flags()
    return {"mode": CONFIGURED["numerics"], "pinned": numerics.differences(effective) == [], **effective,
            "environment": env, "cpu": numerics.cpu_model(), "vendor": numerics.cpu_vendor(),
            "vector_isa": numerics.vector_isa(flags), "cpu_flags": " ".join(flags)}


def device_record(device: torch.device) -> dict:
    rec = {"type": device.type, "cpu": cpu_name(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
        rec["cuda"] = torch.version.cuda
    rec["name"] = rec.get("gpu", rec["cpu"])
    if CONFIGURED["gpu_slot"]:  # the GPU slot the job held (seqmix.slots): <gpu>/<slot index>
        rec["gpu_slot"] = CONFIGURED["gpu_slot"]
    return rec


def code_record(code: Code | None = None) -> dict:
    """The folders seqmix and its kernels were imported from (the checkout that ran), the
    digest of the code that made the result and each of its files' (seqmix.sources)."""
    import seqmix

    # Found, not imported: importing the kernels' package would make it code of every run.
    # Resolved: a checkout reaches its kernels/ through the link src/seqmix/kernels.
    kernels = importlib.util.find_spec("seqmix.kernels")
    return {"seqmix": str(Path(seqmix.__file__).parent), "kernels": str(Path(kernels.origin).resolve().parent),
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
        "numerics": numerics_record(),
        "host": platform.node(),
        "platform": platform.platform(),
        "seed": seed,
        **extra,
    }
