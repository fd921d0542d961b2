"""Deterministic cost counts of one call: FLOPs, bytes written and peak live tensor bytes.

Three counters watch every aten op the call dispatches (forward, and backward when the
call runs one), so the counts are of the code that actually runs, not of a formula:

- **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode``. It counts only ops with a
  registered formula (matmul-class, SDPA, convolution); added here are the CPU flash
  attention kernel PyTorch picks for SDPA on a CPU (``_scaled_dot_product_flash_attention_for_cpu``
  and its backward, with the formulas PyTorch registers for the GPU kernels), Mamba's fused
  CPU scan (2 FLOPs per token, channel and state for each of its contractions: one forward,
  three backward, as the eager scan's matmuls count) and FFTs
  (5 n log2 n per complex transform of n points, half that for a real one: the count
  FFTW's benchFFT reports speeds against, https://www.fftw.org/speed/method.html). Work
  that is elementwise (scans, masks, gates) is invisible to it.
- **bytes written**: the bytes of every tensor an op writes: each output that is not a
  view of an input, and each argument an in-place or ``out=`` op mutates (read from the
  op's schema). This counts all work, elementwise included, and catches an autograd
  pattern that costs no FLOPs: indexing one slice of a big tensor per loop step makes
  ``select_backward`` zero-fill a full-size gradient at every step.
- **peak live bytes**: every storage an op allocates is added when it appears and
  removed when it is freed (a finalizer on the storage's Python object, which PyTorch
  keeps alive exactly as long as the storage: saved-for-backward tensors count); the
  peak is over the call, above what was live before it. This is the memory the tensors
  of the call need, independent of the allocator; the profiler's CPU memory events also
  see allocations made inside kernels, which this does not.

A forward+backward is one forward and ``torch.autograd.grad`` of its output for the input
and every parameter (no optimizer step, no ``.grad`` accumulation). Counts are taken under
``FakeTensorMode`` where asked and the mixer allows it (shapes propagate, no arithmetic is
done, so L = 65,536 costs only the Python-level op calls); a mixer whose code needs real
values (e.g. ``.tolist()`` of an index table) is counted on real CPU tensors instead.
``count_mode`` says which. The two give the same FLOPs and, within 5 %, the same bytes
(tests/test_cost_count.py): PyTorch's meta kernels choose some output strides differently
from the real ones (e.g. ``elu_backward``), which can make a later reshape copy on one side
only. Each is exact and the same on every run.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seqmix.kernels import selective_scan_cpu

aten = torch.ops.aten


def _fft_points(shape, dims) -> int:
    return math.prod(shape[d] for d in dims) if dims else 1


def _fft_flop(points: int, numel: int, real: bool) -> int:
    """5 n log2 n per complex transform of n points, half for a real one (benchFFT)."""
    if points <= 1:
        return 0
    per = 5 * points * math.log2(points) * (0.5 if real else 1.0)
    return int(round(per * numel / points))


def _r2c_flop(self_shape, dim, normalization, onesided, out_shape=None, **kw) -> int:
    return _fft_flop(_fft_points(self_shape, dim), math.prod(self_shape), real=True)


def _c2r_flop(self_shape, dim, normalization, last_dim_size, out_shape=None, **kw) -> int:
    return _fft_flop(_fft_points(out_shape, dim), math.prod(out_shape), real=True)


def _c2c_flop(self_shape, dim, normalization, forward, out_shape=None, **kw) -> int:
    return _fft_flop(_fft_points(self_shape, dim), math.prod(self_shape), real=False)


def _sdpa_cpu_flop(q, k, v, *args, out_shape=None, **kw) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q, k, v)


def _sdpa_cpu_backward_flop(grad_out, q, k, v, *args, out_shape=None, **kw) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, q, k, v)


def _selective_scan_fwd_flop(x, delta, At, B, C, block, out_shape=None, **kw) -> int:
    return selective_scan_cpu.scan_flops(x, At[0])  # y = C · h


def _selective_scan_bwd_flop(gy, x, delta, At, B, C, checkpoints, block, out_shape=None, **kw) -> int:
    return 3 * selective_scan_cpu.scan_flops(x, At[0])  # ∂x = B · λ, ∂B = λ x, ∂C = h gy


EXTRA_FLOP_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flop,
    aten._fft_r2c: _r2c_flop,
    aten._fft_c2r: _c2r_flop,
    aten._fft_c2c: _c2c_flop,
    # Mamba's fused CPU scan: its contractions, counted as the eager scan's matmuls are.
    torch.ops.seqmix.selective_scan_cpu_fwd: _selective_scan_fwd_flop,
    torch.ops.seqmix.selective_scan_cpu_bwd: _selective_scan_bwd_flop,
}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class WorkCounter(TorchDispatchMode):
    """Bytes written by every op, and the peak bytes of storages allocated while active."""

    def __init__(self):
        super().__init__()
        self.bytes_written = 0
        self.ops = 0  # aten ops dispatched: a Python loop over chunks makes it grow with L
        self.live = 0
        self.peak = 0
        self._alive: dict[int, int] = {}  # storage key -> bytes, for storages allocated here
        self._finalizers: list[weakref.finalize] = []

    def _freed(self, key: int) -> None:
        self.live -= self._alive.pop(key, 0)

    def _allocated(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        self._alive[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._finalizers.append(weakref.finalize(storage, self._freed, key))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        schema = func._schema
        # In-place and out= ops write into an argument (its alias_info is a write).
        for arg, value in zip(schema.arguments, args):
            if arg.alias_info is not None and arg.alias_info.is_write:
                for t in _tensors(value):
                    self.bytes_written += t.numel() * t.element_size()
        for arg in schema.arguments:
            if arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write and arg.name in kwargs:
                for t in _tensors(kwargs[arg.name]):
                    self.bytes_written += t.numel() * t.element_size()
        # Outputs on a storage no input has are new tensors the op wrote; the rest are
        # views (view, select, _unsafe_view of a temporary, ...) and write nothing.
        inputs = {_storage_key(t) for t in _tensors((args, kwargs)) if t.layout == torch.strided}
        for t in _tensors(out):
            if t.layout != torch.strided:
                continue
            key = _storage_key(t)
            if key in inputs or key in self._alive:
                continue
            self.bytes_written += t.numel() * t.element_size()
            self._allocated(t)
        return out

    def close(self) -> None:
        """Detach the finalizers (storages still alive stop being tracked)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()


