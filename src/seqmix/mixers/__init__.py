"""The mixer registry: every architecture the study compares, by name.

A mixer maps (batch, L, d_model) -> (batch, L, d_model). Adding one is one module in this
package plus one line in ``_REGISTRY`` (and its name in the config schema's ``arch_name``
enum, which a test keeps in step with this table).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from seqmix.mixers.base import Mixer, MixerOptionsError

# name -> "module:Class". Imported lazily so that `import seqmix.mixers` stays cheap.
_REGISTRY: dict[str, str] = {
    "softmax": "seqmix.mixers.softmax:SoftmaxAttention",
    "grassmann": "seqmix.mixers.grassmann:CausalGrassmann",
    "linear": "seqmix.mixers.linear:LinearAttention",
    "performer": "seqmix.mixers.performer:Performer",
    "sliding_window": "seqmix.mixers.sliding_window:SlidingWindowAttention",
    "bigbird": "seqmix.mixers.bigbird:BigBirdAttention",
    "gla": "seqmix.mixers.gla:GatedLinearAttention",
    "h3": "seqmix.mixers.h3:H3",
    "mamba": "seqmix.mixers.mamba:Mamba",
    "tssa": "seqmix.mixers.tssa:TokenStatisticsAttention",
    "crate": "seqmix.mixers.crate:CrateAttention",
    "linformer": "seqmix.mixers.linformer:Linformer",
}

__all__ = ["Mixer", "MixerOptionsError", "build", "mixer_class", "names", "options_for_layer"]


def names() -> list[str]:
    """The registered architecture names, in the order the report lists them."""
    return list(_REGISTRY)


def mixer_class(name: str) -> type[Mixer]:
    if name not in _REGISTRY:
        raise KeyError(f"unknown mixer {name!r}; registered: {', '.join(_REGISTRY)}")
    module_name, class_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


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

    ``options`` are the fields of the mixer's ``Options`` dataclass; an unknown one is an
    error that lists the allowed fields. ``max_len`` is the longest sequence the model will
    see (needed only by mixers with per-position parameters).
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
    return cls(d_model, cls.Options(**options), causal=causal, max_len=max_len)
