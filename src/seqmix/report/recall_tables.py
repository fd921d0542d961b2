"""The recall notebook's numbers: which swept tasks have a width axis, each mixer's accuracy at
its best learning rate per width (selected on the validation split, Zoology, Arora et al.
2024, Fig. 2) for every seed, with the value a majority of its seeds reach (what the width
claim reads), accuracy by distance from query to key, the recall table and the ``rc`` macros,
from ``runs.csv`` and ``breakdown.csv``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np
import pandas as pd

from seqmix.catalogue import title as task_title
from seqmix.report.latex import escape, table
from seqmix.report.style import arch_title, metric_title, ordered
from seqmix.report.summary import (
    best_of_sweep,
    best_point,
    majority_value,
    point_seeds,
    reach_split,
    sweep_axes,
)

WIDTH = "model.d_model"  # the sweep axis the recall figures are drawn against
DISTANCE_BINS = 8


def width_groups(runs: pd.DataFrame) -> list[str]:
    """The swept tasks (groups) with a width axis, in config order."""
    axes_of = dict(zip(runs.task, sweep_axes(runs)))
    return [g for g in dict.fromkeys(runs.group) if any(WIDTH in axes_of[t] for t in runs[runs.group == g].task)]


def best_by_width(runs: pd.DataFrame, groups: list[str]) -> dict[str, pd.DataFrame]:
    """Per group: each mixer's row at its best learning rate for every width."""
    return {g: best_of_sweep(runs, g, WIDTH) for g in groups}


def chance_label(level: float) -> str:
    """A chance level as the legend prints it: ``1/8 = 0.125`` where it is one over a count."""
    count = round(1 / level) if level > 0 else 0
    return f"1/{count} = {level:.3g}" if count and math.isclose(1 / level, count) else f"{level:.3g}"


def draw_width(ax, runs: pd.DataFrame, best_rows: pd.DataFrame, colours: dict[str, str], title: str) -> None:
    """One group's panel of recall_width (and of the README's results): each mixer's test
    accuracy against width, every seed a circle, the line joining what a majority of seeds
    reach; dotted, chance."""
    points = seed_points(runs, best_rows)
    archs = ordered(best_rows.arch)
    for i, arch in enumerate(archs):
        a = points[points.arch == arch]
        # Each seed a small point, nudged sideways so that mixers do not hide each other; the
        # line joins the values a majority of seeds reach.
        nudge = 2 ** (0.12 * (i - (len(archs) - 1) / 2) / max(1, len(archs) - 1))
        ax.scatter(a.per_value * nudge, a.test_value, s=16, facecolors="none", edgecolors=colours[arch], linewidths=0.8)
        m = a.drop_duplicates("per_value").sort_values("per_value")
        ax.plot(m.per_value * nudge, m.majority, marker="D", ms=3, lw=1.2, color=colours[arch], label=arch_title(arch))
    chance = runs[runs.group == best_rows.group.iloc[0]].chance.dropna()
    if len(chance):
        level = float(chance.iloc[0])  # the task's, from its runs (MQAR: 1 / key-value pairs)
        ax.axhline(level, color="grey", ls=":", lw=1, label=f"chance ({chance_label(level)})")
    widths = sorted(best_rows.per_value.unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [f"{v:g}" for v in widths])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("model width d")
    ax.set_ylabel(f"test {metric_title(best_rows.metric.iloc[0])}")
    ax.set_title(title, fontsize=9)


def binned(rows: pd.DataFrame, edges: np.ndarray) -> pd.DataFrame:
    """Accuracy per distance bin (right-closed) of breakdown rows."""
    cut = pd.cut(rows.value, edges, right=True)
    agg = rows.groupby(cut, observed=True)[["correct", "scored"]].sum()
    return pd.DataFrame({"distance": [iv.right for iv in agg.index], "accuracy": agg.correct / agg.scored,
                         "scored": agg.scored})


def distance_curves(runs: pd.DataFrame, breakdown: pd.DataFrame, group: str) -> Iterator[tuple[str, pd.DataFrame, float | None]]:
    """(arch, accuracy per distance bin on the test split, its reach or None) of each mixer at
    its best point of ``group``, in catalogue order; mixers without breakdown rows are skipped."""
    sub = runs[runs.group == group]
    seq = breakdown[(breakdown.group == group) & (breakdown.by == "query_distance")]
    edges = np.unique(np.linspace(0, seq.value.max() if len(seq) else 1, DISTANCE_BINS + 1).round())
    for arch in ordered(sub.arch):
        task = best_point(runs, group, arch)
        rows = seq[(seq.task == task) & (seq.arch == arch) & (seq.split == sub.test_split.iloc[0])]
        if rows.empty:
            continue
        reach = sub[(sub.task == task) & (sub.arch == arch)].reach.dropna()
        yield arch, binned(rows, edges), (reach.iloc[0] if len(reach) else None)


