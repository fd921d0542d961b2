"""Which implementation runs a mixer's hot loop: a Triton kernel, a fused CPU op or the plain
PyTorch reference. One setting per process (``configure``, called by the CLI) or per block
(``using``: one training run, a test, a benchmark case), a ``Record`` of the path each
named fast path took (for provenance.json and benchmark rows), and a fallback to the
reference, with one ``KernelFallbackWarning``, when a fast path fails (``call``).

Under ``torch.compile`` (``train.compile``) a call takes the path an eager call of the same
name, setting and device took before it (the compiled step's first step runs eagerly,
``seqmix.train.step``): the reference is traced; a fast path whose kernels are
``torch.library`` custom ops with fake and autograd registrations (``compilable``) is traced
too, as one node per op, so the graph has no break and a CUDA graph replays its launches;
any other fast path runs as an opaque call (``torch.compiler.disable``, a graph break). The
compiler never traces the fallback's try/except.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import warnings
from collections.abc import Callable, Iterator
from typing import Literal, get_args

import torch
from torch._subclasses.fake_tensor import FakeTensor  # imported by torch itself

# auto: Triton kernels for CUDA tensors, fused CPU ops for CPU tensors, else the reference;
# reference: the reference everywhere (config train.reference_mixers, or SEQMIX_REFERENCE_MIXERS=1);
# triton: Triton kernels for CPU tensors too, under the Triton interpreter (TRITON_INTERPRET=1
# before the kernels are imported): how the tests check a mixer's kernel dispatch on a CPU.
Implementation = Literal["auto", "reference", "triton"]
IMPLEMENTATIONS: tuple[str, ...] = get_args(Implementation)
FastKind = Literal["triton", "fused_cpu"]


class KernelFallbackWarning(RuntimeWarning):
    """A fast path failed and the PyTorch reference took its place (once per kernel and process)."""


@dataclasses.dataclass(frozen=True)
class FastPath:
    """A fast implementation taking the reference's arguments. ``available()`` says whether it
    can run on this machine at all (triton installed, the C++ op built); it is asked only when
    the path applies, so a GPU machine never builds the CPU op."""

    kind: FastKind
    fn: Callable[..., torch.Tensor]
    available: Callable[[], bool]
    compilable: bool = False  # torch.compile may trace ``fn`` (custom ops inside): no graph break


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_path(fn: Callable[..., torch.Tensor], compilable: bool = False) -> FastPath:
    """A Triton kernel: used for CUDA tensors (every tensor under the ``triton`` setting).
    ``compilable``: ``fn`` calls its kernels through ``torch.library`` custom ops, which
    torch.compile traces as graph nodes (module docstring)."""
    return FastPath("triton", fn, triton_installed, compilable)


def fused_cpu_path(fn: Callable[..., torch.Tensor], available: Callable[[], bool]) -> FastPath:
    """A fused op for CPU tensors."""
    return FastPath("fused_cpu", fn, available)


@dataclasses.dataclass
class Record:
    """The setting of one block and the paths its calls took, by fast-path name, in order."""

    setting: Implementation
    paths: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def note(self, name: str, path: str) -> None:
        taken = self.paths.setdefault(name, [])
        if path not in taken:
            taken.append(path)

    def taken(self) -> dict[str, str]:
        """{name: path}; a name that took several paths lists them in order, joined by '; '."""
        return {name: "; ".join(paths) for name, paths in sorted(self.paths.items())}


# Process state: the stack of blocks (the bottom one is the process's, set by ``configure``),
# the fast paths that failed (name -> reason) and the signatures whose backward ran once.
_BLOCKS: list[Record] = [Record("auto")]
_FAILED: dict[str, str] = {}
_CHECKED: set[tuple] = set()
# (name, setting, device type) -> the fast path an eager call took, as the compiler calls it
# (wrapped in ``torch.compiler.disable`` unless compilable); a name that took the reference
# has no entry.
_RESOLVED: dict[tuple, Callable[..., torch.Tensor]] = {}


def _check_setting(setting: str) -> Implementation:
    if setting not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {setting!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    return setting  # type: ignore[return-value]


def configure(setting: Implementation) -> None:
    """The process's setting (the CLI calls this once, from the config and environment)."""
    _BLOCKS[0].setting = _check_setting(setting)


def current() -> Implementation:
    return _BLOCKS[-1].setting


def record() -> Record:
    """The record of the innermost block (the process's outside any ``using``)."""
    return _BLOCKS[-1]


@contextlib.contextmanager
def using(setting: Implementation | None = None) -> Iterator[Record]:
    """Run a block under ``setting`` (None: the setting in force) with a fresh record, which
    it yields; the previous setting and record return afterwards."""
    block = Record(_check_setting(setting) if setting is not None else current())
    _BLOCKS.append(block)
    try:
        yield block
    finally:
        _BLOCKS.remove(block)


