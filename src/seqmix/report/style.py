"""One plotting style for every figure of the report, and the figure writer."""

from __future__ import annotations

from pathlib import Path

# Architecture order and colours, fixed across figures so a mixer looks the same everywhere.
ARCH_ORDER = [
    "softmax", "grassmann", "linear", "performer", "sliding_window", "bigbird", "gla", "h3",
    "mamba", "tssa", "crate", "linformer",
]
ARCH_LABELS = {
    "softmax": "Softmax", "grassmann": "Grassmann", "linear": "Linear (elu+1)",
    "performer": "Performer", "sliding_window": "Sliding window", "bigbird": "BigBird",
    "gla": "GLA", "h3": "H3", "mamba": "Mamba", "tssa": "ToST (TSSA)", "crate": "CRATE",
    "linformer": "Linformer",
}


def arch_label(arch: str) -> str:
    return ARCH_LABELS.get(arch, arch)


def palette() -> dict[str, tuple]:
    import seaborn as sns

    colours = sns.color_palette("tab20", len(ARCH_ORDER))
    return {a: colours[i] for i, a in enumerate(ARCH_ORDER)}


def ordered(archs) -> list[str]:
    archs = list(dict.fromkeys(archs))
    return sorted(archs, key=lambda a: (ARCH_ORDER.index(a) if a in ARCH_ORDER else len(ARCH_ORDER), a))


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"CreationDate": None, "ModDate": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
