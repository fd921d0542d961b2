"""A mixer's options as a pydantic model, built from its ``Options`` dataclass: the fields,
types and defaults, the bounds in each field's metadata (``field(default=32, metadata={"ge": 2})``)
and the cross-field checks of its ``__post_init__``. The config validation (every
``mixers.<arch>`` key, before any job), the JSON schema and ``seqmix.mixers.build`` all use
it, so a bound is written once, on the field."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator


@functools.cache
def options_model(options_cls: type) -> type[BaseModel]:
    """The pydantic model of an ``Options`` dataclass (unknown keys are errors)."""
    hints = typing.get_type_hints(options_cls, include_extras=True)
    fields = {f.name: (hints[f.name], Field(_default(f), **dict(f.metadata))) for f in dataclasses.fields(options_cls)}

    # What metadata cannot say (h3's dt_min <= dt_max, ...) stays in __post_init__; running
    # it here makes it a validation error of the section, with the dataclass's message.
    @model_validator(mode="after")
    def _post_init_checks(self):
        options_cls(**dict(self))
        return self

    return create_model(options_cls.__name__, __config__=ConfigDict(extra="forbid"),
                        __validators__={"_post_init_checks": _post_init_checks}, **fields)


def _default(f: dataclasses.Field) -> Any:
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default
