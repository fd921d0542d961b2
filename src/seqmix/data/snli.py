"""SNLI 1.0 (Bowman et al. 2015) for sentence-pair classification. Rows without a gold
label ("-") are dropped (the usual 9,842 dev / 9,824 test); which train file was used is
recorded, because an offline mirror may hold only a sample of train."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from seqmix.data.manifest import write_manifest
from seqmix.data.raw import RAW_FILES, SNLI_LABELS, load_snli, resolve_source
from seqmix.data.tokenizer import load_tokenizer, tokenizer_record
from seqmix.io import atomic_file
from seqmix.study.settings import DataSettings

SPLITS = ("train", "validation", "test")


def _encode(tok, texts: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    encs = tok.encode_batch(texts, add_special_tokens=False)
    lengths = np.array([min(len(e.ids), max_tokens) for e in encs], dtype=np.int64)
    flat = np.concatenate([np.asarray(e.ids[:max_tokens], dtype=np.int32) for e in encs])
    return flat, np.concatenate([[0], np.cumsum(lengths)])


def prepare_snli(data: DataSettings, train_file: str, max_sentence_tokens: int, out_dir: str | Path,
                 tokenizer_dir: str | Path, env_mirror: str | None = None) -> dict:
    """``<split>.npz`` (token ids and offsets of premises and hypotheses, labels) with
    their manifest; returns its info. ``env_mirror``: as for ``resolve_source``."""
    source = resolve_source(data, env_mirror)
    tok, _ = load_tokenizer(tokenizer_dir)
    ds = load_snli(source, train_file)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, splits = {}, {}
    for split in SPLITS:
        rows = ds[split].filter(lambda r: r["label"] >= 0, desc=f"drop unlabelled {split}")
        p_ids, p_off = _encode(tok, rows["premise"], max_sentence_tokens)
        h_ids, h_off = _encode(tok, rows["hypothesis"], max_sentence_tokens)
        labels = np.asarray(rows["label"], dtype=np.int64)
        with atomic_file(out_dir / f"{split}.npz") as f:  # a failed write leaves no half file
            np.savez(f, premise=p_ids, premise_offsets=p_off, hypothesis=h_ids, hypothesis_offsets=h_off,
                     labels=labels)
        raw = RAW_FILES[("snli", train_file if split == "train" else split)]
        files[f"{split}.npz"] = {"examples": int(labels.size)}
        splits[split] = {
            "description": raw.description, "complete": raw.complete, "rows": ds[split].num_rows,
            "labelled_examples": int(labels.size),
            "label_counts": {k: int((labels == v).sum()) for k, v in SNLI_LABELS.items()},
        }
    info = {"dataset": "SNLI 1.0", "source": source.describe(), "train_file": train_file,
            "max_sentence_tokens": max_sentence_tokens, "splits": splits,
            "tokenizer": tokenizer_record(tokenizer_dir)}
    write_manifest(out_dir, files, info)
    return info
