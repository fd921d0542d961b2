"""Where raw data comes from: the Hugging Face hub, or a local mirror directory holding the
official raw files (layout: docs/reference/data-mirror.md). Mirror files are checked against
the published sha256 of the official releases before anything is read from them; a missing
or wrong file stops the job naming the file, its expected digest and the fix, which names
the setting in force: the config key 'data.mirror' or the environment variable (read by the
CLI and passed here as ``env_mirror``)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from seqmix.data.manifest import DataError, check_sha256
from seqmix.study.settings import MIRROR_ENV, DataSettings


@dataclasses.dataclass(frozen=True)
class RawFile:
    paths: tuple[str, ...]  # accepted names inside the mirror, first match wins
    sha256: str | None  # None: no published digest to check against
    description: str
    complete: bool  # is this the whole official split?
    unchecked: str = ""  # with no digest: why, and what is known instead


UNCHECKED_SNLI_TRAIN = (
    "no published sha256 exists for a converted snli/train.jsonl.gz, so it is used unchecked (the "
    "official uncompressed snli_1.0_train.jsonl, 487,457,790 bytes, has sha256 "
    "ee95dfbc57800f7b1f62b7602ad2b176c2b983210435a49238e660324a01e963 as published by others; "
    "not checked here)"
)

RAW_FILES: dict[tuple[str, str], RawFile] = {
    ("wikitext2", "train"): RawFile(
        ("wikitext-2-raw/train.txt", "wikitext-2-raw/wiki.train.raw"),
        "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57",
        "WikiText-2 raw train (complete, 36,718 lines)", True),
    ("wikitext2", "validation"): RawFile(
        ("wikitext-2-raw/valid.txt", "wikitext-2-raw/wiki.valid.raw"),
        "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7",
        "WikiText-2 raw validation (complete, 3,760 lines)", True),
    ("wikitext2", "test"): RawFile(
        ("wikitext-2-raw/test.txt", "wikitext-2-raw/wiki.test.raw"),
        "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08",
        "WikiText-2 raw test (complete, 4,358 lines)", True),
    ("snli", "validation"): RawFile(
        ("snli/dev.jsonl.gz",),
        "2242fdc31af5f563aec0f2e5c1dc21e0eaf56d017c40d2407150db1cdec51755",
        "SNLI 1.0 dev (complete, 10,000 pairs)", True),
    ("snli", "test"): RawFile(
        ("snli/test.jsonl.gz",),
        "ceff9192c4ca31c986fa23e5f77a794c29dce2356e55b36fd106d767f34f746a",
        "SNLI 1.0 test (complete, 10,000 pairs)", True),
    ("snli", "train"): RawFile(
        ("snli/train.jsonl.gz",), None,
        "SNLI 1.0 train (complete, 550,152 pairs; no published digest of this file: used unchecked)", True,
        UNCHECKED_SNLI_TRAIN),
    ("snli", "train_sample_1pct"): RawFile(
        ("snli/train_sample_1pct.jsonl.gz",),
        "12e0f970f5b56a4cdc13d4142d48d69411d38d1849b2045560bd7b80716a9512",
        "SNLI 1.0 train, 1% uniform random sample (5,502 of 550,152 pairs)", False),
    ("snli", "train_head_1024"): RawFile(
        ("snli/train_head_1024.jsonl.gz",),
        "7faf7aa3e6d51a0469ae8d9f38535f3f7d6708c9e4d488a2c169817cf9cd0264",
        "SNLI 1.0 train, first 1,024 lines (not a representative sample)", False),
}

HUB_NAMES = {"wikitext2": ("Salesforce/wikitext", "wikitext-2-raw-v1"), "snli": ("stanfordnlp/snli", None)}


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # "mirror" | "hub"
    mirror: Path | None
    origin: str = ""  # which setting named the mirror: what a fix tells the user to change

    def describe(self) -> str:
        return f"local mirror {self.mirror}" if self.kind == "mirror" else "Hugging Face hub"


def resolve_source(data: DataSettings, env_mirror: str | None = None) -> Source:
    """The configured source: ``data.mirror`` (else ``env_mirror``, $SEQMIX_DATA_MIRROR as the
    CLI read it) or the hub."""
    mirror = data.mirror or env_mirror or None
    origin = "config key 'data.mirror'" if data.mirror else f"environment variable {MIRROR_ENV}"
    source = data.source
    if source == "hub" or (source == "auto" and not mirror):
        return Source("hub", None)
    if not mirror:
        raise DataError(
            "config key 'data.source' is 'mirror' but no mirror is set: set 'data.mirror' in "
            f"the config or the environment variable {MIRROR_ENV} to a directory with the "
            "mirror layout (wikitext-2-raw/, snli/, SHA256SUMS; README: The data mirror)"
        )
    path = Path(mirror).expanduser().resolve()
    if not path.is_dir():
        raise DataError(f"data mirror {path} (from the {origin}) is not a directory; "
                        "point it at a directory with the mirror layout (README: The data mirror)")
    return Source("mirror", path, origin)


def mirror_file(source: Source, task: str, split: str, verify: bool = True) -> Path:
    """Path of one raw file in the mirror, checked against its published sha256."""
    raw = RAW_FILES[(task, split)]
    assert source.mirror is not None
    restore = ("copy the official file there (the mirror's SHA256SUMS lists every digest) or point the "
               f"{source.origin} at a mirror that has a good copy")
    for rel in raw.paths:
        p = source.mirror / rel
        if p.exists():
            if verify and raw.sha256:
                check_sha256(p, raw.sha256, restore)
            elif verify:
                print(f"warning: {p}: {raw.unchecked}", file=sys.stderr)
            return p
    names = " or ".join(str(source.mirror / r) for r in raw.paths)
    digest = f"expected sha256 {raw.sha256}" if raw.sha256 else raw.unchecked
    hint = ""
    if (task, split) == ("snli", "train"):
        hint = (" The shared mirror has only ~1.2% of SNLI train: set "
                "'tasks.snli.train_file: train_sample_1pct' to train on its 1% sample.")
    raise DataError(f"data file {names} is missing from the mirror ({raw.description}; {digest}); "
                    f"{restore}.{hint}")


# ------------------------------------------------------------------------------------------
# Raw loaders: Hugging Face `datasets` from the hub, or its builders on the mirror's files.
# ------------------------------------------------------------------------------------------

WIKITEXT_SPLITS = ("train", "validation", "test")
SNLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SNLI_TRAIN_PAIRS = 550_152


def load_wikitext2(source: Source, splits=WIKITEXT_SPLITS):
    """A DatasetDict with a "text" column, one row per raw line, for ``splits``."""
    import datasets

    if source.kind == "hub":
        name, config = HUB_NAMES["wikitext2"]
        ds = datasets.load_dataset(name, config)
        return datasets.DatasetDict({s: ds[s] for s in splits})
    files = {s: str(mirror_file(source, "wikitext2", s)) for s in splits}
    return datasets.load_dataset("text", data_files=files)


def _hub_subset(ds, train_file: str):
    # The mirror's subsets were cut from the official train file; on the hub the same rows
    # are recovered with the same sampler (the README's "The data mirror").
    if train_file == "train_sample_1pct":
        idx = np.random.RandomState(0).choice(SNLI_TRAIN_PAIRS, 5502, replace=False)
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
    return ds.map(lambda row: {"label": SNLI_LABELS.get(row["label"], -1)}, desc="labels")