@contextlib.contextmanager
def isolated(setting: Implementation = "auto") -> Iterator[Record]:
    """A fresh process state for the block (no failures remembered, nothing checked): for tests."""
    global _BLOCKS, _FAILED, _CHECKED, _RESOLVED
    saved = _BLOCKS, _FAILED, _CHECKED, _RESOLVED
    _BLOCKS, _FAILED, _CHECKED, _RESOLVED = [Record(_check_setting(setting))], {}, set(), {}
    try:
        yield _BLOCKS[0]
    finally:
        _BLOCKS, _FAILED, _CHECKED, _RESOLVED = saved


def provenance() -> dict:
    """What the innermost block ran: setting, paths taken, Triton's version (None: not installed)."""
    block = record()
    return {"setting": block.setting, "paths": block.taken(), "triton": _version("triton")}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _applies(path: FastPath, x: torch.Tensor, setting: Implementation) -> bool:
    if path.kind == "triton":
        return x.is_cuda or setting == "triton"
    return x.device.type == "cpu"


def _tracing(x: torch.Tensor) -> bool:
    return x.is_meta or isinstance(x, FakeTensor)


def call(name: str, args: tuple, reference: Callable[..., torch.Tensor], *paths: FastPath) -> torch.Tensor:
    """``reference(*args)``, or the first of ``paths`` that applies to the first tensor of
    ``args`` under the setting in force. A fast path that raises, or whose backward fails at
    a new signature (``_check_backward``), gives way to the reference for this call and the
    rest of the process. Not caught: CUDA out-of-memory (the reference needs more memory, so
    it would fail too, later; the fix is a smaller batch) and errors on fake or meta tensors
    (the tracer's). ``warnings.simplefilter("error", KernelFallbackWarning)`` makes a
    fallback an error, for a GPU check that must prove the kernels."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    if torch.compiler.is_compiling():
        return _compiled_call(name, args, reference, x)
    block = record()
    path = None if block.setting == "reference" else next(
        (p for p in paths if _applies(p, x, block.setting)), None)
    if path is None:
        block.note(name, "reference")
        return reference(*args)
    if name in _FAILED:
        block.note(name, f"reference (fallback: {_FAILED[name]})")
        return reference(*args)
    if not path.available():
        block.note(name, f"reference ({path.kind} not available here)")
        return reference(*args)
    if _tracing(x):
        block.note(name, path.kind)
        return path.fn(*args)
    try:
        out = path.fn(*args)
        if path.kind == "triton":
            _check_backward(name, path, x, args)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the fast path (docstring)
        block.note(name, f"reference (fallback: {_fall_back(name, path, args, err)})")
        return reference(*args)
    block.note(name, path.kind)
    if (key := (name, block.setting, x.device.type)) not in _RESOLVED:
        _RESOLVED[key] = path.fn if path.compilable else torch.compiler.disable(path.fn)
    return out


def _compiled_call(name: str, args: tuple, reference: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A call traced by torch.compile: the fast path an eager call resolved, opaque to the
    compiler, else the reference, traced (module docstring)."""
    fast = _RESOLVED.get((name, current(), x.device.type))
    return reference(*args) if fast is None or name in _FAILED else fast(*args)


def _signature(args: tuple) -> tuple:
    """What a Triton kernel is compiled for, at most: shapes, dtypes, devices, non-tensor args."""
    return tuple((a.shape, a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor)
                 else a if isinstance(a, int | float | str | tuple | None) else repr(a) for a in args)


def _check_backward(name: str, path: FastPath, x: torch.Tensor, args: tuple) -> None:
    """Run the kernel's backward once per signature on detached copies of ``args``, so that a
    backward that fails to compile fails here, where the reference can still take the call,
    instead of in ``loss.backward()`` when no forward can be redone (Triton compiles each
    kernel at its first launch). An OOM here skips the check: it is not the kernel's fault."""
    if not torch.is_grad_enabled():
        return
    wants = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    key = (name, path.kind, torch.is_autocast_enabled(x.device.type), _signature(args))
    if not wants or key in _CHECKED:
        return
    leaves = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                   for a in args)
    try:
        out = path.fn(*leaves)
        torch.autograd.grad(out, [leaves[i] for i in wants], torch.ones_like(out), allow_unused=True)
    except torch.OutOfMemoryError:
        return
    _CHECKED.add(key)


def _fall_back(name: str, path: FastPath, args: tuple, err: Exception) -> str:
    """Warn once and remember the failure for the rest of the process; returns the reason."""
    message = " ".join(str(err).split())
    reason = f"{path.kind} failed: {type(err).__name__}: {message[:300]}"
    shapes = ", ".join(f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}"
                       for a in args if isinstance(a, torch.Tensor))
    device = next(a for a in args if isinstance(a, torch.Tensor)).device
    versions = (f"Triton {_version('triton')}, " if path.kind == "triton" else "") + f"torch {torch.__version__}"
    warnings.warn(f"seqmix: {path.kind} kernel '{name}' failed on inputs {shapes} ({device}; {versions}): "
                  f"{type(err).__name__}: {message[:1000]}. '{name}' uses its PyTorch reference for the rest "
                  "of this process (same results, slower)", KernelFallbackWarning, stacklevel=3)
    _FAILED[name] = reason
    return reason
