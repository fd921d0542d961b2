"""What every mixer module shares: the base class and its optional capabilities, and the
declaration of its kernels.

A mixer module reads like nanoGPT's model.py: an ``Options`` dataclass, the module, its
plain forward (the reference, written for clarity), and where the architecture has one,
its ``step`` (recurrent form) and ``scores`` (explicit attention matrix). Where it has fast
paths in kernels/, it declares each once, beside the reference it equals (``kernel``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import nn


class MixerOptionsError(ValueError):
    """Unknown or invalid options for a mixer."""


@dataclasses.dataclass
class NoOptions:
    pass


class Mixer(nn.Module):
    """Base class. Subclasses set ``Options`` and implement ``forward``; the optional
    capabilities below are declared by the class flags, which tests and analyses read."""

    Options: ClassVar[type] = NoOptions
    supports_causal: ClassVar[bool] = True
    supports_noncausal: ClassVar[bool] = True
    has_scores: ClassVar[bool] = False
    has_step: ClassVar[bool] = False
    # The Grassmann layer blends its input into its output itself (a gate, not a residual);
    # the block then skips its own residual around the mixer (Zhang 2025, arXiv:2512.19428, §3.2, gated fusion).
    residual_in_mixer: ClassVar[bool] = False
    # A mixer that replaces the block's feed-forward (CRATE's ISTA) names a module class
    # taking (d_model, d_ff, dropout); None keeps the block's GELU MLP.
    feedforward: ClassVar[Any] = None
    # False when that feed-forward's output replaces the stream instead of being added to it
    # (CRATE's ISTA step, Yu et al. 2023, arXiv:2306.01129); the block then drops its residual around it.
    feedforward_residual: ClassVar[bool] = True
    # Whether the seeds of a run can train together as one vectorised model (seqmix.train.pack:
    # torch.func.vmap over the members' stacked weights): a reason string where they cannot.
    packable: ClassVar[bool | str] = True

    def __init__(self, d_model: int, options: Any, *, causal: bool = True, max_len: int | None = None):
        super().__init__()
        self.d_model = d_model
        self.options = options
        self.causal = causal
        self.max_len = max_len

    @classmethod
    def options_for_layer(cls, options: dict[str, Any], layer_index: int) -> dict[str, Any]:
        """Per-layer options (default: every layer gets the same)."""
        return options

    def reach(self) -> int | None:
        """How many positions back this layer's output at t can read (it depends on inputs
        t - reach .. t only); None: every earlier position (attention, recurrences)."""
        return None

    def no_weight_decay(self) -> set[str]:
        """Names of parameters (relative to this module) that AdamW should not decay."""
        return set()

    def flops(self, seq_len: int) -> float:
        """Theoretical forward FLOPs for one sequence."""
        raise NotImplementedError(f"{type(self).__name__} does not state its FLOP count")

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, L) non-negative, unnormalised attention scores (``has_scores``)."""
        raise NotImplementedError(f"{type(self).__name__} has no explicit score matrix")

    def init_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form")

    def step(self, x_t: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """(y_t, state): the recurrent form, one token at a time from ``init_state``'s state
        (``has_step``); a test holds it equal to ``forward``."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form")

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, causal={self.causal}, options={self.options}"


class HeadProjections:
    """Mixin for the attention-style mixers (softmax, linear, performer, sliding window,
    BigBird): Q, K, V and output projections d → d with bias, as in the paper's
    Transformer (Zhang 2025, arXiv:2512.19428, §4.1), split into ``n_heads`` heads of ``d_head``."""

    def init_projections(self, d_model: int, n_heads: int, bias: bool) -> None:
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, d) -> (B, H, L, Dh)."""
        B, L, _ = t.shape
        return t.view(B, L, self.n_heads, self.d_head).transpose(1, 2)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of x: (B, H, L, Dh) each."""
        return self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))


def linear_flops(tokens: int, d_in: int, d_out: int) -> float:
    """Multiply-adds of a dense layer counted as 2 FLOPs each."""
    return 2.0 * tokens * d_in * d_out


# ------------------------------------------------------------------------------------------
# Kernels: the fast paths of kernels/ (seqmix.kernels), each declared by the module that runs it.
# ------------------------------------------------------------------------------------------

KernelForm = Literal["triton", "cpp", "pytorch"]  # Triton (CUDA), C++ (CPU), PyTorch with its own backward


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel as its mixer module declares it (``kernel``): ``name`` is its module's
    (kernels/<name>.py), ``form`` how it runs, ``reference`` the plain function of this
    package it must equal and ``test`` the test module that compares the two, forward and
    backward. ``importer`` imports the kernel function and returns it. Calling the declaration
    calls the kernel, imported then: a Triton kernel's module imports triton, which a CPU
    machine may lack and which must see TRITON_INTERPRET before it. Every run-time import
    is a statement in the mixer module, so the kernel is part of that mixer's runs' code and
    no other's (seqmix.sources reads import statements, in functions too). The list of them
    all: ``seqmix.mixers.declared_kernels()``."""

    name: str
    form: KernelForm
    importer: Callable[[], Callable[..., Any]]
    reference: Callable[..., Any]
    test: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.importer()(*args, **kwargs)  # looked up at every call: a patched or reloaded module counts

    @property
    def fast(self) -> str:
        """The kernel function, ``"module:function"`` (this imports it)."""
        fn = self.importer()
        return f"{fn.__module__}:{fn.__name__}"

    @property
    def module(self) -> str:
        return self.fast.partition(":")[0]

    @property
    def declared_by(self) -> str:
        """The module that declares it: the mixer's that runs it."""
        return self.importer.__module__


def kernel(name: str, form: KernelForm, *, reference: Callable[..., Any], test: str) -> Callable[[Callable], Kernel]:
    """Declare a kernel (``Kernel``): decorates the function that imports it and returns it,

        @kernel("gla", "triton", reference=gla_recurrent_reference, test="tests/kernels/test_kernels.py")
        def triton_gla():
            from seqmix.kernels.gla import chunk_gla
            return chunk_gla

    and the name is then the declaration, callable as the kernel."""
    return lambda importer: Kernel(name, form, importer, reference, test)
