"""A linear recurrence h_t = a_t ⊙ h_{t-1} + b_t along time: what Mamba's selective scan and
GLA's chunk-to-chunk state carry have in common. ``linear_scan_reference`` is its
specification, one step per token; its fast form, ``linear_scan`` (vectorised, with its own
backward), is a kernel (``seqmix.kernels.linear_scan``), declared here because no one mixer
owns it: GLA's chunked form and Performer's causal FAVOR+ call it.
"""

from __future__ import annotations

import torch

from seqmix.mixers.base import kernel


def linear_scan_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t along dim 0, h_{-1} = 0, one step per token (the spec)."""
    h, out = torch.zeros_like(b[0]), []
    for a_t, b_t in zip(a.unbind(0), b.unbind(0)):
        h = a_t * h + b_t
        out.append(h)
    return torch.stack(out)


@kernel("linear_scan", "pytorch", reference=linear_scan_reference, test="tests/mixers/test_mixers_scan.py")
def pytorch_linear_scan():
    from seqmix.kernels.linear_scan import linear_scan

    return linear_scan
