"""Counts of the work PyTorch code does, taken on the aten ops it dispatches: FLOPs, bytes
written, and live and peak tensor bytes. The one counter the plan, the preflight, the
complexity analysis and training's memory check use; it sits below models/ and mixers/.

FLOPs are ``FlopCounterMode``'s (matmul-class ops, SDPA, convolution) plus
``EXTRA_FLOP_FORMULAS`` and the custom ops' (seqmix.flop_formulas, where each kernel registers
its own); elementwise work (scans, masks, gates) is not in them but is in the
bytes written. Under ``FakeTensorMode`` the FLOPs are the same as on real tensors and the
bytes within 5 % (tests/core/test_cost_count.py): meta kernels choose some output strides
differently (e.g. ``elu_backward``), which can make a later reshape copy.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from seqmix import flop_formulas

aten = torch.ops.aten
GIB = 2**30
STATE_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two moments (gradients are in a step's peak)


# ------------------------------------------------------------------------------------------
# FLOP formulas FlopCounterMode lacks.
# ------------------------------------------------------------------------------------------


def _fft_points(shape, dims) -> int:
    return math.prod(shape[d] for d in dims) if dims else 1


def _fft_flop(points: int, numel: int, real: bool) -> int:
    """5 n log2 n per complex transform of n points, half for a real one: the count FFTW's
    benchFFT reports speeds against (https://www.fftw.org/speed/method.html)."""
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


EXTRA_FLOP_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flop,
    aten._fft_r2c: _r2c_flop,
    aten._fft_c2r: _c2r_flop,
    aten._fft_c2c: _c2c_flop,
}


# ------------------------------------------------------------------------------------------
# The counter.
# ------------------------------------------------------------------------------------------


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class WorkCounter(TorchDispatchMode):
    """Bytes written by every op, and the live and peak bytes of storages allocated while
    active; with ``timeline``, the live bytes after every allocation too (``extend_peak``).

    Bytes written are every output that is not a view of an input and every argument an op
    mutates: they see work that costs no FLOPs (indexing one slice of a big tensor per loop
    step makes ``select_backward`` zero-fill a full-size gradient every step). A storage
    counts as live until its Python object is freed (a finalizer; PyTorch keeps it alive as
    long as the storage, so saved-for-backward tensors count); allocations inside kernels
    are not seen."""

    def __init__(self, timeline: bool = False):
        super().__init__()
        self.timeline: list[int] | None = [] if timeline else None
        self.bytes_written = 0
        self.ops = 0  # aten ops dispatched: a Python loop over chunks makes it grow with L
        self.writes = 0  # ops that wrote bytes: on a GPU each is at least one kernel launch (views none)
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
        if self.timeline is not None:
            self.timeline.append(self.live)
        self._finalizers.append(weakref.finalize(storage, self._freed, key))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        before = self.bytes_written
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
        self.writes += self.bytes_written > before
        return out

    def close(self) -> None:
        """Detach the finalizers (storages still alive stop being tracked)."""
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()


class Count:
    """``with Count() as c:``: FLOPs, bytes written, live and peak bytes, aten ops and the ops
    among them that wrote (``writes``) of what runs inside, readable during the block (so
    far) and after it."""

    def __init__(self, timeline: bool = False):
        self._timeline = timeline

    def __enter__(self) -> Count:
        # Imported here: torch.utils.flop_counter imports triton, which must not happen
        # before a process that wants the Triton interpreter has set TRITON_INTERPRET.
        from torch.utils.flop_counter import FlopCounterMode

        self._flops = FlopCounterMode(display=False, custom_mapping={**EXTRA_FLOP_FORMULAS, **flop_formulas.FORMULAS})
        self._work = WorkCounter(self._timeline)
        self._stack = contextlib.ExitStack()  # left in reverse: work, FLOPs, then close()
        self._stack.callback(self._work.close)
        self._stack.enter_context(self._flops)
        self._stack.enter_context(self._work)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    @property
    def flops(self) -> int:
        return int(self._flops.get_total_flops())

    @property
    def bytes_written(self) -> int:
        return int(self._work.bytes_written)

    @property
    def live(self) -> int:
        return int(self._work.live)

    @property
    def peak(self) -> int:
        return int(self._work.peak)

    @property
    def ops(self) -> int:
        return self._work.ops

    @property
    def writes(self) -> int:
        return self._work.writes

    @property
    def timeline(self) -> list[int] | None:
        return self._work.timeline


def count_call(fn: Callable[[], None]) -> dict:
    """FLOPs, bytes written, peak live bytes (above the start) and aten ops of one call of ``fn``."""
    with Count() as c:
        fn()
    return {"flops": c.flops, "bytes_written": c.bytes_written, "peak_bytes": c.peak, "ops": c.ops}


def fake_failures() -> tuple[type[Exception], ...]:
    """What an op that needs real values raises under FakeTensorMode."""
    from torch._subclasses import fake_tensor as ft

    return (ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException,
            ft.UnsupportedFakeTensorException)


