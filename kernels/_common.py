"""Helpers the Triton kernels share: block-size choice, dot precision, dtype policy.

Importing this module imports triton; ``seqmix.kernels`` itself does not, so CPU-only
users never pay for it.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

HALF_DTYPES = (torch.float16, torch.bfloat16)


def interpreted(kernel) -> bool:
    """True when ``kernel`` runs under the Triton interpreter (on the CPU through numpy, slow
    but exact). Triton chooses when it decorates the kernel (TRITON_INTERPRET=1 at import), so
    the kernel object's type says what will run, whatever the environment says now."""
    return isinstance(kernel, InterpretedFunction)


def next_pow2(n: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(int(n), 1)))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Dtype of the matmul operands: the input's own 16-bit type (AMP), else fp32.

    Accumulation is always fp32; elementwise work (norms, gates, scans) is done in fp32.
    """
    return x.dtype if x.dtype in HALF_DTYPES else torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` for tl.dot on fp32 operands, following PyTorch's own switch.

    fp32 matmuls in PyTorch are exact unless ``torch.backends.cuda.matmul.allow_tf32`` is
    set; the kernels do the same so that kernel and reference differ only by summation order.
    16-bit operands ignore this (tensor cores, fp32 accumulation).
    """
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


# Set by ``tools.bench.compile_check`` while it records launches for compilation: the
# tensors are then fake CPU tensors, nothing runs, and the host code must take the branch it
# takes on a GPU (its tiles, its device check) on a GPU of ``_RECORDING["sms"]`` SMs.
_RECORDING: dict[str, int] = {}


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors on ``device`` (a nominal 4 on the CPU interpreter)."""
    if _RECORDING:
        return _RECORDING["sms"]
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def check_same_device(kernel, *tensors: torch.Tensor | None) -> torch.device:
    """The one device of ``tensors``, on which ``kernel`` can run (CUDA, or any under the interpreter)."""
    devs = {t.device for t in tensors if t is not None}
    if len(devs) != 1:
        raise ValueError(f"kernel inputs must be on one device, got {sorted(map(str, devs))}")
    dev = devs.pop()
    if dev.type != "cuda" and not interpreted(kernel) and not _RECORDING:
        raise RuntimeError(
            f"Triton kernels need CUDA tensors (got {dev}); on the CPU set TRITON_INTERPRET=1 "
            "before importing seqmix.kernels, or call the PyTorch reference"
        )
    return dev
