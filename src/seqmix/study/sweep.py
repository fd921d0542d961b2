"""Sweeps are config: a task's ``sweep`` maps model./train. settings to lists of values,
and the task becomes one task per point of their grid, named ``<task>/<point>``
(``d64-lr0.001``). Zoology (Arora et al. 2024, arXiv:2312.04927) sweeps width x sequence
length x learning rate the same way; each result row carries the axes it varied.
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import ValidationError

from seqmix.study.settings import TaskCommon

SWEEPABLE = ("model", "train")
# Short names of swept settings in a point's name; others keep their own name.
SHORT = {"d_model": "d", "n_layers": "layers", "lr": "lr", "batch_size": "bs", "steps": "steps"}



def _point_name(axes: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "on" if v else "off"
        return f"{v:g}" if isinstance(v, float) else str(v)

    return "-".join(f"{SHORT.get(k.split('.', 1)[1], k.split('.', 1)[1])}{fmt(v)}" for k, v in axes.items())


def _with(section: TaskCommon, axes: dict[str, Any]) -> TaskCommon:
    data = section.model_dump()
    for key, value in axes.items():
        part, field = key.split(".", 1)
        data[part][field] = value
    data["sweep"] = {}
    return type(section).model_validate(data)


def sweep_points(section: TaskCommon) -> list[tuple[str, dict[str, Any], TaskCommon]]:
    """(point name, axes, section at that point) for every point of the section's grid."""
    if not section.sweep:
        return []
    keys = list(section.sweep)
    out = []
    for values in itertools.product(*(section.sweep[k] for k in keys)):
        axes = dict(zip(keys, values))
        out.append((_point_name(axes), axes, _with(section, axes)))
    return out


def sweep_problems(name: str, section: TaskCommon) -> list[str]:
    """What is wrong with a task's sweep, one line per problem (empty: nothing)."""
    problems = []
    for key, values in section.sweep.items():
        part, _, field = key.partition(".")
        where = f"config key 'tasks.{name}.sweep.{key}'"
        if part not in SWEEPABLE or field not in type(getattr(section, part, None) or section).model_fields:
            problems.append(f"{where}: a sweep varies model.<setting> or train.<setting>; e.g. model.d_model, train.lr")
        elif not values:
            problems.append(f"{where}: give at least one value")
    if problems:
        return problems
    try:
        sweep_points(section)
    except ValidationError as e:
        problems += [f"config key 'tasks.{name}.sweep': a point is not a valid setting: {err['msg']} "
                     f"({'.'.join(map(str, err['loc']))} = {err['input']!r})" for err in e.errors()]
    return problems