def count_call(fn: Callable[[], None]) -> dict:
    """FLOPs, bytes written, peak live bytes (above the start) and aten ops of one call of ``fn``."""
    # Imported here: torch.utils.flop_counter imports triton, which must not happen before
    # a process that wants the Triton interpreter has set TRITON_INTERPRET.
    from torch.utils.flop_counter import FlopCounterMode

    flop_counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)
    work = WorkCounter()
    try:
        with flop_counter, work:
            fn()
    finally:
        work.close()
    return {"flops": int(flop_counter.get_total_flops()), "bytes_written": int(work.bytes_written),
            "peak_bytes": int(work.peak), "ops": work.ops}


def _fake_failures() -> tuple[type[Exception], ...]:
    from torch._subclasses import fake_tensor as ft

    return (ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException,
            ft.UnsupportedFakeTensorException)


def _calls(mixer: torch.nn.Module, state: dict, x: torch.Tensor, grad_out: torch.Tensor):
    """(forward under no_grad, forward + backward) of ``mixer`` with its tensors ``state``."""
    from torch.func import functional_call

    def forward():
        with torch.no_grad():
            functional_call(mixer, state, (x,))

    leaves = [x, *(t for t in state.values() if t.requires_grad)]

    def forward_backward():
        # autograd.grad, not backward(): no .grad accumulation, whose copy-or-steal choice
        # depends on reference counts (fake and real tensors would then differ). The mixer
        # gets a view of the leaf x: FlopCounterMode's module hooks refuse a leaf input
        # under autograd.grad.
        torch.autograd.grad(functional_call(mixer, state, (x.view_as(x),)), leaves, grad_out)

    return forward, forward_backward


def _count_both(mixer, state, x, grad_out) -> dict:
    forward, forward_backward = _calls(mixer, state, x, grad_out)
    fwd, fb = count_call(forward), count_call(forward_backward)
    return {"flops_fwd": fwd["flops"], "flops_fwdbwd": fb["flops"],
            "bytes_written_fwd": fwd["bytes_written"], "bytes_written_fwdbwd": fb["bytes_written"],
            "peak_fwd_bytes": fwd["peak_bytes"], "peak_fwdbwd_bytes": fb["peak_bytes"], "ops_fwdbwd": fb["ops"]}


def count_mixer(mixer: torch.nn.Module, seq_len: int, batch: int, fake: bool = True) -> dict:
    """Counts (``count_call``) of one forward and one forward+backward of ``mixer`` (a CPU
    module) on a (batch, seq_len, d) input, under FakeTensorMode when ``fake`` and the
    mixer runs there, else on real tensors; ``count_mode`` is fake | real."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    d = mixer.d_model
    state = {**dict(mixer.named_parameters()), **dict(mixer.named_buffers())}
    if fake:
        # A copy runs fake: per-length caches it fills (e.g. sliding window's dense mask) hold
        # fake tensors, which the caller's module, timed next on real ones, must not keep.
        scratch = copy.deepcopy(mixer)
        try:
            with FakeTensorMode() as mode:
                fake_state = {n: mode.from_tensor(t).requires_grad_(t.requires_grad) for n, t in state.items()}
                x = torch.empty(batch, seq_len, d).normal_().requires_grad_()
                _calls(scratch, fake_state, x, x)[0]()  # uncounted, as on real tensors below
                counts = _count_both(scratch, fake_state, x, torch.empty(batch, seq_len, d).normal_())
            return {**counts, "count_mode": "fake"}
        except _fake_failures():
            pass
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq_len, d, generator=g).requires_grad_()
    state = {n: t.detach().clone().requires_grad_(t.requires_grad) for n, t in state.items()}
    forward, _ = _calls(mixer, state, x, x)
    forward()  # uncounted: per-length caches (e.g. BigBird's block table) are built here
    return {**_count_both(mixer, state, x, torch.randn(batch, seq_len, d, generator=g)), "count_mode": "real"}
