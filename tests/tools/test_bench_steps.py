"""``bench steps`` counts a training step as a GPU dispatches it: the Triton paths taken on
CPU tensors with their launches skipped, so that the Triton scan is counted without a GPU
or the interpreter, and nothing of that leaks into what runs afterwards."""

from __future__ import annotations

import torch

from seqmix import measure
from seqmix.mixers import build, dispatch
from tests.conftest import require_triton

require_triton()


def _counted_step(mixer, x):
    with measure.Count() as c:
        # a view of the leaf x: FlopCounterMode's module hooks refuse a leaf input under autograd.grad
        torch.autograd.grad(mixer(x.view_as(x)).sum(), [x, *mixer.parameters()])
    return c


def test_counting_as_on_a_gpu_takes_the_triton_scan_without_running_it():
    from tools.bench.steps import _as_on_a_gpu

    torch.manual_seed(0)
    mixer = build("mamba", 16, d_state=4, expand=1)
    x = torch.randn(2, 19, 16, requires_grad=True)  # 19: not a multiple of the scan's chunk
    with _as_on_a_gpu(), dispatch.isolated("auto") as gpu:
        as_gpu = _counted_step(mixer, x)
    with dispatch.isolated("reference") as eager:
        chunked = _counted_step(mixer, x)  # what a GPU ran before the Triton scan
    assert gpu.taken() == {"mamba": "triton"} and eager.taken() == {"mamba": "reference"}
    assert 0 < as_gpu.writes < chunked.writes
    with dispatch.isolated("auto") as after:  # the patches are gone: a CPU tensor's own path again
        mixer(x)
    assert "triton" not in after.taken()["mamba"]


def test_writes_count_the_ops_that_write_not_views():
    x = torch.randn(4, 4)
    with measure.Count() as c:
        y = x.t()  # a view: no kernel
        z = y + 1
        z.add_(1)  # in place: writes into its argument
    assert (c.ops, c.writes) == (3, 2)
