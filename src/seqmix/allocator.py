"""Keep freed memory in the process instead of handing it back to the OS (glibc only).

glibc's malloc serves every request above its mmap threshold (at most 32 MiB) with a fresh
mmap, unmaps it on free and trims the heap's free top, so the next allocation of that size
page-faults on every 4 KiB page it touches; a CPU training step allocates the same large
tensors every step (logits, attention scores, Mamba's states). This is the reuse PyTorch's
CPU performance guide gets from jemalloc or TCMalloc, set with glibc's own ``mallopt`` so
that nothing is preloaded. Resident memory stays at its peak, which rules declare anyway.
The CLI calls it for every command unless ``SEQMIX_SYSTEM_MALLOC=1``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # <malloc.h>: free top of heap kept up to this many bytes
M_MMAP_MAX = -4  # <malloc.h>: at most this many mmap-served chunks (0: none, use the heap)
INT_MAX = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Ask glibc to serve large allocations from the heap and never trim it; True when it
    took effect (False on other C libraries)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, INT_MAX))
