"""What each layer's mixer actually receives while a trained model reads its inputs: the
analyses (sparsity, geometry) measure the mixers on these hidden states."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture_mixer_inputs(model: torch.nn.Module, run: Callable[[], object]) -> list[torch.Tensor]:
    """The input each block's mixer received while ``run()`` executed, in layer order."""
    inputs: list[torch.Tensor] = []
    hooks = [block.mixer.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return inputs
