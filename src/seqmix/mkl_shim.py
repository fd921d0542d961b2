"""The small library portable numerics loads before torch on every host, so that oneMKL computes
the same bits on any vendor's x86-64 CPU (seqmix.numerics, README "Numerics"). It does two things.

oneMKL takes its AVX2 branch on any vendor's CPU. oneMKL picks its code from the CPU's
instruction sets and from its vendor: its conditional numerical reproducibility (CNR) branches
other than AUTO and COMPATIBLE exist on Intel CPUs only, and elsewhere ``MKL_CBWR=AVX2``
silently runs AUTO (oneMKL developer guide, "Getting Started with Conditional Numerical
Reproducibility"). The vendor comes from three functions of oneMKL's service layer, which the
PyTorch wheel's statically linked oneMKL exports and calls through the dynamic linker; this
library answers them as on an Intel CPU (where that is the true answer). These functions are
oneMKL's internals, not an interface Intel supports: a oneMKL that renamed them would ignore
the answer. Nothing fails then, but the process reports oneMKL's branch AUTO
(seqmix.train.provenance.numerics_record), its runs are recorded as not pinned, and the
fingerprint test fails on such a host.

``torch.sqrt`` is IEEE's square root. ATen computes it with oneMKL's vector math (``vmsSqrt``,
called through the dynamic linker too), whose AVX2 kernel refines the CPU's approximate
``vrsqrtps``: that instruction's results differ between vendors, and the refined square root
is not correctly rounded for some inputs below 2^-102, which ones depending on the
approximation (docs/numerics-probe.md). AdamW takes the square root of every parameter's
second moment at every step: one that small would round otherwise on another vendor's CPU.
Here ``vmsSqrt`` is the correctly rounded one, which every x86-64 CPU computes alike.

A library that defines these functions and sits in the process's global scope before torch
loads libtorch_cpu is found first (the global scope is searched before a library's own
definitions): ``load`` puts it there with ``dlopen(RTLD_GLOBAL)`` in the process itself, which
has the effect of ``LD_PRELOAD`` (tests/test_numerics.py). Built once per machine with the
system's C compiler (``cc``) into a cache folder, under a name keyed by its source and flags,
and renamed into place whole (two jobs starting at once each get a whole library). Standard
library only: all of it runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

VENDOR_CHECK = """\
/* oneMKL's vendor check, answered as on an Intel CPU: its CNR branches other than AUTO and
   COMPATIBLE then run on any vendor's CPU. */
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
int mkl_serv_cpuiszen(void) { return 0; }
"""
SQUARE_ROOT = """\
/* oneMKL's single-precision vector square root (n: MKL_INT of the LP64 interface), as ATen
   calls it for torch.sqrt: IEEE's, correctly rounded on every CPU, instead of a refinement
   of the CPU's approximate vrsqrtps. */
#include <math.h>
void vmsSqrt(int n, const float *a, float *r, long long mode) {
  (void)mode;
  for (int i = 0; i < n; ++i) r[i] = sqrtf(a[i]);
}
"""
SOURCE = "/* Loaded by seqmix before torch (seqmix/mkl_shim.py). */\n" + VENDOR_CHECK + SQUARE_ROOT
FLAGS = ("-shared", "-fPIC", "-O2", "-fno-math-errno")  # sqrtf as the sqrt instruction: no errno call
PREFIX = "libseqmix_mkl_shim"  # the library's file name, before its key
CACHE_ENV = "XDG_CACHE_HOME"  # the shim lives in $XDG_CACHE_HOME/seqmix (default ~/.cache/seqmix)
# The cache's parent as the entry points read it from CACHE_ENV (seqmix.cli, seqmix.study.dag).
SETTINGS: dict = {"cache_home": None}


def configure(cache_home: str | None) -> None:
    """Where the shim is cached: ``cache_home``/seqmix (None or '': ~/.cache/seqmix)."""
    SETTINGS["cache_home"] = cache_home or None


def compiler() -> str | None:
    """The C compiler the shim is built with (``cc``, else ``gcc``); None: there is none."""
    return shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    return Path(SETTINGS["cache_home"] or Path.home() / ".cache") / "seqmix"


def key() -> str:
    """What names one build: the source, the flags and the machine it is built for."""
    return hashlib.sha256("\n".join([SOURCE, *FLAGS, platform.machine()]).encode()).hexdigest()[:16]


def path(directory: Path | None = None) -> Path:
    """Where the shim of this source is (or will be) built."""
    return (directory or cache_dir()) / f"{PREFIX}-{key()}.so"


class ShimError(RuntimeError):
    """The shim cannot be built here (no compiler, a failing one, an unwritable cache)."""


def build(directory: Path | None = None) -> Path:
    """The shim's library, built into ``directory`` (default ``cache_dir()``) unless it is there."""
    target = path(directory)
    if target.exists():
        return target
    cc = compiler()
    if cc is None:
        raise ShimError("no C compiler (cc or gcc) on PATH")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
            source, library = Path(tmp) / "mkl_shim.c", Path(tmp) / target.name
            source.write_text(SOURCE)
            proc = subprocess.run([cc, *FLAGS, "-o", str(library), str(source)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise ShimError(f"{cc} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
            os.replace(library, target)  # whole or absent: a job starting beside this one never sees half
    except OSError as e:
        raise ShimError(f"cannot write {target.parent}: {e.strerror or e}") from None
    return target


def load(directory: Path | None = None) -> Path:
    """Build the shim if needed and put it in this process's global scope. Before torch is
    imported only: a oneMKL already loaded has bound its own functions."""
    library = build(directory)
    ctypes.CDLL(str(library), mode=os.RTLD_GLOBAL)
    return library


def loaded() -> str | None:
    """The shim's file if this process has it mapped (loaded by ``load`` or ``LD_PRELOAD``), else None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith(PREFIX):
            return fields[5]
    return None
