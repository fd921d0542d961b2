"""Triton's JIT without a GPU: record the project's kernel launches on fake tensors, derive
each launch's specialisation as the JIT would on an sm_80 or sm_90 GPU, and compile it.

Triton compiles a kernel once per specialisation: pointer dtypes and 16-byte alignment,
integers equal to 1 (compiled in as constants) or multiples of 16, constexprs, num_warps.
A kernel can compile at one and fail at another (ToST's causal kernels with Triton 3.6,
issue 24), so the specialisations come from the real calls, through Triton's own binder.
Kernels behind a ``torch.library`` custom op (Mamba's selective scan) are reached by running
the op's own host code on the fakes, where FakeTensorMode would run only its fake impl.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

# Compute capability -> SMs of the GPU it stands for (A100 SXM, H100 SXM): only grid sizes use it.
TARGETS = {80: 108, 90: 132}
Case = tuple  # (origin, call): see tools.bench.compile_cases



# ---------------------------------------------------------------------------------------
# Recording launches through Triton's JIT, without a GPU
# ---------------------------------------------------------------------------------------


class _Target:
    """A stand-in for Triton's active driver: the device is the capability, the target that GPU."""

    def __init__(self, arch: int):
        self.arch = arch

    def get_current_device(self) -> int:
        return self.arch  # one JIT device cache per target

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)


@contextlib.contextmanager
def _targeting(arch: int):
    """Triton's active driver is ``_Target(arch)`` for the block (restored as it was: without a
    GPU there is no default driver to reset to)."""
    from triton.runtime.driver import driver

    active = driver._active
    driver.set_active(_Target(arch))
    try:
        yield
    finally:
        driver.set_active(active)


class _Pointer:
    """A tensor argument as the JIT's binder sees it (triton.runtime.jit.MockTensor's interface):
    its dtype, and the address a CUDA tensor would have: the caching allocator hands out
    512-byte aligned blocks, and a view adds its storage offset."""

    def __init__(self, t: torch.Tensor):
        self.dtype, self.shape = t.dtype, list(t.shape)
        self._address = 512 + t.storage_offset() * t.element_size()

    def data_ptr(self) -> int:
        return self._address

    def stride(self) -> tuple[int, ...]:
        return (1,)

    def __repr__(self) -> str:  # the launch's identity: what the binder reads
        return f"*{self.dtype}@{self._address % 16}"


def jit_kernels(module) -> dict:
    """The module's own ``@triton.jit`` functions, by name."""
    from triton.runtime.jit import JITFunction

    return {name: obj for name, obj in vars(module).items()
            if isinstance(obj, JITFunction) and obj.fn.__module__ == module.__name__}


def custom_ops(module) -> list:
    """The module's own ``torch.library`` custom ops (selective_scan's halves)."""
    from torch._library.custom_ops import CustomOpDef

    return [op for op in vars(module).values()
            if isinstance(op, CustomOpDef) and op._init_fn.__module__ == module.__name__]


@contextlib.contextmanager
def _real_host_code(ops: list):
    """FakeTensorMode runs a custom op's fake impl (shapes only: no launch); in the block it
    runs the op's own function instead, whose host code launches the kernels on the fakes.
    ``_abstract_fn`` / ``_init_fn`` are torch's CustomOpDef internals (torch 2.4 to 2.13)."""
    fakes = [op._abstract_fn for op in ops]
    for op in ops:
        op._abstract_fn = op._init_fn
    try:
        yield
    finally:
        for op, fake in zip(ops, fakes):
            op._abstract_fn = fake


@dataclasses.dataclass
class Launch:
    """One distinct launch: the kernel, its arguments as the binder sees them, where it came from."""

    kernel: object  # the JITFunction
    args: tuple
    kwargs: dict
    origins: list[str]


