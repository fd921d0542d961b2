"""FLOP formulas of custom ops, each registered by the kernel that defines its op and read by
seqmix.measure's counter: the counter then imports no kernel, and a run depends on no other
mixer's kernel. Below every layer (standard library only), so that a kernel registers here
without importing the counter above it."""

from __future__ import annotations

from collections.abc import Callable

FORMULAS: dict = {}  # op (an OpOverloadPacket) -> formula(*arguments as shapes, out_shape=...) -> FLOPs


def register_flop_formula(op) -> Callable[[Callable], Callable]:
    """Decorator: ``formula`` counts the FLOPs of ``op`` (FlopCounterMode's convention: the
    op's arguments with tensors as their shapes, ``out_shape``)."""

    def register(formula: Callable) -> Callable:
        FORMULAS[op] = formula
        return formula

    return register
