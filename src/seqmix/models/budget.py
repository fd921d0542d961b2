"""Parameter budgets: count parameters, and solve for the width (or depth) that brings an
architecture closest to a target count, so that every architecture is compared at the
same size (the Grassmann paper compares at 13-18M parameters).

Widths move in steps (multiples of ``width_step``, so head splits stay integral), and at a
30k-token vocabulary one step of 4 moves a 13M model by about 2 %: the closest width alone
cannot promise a tolerance of 1 %. With ``tolerance`` set, a solution outside it is refined
on the one continuous knob the blocks have, the feed-forward width d_ff (in multiples of
``ffn_step``), at the solved width; a model without a feed-forward that still misses the
tolerance is refused with the counts it can reach.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

Builder = Callable[[int, int, float], nn.Module]  # (d_model, n_layers, d_ff_mult) -> model


class BudgetError(ValueError):
    """A parameter budget that no candidate meets within its tolerance."""


@dataclasses.dataclass(frozen=True)
class Size:
    d_model: int
    n_layers: int
    d_ff_mult: float
    params: int


def count_params(model: nn.Module) -> int:
    """Trainable parameters, shared (tied) tensors counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def count_for(build: Builder, d_model: int, n_layers: int, d_ff_mult: float) -> int:
    # Built on the meta device: shapes only, no memory, no initialisation cost.
    with torch.device("meta"):
        return count_params(build(d_model, n_layers, d_ff_mult))


def _closest(build: Builder, candidates: list[tuple[int, int]], d_ff_mult: float, params: int,
             solve: str) -> tuple[int, int, int]:
    best = None
    for d, n in candidates:
        try:
            c = count_for(build, d, n, d_ff_mult)
        except ValueError:
            continue
        key = (abs(c - params), c)
        if best is None or key < best[0]:
            best = (key, d, n, c)
        if c > params and solve == "width" and best[3] <= params:
            break  # counts grow with width: past the target and already bracketed
    if best is None:
        raise BudgetError(f"no {solve} candidate builds for budget {params}")
    return best[1], best[2], best[3]


def _refine_ffn(build: Builder, d: int, n: int, d_ff_mult: float, params: int, ffn_step: int) -> tuple[float, int]:
    """The d_ff (a multiple of ffn_step) closest to the budget at width d: counts are linear
    in d_ff, so two counts give the slope; the answer is counted again."""
    d_ff = int(round(d_ff_mult * d))
    c0, c1 = count_for(build, d, n, d_ff / d), count_for(build, d, n, (d_ff + ffn_step) / d)
    if c1 == c0:  # no feed-forward in these blocks (Mamba's, or d_ff_mult 0)
        return d_ff_mult, c0
    steps = round((params - c0) / (c1 - c0))
    best = min((max(ffn_step, d_ff + (steps + k) * ffn_step) for k in (-1, 0, 1)),
               key=lambda f: abs(count_for(build, d, n, f / d) - params))
    return best / d, count_for(build, d, n, best / d)


def solve_budget(
    build: Builder,
    *,
    d_model: int,
    n_layers: int,
    d_ff_mult: float,
    params: int | None,
    solve: str = "width",
    width_step: int = 16,
    max_width: int = 1024,
    max_depth: int = 48,
    tolerance: float | None = None,
    ffn_step: int = 8,
) -> Size:
    """The size closest to ``params``; the given size when params is None.

    Width candidates are multiples of ``width_step``; ties go to the smaller model;
    candidates a mixer rejects (e.g. width not divisible by its heads) are skipped. With
    ``tolerance`` (relative), a solution outside it gets its d_ff refined, and one that
    still misses it raises BudgetError naming what it reached.
    """
    if params is None:
        return Size(d_model, n_layers, d_ff_mult, count_for(build, d_model, n_layers, d_ff_mult))
    if solve == "width":
        candidates = [(w, n_layers) for w in range(width_step, max_width + 1, width_step)]
    else:
        candidates = [(d_model, n) for n in range(1, max_depth + 1)]
    d, n, c = _closest(build, candidates, d_ff_mult, params, solve)
    if tolerance is None or abs(c / params - 1) <= tolerance:
        return Size(d, n, d_ff_mult, c)
    mult, c2 = _refine_ffn(build, d, n, d_ff_mult, params, ffn_step)
    if abs(c2 / params - 1) > tolerance:
        raise BudgetError(
            f"budget {params:,} ± {tolerance:.1%} cannot be met: the closest {solve} gives {c:,} parameters "
            f"(d_model {d}, {n} layers){'' if c2 == c else f', and refining d_ff gives {c2:,}'}; set a smaller "
            "model.budget.width_step, a larger model.budget.tolerance, or another budget")
    return Size(d, n, mult, c2)
