"""The gap of one architecture over another against model size: the per-seed gaps of a size
ladder (the tasks of a ``gap_trend`` claim, e.g. config/size-ladder.yaml's, read from the
collected runs), the least-squares slope of the gap against log10(parameters) with its 95%
interval, and the figure that draws them beside a claim's stated band and published
reproductions (paper/claims.yaml: the claim's ``band`` and ``references``).

Each gap is 100·(metric[arch] / metric[baseline] − 1) of one seed pair at one size, as the
``relative_gap`` claims compute theirs; a size's parameters are its baseline's.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math

import numpy as np
import pandas as pd

GAP_COLUMNS = ["task", "seed", "params", "gap"]


def ladder_gaps(runs: pd.DataFrame | None, pattern: str, arch: str, baseline: str, split: str = "eval") -> pd.DataFrame:
    """One row per (size, seed) both architectures finished: task, seed, params (the
    baseline's), gap in % of ``split``'s metric (eval: validation, test)."""
    if runs is None or runs.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    mine = runs[runs.task.map(lambda t: fnmatch.fnmatchcase(str(t), pattern)) & (runs.status == "ok")]
    col, rows = f"{split}_value", []
    for task, at in mine.groupby("task", sort=False):
        a = at[at.arch == arch].drop_duplicates("seed").set_index("seed")
        b = at[at.arch == baseline].drop_duplicates("seed").set_index("seed")
        for seed in sorted(set(a.index) & set(b.index)):
            rows.append({"task": task, "seed": int(seed), "params": float(b.loc[seed, "params"]),
                         "gap": 100.0 * (float(a.loc[seed, col]) / float(b.loc[seed, col]) - 1.0)})
    return pd.DataFrame(rows, columns=GAP_COLUMNS).sort_values(["params", "seed"], ignore_index=True)


@dataclasses.dataclass(frozen=True)
class Trend:
    slope: float  # percentage points of gap per tenfold parameters
    half: float  # half-width of its 95% t-interval (n − 2 degrees of freedom)
    intercept: float
    points: int  # seed pairs fitted
    sizes: int  # sizes with at least two seed pairs
    span: float  # largest size's parameters over the smallest's

    @property
    def direction(self) -> str:
        """narrows / widens where the whole 95% interval of the slope is below / above zero,
        else no trend shown."""
        if math.isnan(self.slope) or math.isnan(self.half):
            return "no trend shown"
        if self.slope + self.half < 0:
            return "narrows"
        if self.slope - self.half > 0:
            return "widens"
        return "no trend shown"


def fit_trend(gaps: pd.DataFrame, confidence: float = 0.95) -> Trend:
    """Least squares of gap on log10(params) over every seed pair (each seed its own point,
    so seed-to-seed spread enters the interval)."""
    from scipy import stats

    counts = gaps.groupby("params").size() if len(gaps) else pd.Series(dtype=int)
    sizes = int((counts >= 2).sum())
    span = float(counts.index.max() / counts.index.min()) if len(counts) else float("nan")
    if len(gaps) < 3 or len(counts) < 2:
        return Trend(float("nan"), float("nan"), float("nan"), len(gaps), sizes, span)
    fit = stats.linregress(np.log10(gaps.params.to_numpy(float)), gaps.gap.to_numpy(float))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(gaps) - 2) * fit.stderr)
    return Trend(float(fit.slope), half, float(fit.intercept), len(gaps), sizes, span)


def draw_gap_trend(ax, gaps: pd.DataFrame, trend: Trend, claim, colour: str) -> None:
    """The gap against parameters (log axis): every seed pair, each size's mean with its 95%
    interval, the fitted line, the band ``claim.band`` states and ``claim.references``."""
    from seqmix.report.summary import mean_ci

    ax.scatter(gaps.params, gaps.gap, s=14, facecolors="none", edgecolors=colour, linewidths=0.8, label="ours, per seed")
    means = [(p, *mean_ci(g.gap)[:2]) for p, g in gaps.groupby("params")]
    if means:
        p, m, h = (np.array(v, float) for v in zip(*means))
        ax.errorbar(p, m, yerr=np.nan_to_num(h), fmt="D", ms=4, color=colour, capsize=3, label="ours, mean (95% CI)")
    if not math.isnan(trend.slope):
        xs = np.geomspace(gaps.params.min(), gaps.params.max(), 20)
        ax.plot(xs, trend.intercept + trend.slope * np.log10(xs), color=colour, lw=1, ls="--",
                label=f"fit: {trend.slope:+.1f} ± {trend.half:.1f} pp per 10x ({trend.direction})")
    if claim.band is not None:
        (g0, g1), (p0, p1) = claim.band.gap, claim.band.params
        ax.fill_between([p0, p1], g0, g1, color="grey", alpha=0.3, label=f"{claim.band.claim}: {g0:g}-{g1:g} %")
    for ref, marker in zip(claim.references, "s^vP*X"):
        ax.scatter([ref.params], [ref.gap], marker=marker, color="black", s=30, zorder=3,
                   label=f"{ref.label} ({ref.split}): {ref.gap:.1f} %")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("parameters (the baseline's)")
    split = {"eval": "validation", "test": "test"}[claim.split]
    ax.set_ylabel(f"{split} gap, % ({claim.arch} over {claim.baseline})")


def trend_macros(claim, gaps: pd.DataFrame) -> dict[str, str]:
    """The ``cl`` macros of the gap_trend figure: ``gapTrendDrawn`` (1 where the ladder has
    runs to draw, else 0) and ``gapTrendSkipped``, the line that stands where it is not drawn."""
    from seqmix.report.latex import escape

    if len(gaps):
        return {"gapTrendDrawn": "1", "gapTrendSkipped": ""}
    return {"gapTrendDrawn": "0", "gapTrendSkipped": escape(
        f"The gap against size ({claim.id}) is not drawn: the collected runs hold no pair of {claim.arch} and "
        f"{claim.baseline} runs on a task matching {claim.tasks}; the size ladder is drawn once it is recorded "
        "(python -m seqmix record --config config/size-ladder.yaml) and named under recordings in this profile's config.")}
