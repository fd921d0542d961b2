"""The mixer registry: every architecture the study compares, by name.

A mixer maps (batch, L, d_model) -> (batch, L, d_model). The names, import paths, titles,
colours and blocks live in the torch-free catalogue (``seqmix/catalogue.py``), its forms
(``supports_causal`` / ``supports_noncausal``) and options on its class; adding a mixer is
its module plus one entry there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from seqmix import catalogue
from seqmix.errors import problem_lines
from seqmix.mixers.base import Mixer, MixerOptionsError
from seqmix.mixers.options import options_model

__all__ = ["Mixer", "MixerOptionsError", "build", "mixer_class", "names", "options_for_layer", "options_model"]


def names() -> list[str]:
    """The catalogued architecture names, in the order the report lists them."""
    return catalogue.mixer_names()


def mixer_class(name: str) -> type[Mixer]:
    return catalogue.load(catalogue.mixer_entry(name).path)


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