ENDED_MARK = {"solved": "s", "plateau": "p", "budget": "b", "diverged": "d"}


# A run stopped on an accuracy plateau whose validation loss still fell by more than this
# fraction over the plateau's window is marked "p*": flat in accuracy, not in loss.
LOSS_STILL_FALLING = 0.05


def ending(runs: pd.DataFrame, task: str, arch: str) -> str:
    """The step each seed of one run ended at and why, e.g. "700s" or "800p/1000p*"."""
    rows = runs[(runs.task == task) & (runs.arch == arch)].sort_values("seed")
    ends = (f"{int(r.steps_completed)}{ENDED_MARK.get(r.ended, '?')}{still_falling(r)}" for r in rows.itertuples())
    return "/".join(dict.fromkeys(ends))


def still_falling(run) -> str:
    """"*" for a run stopped on a plateau while its validation loss was still falling."""
    drop = getattr(run, "late_loss_drop", None)
    return "*" if run.ended == "plateau" and drop is not None and drop > LOSS_STILL_FALLING else ""


def seed_points(runs: pd.DataFrame, best_rows: pd.DataFrame) -> pd.DataFrame:
    """Every finished seed of every selected (mixer, width) point: arch, per_value, seed, task,
    test_value, ending (e.g. "700s"), and ``majority``, the value more than half of that
    point's seeds reach (``summary.majority_value``), on each of its rows."""
    parts = []
    for point in best_rows.itertuples():
        seeds = point_seeds(runs, point.task, point.arch)
        if seeds.empty:
            continue
        parts.append(pd.DataFrame({
            "arch": point.arch, "per_value": point.per_value, "seed": seeds.seed.astype(int).to_numpy(),
            "task": point.task, "test_value": seeds.test_value.to_numpy(),
            "ending": [f"{int(r.steps_completed)}{ENDED_MARK.get(r.ended, '?')}{still_falling(r)}" for r in seeds.itertuples()],
            "majority": majority_value(seeds.test_value)}))
    columns = ["arch", "per_value", "seed", "task", "test_value", "ending", "majority"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def plateau_words(runs: pd.DataFrame) -> str:
    """The plateau rule the runs were trained with, in words for a table note ("" when off)."""
    rules = {r for r in runs.plateau_rule.dropna() if r not in ("", "{}")}
    if len(rules) != 1:
        return "p stopped on a plateau (rules differ between runs), " if rules else ""
    rule = json.loads(rules.pop())
    return (f"p stopped on a plateau (from step {rule['after']:,}, the best validation accuracy of the last "
            f"{rule['window']:,} steps beat the best before them by less than {rule['min_gain']:g}; p* while its "
            f"validation loss still fell by more than {LOSS_STILL_FALLING:.0%} over those steps), ").replace("%", "\\%")


def recall_table(runs: pd.DataFrame, best: dict[str, pd.DataFrame]) -> str:
    """tab:recall: test accuracy per group, mixer, seed and width, each with the step its run
    ended at and why (or a paragraph: no width sweep)."""
    groups = list(best)
    if not groups:
        return ("% Generated by a seqmix notebook: this profile has no width sweep.\n"
                "\\paragraph{Recall.}\\label{tab:recall} This profile has no task swept over model width.\n")
    widths = sorted({w for b in best.values() for w in b.per_value.unique()})
    body = []
    for g, b in best.items():
        points = seed_points(runs, b)
        for k, arch in enumerate(ordered(b.arch)):
            mine = points[points.arch == arch]
            for i, seed in enumerate(sorted(mine.seed.unique())):
                cells = []
                for w in widths:
                    at = mine[(mine.per_value == w) & (mine.seed == seed)]
                    cells.append(f"{at.test_value.iloc[0]:.3f}\\,{{\\scriptsize {at.ending.iloc[0]}}}" if len(at) else "--")
                body.append([escape(task_title(g)) if i == k == 0 else "", escape(arch_title(arch)) if i == 0 else "",
                             str(seed), *cells])
    first = runs[runs.group == groups[0]]
    fewer = seed_counts(runs, best)
    lrs = first.lr.nunique()
    chosen = (f"at the learning rate with the best mean validation accuracy for each width (of {lrs})" if lrs > 1
              else f"at learning rate {first.lr.iloc[0]:g}")
    note = (f"Test accuracy at query positions of each seed, {chosen}; {escape(first.iloc[0].train_data)}; seeds "
            "change the initialisation and the order of the batches, not the data. Beside each: the step its run "
            f"ended at and why: s solved (validation accuracy reached the early stop), {plateau_words(first)}b ran all "
            f"its steps, d diverged.{fewer}")
    return table(["Task", "Architecture", "Seed", *[f"$d={w:g}$" for w in widths]], body,
                 caption="Multi-query associative recall against model width, every seed.", label="tab:recall",
                 align="llr" + "r" * len(widths), note=note, size="\\footnotesize", long=True)


def seed_counts(runs: pd.DataFrame, best: dict[str, pd.DataFrame]) -> str:
    """A sentence naming the mixers trained with fewer seeds than the most any has ("" when
    every mixer has as many): the profile gave its seeds to some points only."""
    counts = {}
    for b in best.values():
        points = seed_points(runs, b)
        for arch, at in points.groupby("arch"):
            counts[arch] = max(counts.get(arch, 0), at.seed.nunique())
    most = max(counts.values(), default=0)
    fewer = {a: n for a, n in counts.items() if n < most}
    if not fewer:
        return ""
    names = ", ".join(f"{escape(arch_title(a))} ({fewer[a]})" for a in ordered(fewer))
    return f" Trained with fewer seeds than the others' {most} (this profile's seeds per architecture): {names}."


def selection_text(runs: pd.DataFrame, groups: list[str]) -> str:
    """How each width's run was chosen, as the recall captions say it: the one learning rate
    of a sweep with no other axis, or the best of the points that share a width, selected on
    validation (Zoology's best learning rate per width)."""
    rows = runs[runs.group.isin(groups)]
    others = sorted({a for axes in sweep_axes(rows) for a in axes} - {WIDTH})
    if not others:
        return f"one learning rate, {', '.join(f'{lr:g}' for lr in sorted(rows.lr.unique()))}"
    widths = [axes.get(WIDTH) for axes in sweep_axes(rows)]
    n = rows.assign(width=widths).groupby(["group", "arch", "width"]).task.nunique().max()
    points = "learning rates" if others == ["train.lr"] else f"points of {', '.join(others)}"
    return f"the best of {n} {points} per width, by validation {rows.metric.iloc[0]}"


def recall_macros(best: dict[str, pd.DataFrame], runs: pd.DataFrame) -> dict[str, str]:
    """The ``rc`` macros: the test accuracy a majority of each group, mixer and width's seeds
    reach, the number of groups, and how each width's run was chosen (the captions')."""
    macros = {"selection": escape(selection_text(runs, list(best)))} if best else {}
    for g, b in best.items():
        points = seed_points(runs, b)
        for arch in ordered(b.arch):
            for w in sorted(b.per_value.unique()):
                at = points[(points.arch == arch) & (points.per_value == w)]
                macros[f"{g}-{arch}-d{w:g}"] = f"{at.majority.iloc[0] if len(at) else float('nan'):.3f}"
    macros["numGroups"] = str(len(best))
    return macros


# A run whose final validation loss is within this fraction of the blind loss (ln of the number
# of value tokens) never learned even which values the context holds: its loss is flat.
FLAT_LOSS = 0.02
# A mixer that copies the previous token less often than this cannot move one token's
# identity to another position (the copy probe, seqmix.analysis.copy_probe).
MIN_COPY = 0.5


def previous_token(probe: pd.DataFrame | None) -> pd.DataFrame | None:
    """The copy probe's rows at lag 1 (copying the previous token; a probe without a ``lag``
    column has only those), or None without any."""
    if probe is None or probe.empty:
        return None
    rows = probe[probe.lag == 1] if "lag" in probe else probe
    return rows if len(rows) else None


def run_reach_split(breakdown: pd.DataFrame, run: pd.Series) -> tuple[float, float, int] | None:
    """(accuracy on test queries whose key is within the run's reach, accuracy beyond it,
    queries beyond) of a run with a finite reach and a distance breakdown; None otherwise."""
    if pd.isna(run.reach):
        return None
    acc_in, n_in, acc_out, n_out = reach_split(breakdown, run.task, run.arch, run.test_split, run.reach)
    return (acc_in, acc_out, n_out) if n_in + n_out else None


def floor_reason(run: pd.Series, split: tuple[float, float, int] | None, copy_accuracy: float | None) -> str:
    """Why a run ended below chance, from what was measured, in the first of these that holds:
    its keys lay beyond its reach (it recalls within it, not beyond); it cannot copy the
    previous token (the copy probe: no token-pair interaction carries a token's identity); its validation loss stayed at
    the blind level (it never learned which values the context holds: an optimisation failure,
    with its gradient norms); else its loss was still above the informed-chance level when it
    ended (the plateau rule or the step cap stopped it first)."""
    within = (f"; accuracy {split[0]:.3f} on keys within its reach of {int(run.reach)} tokens, "
              f"{split[1]:.3f} on the {split[2]:,} beyond") if split else ""
    if split and split[2] and split[0] > run.chance >= split[1]:
        return f"receptive field: recalls keys within its reach of {int(run.reach)} tokens ({split[0]:.3f}), not beyond ({split[1]:.3f})"
    if copy_accuracy is not None and copy_accuracy < MIN_COPY:
        return (f"cannot carry one token's identity to another position: it copies the previous token at "
                f"{copy_accuracy:.3f} in the copy probe{within}")
    if run.blind_loss and run.last_eval_loss >= run.blind_loss * (1 - FLAT_LOSS):
        return (f"optimisation: validation loss at the blind level ln {round(math.exp(run.blind_loss))} = "
                f"{run.blind_loss:.2f} from its first evaluation ({run.first_eval_loss:.2f}) to its last "
                f"({run.last_eval_loss:.2f}), gradient norm {run.grad_norm_first:.2f} $\\to$ {run.grad_norm_last:.2f}{within}")
    return (f"had not learned which value a key holds when it ended: validation loss {run.first_eval_loss:.2f} "
            f"$\\to$ {run.last_eval_loss:.2f}, above the informed-chance level ln {round(1 / run.chance)} = "
            f"{math.log(1 / run.chance):.2f}{within}")


def floor_rows(runs: pd.DataFrame, breakdown: pd.DataFrame, best: dict[str, pd.DataFrame],
               probe: pd.DataFrame | None) -> list[dict]:
    """Every selected (group, mixer, width) at which a majority of seeds ended below chance,
    with each seed's accuracy and ending, and the reason the measurements of its median seed
    (the one at the majority value) show."""
    copy = dict(zip(previous.arch, previous.accuracy)) if (previous := previous_token(probe)) is not None else {}
    out = []
    for g, b in best.items():
        points = seed_points(runs, b)
        for (arch, width), at in points.groupby(["arch", "per_value"], sort=False):
            median = at[at.test_value == at.majority.iloc[0]].iloc[0]
            run = runs[(runs.task == median.task) & (runs.arch == arch) & (runs.seed == median.seed)].iloc[0]
            if pd.isna(run.chance) or median.majority >= run.chance:
                continue
            out.append({"group": g, "arch": arch, "width": width, "seed": int(median.seed),
                        "test": "/".join(f"{v:.3f}" for v in at.test_value), "ending": "/".join(at.ending),
                        "reason": floor_reason(run, run_reach_split(breakdown, run), copy.get(arch))})
    return out


def floor_table(rows: list[dict], has_probe: bool) -> str:
    """tab:recall-floor: the runs below chance and the measured reason for each."""
    if not rows:
        return ("% Generated by a seqmix notebook.\n\\paragraph{Below chance.}\\label{tab:recall-floor} "
                "No selected recall run ended below chance.\n")
    rank = {a: i for i, a in enumerate(ordered({r["arch"] for r in rows}))}
    body = [[escape(arch_title(r["arch"])), f"{r['width']:g}", r["test"], r["ending"], f"seed {r['seed']}: {r['reason']}"]
            for r in sorted(rows, key=lambda r: (r["group"], rank[r["arch"]], r["width"]))]
    note = ("Each seed's test accuracy and ending, in seed order; listed where a majority of seeds ended below chance, "
            "a model that outputs a value of its context without knowing which (1 / pairs). The reason is "
            "the first of these that the measurements of the median seed show: a receptive field that ends before the key; no "
            "token-pair interaction that carries a token's identity (the copy probe: the mixer trained to copy the previous token on random tokens"
            + ("" if has_probe else ", not measured in this profile") +
            f", fails: accuracy below {MIN_COPY:g}); an optimisation failure (validation loss within "
            f"{FLAT_LOSS:.0%} of the blind level, ln of the number of value tokens, from start to end); else a loss "
            "still falling above the informed-chance level ln(pairs) when the run ended.").replace("%", "\\%")
    return table(["Architecture", "$d$", "test acc.", "ended", "why below chance (measured)"], body,
                 caption="Recall runs that ended below chance, and why.", label="tab:recall-floor",
                 align="lrp{0.12\\linewidth}p{0.12\\linewidth}p{0.44\\linewidth}", note=note, size="\\footnotesize")
