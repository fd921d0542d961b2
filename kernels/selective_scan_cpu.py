"""Mamba's selective scan on the CPU as one fused C++ loop (``selective_scan_cpu.cpp``):
``selective_scan_cpu(x, delta, A, B, C)`` equals ``seqmix.mixers.mamba``'s eager chunked
scan, and so ``selective_scan_reference``, forward and backward. The eager scan runs ~10
PyTorch ops per position on (chunks, batch, N, D) slabs and is bound by memory traffic; this
loop keeps one sequence's state in cache and reads each input once per pass.

Compiled at first use by ``torch.utils.cpp_extension.load`` and cached in
``TORCH_EXTENSIONS_DIR``; where it cannot be built, ``available()`` is False after one
warning and Mamba keeps the eager scan. Both halves are ``torch.library`` custom ops with
fake (shape-only) implementations, so FakeTensorMode cost counts see them.
"""

from __future__ import annotations

import functools
import pathlib
import warnings

import torch

from seqmix.flop_formulas import register_flop_formula

SOURCE = pathlib.Path(__file__).with_name("selective_scan_cpu.cpp")
# Positions per backward block: the block's states and decays (2 · K · N · D values, 256 KiB
# at K 16, N 16, D 128 in fp32) stay in L2 while the adjoint runs back through them.
BLOCK = 16


def _vector_flags() -> list[str]:
    """AVX2 + FMA where the CPU has them (the build is per machine, named by capability)."""
    capability = torch.backends.cpu.get_cpu_capability()
    return ["-mavx2", "-mfma"] if capability in ("AVX2", "AVX512") else []


@functools.cache
def _extension():
    from torch.utils.cpp_extension import load

    flags = _vector_flags()
    name = "seqmix_selective_scan_" + ("avx2" if flags else "generic")
    # -ffast-math lets g++ call glibc's vector exp (libmvec) inside the vectorised loops.
    return load(name=name, sources=[str(SOURCE)], verbose=False,
                extra_cflags=["-O3", "-ffast-math", "-fopenmp-simd", *flags])


@functools.cache
def available() -> bool:
    """True when the extension is (or can be) built on this machine."""
    try:
        _extension()
    except Exception as err:  # no compiler, no headers, a read-only cache: fall back
        warnings.warn(f"seqmix: the fused CPU selective scan could not be built ({err}); "
                      "Mamba uses the eager chunked scan (slower, same results)", stacklevel=2)
        return False
    return True


@torch.library.custom_op("seqmix::selective_scan_cpu_fwd", mutates_args=())
def _forward(x: torch.Tensor, delta: torch.Tensor, At: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, checkpoints = _extension().forward(x, delta, At, B, C, block)
    return y, checkpoints


@_forward.register_fake
def _(x, delta, At, B, C, block):
    n_blocks = -(-x.shape[1] // block)
    return torch.empty_like(x), x.new_empty(x.shape[0], n_blocks, At.shape[0], x.shape[2])


@torch.library.custom_op("seqmix::selective_scan_cpu_bwd", mutates_args=())
def _backward(gy: torch.Tensor, x: torch.Tensor, delta: torch.Tensor, At: torch.Tensor,
              B: torch.Tensor, C: torch.Tensor, checkpoints: torch.Tensor,
              block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                   torch.Tensor]:
    return tuple(_extension().backward(gy, x, delta, At, B, C, checkpoints, block))


@_backward.register_fake
def _(gy, x, delta, At, B, C, checkpoints, block):
    return tuple(torch.empty_like(t) for t in (x, delta, At, B, C))


def _setup_context(ctx, inputs, output):
    x, delta, At, B, C, block = inputs
    ctx.save_for_backward(x, delta, At, B, C, output[1])
    ctx.block = block


def _autograd_backward(ctx, gy, _g_checkpoints):
    x, delta, At, B, C, checkpoints = ctx.saved_tensors
    grads = _backward(gy.contiguous(), x, delta, At, B, C, checkpoints, ctx.block)
    return (*grads, None)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def scan_flops(x_shape, n_state: int) -> int:
    """2 FLOPs per (token, channel, state) for one contraction."""
    batch, length, channels = x_shape
    return 2 * batch * length * channels * n_state


# The op's FLOPs for seqmix.measure's counter (seqmix.flop_formulas), as the eager scan's matmuls count them: one
# contraction forward (y = C · h), three backward (∂x = B · λ, ∂B = λ x, ∂C = h gy).
@register_flop_formula(torch.ops.seqmix.selective_scan_cpu_fwd)
def _forward_flops(x, delta, At, B, C, block, out_shape=None, **kw) -> int:
    return scan_flops(x, At[0])


@register_flop_formula(torch.ops.seqmix.selective_scan_cpu_bwd)
def _backward_flops(gy, x, delta, At, B, C, checkpoints, block, out_shape=None, **kw) -> int:
    return 3 * scan_flops(x, At[0])


def selective_scan_cpu(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                       C: torch.Tensor) -> torch.Tensor:
    """y (Bt, L, D) of the selective scan; x = Δ ⊙ u and Δ: (Bt, L, D), A: (D, N),
    B, C: (Bt, L, N), all on the CPU in one floating dtype."""
    y, _ = _forward(x.contiguous(), delta.contiguous(), A.t().contiguous(), B.contiguous(),
                    C.contiguous(), BLOCK)
    return y
