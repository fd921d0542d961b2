"""`python -m seqmix data <task>`: prepare one task's data under data.dir."""

from __future__ import annotations

from pathlib import Path

DATA_TASKS = ("tokenizer", "wikitext2", "snli", "mqar")


def task_dir(spec_or_cfg: dict, task: str) -> Path:
    return Path(spec_or_cfg["data"]["dir"]) / task


def prepare(task: str, spec: dict) -> dict:
    """Prepare ``task`` from a data spec (seqmix.config.data_spec); returns its manifest info."""
    if task not in DATA_TASKS:
        raise ValueError(f"unknown data task {task!r}; choose one of {', '.join(DATA_TASKS)}")
    out = task_dir(spec, task)
    if task == "tokenizer":
        from seqmix.data.tokenizer import prepare_tokenizer

        return prepare_tokenizer(spec, out)
    if task == "mqar":
        from seqmix.data.mqar import prepare_mqar

        return prepare_mqar(spec, out)
    tokenizer_dir = task_dir(spec, "tokenizer")
    if task == "wikitext2":
        from seqmix.data.wikitext import prepare_wikitext2

        return prepare_wikitext2(spec, out, tokenizer_dir)
    from seqmix.data.snli import prepare_snli

    return prepare_snli(spec, out, tokenizer_dir)
