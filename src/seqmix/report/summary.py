"""Summary statistics of the runs, for the notebooks: per (task, architecture), the mean
and 95% t-interval across seeds of the final metric. One implementation, tested, that
every table and figure uses."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, int]:
    """Mean and half-width of the t confidence interval across seeds (NaN half-width for n<2)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(v[0]), float("nan"), 1
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * v.std(ddof=1) / math.sqrt(n)
    return float(v.mean()), float(half), n


SUMMARY_COLUMNS = ["task", "kind", "group", "arch", "seeds", "ok", "diverged", "params", "d_model", "n_layers",
                   "metric", "higher_is_better", "eval_mean", "eval_ci", "test_mean", "test_ci",
                   "eval_split", "test_split"]


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, arch): seeds run and finished, size, and mean ± 95% CI of the
    eval and test metric over the finished seeds (NaN when none finished)."""
    rows = []
    for (task, arch), g in runs.groupby(["task", "arch"], sort=False):
        ok = g[g.status == "ok"]
        ev, ev_half, n = mean_ci(ok.eval_value)
        te, te_half, _ = mean_ci(ok.test_value)
        first = g.iloc[0]
        rows.append(dict(task=task, kind=first.kind, group=first.group, arch=arch, seeds=len(g), ok=n,
                         diverged=int((g.status == "diverged").sum()), params=int(first.params),
                         d_model=int(first.d_model), n_layers=int(first.n_layers), metric=first.metric,
                         higher_is_better=bool(first.higher_is_better), eval_mean=ev, eval_ci=ev_half,
                         test_mean=te, test_ci=te_half, eval_split=first.eval_split, test_split=first.test_split))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def unfinished_tasks(runs: pd.DataFrame) -> list[str]:
    """Tasks (in runs.csv order) none of whose runs finished: every one diverged, so the
    task has no quality result; the report says so instead of drawing nothing."""
    done = runs.groupby("task", sort=False).status.agg(lambda s: bool((s == "ok").any()))
    return [t for t, any_ok in done.items() if not any_ok]


def sweep_axes(runs: pd.DataFrame) -> pd.Series:
    """The sweep settings of every row (runs.csv's ``sweep`` JSON) as dicts."""
    import json

    return runs["sweep"].fillna("{}").map(json.loads)


def best_of_sweep(runs: pd.DataFrame, group: str, per: str) -> pd.DataFrame:
    """The summary rows of the best point of a swept task, for every (architecture, value
    of the ``per`` axis): the point whose mean *eval* metric is best among those that share
    that value (Zoology reports the best learning rate per width, Arora et al. 2024,
    arXiv:2312.04927, Fig. 2). Adds a column ``per_value``; test values are the selected
    point's, never the maximum over test scores."""
    mine = runs[runs.group == group]
    if mine.empty:
        return pd.DataFrame(columns=[*SUMMARY_COLUMNS, "per_value"])
    summ = summarise(mine)
    axes = dict(zip(mine.task, sweep_axes(mine)))
    summ["per_value"] = [axes[t].get(per) for t in summ.task]
    higher = bool(summ.higher_is_better.iloc[0])
    order = summ.sort_values("eval_mean", ascending=not higher, na_position="last")
    best = order.groupby(["arch", "per_value"], sort=False).head(1)
    return best.sort_values(["arch", "per_value"]).reset_index(drop=True)


def majority_value(values) -> float:
    """The value more than half of ``values`` reach (e.g. the seeds' accuracies at one sweep
    point): the (⌊n/2⌋+1)-th largest, the median of three. "A majority of seeds reach x"
    holds exactly where this value is at least x. NaN without values."""
    v = sorted((float(x) for x in values if x is not None and not math.isnan(float(x))), reverse=True)
    return v[len(v) // 2] if v else float("nan")


def point_seeds(runs: pd.DataFrame, task: str, arch: str) -> pd.DataFrame:
    """The finished runs (one per seed, in seed order) of ``arch`` at the sweep point ``task``."""
    rows = runs[(runs.task == task) & (runs.arch == arch)]
    return rows[rows.status == "ok"].sort_values("seed") if "status" in rows else rows.sort_values("seed")


def best_point(runs: pd.DataFrame, group: str, arch: str) -> str | None:
    """The task name (sweep point) of ``arch``'s best mean eval metric within ``group``."""
    mine = runs[(runs.group == group) & (runs.arch == arch)]
    if mine.empty:
        return None
    summ = summarise(mine).dropna(subset=["eval_mean"])
    if summ.empty:
        return None
    higher = bool(summ.higher_is_better.iloc[0])
    return summ.sort_values("eval_mean", ascending=not higher).task.iloc[0]


def reach_split(breakdown: pd.DataFrame, task: str, arch: str, split: str, reach: float,
                seed: int | None = None) -> tuple[float, int, float, int]:
    """(accuracy, queries) on the ``split`` queries of one run (``seed``; None: its seeds
    pooled) whose key lies within ``reach`` tokens, then the same beyond it, from
    breakdown.csv's query distances (nan: no query)."""
    rows = breakdown[(breakdown.task == task) & (breakdown.arch == arch) & (breakdown.by == "query_distance")
                     & (breakdown.split == split)]
    if seed is not None:
        rows = rows[rows.seed == seed]
    near = rows.value.astype(float) <= reach
    inside, beyond = rows[near], rows[~near]
    n_in, n_out = int(inside.scored.sum()), int(beyond.scored.sum())
    return (inside.correct.sum() / n_in if n_in else float("nan"), n_in,
            beyond.correct.sum() / n_out if n_out else float("nan"), n_out)