# ------------------------------------------------------------------------------------------
# One mixer layer: a forward, and a forward + backward (the complexity analysis).
# ------------------------------------------------------------------------------------------


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
    """Counts of one forward and one forward + backward (``torch.autograd.grad`` of the output
    for the input and every parameter: no optimiser, no ``.grad``) of ``mixer`` (a CPU module)
    on a (batch, seq_len, d) input, each after one uncounted call (per-length caches, e.g.
    BigBird's block table, are built first): under FakeTensorMode when ``fake`` and the mixer
    runs there, else on real tensors; ``count_mode`` says which (fake | real)."""
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
        except fake_failures():
            pass
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq_len, d, generator=g).requires_grad_()
    state = {n: t.detach().clone().requires_grad_(t.requires_grad) for n, t in state.items()}
    forward, _ = _calls(mixer, state, x, x)
    forward()  # uncounted: per-length caches (e.g. BigBird's block table) are built here
    return {**_count_both(mixer, state, x, torch.randn(batch, seq_len, d, generator=g)), "count_mode": "real"}


# ------------------------------------------------------------------------------------------
# One training step of a model (the plan, training's memory check). ``loss_at(b)`` runs the
# model's forward pass on a made-up batch of b and returns its loss (the caller's task makes
# the batch and the loss: nothing here knows tasks or run specs).
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SmallSteps:
    """Forward and backward passes at small batches (``small_steps``)."""

    forward_flops: float  # at batch 1
    backward_flops: float  # at batch 1
    held: tuple[float, float]  # at batches 2 and 3: bytes the forward pass keeps for the backward pass
    peaks: tuple[float, float]  # at batches 2 and 3: the most bytes alive at once in both passes
    timelines: tuple[tuple[int, ...], tuple[int, ...]]  # at batches 2 and 3: live bytes after every allocation


MEMORY_BATCHES = (2, 3)  # not 1: at batch 1 some copies are views (a size-1 dim's stride is free)


def small_steps(loss_at: Callable[[int], torch.Tensor], model: torch.nn.Module) -> SmallSteps:
    """Counts of a forward and backward pass at batches 1, 2 and 3: FLOPs at batch 1 (they
    are linear in the batch), memory at batches 2 and 3 (after the pass at batch 1, so that
    caches a mixer fills on its first call, e.g. a sliding window's mask, exist: both passes
    allocate the same tensors). In eval mode: no dropout masks (a byte per element), no random
    draws, no state advanced (the Performer counts training calls), so that training
    afterwards is unchanged."""
    passes, was_training = [], model.training
    model.eval()
    for b in (1, *MEMORY_BATCHES):
        with Count(timeline=b in MEMORY_BATCHES) as c:
            loss = loss_at(b)
            held, forward = c.live, c.flops
            loss.backward()
        passes.append((held, c.peak, forward, c.flops - forward, tuple(c.timeline or ())))
        del loss
        model.zero_grad(set_to_none=True)
    model.train(was_training)
    (_, _, forward, backward, _), two, three = passes
    return SmallSteps(forward, backward, (two[0], three[0]), (two[1], three[1]), (two[4], three[4]))


def extend(pair: tuple[float, float], batch_size: int) -> float:
    """A count at ``batch_size`` from its values at MEMORY_BATCHES (linear in the batch)."""
    first, second = MEMORY_BATCHES
    return pair[0] + (pair[1] - pair[0]) / (second - first) * (batch_size - first)


def extend_peak(small: SmallSteps, batch_size: int) -> float:
    """The most bytes alive at once at ``batch_size``: the live bytes after every allocation
    of the passes at MEMORY_BATCHES, each extended linearly (a tensor's size is constant, like
    a gradient, or proportional to the batch), and their maximum. The moment of the peak
    moves with the batch (late in the backward pass at a small batch, where the gradients are
    all allocated; early at a large batch, where the activations are): the peak itself does
    not extend linearly. Where the two passes allocate differently, their peaks are extended."""
    one, two = small.timelines
    if not one or len(one) != len(two):
        return extend(small.peaks, batch_size)
    return float(max(extend((a, b), batch_size) for a, b in zip(one, two)))


def step_bytes(small: SmallSteps, batch_size: int) -> tuple[float, float]:
    """(activations, peak) of one forward and backward pass at ``batch_size``: the bytes the
    forward pass keeps for the backward pass, and the most alive at once during both
    (gradients included), from the passes at batches 2 and 3 (``extend_peak``; nothing at
    the full batch is allocated)."""
    return extend(small.held, batch_size), extend_peak(small, batch_size)


def training_step_bytes(loss_at: Callable[[int], torch.Tensor], model: torch.nn.Module, batch_size: int) -> float:
    """The most memory one training step holds: the peak of its forward and backward passes
    plus fp32 weights and AdamW's two moments."""
    params = sum(p.numel() for p in model.parameters())
    return step_bytes(small_steps(loss_at, model), batch_size)[1] + STATE_BYTES_PER_PARAM * params


def activation_floor(batch_size: int, length: int, d_model: int, n_layers: int, value_bytes: int = 4) -> float:
    """Bytes a training step of a residual stack keeps at least, from its shapes alone (no
    model built): the embedding and every block leave a fresh (batch, length, d_model) tensor
    that the next layer saves for its backward pass (a norm's or a linear layer's input), so
    n_layers + 1 of them are alive when the backward pass starts."""
    return float((n_layers + 1) * batch_size * length * d_model * value_bytes)


def available_memory(device: str) -> float:
    """Bytes a job can use: the GPU's memory, or the host's available memory."""
    if device != "cpu" and torch.cuda.is_available():
        return float(torch.cuda.mem_get_info()[1])
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return float(info.get("MemAvailable", info["MemTotal"]))
