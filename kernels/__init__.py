"""Triton kernels, importable as ``seqmix.kernels``: fast paths beside the mixers' references.

This package imports nothing heavy: triton is imported by the submodules only, so that
CPU-only users can ``import seqmix`` without it. Each kernel is a ``torch.autograd.Function``
(forward and backward) behind one function with its reference's signature:

- ``seqmix.kernels.grassmann.grassmann_mix``  = ``mixers.grassmann.grassmann_mix_reference``
  (causal offsets), fused: the L × offsets × r(r-1)/2 Plücker tensor is never stored.
- ``seqmix.kernels.gla.chunk_gla``             = ``mixers.gla.gla_recurrent_reference``
- ``seqmix.kernels.tssa.tssa``                 = ``mixers.tssa.tssa_reference``

Beside them, for CPU tensors and without triton: ``seqmix.kernels.selective_scan_cpu``, Mamba's
selective scan as one C++ loop (compiled at first use by ``torch.utils.cpp_extension``) =
``mixers.mamba.selective_scan_reference``.

Mixers reach them through ``seqmix.mixers.dispatch`` (Triton for CUDA tensors, the C++ scan
for CPU tensors, the reference under ``train.reference_mixers`` or ``SEQMIX_REFERENCE_MIXERS=1``;
a kernel that fails falls back to its reference). On the CPU the Triton kernels run under
``TRITON_INTERPRET=1`` (set before the submodules are imported): slow, exact, and what
``tests/test_kernels.py`` uses.
"""

from __future__ import annotations

import importlib.util

KERNELS = {
    "grassmann": "seqmix.kernels.grassmann:grassmann_mix",
    "gla": "seqmix.kernels.gla:chunk_gla",
    "tssa": "seqmix.kernels.tssa:tssa",
}


def available() -> bool:
    """True when triton can be imported (the kernels themselves need CUDA or the interpreter)."""
    return importlib.util.find_spec("triton") is not None
