"""The environment of a command: the one module of the command line that reads the process
environment or writes to it, and where the process's global settings are made from it.

``configure(args)`` runs before every command, and makes the three global settings, in order:

1. ``pin_numerics``: oneMKL's shim cache (``mkl_shim.configure``), then the command's numerics
   (seqmix.cli.inputs.numerics_of) checked against this host and set as the variables the
   libraries read, the shim loaded, all before torch is imported (nothing at the top of the
   command line imports it; a test keeps that so);
2. seqmix.allocator's setting, unless SEQMIX_SYSTEM_MALLOC=1;
3. ``dispatch.configure`` (SEQMIX_REFERENCE_MIXERS) and ``provenance.configure`` (the GPU slot,
   the commit, the numerics and the variables that pinned them), as every run records them.

A data job also takes the data mirror from here (``data_mirror``). The other modules that read
the environment are entry points of their own: seqmix.slots (the GPUs it spreads jobs over)
and seqmix.study.dag (the Snakefile's: its cache key, and the environment of the ``jobs``
command it runs); tests/mixers/test_dispatch.py keeps it so.
"""

from __future__ import annotations

import os
import sys

from seqmix import mkl_shim, numerics
from seqmix.cli.inputs import numerics_of
from seqmix.errors import ConfigError
from seqmix.study.settings import MIRROR_ENV

REFERENCE_ENV = "SEQMIX_REFERENCE_MIXERS"  # 1: plain PyTorch mixers everywhere (dispatch setting "reference")
SYSTEM_MALLOC_ENV = "SEQMIX_SYSTEM_MALLOC"  # 1: glibc's malloc defaults (seqmix.allocator not applied)
COMMIT_ENV = "SEQMIX_GIT_COMMIT"  # the commit a copy of the checkout without .git came from (provenance)
# seqmix.slots.SLOT_ENV, SEQMIX_GPU_SLOT: the GPU slot a training or evaluation job holds (provenance)
# MIRROR_ENV, SEQMIX_DATA_MIRROR: the raw-data mirror when data.mirror is null, given to data jobs


def configure(args) -> None:
    """This process's global settings, made once before the command runs (the module
    docstring); a host that cannot run the command's numerics is a ConfigError, raised before
    anything imports torch."""
    pin_numerics(args)
    from seqmix.mixers import dispatch
    from seqmix.slots import SLOT_ENV
    from seqmix.train import provenance

    keep_freed_memory_unless_asked()  # every step's large tensors reuse memory instead of page-faulting
    dispatch.configure("reference" if os.environ.get(REFERENCE_ENV) == "1" else "auto")
    provenance.configure(gpu_slot=os.environ.get(SLOT_ENV), commit=os.environ.get(COMMIT_ENV),
                         numerics=getattr(args, "numerics", None),
                         environment={k: os.environ[k] for k in numerics.VARIABLES if k in os.environ})


def pin_numerics(args) -> None:
    """Set the variables of the command's numerics (seqmix.numerics) and, for portable, load
    oneMKL's shim (seqmix.mkl_shim) before torch is imported, or refuse a host that cannot run
    them; ``args.numerics`` records the mode. In a process that imported torch before (a call
    from within Python: a test, a notebook) it is too late to pin the libraries, and nothing is
    set: provenance records the code paths that ran (seqmix.train.provenance.numerics_record),
    and the report flags runs that were not pinned."""
    mode, where = numerics_of(args)
    args.numerics = mode
    mkl_shim.configure(os.environ.get(mkl_shim.CACHE_ENV))
    if problem := numerics.host_problem(mode) or numerics.shim_problem(mode):
        raise ConfigError(problem + (f" (the numerics of {where})" if where else ""))
    if "torch" not in sys.modules:
        os.environ.update(numerics.environment(mode))
        if mode == "portable":
            mkl_shim.load()  # built by shim_problem; before libtorch binds oneMKL's functions


def keep_freed_memory_unless_asked() -> bool:
    """seqmix.allocator's setting unless SEQMIX_SYSTEM_MALLOC=1; True when it took effect."""
    from seqmix.allocator import keep_freed_memory

    return os.environ.get(SYSTEM_MALLOC_ENV) != "1" and keep_freed_memory()


def data_mirror() -> str | None:
    """$SEQMIX_DATA_MIRROR, the raw-data mirror a data job uses where data.mirror is null."""
    return os.environ.get(MIRROR_ENV) or None


def compiler() -> str:
    """$CXX, else c++: the C++ compiler torch's extension builder runs (Mamba's fused scan)."""
    return os.environ.get("CXX") or "c++"
