"""WikiText-2 (raw) for causal language modelling: the raw text through Hugging Face
`datasets` (hub, or the "text" builder on a mirror's files), tokenised into one stream of
token ids per split (REFERENCE.md §1.5: contiguous chunks of fixed length)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from seqmix.data.manifest import write_manifest
from seqmix.data.sources import HUB_NAMES, RAW_FILES, Source, mirror_file, resolve_source

SPLITS = ("train", "validation", "test")


def load_wikitext2(source: Source, splits=SPLITS):
    """A DatasetDict with a "text" column, one row per raw line, for ``splits``."""
    import datasets

    if source.kind == "hub":
        name, config = HUB_NAMES["wikitext2"]
        ds = datasets.load_dataset(name, config)
        return datasets.DatasetDict({s: ds[s] for s in splits})
    files = {s: str(mirror_file(source, "wikitext2", s)) for s in splits}
    return datasets.load_dataset("text", data_files=files)


def prepare_wikitext2(spec: dict, out_dir: str | Path, tokenizer_dir: str | Path) -> dict:
    from tqdm import tqdm

    from seqmix.data.tokenizer import load_tokenizer, tokenizer_record

    source = resolve_source(spec["data"])
    tok, _ = load_tokenizer(tokenizer_dir)
    ds = load_wikitext2(source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, splits = {}, {}
    for split in SPLITS:
        lines = [t for t in ds[split]["text"] if t.strip()]
        ids: list[int] = []
        batch = 1024
        for i in tqdm(range(0, len(lines), batch), desc=f"tokenise wikitext2/{split}", leave=False):
            for enc in tok.encode_batch(lines[i : i + batch], add_special_tokens=False):
                ids.extend(enc.ids)
        arr = np.asarray(ids, dtype=np.int32)
        np.save(out_dir / f"{split}.npy", arr)
        files[f"{split}.npy"] = {"tokens": int(arr.size)}
        splits[split] = {
            "description": RAW_FILES[("wikitext2", split)].description,
            "complete": RAW_FILES[("wikitext2", split)].complete,
            "rows": ds[split].num_rows,
            "tokens": int(arr.size),
        }
    info = {
        "task": "wikitext2",
        "dataset": "WikiText-2 raw (wikitext-2-raw-v1)",
        "source": source.describe(),
        "splits": splits,
        "tokenizer": tokenizer_record(tokenizer_dir),
    }
    write_manifest(out_dir, files, info)
    return info
