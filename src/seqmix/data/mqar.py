"""Multi-query associative recall (Zoology: Arora et al. 2024, arXiv:2312.04927, §3 and
its generator zoology/data/multiquery_ar.py), generated from a seed.

A context of key-value pairs [k1 v1 k2 v2 ...] is followed by a query region in which
each key reappears at a power-law distributed gap; the label at a query key is its value
(next-token prediction), every other label is ignored (-100). Keys come from
{1, ..., V/2 - 1}, values from {V/2, ..., V - 1}, each example without replacement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from seqmix.data.manifest import write_manifest
from seqmix.io import atomic_file

SPLITS = {"train": 0, "validation": 1, "test": 2}  # split -> offset added to the data seed


def multiquery_ar(
    vocab_size: int,
    num_examples: int,
    input_seq_len: int,
    num_kv_pairs: int,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels), both (num_examples, input_seq_len) int64."""
    if input_seq_len % 2:
        raise ValueError(f"mqar seq_len must be even, got {input_seq_len}")
    if vocab_size <= input_seq_len:
        raise ValueError(f"mqar vocab_size ({vocab_size}) must exceed seq_len ({input_seq_len})")
    if num_kv_pairs * 4 > input_seq_len:
        raise ValueError(
            f"mqar num_kv_pairs*4 ({num_kv_pairs * 4}) must be <= seq_len ({input_seq_len})"
        )
    if num_kv_pairs > vocab_size // 2 - 1:
        raise ValueError(f"mqar needs vocab_size/2 - 1 >= num_kv_pairs ({num_kv_pairs})")
    rng = np.random.default_rng(seed)
    context = num_kv_pairs * 2
    half = vocab_size // 2
    keys = np.stack([rng.choice(np.arange(1, half), num_kv_pairs, replace=False) for _ in range(num_examples)])
    values = np.stack([rng.choice(np.arange(half, vocab_size), num_kv_pairs, replace=False) for _ in range(num_examples)])
    kvs = np.zeros((num_examples, context), dtype=np.int64)
    kvs[:, 0::2], kvs[:, 1::2] = keys, values

    space = (input_seq_len - context) // 2
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    p /= p.sum()
    gaps = np.stack([rng.choice(space, num_kv_pairs, replace=False, p=p) for _ in range(num_examples)])

    queries = np.zeros((num_examples, input_seq_len - context + 1), dtype=np.int64)
    np.put_along_axis(queries, gaps * 2, keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)
    labels = np.full((num_examples, input_seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(labels, gaps * 2 + context + 1, values, axis=1)
    inputs, labels = examples[:, :-1], labels[:, 1:]
    if random_non_queries:
        noise = rng.integers(0, vocab_size, size=inputs.shape)
        inputs = np.where(inputs == 0, noise, inputs)
    return inputs, labels


def prepare_mqar(vocab_size: int, seq_len: int, num_kv_pairs: int, num_train: int, num_test: int,
                 power_a: float, random_non_queries: bool, data_seed: int, out_dir: str | Path) -> dict:
    """``<split>.npz`` (inputs, labels) of every split with their manifest; returns its info."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, splits = {}, {}
    for split, offset in SPLITS.items():
        n = num_train if split == "train" else num_test
        inputs, labels = multiquery_ar(vocab_size, n, seq_len, num_kv_pairs, power_a, random_non_queries,
                                       seed=data_seed + offset)
        with atomic_file(out_dir / f"{split}.npz") as f:  # a failed write leaves no half file
            np.savez(f, inputs=inputs, labels=labels)
        files[f"{split}.npz"] = {"examples": n}
        splits[split] = {
            "description": f"synthetic MQAR, {n:,} examples, seed {data_seed + offset}",
            "complete": True,
            "examples": n,
            "queries": int((labels != -100).sum()),
        }
    info = {
        "dataset": f"MQAR (Zoology generator): vocab {vocab_size}, seq_len {seq_len}, {num_kv_pairs} key-value pairs",
        "source": "generated",
        "generator": {"vocab_size": vocab_size, "seq_len": seq_len, "num_kv_pairs": num_kv_pairs,
                      "num_train": num_train, "num_test": num_test, "power_a": power_a,
                      "random_non_queries": random_non_queries, "data_seed": data_seed},
        "splits": splits,
    }
    write_manifest(out_dir, files, info)
    return info
