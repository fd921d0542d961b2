"""Fast paths beside the mixers' references, importable as ``seqmix.kernels``: the Triton
kernels in ``KERNELS`` (each a ``torch.autograd.Function`` or ``torch.library`` op behind one
function with its reference's signature) and Mamba's fused C++ CPU scan
(``selective_scan_cpu``). Mixers reach them through ``seqmix.mixers.dispatch``. This package
imports nothing heavy: triton is imported by the submodules only, so that CPU-only users can
``import seqmix`` without it. On a CPU the Triton kernels run under ``TRITON_INTERPRET=1``,
set before they are imported: slow, exact, and how ``tests/test_kernels.py`` checks them.
"""

from __future__ import annotations

import importlib.util

KERNELS = {  # each equals its reference: the fused Grassmann kernel never stores the Plücker tensor
    "grassmann": "seqmix.kernels.grassmann:grassmann_mix",  # = mixers.grassmann.grassmann_mix_reference (causal)
    "gla": "seqmix.kernels.gla:chunk_gla",  # = mixers.gla.gla_recurrent_reference
    "tssa": "seqmix.kernels.tssa:tssa",  # = mixers.tssa.tssa_reference
    # = mixers.mamba.selective_scan_reference with the D skip and SiLU(z) gate inside; the
    # backward recomputes the states from per-chunk checkpoints instead of storing L x D x N
    "selective_scan": "seqmix.kernels.selective_scan:selective_scan",
}


def available() -> bool:
    """True when triton can be imported (the kernels themselves need CUDA or the interpreter)."""
    return importlib.util.find_spec("triton") is not None
