"""The scans: Mamba's selective scan (chunked, and fused in C++ for CPU tensors, built once
per machine by the fused_scan fixture) and the linear scan behind GLA's chunk carry and
Performer's causal form, each against its plain reference, forward and backward. (GLA, H3
and TSSA: test_mixers_recurrent.py, whose tolerances hold here too.)"""

from __future__ import annotations

import pytest
import torch

from seqmix import mixers
from seqmix.kernels.linear_scan import linear_scan
from seqmix.mixers.mamba import (
    selective_scan_chunked,
    selective_scan_fused,
    selective_scan_reference,
)
from seqmix.mixers.scan import linear_scan_reference
from tests.conftest import skip_or_fail
from tests.helpers import F64, assert_close_fwd_bwd, scan_inputs

# ----------------------------------------------------------------------------- Mamba (Gu & Dao 2023)


@pytest.mark.parametrize("strong", [False, True])
@pytest.mark.parametrize(
    "Bt,D,N,L,chunk",
    [
        (1, 2, 3, 1, 64),  # one token
        (2, 3, 4, 13, 4),  # partial last chunk
        (2, 3, 4, 150, 64),  # several chunks, partial tail
        (1, 2, 5, 300, 8),  # 38 chunks > C: the carry scan recurses twice
        (3, 4, 2, 9, 1),  # chunks of one token
        (2, 3, 4, 17, 16),  # two chunks, the second one token long
    ],
)
def test_selective_scan_chunked_equals_reference(Bt, D, N, L, chunk, strong):
    inputs, _ = scan_inputs(Bt, D, N, L, strong=strong)
    ref = selective_scan_reference(*inputs)
    out = selective_scan_chunked(*inputs, chunk_size=chunk)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


def test_selective_scan_chunked_fp32_and_without_D():
    inputs, _ = scan_inputs(2, 4, 16, 200, dtype=torch.float32, strong=True)
    inputs[-1] = None  # no D
    ref = selective_scan_reference(*inputs)
    out = selective_scan_chunked(*inputs, chunk_size=64)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-4, rtol=1e-4, grad_atol=1e-3, grad_rtol=1e-3)  # the backward too


def test_selective_scan_chunked_gate_equals_reference():
    inputs, _ = scan_inputs(2, 3, 4, 21, gate=True)
    ref = selective_scan_reference(*inputs)
    out = selective_scan_chunked(*inputs, chunk_size=8)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


# Set by CI (.ci/run): there a fused CPU scan that cannot be built is a failure, not a skip.
REQUIRE_CPU_EXTENSION_ENV = "SEQMIX_REQUIRE_CPU_EXTENSION"


@pytest.fixture(scope="module")
def fused_scan():
    """The fused C++ scan; skips where it cannot be built (no g++), fails so in CI."""
    from seqmix.kernels import selective_scan_cpu

    if not selective_scan_cpu.available():
        skip_or_fail("the fused CPU selective scan could not be built here (a C++ compiler is needed)",
                     REQUIRE_CPU_EXTENSION_ENV, "Mamba's fused CPU scan")
    return selective_scan_fused


@pytest.mark.parametrize("strong", [False, True])
@pytest.mark.parametrize(
    "Bt,D,N,L",
    [
        (1, 2, 3, 1),  # one token
        (2, 3, 4, 13),  # inside one backward block (16)
        (2, 3, 4, 17),  # two blocks, the second one token long
        (2, 5, 4, 150),  # many blocks, partial tail; D not a multiple of the vector width
        (3, 4, 2, 16),  # exactly one block
        (2, 128, 16, 70),  # the CPU profile's width (D 128, N 16): vectorised loops
    ],
)
def test_selective_scan_fused_equals_reference(fused_scan, Bt, D, N, L, strong):
    inputs, _ = scan_inputs(Bt, D, N, L, strong=strong)
    ref = selective_scan_reference(*inputs)
    out = fused_scan(*inputs)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


def test_selective_scan_fused_fp32_and_without_D(fused_scan):
    inputs, _ = scan_inputs(2, 4, 16, 200, dtype=torch.float32, strong=True)
    inputs[-1] = None  # no D
    ref = selective_scan_reference(*inputs)
    out = fused_scan(*inputs)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-4, rtol=1e-4, grad_atol=1e-3, grad_rtol=1e-3)


def test_selective_scan_fused_gate_equals_reference(fused_scan):
    inputs, _ = scan_inputs(2, 3, 4, 21, gate=True)
    ref = selective_scan_reference(*inputs)
    out = fused_scan(*inputs)
    assert_close_fwd_bwd(out, ref, inputs, atol=1e-10)


def test_mamba_layer_takes_the_fused_scan_on_cpu_and_matches_the_eager_one(fused_scan):
    from seqmix.mixers import dispatch

    torch.manual_seed(0)
    layer = mixers.build("mamba", 16).double()
    u = torch.randn(2, 21, 16, dtype=F64, requires_grad=True)
    params = [u, *layer.parameters()]
    with dispatch.using("auto") as fused_run, torch.profiler.profile() as prof:
        fast = layer(u)
    with dispatch.using("reference") as eager_run:
        eager = layer(u)
    assert any("selective_scan_cpu" in e.name for e in prof.events())
    assert fused_run.taken() == {"mamba": "fused_cpu"} and eager_run.taken() == {"mamba": "reference"}
    assert_close_fwd_bwd(fast, eager, params, atol=1e-10)


def test_linear_scan_custom_backward_gradcheck():
    # The scan's backward is hand-written (the adjoint recurrence); check it numerically.
    g = torch.Generator().manual_seed(3)
    a = torch.rand(11, 2, 3, generator=g, dtype=F64).requires_grad_()
    b = torch.randn(11, 2, 3, generator=g, dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: linear_scan(a, b, 3), (a, b))


@pytest.mark.parametrize("L,chunk", [(1, 4), (11, 3), (40, 4)])
def test_linear_scan_equals_reference(L, chunk):
    g = torch.Generator().manual_seed(L)
    a = torch.rand(L, 2, 3, generator=g, dtype=F64).requires_grad_()
    b = torch.randn(L, 2, 3, generator=g, dtype=F64).requires_grad_()
    out, ref = linear_scan(a, b, chunk), linear_scan_reference(a, b)
    assert_close_fwd_bwd(out, ref, [a, b], atol=1e-12)


def test_linear_scan_leaves_its_inputs_untouched():
    a, b = torch.rand(10, 3), torch.randn(10, 3)
    a0, b0 = a.clone(), b.clone()
    linear_scan(a, b, 4)
    linear_scan(a[:4], b[:4], 4)  # one full chunk: no padding, the copy must still be private
    assert torch.equal(a, a0) and torch.equal(b, b0)


