"""The small library portable numerics loads before torch on every host, so that oneMKL computes
the same bits on any vendor's x86-64 CPU (seqmix.numerics). What it answers and why: its
source, seqmix/mkl_shim.c, whose comment is the one place that says so.

``load`` puts it in the process's global scope with ``dlopen(RTLD_GLOBAL)`` before torch is
imported, which has the effect of ``LD_PRELOAD`` (tests/core/test_numerics.py). It is built once per
machine with the system's C compiler (``cc``) into a cache folder, under a name keyed by its
source and flags, and renamed into place whole (two jobs starting at once each get a whole
library), with the SHA-256 of what was built beside it. A cached library is checked against
that digest before it is loaded, and one that is not what was built (truncated, overwritten,
without its digest) is built again instead: a damaged copy mapped into the process would kill
it with SIGBUS at its first call, with no message. Standard library only: all of it runs
before torch is imported.
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

SOURCE = Path(__file__).with_name("mkl_shim.c")  # ships with the package (pyproject's package-data)
FLAGS = ("-shared", "-fPIC", "-O2", "-fno-math-errno")  # sqrtf as the sqrt instruction: no errno call
VENDOR_CHECK_ONLY = "-DSEQMIX_VENDOR_CHECK_ONLY"  # the vendor answer without the square root (the probe's)
PREFIX = "libseqmix_mkl_shim"  # the library's file name, before its key
DIGEST = ".sha256"  # beside the library, the digest of the library as it was built
CACHE_ENV = "XDG_CACHE_HOME"  # the shim lives in $XDG_CACHE_HOME/seqmix (default ~/.cache/seqmix)
# The cache's parent as the entry points read it from CACHE_ENV (seqmix.cli, seqmix.study.dag).
CONFIGURED: dict = {"cache_home": None}


def configure(cache_home: str | None) -> None:
    """Where the shim is cached: ``cache_home``/seqmix (None or '': ~/.cache/seqmix)."""
    CONFIGURED["cache_home"] = cache_home or None


def compiler() -> str | None:
    """The C compiler the shim is built with (``cc``, else ``gcc``); None: there is none."""
    return shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    return Path(CONFIGURED["cache_home"] or Path.home() / ".cache") / "seqmix"


def flags(vendor_check_only: bool = False) -> tuple[str, ...]:
    return (*FLAGS, VENDOR_CHECK_ONLY) if vendor_check_only else FLAGS


def key(vendor_check_only: bool = False) -> str:
    """What names one build: the source, the flags and the machine it is built for."""
    parts = [SOURCE.read_text(), *flags(vendor_check_only), platform.machine()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def path(directory: Path | None = None, vendor_check_only: bool = False) -> Path:
    """Where the shim of this source is (or will be) built."""
    return (directory or cache_dir()) / f"{PREFIX}-{key(vendor_check_only)}.so"


def intact(library: Path) -> bool:
    """Whether ``library`` is the file that was built: its bytes have the digest recorded beside
    it when it was. False where either is missing or unreadable."""
    try:
        recorded = library.with_name(library.name + DIGEST).read_text().strip()
        return hashlib.sha256(library.read_bytes()).hexdigest() == recorded
    except OSError:
        return False


class ShimError(RuntimeError):
    """The shim cannot be built here (no compiler, a failing one, an unwritable cache)."""


def build(directory: Path | None = None, vendor_check_only: bool = False) -> Path:
    """The shim's library, built into ``directory`` (default ``cache_dir()``) unless an intact one
    is there (``intact``). ``vendor_check_only``: without its square root (tools.numerics_probe)."""
    target = path(directory, vendor_check_only)
    if intact(target):
        return target
    cc = compiler()
    if cc is None:
        raise ShimError("no C compiler (cc or gcc) on PATH")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
            # Compiled by relative names in the build folder: no path of it in the library, so
            # that two builds of one source give the same bytes, whichever lands last.
            Path(tmp, SOURCE.name).write_bytes(SOURCE.read_bytes())
            command = [cc, *flags(vendor_check_only), "-o", target.name, SOURCE.name]
            proc = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ShimError(f"{cc} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
            library, digest = Path(tmp, target.name), Path(tmp, target.name + DIGEST)
            digest.write_text(hashlib.sha256(library.read_bytes()).hexdigest() + "\n")
            # Each whole or absent: a job starting beside this one never sees half of either.
            os.replace(library, target)
            os.replace(digest, target.with_name(digest.name))
    except OSError as e:
        raise ShimError(f"cannot write {target.parent}: {e.strerror or e}") from None
    return target


def load(directory: Path | None = None) -> Path:
    """Build the shim if needed (or rebuild one that is not what was built) and put it in this
    process's global scope. Before torch is imported only: a oneMKL already loaded has bound its
    own functions."""
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
