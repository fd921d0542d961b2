"""The one registry of the fast paths of ``seqmix.kernels``, ``KERNELS``: each fast path with
the plain reference it must equal (the specification, in its mixer's module) and the test
that compares the two forward and backward, as flash-linear-attention keeps each op's naive
form beside its fused ones. The maintainer's tools (tools/bench) compile, time and check on
a GPU the Triton ones, ``triton_kernels()``.

A module of its own, which no mixer imports: a run's code is the closure of its imports
(seqmix.sources), and every module of a package imports the package's ``__init__``, so a
registry there would be part of every run that takes a kernel, and an entry added here would
retrain GLA, Performer and Mamba.
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A fast path and the reference it equals, each ``"module:function"``; ``form``: how the
    fast path runs; ``test``: the test module that compares them forward and backward."""

    fast: str
    reference: str
    form: Literal["triton", "cpp", "pytorch"]
    test: str

    @property
    def module(self) -> str:
        return self.fast.partition(":")[0]


KERNELS: dict[str, Kernel] = {
    # never stores the Plücker tensor
    "grassmann": Kernel("seqmix.kernels.grassmann:grassmann_mix", "seqmix.mixers.grassmann:grassmann_mix_reference",
                        "triton", "tests/test_kernels.py"),
    "gla": Kernel("seqmix.kernels.gla:chunk_gla", "seqmix.mixers.gla:gla_recurrent_reference",
                  "triton", "tests/test_kernels.py"),
    "tssa": Kernel("seqmix.kernels.tssa:tssa", "seqmix.mixers.tssa:tssa_reference", "triton", "tests/test_kernels.py"),
    # the D skip and SiLU(z) gate inside; the backward recomputes the states from per-chunk
    # checkpoints instead of storing L x D x N
    "selective_scan": Kernel("seqmix.kernels.selective_scan:selective_scan",
                             "seqmix.mixers.mamba:selective_scan_reference", "triton", "tests/test_kernels.py"),
    # time-major, without D and z: the mixer's selective_scan_fused adds them
    "selective_scan_cpu": Kernel("seqmix.kernels.selective_scan_cpu:selective_scan_cpu",
                                 "seqmix.mixers.mamba:selective_scan_reference", "cpp", "tests/test_zoo_recurrent.py"),
    # time-major, without D and z: the mixer's selective_scan_chunked adds them
    "selective_scan_chunked": Kernel("seqmix.kernels.selective_scan_chunked:selective_scan_chunked",
                                     "seqmix.mixers.mamba:selective_scan_reference", "pytorch",
                                     "tests/test_zoo_recurrent.py"),
    "linear_scan": Kernel("seqmix.kernels.linear_scan:linear_scan", "seqmix.mixers.scan:linear_scan_reference",
                          "pytorch", "tests/test_zoo_recurrent.py"),
}


def triton_kernels() -> dict[str, Kernel]:
    """The Triton kernels of ``KERNELS``, by name (the module's: kernels/<name>.py)."""
    return {name: k for name, k in KERNELS.items() if k.form == "triton"}
