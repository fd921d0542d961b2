"""SNLI 1.0 for sentence-pair classification. Rows without a gold label ("-") are dropped
(the usual 9,842 dev / 9,824 test); which train file was used is recorded, because the
shared mirror holds only a 1% sample of train (shared/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from seqmix.data.manifest import write_manifest
from seqmix.data.sources import HUB_NAMES, RAW_FILES, Source, mirror_file, resolve_source

LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SPLITS = ("train", "validation", "test")
OFFICIAL_TRAIN_PAIRS = 550_152


def _hub_subset(ds, train_file: str):
    # The mirror's subsets were cut from the official train file; on the hub the same rows
    # are recovered with the same sampler (shared/data/README.md).
    if train_file == "train_sample_1pct":
        idx = np.random.RandomState(0).choice(OFFICIAL_TRAIN_PAIRS, 5502, replace=False)
        return ds.select(idx.tolist())
    if train_file == "train_head_1024":
        return ds.select(range(1024))
    return ds


def load_snli(source: Source, train_file: str):
    """A DatasetDict (train, validation, test) with premise, hypothesis and an int label
    (0 entailment, 1 neutral, 2 contradiction, -1 no gold label)."""
    import datasets

    if source.kind == "hub":
        ds = datasets.load_dataset(HUB_NAMES["snli"][0])
        return datasets.DatasetDict(
            train=_hub_subset(ds["train"], train_file), validation=ds["validation"], test=ds["test"]
        )
    files = {
        "train": str(mirror_file(source, "snli", train_file)),
        "validation": str(mirror_file(source, "snli", "validation")),
        "test": str(mirror_file(source, "snli", "test")),
    }
    ds = datasets.load_dataset("json", data_files=files)
    return ds.map(lambda row: {"label": LABELS.get(row["label"], -1)}, desc="labels")


def _encode(tok, texts: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    encs = tok.encode_batch(texts, add_special_tokens=False)
    lengths = np.array([min(len(e.ids), max_tokens) for e in encs], dtype=np.int64)
    flat = np.concatenate([np.asarray(e.ids[:max_tokens], dtype=np.int32) for e in encs])
    return flat, np.concatenate([[0], np.cumsum(lengths)])


def prepare_snli(spec: dict, out_dir: str | Path, tokenizer_dir: str | Path) -> dict:
    from seqmix.data.tokenizer import load_tokenizer, tokenizer_record

    task_cfg = spec["task_config"]
    source = resolve_source(spec["data"])
    tok, _ = load_tokenizer(tokenizer_dir)
    train_file = task_cfg["train_file"]
    ds = load_snli(source, train_file)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, splits = {}, {}
    for split in SPLITS:
        rows = ds[split].filter(lambda r: r["label"] >= 0, desc=f"drop unlabelled {split}")
        p_ids, p_off = _encode(tok, rows["premise"], task_cfg["max_sentence_tokens"])
        h_ids, h_off = _encode(tok, rows["hypothesis"], task_cfg["max_sentence_tokens"])
        labels = np.asarray(rows["label"], dtype=np.int64)
        np.savez(out_dir / f"{split}.npz", premise=p_ids, premise_offsets=p_off,
                 hypothesis=h_ids, hypothesis_offsets=h_off, labels=labels)
        raw = RAW_FILES[("snli", train_file if split == "train" else split)]
        files[f"{split}.npz"] = {"examples": int(labels.size)}
        splits[split] = {
            "description": raw.description,
            "complete": raw.complete,
            "rows": ds[split].num_rows,
            "labelled_examples": int(labels.size),
            "label_counts": {k: int((labels == v).sum()) for k, v in LABELS.items()},
        }
    info = {
        "task": "snli",
        "dataset": "SNLI 1.0",
        "source": source.describe(),
        "train_file": train_file,
        "max_sentence_tokens": task_cfg["max_sentence_tokens"],
        "splits": splits,
        "tokenizer": tokenizer_record(tokenizer_dir),
    }
    write_manifest(out_dir, files, info)
    return info
