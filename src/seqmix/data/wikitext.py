"""WikiText-2 (raw) for causal language modelling: the raw text through Hugging Face
`datasets` (seqmix.data.raw), tokenised into one stream of token ids per split
(contiguous chunks of fixed length, as in the Grassmann paper: Zhang 2025,
arXiv:2512.19428, §4.1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tqdm import tqdm

from seqmix.data.manifest import MANIFEST, DataError, write_manifest
from seqmix.data.raw import (
    RAW_FILES,
    WIKITEXT_SPLITS,
    load_wikitext2,
    mirror_file,
    resolve_source,
)
from seqmix.data.tokenizer import TOKENIZER_FILE, load_tokenizer, tokenizer_record
from seqmix.io import FileError, atomic_file, read_json, sha256_file
from seqmix.study.settings import DataSettings


def prepare_wikitext2(data: DataSettings, out_dir: str | Path, tokenizer_dir: str | Path,
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


# ------------------------------------------------------------------------------------------
# Token counts before a job reads the data (the preflight's limits).
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SplitTokens:
    """A split's token count: ``exact`` (the prepared manifest's), or an upper bound."""

    tokens: int
    exact: bool
    source: str  # the file the count comes from


def manifest_tokens(manifest: dict, path: str | Path) -> dict[str, SplitTokens]:
    return {split: SplitTokens(int(info["tokens"]), True, str(path)) for split, info in manifest["splits"].items()}


def split_tokens(data_dir: str | Path, data: DataSettings, tokenizer_dir: str | Path) -> dict[str, SplitTokens]:
    """Token counts of the splits from cheap metadata, nothing tokenised: the manifest's
    (exact) where the data were prepared with the tokenizer now in ``tokenizer_dir``, else
    the byte size of each raw file of the mirror, an upper bound: a WordPiece token covers at
    least one character of the normalised text (an unknown word is one [UNK], and no special
    tokens are added), and BERT's normalisation (NFD, accents stripped, lower case) leaves no
    more characters than the raw text has bytes (a decomposed character keeps one base
    letter, a three-byte Hangul syllable at most three jamo). {} where neither is at hand
    (data from the hub): the job checks the prepared data."""
    return _prepared(Path(data_dir), Path(tokenizer_dir)) or _raw_bounds(data)


def _prepared(data_dir: Path, tokenizer_dir: Path) -> dict[str, SplitTokens]:
    path, tokenizer = data_dir / MANIFEST, tokenizer_dir / TOKENIZER_FILE
    if not path.exists() or not tokenizer.exists():
        return {}
    try:
        manifest = read_json(path)
        if manifest["tokenizer"]["sha256"] != sha256_file(tokenizer):
            return {}  # prepared with another tokenizer: the DAG prepares them again
        return manifest_tokens(manifest, path)
    except (FileError, OSError, KeyError, TypeError, ValueError):
        return {}  # not a manifest these counts can come from: the data job rewrites it


def _raw_bounds(data: DataSettings) -> dict[str, SplitTokens]:
    try:
        source = resolve_source(data)
        if source.kind != "mirror":
            return {}
        files = {split: mirror_file(source, "wikitext2", split, verify=False) for split in WIKITEXT_SPLITS}
    except DataError:
        return {}  # no mirror, or a file missing from it: the data job says which
    return {split: SplitTokens(p.stat().st_size, False, f"{p}, {p.stat().st_size:,} bytes") for split, p in files.items()}
