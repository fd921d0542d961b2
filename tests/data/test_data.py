"""Data: the MQAR generator, mirror checks, manifests, and prepared WikiText-2 / SNLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from seqmix.data.manifest import DataError, read_manifest
from seqmix.data.mqar import multiquery_ar
from seqmix.data.raw import RAW_FILES, mirror_file, resolve_source
from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.io import sha256_file
from seqmix.study.settings import DataSettings
from seqmix.tasks import task_class


def test_mqar_labels_are_the_values_of_the_queried_keys():
    V, L, K = 64, 32, 4
    x, y = multiquery_ar(V, 50, L, K, seed=7)
    assert x.shape == y.shape == (50, L)
    for row_x, row_y in zip(x, y):
        kv = dict(zip(row_x[0 : 2 * K : 2], row_x[1 : 2 * K : 2]))
        assert all(1 <= k < V // 2 for k in kv) and all(V // 2 <= v < V for v in kv.values())
        assert len(kv) == K  # keys without replacement
        pos = np.flatnonzero(row_y != -100)
        assert len(pos) == K
        for p in pos:  # the label at a query key is that key's value
            assert row_y[p] == kv[row_x[p]]
            assert p >= 2 * K


def test_mqar_is_seeded():
    a = multiquery_ar(64, 10, 32, 4, seed=1)
    b = multiquery_ar(64, 10, 32, 4, seed=1)
    c = multiquery_ar(64, 10, 32, 4, seed=2)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_mqar_rejects_impossible_settings():
    with pytest.raises(ValueError, match="num_kv_pairs"):
        multiquery_ar(64, 1, 16, 5)
    # ... and the config says so before any job runs, naming the key.
    from seqmix.expansion.validate import ConfigError

    with pytest.raises(ConfigError, match=r"tasks.mqar.*num_kv_pairs \* 4 \(20\) must be <= seq_len \(16\)"):
        validate_study({"tasks": {"mqar": {"seq_len": 16, "num_kv_pairs": 5, "vocab_size": 64}},
                         "architectures": ["softmax"], "seeds": [0]})


def test_corrupted_mirror_file_names_the_file_and_its_sha256(tmp_path):
    # Any bytes but the official file's: no real mirror needed.
    target = tmp_path / "mirror" / "snli" / "dev.jsonl.gz"
    target.parent.mkdir(parents=True)
    with gzip.open(target, "wb") as f:
        f.write(b'{"premise": "x", "hypothesis": "y", "label": "neutral"}\n')
    source = resolve_source(DataSettings(mirror=str(tmp_path / "mirror"), source="mirror"))
    expected = RAW_FILES[("snli", "validation")].sha256
    with pytest.raises(DataError, match=rf"{target}.*expected {expected}"):
        mirror_file(source, "snli", "validation")


def test_missing_snli_train_explains_the_subset(tmp_path):
    # A mirror laid out like shared/data, which holds SNLI train's subsets but not the split.
    (tmp_path / "mirror" / "snli").mkdir(parents=True)
    source = resolve_source(DataSettings(mirror=str(tmp_path / "mirror"), source="mirror"))
    with pytest.raises(DataError, match=r"snli/train\.jsonl\.gz(?s:.*)train_sample_1pct"):
        mirror_file(source, "snli", "train")


def test_mirror_source_needs_a_mirror(monkeypatch):
    monkeypatch.delenv("SEQMIX_DATA_MIRROR", raising=False)
    with pytest.raises(DataError, match="SEQMIX_DATA_MIRROR"):
        resolve_source(DataSettings(mirror=None, source="mirror"))


def test_prepared_mqar_has_a_manifest_that_catches_corruption(tmp_path):
    cfg = validate_study({"tasks": {"mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2,
                                              "num_train": 20, "num_test": 5}},
                           "architectures": ["softmax"], "seeds": [0], "data": {"dir": str(tmp_path)}})
    info = task_class("mqar").prepare(expand(cfg).data_job("mqar"))
    assert info["splits"]["train"]["examples"] == 20
    manifest = read_manifest(tmp_path / "mqar", "mqar")
    assert set(manifest["files"]) == {"train.npz", "validation.npz", "test.npz"}
    (tmp_path / "mqar" / "test.npz").write_bytes(b"not the data")
    expected = manifest["files"]["test.npz"]["sha256"]
    with pytest.raises(DataError, match=rf"test.npz has sha256 .*expected {expected}.*python -m seqmix data mqar"):
        read_manifest(tmp_path / "mqar", "mqar")


def test_prepared_wikitext_is_complete_and_recorded(prepared):
    m = read_manifest(Path(prepared["data"]["dir"]) / "wikitext2", "wikitext2")
    assert m["splits"]["train"]["rows"] == 36718 and m["splits"]["train"]["complete"]
    assert m["splits"]["validation"]["rows"] == 3760 and m["splits"]["test"]["rows"] == 4358
    assert "local mirror" in m["source"]
    tok = m["tokenizer"]
    # WordPiece keeps every character of the alphabet, so a tiny target can be exceeded;
    # what is recorded must be what the tokenizer really has.
    from seqmix.data.tokenizer import load_tokenizer

    real, _ = load_tokenizer(Path(prepared["data"]["dir"]) / "tokenizer")
    assert tok["kind"] == "trained" and tok["vocab_size"] == real.get_vocab_size() >= 256
    assert "validation split" in tok["description"]
    for name, entry in m["files"].items():
        assert sha256_file(Path(prepared["data"]["dir"]) / "wikitext2" / name) == entry["sha256"]


def test_prepared_snli_drops_unlabelled_and_says_it_is_a_subset(prepared):
    m = read_manifest(Path(prepared["data"]["dir"]) / "snli", "snli")
    assert m["splits"]["validation"]["labelled_examples"] == 9842
    assert m["splits"]["test"]["labelled_examples"] == 9824
    train = m["splits"]["train"]
    assert train["complete"] is False and train["labelled_examples"] == 1022
    assert "not a representative sample" in train["description"]
    z = np.load(Path(prepared["data"]["dir"]) / "snli" / "train.npz")
    assert z["premise_offsets"][-1] == len(z["premise"])
    assert json.loads(json.dumps(m))  # plain JSON


def test_the_trained_tokenizer_is_the_same_in_every_process(mirror):
    # HF tokenizers' WordPiece trainer numbers subword tokens in hash-map order, which is
    # random per process (huggingface/tokenizers#1794); train_wordpiece must not inherit
    # that. Separate processes, because within one the hash seed is fixed.
    import subprocess
    import sys

    script = (
        "import hashlib, sys\n"
        "from seqmix.data.tokenizer import train_wordpiece\n"
        "lines = open(sys.argv[1], encoding='utf-8').read().splitlines()\n"
        "print(hashlib.sha256(train_wordpiece(lines, 1000).to_str().encode()).hexdigest())\n"
    )
    text = str(mirror / "wikitext-2-raw" / "valid.txt")
    digests = {subprocess.run([sys.executable, "-c", script, text], capture_output=True, text=True,
                              check=True).stdout.strip() for _ in range(4)}
    assert len(digests) == 1, f"{len(digests)} different vocabularies from the same text"
