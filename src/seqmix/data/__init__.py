"""Data: WikiText-2 and SNLI through Hugging Face `datasets` (hub or local mirror), a
seeded synthetic MQAR task, the WordPiece tokenizer, and manifests with sha256."""

from seqmix.data.manifest import DataError

__all__ = ["DataError"]
