"""The tokenizer of the Grassmann paper (Zhang 2025, arXiv:2512.19428, §4.1): a BERT-style WordPiece
vocabulary of ~30,522. Online: bert-base-uncased's own. Offline: one of the configured
size trained with Hugging Face `tokenizers` on the WikiText-2 training split, with the
same normalisation (lower-case, accent stripping) and special tokens."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from seqmix.data.manifest import DataError, read_manifest, write_manifest
from seqmix.data.raw import Source, load_wikitext2, resolve_source
from seqmix.io import atomic_path, sha256_file
from seqmix.study.jobs import TokenizerJob

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TOKENIZER_FILE = "tokenizer.json"


def train_wordpiece(lines, vocab_size: int) -> Tokenizer:
    """A WordPiece vocabulary trained with HF ``tokenizers``, the same in every process.

    The trainer alone is not deterministic (huggingface/tokenizers#1794): it numbers the
    continuing-subword tokens (``##c``) in hash-map order, and those numbers break ties
    between merges of equal count, so two processes can learn different vocabularies from
    the same text. Registering every ``##c`` up front, in sorted order, fixes their numbers;
    the vocabulary is then loaded into a fresh WordPiece model, so that only the real
    special tokens are special.
    """
    lines = [line for line in lines if line.strip()]
    normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    continuing = set()
    for line in lines:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            continuing.update(word[1:])
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS + ["##" + c for c in sorted(continuing)],
        show_progress=False,
    )
    learner = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    learner.normalizer, learner.pre_tokenizer = normalizer, pre_tokenizer
    learner.train_from_iterator(lines, trainer=trainer)

    tok = Tokenizer(models.WordPiece(learner.get_vocab(), unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIALS)
    return tok


def prepare_tokenizer(job: TokenizerJob) -> dict:
    """Build the tokenizer described by ``job.tokenizer`` into ``job.out_dir``."""
    tcfg = job.tokenizer
    source = resolve_source(job.data, job.env_mirror)
    kind = tcfg.kind
    if kind == "auto":
        kind = "pretrained" if source.kind == "hub" else "trained"
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind == "pretrained":
        try:
            tok = Tokenizer.from_pretrained(tcfg.pretrained_name)
        except Exception as e:  # the hub is unreachable or the name is wrong
            raise DataError(
                f"could not download tokenizer {tcfg.pretrained_name!r} from the Hugging Face "
                f"hub ({type(e).__name__}: {e}); set 'tokenizer.kind: trained' (or use a data "
                "mirror) to train a WordPiece vocabulary locally"
            ) from e
        description = f"{tcfg.pretrained_name} WordPiece (pretrained, from the hub)"
    else:
        split = tcfg.train_split
        texts = load_wikitext2(source, [split])[split]["text"]
        tok = train_wordpiece(texts, tcfg.vocab_size)
        description = (
            f"WordPiece, vocabulary {tok.get_vocab_size():,}, trained with HF tokenizers on the "
            f"WikiText-2 {split} split (bert-base-uncased was not reachable)"
        )
    with atomic_path(out_dir / TOKENIZER_FILE) as tmp:  # a failed write leaves no half file
        tok.save(str(tmp))
    info = {
        "task": "tokenizer",
        "kind": kind,
        "description": description,
        "vocab_size": tok.get_vocab_size(),
        "source": source.describe(),
        "specials": {s: tok.token_to_id(s) for s in SPECIALS},
    }
    write_manifest(out_dir, {TOKENIZER_FILE: {"vocab_size": tok.get_vocab_size()}}, info)
    return info


def load_tokenizer(directory: str | Path) -> tuple[Tokenizer, dict]:
    directory = Path(directory)
    info = read_manifest(directory, "tokenizer")
    return Tokenizer.from_file(str(directory / TOKENIZER_FILE)), info


def tokenizer_record(directory: str | Path) -> dict:
    """What a run records about its tokenizer."""
    m = json.loads((Path(directory) / "manifest.json").read_text())
    return {
        "kind": m["kind"],
        "description": m["description"],
        "vocab_size": m["vocab_size"],
        "sha256": sha256_file(Path(directory) / TOKENIZER_FILE),
    }


__all__ = ["Source", "load_tokenizer", "prepare_tokenizer", "tokenizer_record", "train_wordpiece"]
