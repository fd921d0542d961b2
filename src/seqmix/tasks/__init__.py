"""The task kinds, by name, from the catalogue (seqmix/catalogue.py).
A task kind is a ``seqmix.tasks.base.Task`` subclass; see base.py for what it owns."""

from __future__ import annotations

from seqmix import catalogue


def task_class(kind: str):
    """The Task subclass of ``kind`` (``"mqar"``; a task name ``"mqar/L64-kv4"`` works too)."""
    return catalogue.imported(catalogue.task_entry(catalogue.kind_of(kind)).path)


def kinds() -> list[str]:
    return catalogue.task_kinds()


def make_task(spec):
    """The task of a run spec, its data checked against its manifest."""
    return task_class(spec.kind)(spec)
