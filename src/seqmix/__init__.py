"""seqmix: a reproducible replication pipeline asking whether softmax attention is what
sequence models need. ``python -m seqmix --help`` lists the commands."""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"
# The checkout seqmix runs from: notebooks/, paper/ and config/ live beside src/.
REPO_ROOT = Path(__file__).resolve().parents[2]


class _CheckoutKernels(importlib.abc.MetaPathFinder):
    """``seqmix.kernels`` from the top-level kernels/ of the checkout this seqmix was imported
    from. An install maps kernels/ there itself (pyproject's package-dir); a checkout run with
    PYTHONPATH=src, as every rule runs, has no such mapping, and an editable install of another
    checkout would otherwise hand out that checkout's kernels."""

    def __init__(self, folder: Path):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != f"{__name__}.kernels":
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / "__init__.py",
                                                      submodule_search_locations=[str(self.folder)])


if Path(__file__).resolve().parent.parent.name == "src" and (REPO_ROOT / "kernels" / "__init__.py").exists():
    sys.meta_path.insert(0, _CheckoutKernels(REPO_ROOT / "kernels"))