@contextlib.contextmanager
def _gpu_host_code(modules: list, sink: dict[tuple, Launch], origin: list[str], kept: set[str]):
    """The kernels' host code on its GPU branch, on fake CPU tensors, with every launch of the
    modules named in ``kept`` kept in ``sink``; none is run: the tensors are
    fake (shapes, dtypes, strides; no arithmetic), so paper-sized batches cost nothing."""
    from seqmix.kernels import _common
    from seqmix.mixers import dispatch

    def keep(kernel):
        def launch(*args, grid, warmup, **kwargs):
            if kernel.fn.__module__ not in kept:
                return
            args = tuple(_Pointer(a) if isinstance(a, torch.Tensor) else a for a in args)
            kwargs = {k: _Pointer(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            key = (id(kernel), repr(args), repr(sorted(kwargs.items())))
            got = sink.setdefault(key, Launch(kernel, args, kwargs, []))
            if origin[0] not in got.origins:
                got.origins.append(origin[0])
        return launch

    kernels = [k for m in modules for k in jit_kernels(m).values()]
    ops = [op for m in modules for op in custom_ops(m)]
    if any(_common.interpreted(k) for k in kernels):
        raise RuntimeError("the kernels were defined under the Triton interpreter (TRITON_INTERPRET=1): "
                           "run this check in a process without it")
    applies = dispatch._applies
    _common._RECORDING["sms"] = max(TARGETS.values())
    dispatch._applies = lambda path, x, setting: path.kind == "triton"  # as for a CUDA tensor
    for k in kernels:
        k.run = keep(k)
    try:
        with dispatch.isolated("auto"), _real_host_code(ops):
            yield
    finally:
        for k in kernels:
            del k.run
        dispatch._applies = applies
        _common._RECORDING.clear()


def record(cases: list[Case], modules: list, kept: set[str]) -> tuple[list[Launch], list[str]]:
    """Every distinct launch of ``cases`` by a kernel of the modules ``kept``; and the cases
    that raised."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    sink: dict[tuple, Launch] = {}
    origin = [""]
    errors = []
    with _gpu_host_code(modules, sink, origin, kept), FakeTensorMode(allow_non_fake_inputs=True):
        for where, call in cases:
            origin[0] = where
            try:
                call()
            except Exception as err:  # noqa: BLE001 - a case that cannot run is reported, the rest go on
                errors.append(f"{where}: {type(err).__name__}: {' '.join(str(err).split())[:300]}")
    return list(sink.values()), errors


def specialise(arch: int, launches: list[Launch]) -> dict[str, tuple[object, list[str]]]:
    """Triton's serialised specialisation of each launch on target ``arch`` (the JIT's
    binder, stopped by ``jit_cache_hook`` before it compiles), merged:
    {specialisation data: (kernel, origins)}."""
    from triton import knobs

    out: dict[str, tuple[object, list[str]]] = {}
    current: list[Launch] = []

    def hook(*, fn, compile, **_):
        kernel, origins = out.setdefault(compile["specialization_data"], (fn.jit_function, []))
        origins += [o for o in current[0].origins if o not in origins]
        return True  # recorded: do not compile here

    knobs.runtime.jit_cache_hook = hook
    try:
        with _targeting(arch):
            for launch in launches:
                current[:] = [launch]
                type(launch.kernel).run(launch.kernel, *launch.args, grid=(1,), warmup=True, **launch.kwargs)
    finally:
        knobs.runtime.jit_cache_hook = None
    return out


# ---------------------------------------------------------------------------------------
# Compiling
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _stderr_into(path: str):
    """File descriptor 2 into ``path``: the compiler's C++ assertions are printed, not raised."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _message(err: Exception) -> str:
    """An error's message on one line. Triton's front-end errors quote the kernel's source up
    to the failing line, then give the reason: kept as place, line and reason."""
    text = str(err)
    reason = getattr(err, "error_message", None)
    if reason and text.startswith("at "):
        lines = text.splitlines()
        caret = next((i for i, ln in enumerate(lines) if ln.strip() == "^"), 0)
        text = f"{lines[0]} {lines[caret - 1].strip() + ': ' if caret else ''}{reason}"
    return " ".join(text.split())[:400]


def _first_error_lines(err: Exception, stderr: str, n: int = 3) -> str:
    keep = [ln.strip() for ln in stderr.splitlines()
            if re.search(r"Assertion|error:|Error|failed", ln) and len(ln) < 2000]
    keep.append(f"{type(err).__name__}: {_message(err)}")
    return " | ".join(dict.fromkeys(keep[:n] + keep[-1:]))


def compile_one(arch: int, kernel_name: str, data: str) -> tuple[str, float]:
    """("ok" or "failed: <first lines of the error>", seconds) of compiling one recorded
    launch for ``arch``; ``kernel_name`` is "module:qualname" (picklable, for worker processes)."""
    import importlib

    module, name = kernel_name.split(":")
    kernel = getattr(importlib.import_module(module), name)
    started = time.time()
    with tempfile.NamedTemporaryFile("r", suffix=".stderr") as log, _targeting(arch):
        try:
            with _stderr_into(log.name):
                kernel.preload(data)
            status = "ok"
        except Exception as err:  # noqa: BLE001 - a failed compile is the result
            status = "failed: " + _first_error_lines(err, Path(log.name).read_text(errors="replace"))
    return status, time.time() - started


def compile_all(tasks: list[tuple[int, str, str]], jobs: int) -> list[tuple[str, float]]:
    """compile_one over (arch, kernel name, data) tasks, in ``jobs`` worker processes (spawned:
    a compile in a worker is the same call, in a fresh process) or here."""
    if jobs <= 1:
        return [compile_one(*t) for t in tasks]
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(compile_one, *zip(*tasks), chunksize=4))
