"""Parameter budgets: count parameters, and solve for the width (or depth) that brings an
architecture closest to a target count, so that every architecture is compared at the
same size (the Grassmann paper compares at 13-18M parameters)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def count_params(model: nn.Module) -> int:
    """Trainable parameters, shared (tied) tensors counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def count_for(build: Callable[[int, int], nn.Module], d_model: int, n_layers: int) -> int:
    # Built on the meta device: shapes only, no memory, no initialisation cost.
    with torch.device("meta"):
        return count_params(build(d_model, n_layers))


def solve_budget(
    build: Callable[[int, int], nn.Module],
    *,
    d_model: int,
    n_layers: int,
    params: int | None,
    solve: str = "width",
    width_step: int = 16,
    max_width: int = 1024,
    max_depth: int = 48,
) -> tuple[int, int, int]:
    """(d_model, n_layers, count) closest to ``params``; the given size when params is None.

    Width candidates are multiples of ``width_step`` (so head splits stay integral); ties
    go to the smaller model. Candidates a mixer rejects (e.g. width not divisible by its
    heads) are skipped.
    """
    if params is None:
        return d_model, n_layers, count_for(build, d_model, n_layers)
    if solve == "width":
        candidates = [(w, n_layers) for w in range(width_step, max_width + 1, width_step)]
    else:
        candidates = [(d_model, n) for n in range(1, max_depth + 1)]
    best = None
    for d, n in candidates:
        try:
            c = count_for(build, d, n)
        except ValueError:
            continue
        key = (abs(c - params), c)
        if best is None or key < best[0]:
            best = (key, d, n, c)
        if c > params and solve == "width" and best[3] <= params:
            break  # counts grow with width: past the target and already bracketed
    if best is None:
        raise ValueError(f"no {solve} candidate builds for budget {params}")
    return best[1], best[2], best[3]
