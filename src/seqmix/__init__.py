"""seqmix: a reproducible replication pipeline asking whether softmax attention is what
sequence models need. ``python -m seqmix --help`` lists the commands.

``seqmix.kernels`` is the checkout's top-level kernels/, by the link src/seqmix/kernels
(pyproject.toml says why)."""

from pathlib import Path

__version__ = "0.1.0"
# The checkout seqmix runs from: notebooks/, paper/ and config/ live beside src/.
REPO_ROOT = Path(__file__).resolve().parents[2]
