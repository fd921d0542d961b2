"""WikiText-2 (raw) for causal language modelling: the raw text through Hugging Face
`datasets` (seqmix.data.sources), tokenised into one stream of token ids per split
(contiguous chunks of fixed length, as in the Grassmann paper: Zhang 2025,
arXiv:2512.19428, §4.1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from seqmix.data.manifest import write_manifest
from seqmix.data.sources import RAW_FILES, WIKITEXT_SPLITS, load_wikitext2, resolve_source
from seqmix.data.tokenizer import load_tokenizer, tokenizer_record
from seqmix.io import atomic_file
from seqmix.sections import DataSpec


def prepare_wikitext2(data: DataSpec, out_dir: str | Path, tokenizer_dir: str | Path,
                      env_mirror: str | None = None) -> dict:
    """``<split>.npy`` token streams of every split with their manifest; returns its info.
    ``env_mirror``: $SEQMIX_DATA_MIRROR as the CLI read it (``resolve_source``)."""
    source = resolve_source(data, env_mirror)
    tok, _ = load_tokenizer(tokenizer_dir)
    ds = load_wikitext2(source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, splits = {}, {}
    for split in WIKITEXT_SPLITS:
        lines = [t for t in ds[split]["text"] if t.strip()]
        ids: list[int] = []
        batch = 1024
        for i in tqdm(range(0, len(lines), batch), desc=f"tokenise wikitext2/{split}", leave=False):
            for enc in tok.encode_batch(lines[i : i + batch], add_special_tokens=False):
                ids.extend(enc.ids)
        arr = np.asarray(ids, dtype=np.int32)
        with atomic_file(out_dir / f"{split}.npy") as f:  # a failed write leaves no half file
            np.save(f, arr)
        files[f"{split}.npy"] = {"tokens": int(arr.size)}
        raw = RAW_FILES[("wikitext2", split)]
        splits[split] = {"description": raw.description, "complete": raw.complete,
                         "rows": ds[split].num_rows, "tokens": int(arr.size)}
    info = {"dataset": "WikiText-2 raw (wikitext-2-raw-v1)", "source": source.describe(),
            "splits": splits, "tokenizer": tokenizer_record(tokenizer_dir)}
    write_manifest(out_dir, files, info)
    return info
