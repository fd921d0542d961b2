"""The mixers: every architecture the study compares, by name, and the kernels they declare.

A mixer maps (batch, L, d_model) -> (batch, L, d_model). The names, import paths, titles,
colours and blocks live in the torch-free catalogue (``seqmix/catalogue.py``), its forms
(``supports_causal`` / ``supports_noncausal``) and options on its class; adding a mixer is
its module plus one entry there. A mixer's fast paths in kernels/ are declared in its module
(``seqmix.mixers.base.kernel``); ``declared_kernels()`` lists them all, for the tests and the
maintainer's tools.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from pydantic import ValidationError

from seqmix import catalogue
from seqmix.errors import problem_lines
from seqmix.mixers.base import Kernel, Mixer, MixerOptionsError
from seqmix.mixers.options import options_model

__all__ = ["Kernel", "Mixer", "MixerOptionsError", "build", "declared_kernels", "mixer_class", "names",
           "options_for_layer", "options_model", "triton_kernels"]


def names() -> list[str]:
    """The catalogued architecture names, in the order the report lists them."""
    return catalogue.mixer_names()


def mixer_class(name: str) -> type[Mixer]:
    return catalogue.imported(catalogue.mixer_entry(name).path)


def options_for_layer(name: str, options: dict[str, Any], layer_index: int) -> dict[str, Any]:
    """The options layer ``layer_index`` of a stack gets (e.g. Grassmann's per-layer offsets)."""
    return mixer_class(name).options_for_layer(dict(options), layer_index)


def build(
    name: str,
    d_model: int,
    causal: bool = True,
    *,
    max_len: int | None = None,
    **options: Any,
) -> Mixer:
    """Build the mixer ``name`` for width ``d_model``.

    ``options`` are the fields of the mixer's ``Options`` dataclass, checked against their
    types and bounds; an unknown one is an error that lists the allowed fields. ``max_len``
    is the longest sequence the model will see (needed only by mixers with per-position
    parameters).
    """
    cls = mixer_class(name)
    if causal and not cls.supports_causal:
        raise ValueError(
            f"mixer {name!r} has no causal form (it mixes every position with every other); "
            "build it with causal=False, e.g. as the SNLI encoder"
        )
    if not causal and not cls.supports_noncausal:
        raise ValueError(f"mixer {name!r} is causal only; build it with causal=True")
    field_names = {f.name for f in dataclasses.fields(cls.Options)}
    unknown = sorted(set(options) - field_names)
    if unknown:
        raise MixerOptionsError(
            f"unknown option(s) {', '.join(unknown)} for mixer {name!r}; "
            f"allowed: {', '.join(sorted(field_names)) or '(none)'}"
        )
    try:
        valid = options_model(cls.Options).model_validate(options)
    except ValidationError as e:
        problems = "; ".join(problem_lines(e.errors(), {(): sorted(field_names)}, what="option"))
        raise MixerOptionsError(f"mixer {name!r}: {problems}") from None
    return cls(d_model, cls.Options(**dict(valid)), causal=causal, max_len=max_len)


def declared_kernels() -> dict[str, Kernel]:
    """Every kernel the modules of this package and the catalogued mixers' declare, by name.
    The modules are imported by name, here only: no module imports them all, so a run's code
    (seqmix.sources, the closure of import statements) holds its own mixer's kernels only."""
    modules = {f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)}
    modules |= {entry.path.partition(":")[0] for entry in catalogue.MIXERS}
    found: dict[str, Kernel] = {}
    for module in sorted(modules):
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, Kernel) and found.setdefault(value.name, value) is not value:
                raise ValueError(f"two kernels are declared as {value.name!r}: in {module} and elsewhere; "
                                 "a kernel is declared once, by the module that runs it")
    return dict(sorted(found.items()))


def triton_kernels() -> dict[str, Kernel]:
    """The Triton kernels of ``declared_kernels()`` (each its module's: kernels/<name>.py)."""
    return {name: k for name, k in declared_kernels().items() if k.form == "triton"}
