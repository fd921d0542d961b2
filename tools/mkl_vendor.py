"""oneMKL as it dispatches on the other vendor's CPU, on this one: evidence for docs/hosts.md.

oneMKL picks its code by the CPU's instruction sets *and* its vendor: on Intel an AVX-512 or
AVX2 kernel (or the AVX2 conditional-numerical-reproducibility branch, MKL_CBWR=AVX2), on
AMD a Zen kernel of its generic branch (MKL_CBWR=AVX2 silently runs AUTO there). The vendor
comes from three functions the PyTorch wheel's statically linked oneMKL exports and calls
through the dynamic linker: a preloaded library that answers them differently makes oneMKL
take the other vendor's branches, here. That is the dispatch only: the instructions still run
on this CPU, which computes every IEEE operation the branches use the same way (what differs
between vendors are the approximations rcpps/rsqrtps, which the COMPATIBLE branch never uses).

``build(directory, intel=True)`` compiles the library (a C compiler is needed); run a process
with ``LD_PRELOAD=<it>``. Checking what ran: ``perf report`` names mkl_blas_avx512_* against
mkl_blas_def_*_zen, and ``seqmix.train.provenance.mkl_branch`` reads AVX2 instead of AUTO.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = """\
/* oneMKL's vendor check, answered as on {vendor} CPUs (tools/mkl_vendor.py). */
int mkl_serv_intel_cpu_true(void) {{ return {intel}; }}
int mkl_serv_intel_cpu(void) {{ return {intel}; }}
int mkl_serv_cpuiszen(void) {{ return {zen}; }}
"""


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build(directory: str | Path, intel: bool = True) -> Path:
    """The preloadable library making oneMKL take ``intel`` (else AMD Zen) branches."""
    name = "intel" if intel else "amd"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source, library = directory / f"mkl_vendor_{name}.c", directory / f"libmkl_vendor_{name}.so"
    source.write_text(SOURCE.format(vendor="Intel" if intel else "AMD Zen", intel=int(intel), zen=int(not intel)))
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the oneMKL vendor shim")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)], check=True)
    return library
