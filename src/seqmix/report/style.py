"""One plotting style for every figure of the report, and the figure writer. Order,
titles and colours of the architectures come from the catalogue (seqmix/catalogue.py), so
a mixer looks the same in every figure and a new one is drawn with no change here."""

from __future__ import annotations

from pathlib import Path

from seqmix import catalogue
from seqmix.io import atomic_path


def arch_title(arch: str) -> str:
    return catalogue.title(arch)


METRIC_TITLES = {"ppl": "perplexity", "accuracy": "accuracy"}


def metric_title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric)


def palette() -> dict[str, str]:
    """Colour of every catalogued mixer."""
    return {m.name: m.colour for m in catalogue.MIXERS}


def ordered(archs) -> list[str]:
    """``archs`` in catalogue order (names not in the catalogue last, alphabetically)."""
    order = catalogue.mixer_names()
    archs = list(dict.fromkeys(archs))
    return sorted(archs, key=lambda a: (order.index(a) if a in order else len(order), a))


def apply_style() -> None:
    import matplotlib as mpl
    import seaborn as sns

    mpl.use("Agg")
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.0)
    mpl.rcParams.update({
        "figure.figsize": (6.0, 3.6),
        "figure.dpi": 150,
        "savefig.bbox": "tight",
        "pdf.fonttype": 42,
        "axes.titlesize": 10,
        "legend.fontsize": 7,
        # Identical bytes for identical results: no creation date in the PDF.
        "pdf.compression": 6,
    })


def save_figure(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip("."), metadata={"CreationDate": None, "ModDate": None})
    plt.close(fig)
    return Path(path)
