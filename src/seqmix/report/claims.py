"""The claims table: each claim of paper/claims.yaml evaluated against this pipeline's
results files, with our value ± 95% CI, what it was measured on, and a verdict:

- ``agrees`` / ``disagrees``: the measurement's 95% interval lies inside / outside the
  claim's ``agree_if`` (a value with no interval, e.g. a closed form, by itself);
- ``inconclusive``: the interval straddles a bound of ``agree_if``: the runs cannot tell;
- ``not testable``: the runs do not reach the scale the claim is about (``requires``), or
  the architecture was not run; the reason is given. Our value is still shown.

Each evaluator takes one kind's typed claim (seqmix.report.claims_file, where the file is
read and validated). Everything here reads results files (runs.csv, complexity_fit.csv,
sparsity.csv, sparsity_analytic.csv) and, for a claim marked ``runs: recorded``, the runs
recorded in the repository (seqmix.report.recorded); nothing is trained or timed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from seqmix.report.claims_file import (
    AgreeIf,
    AnyClaim,
    ClaimsError,
    ComplexityExponent,
    CopyBeyondReach,
    GapTrend,
    MeasuredSparsity,
    MetricThreshold,
    OnTask,
    Paired,
    RecallBeyondReach,
    SuClosedForm,
    WidthToReach,
    load_claims,
)
from seqmix.report.recorded import Recording, chosen, refusal_lines
from seqmix.report.summary import (
    best_of_sweep,
    best_point,
    majority_value,
    mean_ci,
    point_seeds,
    reach_split,
)
from seqmix.report.trend import fit_trend, ladder_gaps

VERDICTS = ("agrees", "disagrees", "inconclusive", "not testable")


@dataclasses.dataclass
class ClaimResult:
    id: str
    claim: str
    source: str
    reported: str
    ours: str  # our value ± CI, formatted
    value: float  # the number agree_if is applied to (NaN when there is none)
    measured_on: str
    verdict: str
    why: str
    # The per-seed (or per-point) values the verdict was computed from, for figures: the
    # notebooks plot these rather than recomputing a claim's number.
    values: list[float] = dataclasses.field(default_factory=list)


class Results:
    """The results files of one profile, read once."""

    def __init__(self, results_dir: str | Path):
        self.dir = Path(results_dir)
        self._cache: dict[str, pd.DataFrame | None] = {}

    def table(self, rel: str) -> pd.DataFrame | None:
        if rel not in self._cache:
            p = self.dir / rel
            self._cache[rel] = pd.read_csv(p) if p.exists() else None
        return self._cache[rel]

    @property
    def runs(self) -> pd.DataFrame:
        return self.table("summary/runs.csv")


def judge(mean: float, half: float, agree_if: AgreeIf) -> str:
    """agrees when all of [mean - half, mean + half] meets agree_if, disagrees when none of
    it does, inconclusive when it straddles a bound. No interval (NaN: one seed) judges
    the mean alone; no mean (NaN) is not testable. Bounds are inclusive."""
    if math.isnan(mean):
        return "not testable"
    half = 0.0 if math.isnan(half) else abs(half)
    low, high = mean - half, mean + half
    if agree_if.holds(low) and agree_if.holds(high):
        return "agrees"
    if high < agree_if.floor or low > agree_if.ceiling:
        return "disagrees"
    return "inconclusive"


def criterion(agree_if: AgreeIf) -> str:
    parts = []
    if agree_if.min is not None:
        parts.append(f"≥ {agree_if.min:g}")
    if agree_if.max is not None:
        parts.append(f"≤ {agree_if.max:g}")
    return " and ".join(parts)


def _fmt(mean: float, half: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "--"
    return f"{mean:.{digits}g}" if math.isnan(half) else f"{mean:.{digits}g} ± {half:.2g}"


def _run_requirements(claim: Paired | MetricThreshold, rows: pd.DataFrame) -> list[str]:
    req, why = claim.requires, []
    if req.backbone is not None:
        why.append(f"needs {req.backbone}")
    if req.min_params is not None and rows.params.min() < req.min_params:
        why.append(f"measured at {rows.params.min() / 1e6:.2f}M parameters, the claim is about "
                   f"≥ {req.min_params / 1e6:.0f}M")
    if req.min_steps is not None and rows.steps_completed.min() < req.min_steps:
        why.append(f"trained {int(rows.steps_completed.min()):,} steps, the claim needs ≥ {req.min_steps:,}")
    if req.complete_train_data and not rows.train_complete.astype(bool).all():
        why.append(f"trained on {rows.train_data.iloc[0]}, not the full training split")
    return why


def _run_scale(rows: pd.DataFrame) -> str:
    r = rows.iloc[0]
    seeds = rows.seed.nunique()
    return (f"{r.task}: {rows.params.min() / 1e6:.2f}--{rows.params.max() / 1e6:.2f}M params, "
            f"{int(r.steps_planned):,} steps, {seeds} seed{'s' if seeds != 1 else ''}; train: {r.train_data}")


def _metric_rows(res: Results, claim: OnTask, arch: str) -> pd.DataFrame:
    runs = res.runs
    return runs[(runs.task == claim.task) & (runs.arch == arch) & (runs.status == "ok")]


def _paired(res: Results, claim: Paired, op) -> tuple[list[float], pd.DataFrame]:
    col = f"{claim.split}_value"
    a = _metric_rows(res, claim, claim.arch).set_index("seed")
    b = _metric_rows(res, claim, claim.baseline).set_index("seed")
    seeds = sorted(set(a.index) & set(b.index))
    values = [op(a.loc[s, col], b.loc[s, col]) for s in seeds]
    return values, pd.concat([a.loc[seeds], b.loc[seeds]]).reset_index()


def _not_run(res: Results, claim: OnTask, archs: list[str]) -> str | None:
    if res.runs is None:
        return "no training results in this profile"
    ran = set(res.runs[res.runs.task == claim.task].arch)
    missing = [a for a in archs if a not in ran]
    return f"{', '.join(missing)} not trained on {claim.task} in this profile" if missing else None


def eval_paired(res: Results, claim: Paired) -> ClaimResult:
    archs = [claim.arch, claim.baseline]
    if (missing := _not_run(res, claim, archs)):
        return _result(claim, float("nan"), float("nan"), "--", "not testable", missing)
    if claim.kind == "relative_gap":
        values, rows = _paired(res, claim, lambda x, y: 100.0 * (x / y - 1.0))
    else:
        values, rows = _paired(res, claim, lambda x, y: x - y)
    mean, half, n = mean_ci(values)
    if n == 0:
        return _result(claim, mean, half, _run_scale(rows) if len(rows) else "--", "not testable",
                       "no seed finished for both architectures")
    return dataclasses.replace(_decide(claim, mean, half, _run_scale(rows), _run_requirements(claim, rows)),
                               values=[float(v) for v in values])


def eval_threshold(res: Results, claim: MetricThreshold) -> ClaimResult:
    if claim.per is not None:
        return eval_threshold_per(res, claim)
    if (missing := _not_run(res, claim, [claim.arch])):
        return _result(claim, float("nan"), float("nan"), "--", "not testable", missing)
    rows = _metric_rows(res, claim, claim.arch)
    if rows.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"no run of {claim.arch} finished")
    col = f"{claim.split}_value"
    mean, half, _ = mean_ci(rows[col])
    return dataclasses.replace(_decide(claim, mean, half, _run_scale(rows), _run_requirements(claim, rows)),
                               values=[float(v) for v in rows[col]])


def _group_rows(res: Results, claim: OnTask) -> pd.DataFrame:
    runs = res.runs
    if runs is None or "group" not in runs:
        return pd.DataFrame()
    return runs[runs.group == claim.task]


def _sweep_scale(rows: pd.DataFrame, per: str, values) -> str:
    r = rows.iloc[0]
    return (f"{r.group}: {per.split('.')[-1]} {', '.join(f'{v:g}' for v in values)}, best of "
            f"{rows.lr.nunique()} learning rate(s) by {r.eval_split} {r.metric}, {int(r.steps_planned):,} steps max, "
            f"{rows.seed.nunique()} seed(s); train: {r.train_data}")


def eval_threshold_per(res: Results, claim: MetricThreshold) -> ClaimResult:
    """A threshold that must hold at every value of a swept axis (``per``, e.g. every
    width), each at its best point over the other axes (selected on the eval split): on the
    mean over seeds, or with ``each_seed: true`` on every seed (the worst seed decides)."""
    rows = _group_rows(res, claim)
    best = best_of_sweep(rows, claim.task, claim.per) if len(rows) else pd.DataFrame()
    mine = best[best.arch == claim.arch] if len(best) else best
    if mine.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       f"{claim.arch} not trained on {claim.task} in this profile")
    split = claim.split
    axis = claim.per.split(".")[-1]
    lower = claim.agree_if.min is not None
    if claim.each_seed:
        seeds = {p.per_value: point_seeds(rows, p.task, claim.arch) for p in mine.itertuples()}
        per_width = {w: (min if lower else max)(r[f"{split}_value"]) for w, r in seeds.items()}
        at = "; ".join(f"{axis} {w:g}: " + "/".join(f"{v:.3f}" for v in r[f"{split}_value"]) for w, r in seeds.items())
        values = [float(v) for r in seeds.values() for v in r[f"{split}_value"]]
        at += " (each seed, in seed order)"
    else:
        per_width = dict(zip(mine.per_value, mine[f"{split}_mean"]))
        at = ", ".join(f"{axis} {w:g}: {v:.3f}" for w, v in per_width.items())
        values = [float(v) for v in per_width.values()]
    # "at every width": the width (and seed) closest to failing the criterion decides.
    worst = (min if lower else max)(per_width.values())
    measured = _sweep_scale(rows, claim.per, mine.per_value) + f"; {at}"
    unmet = _run_requirements(claim, rows[rows.arch == claim.arch]) + _still_learning(claim, rows, mine)
    return dataclasses.replace(_decide(claim, float(worst), float("nan"), measured, unmet), values=values)


def _still_learning(claim: MetricThreshold, rows: pd.DataFrame, best: pd.DataFrame) -> list[str]:
    """The swept values at which a seed of the selected run of ``arch`` had not reached the
    regime the claim is about when its budget ran out:
    ``requires.max_final_gain``: its periodic evaluation metric was still rising by more than
    this over the last quarter of its steps (runs.csv's ``final_gain``);
    ``requires.min_over_chance``: its test metric was below this multiple of the task's
    chance level, i.e. it had not left the initial plateau (MQAR: a model that outputs some
    value of the context, not the queried one), where a flat curve says nothing."""
    gain_limit, plateau = claim.requires.max_final_gain, claim.requires.min_over_chance
    axis, out = claim.per.split(".")[-1], []
    for point in best.itertuples():
        seeds = point_seeds(rows, point.task, claim.arch)
        several = len(seeds) > 1
        for run in seeds.itertuples():
            who = f"{claim.arch} (seed {run.seed})" if several else claim.arch
            gain = getattr(run, "final_gain", float("nan"))
            chance = getattr(run, "chance", float("nan"))
            if gain_limit is not None and gain > gain_limit:
                out.append(f"at {axis} {point.per_value:g} {who} was still learning when its budget ran out "
                           f"({point.metric} +{gain:.3f} over the last quarter of its steps, more than {gain_limit:g})")
            elif plateau is not None and run.test_value < plateau * chance:
                out.append(f"at {axis} {point.per_value:g} {who} had not left the initial plateau when its budget "
                           f"ran out ({point.metric} {run.test_value:.3f}, below {plateau:g} x chance {chance:.3f})")
    return out


REACH_RULES = {"majority": "more than half of its seeds reach", "every": "every seed reaches"}


def _reached(values, rule: str) -> float:
    """The value that ``rule``'s share of seeds reach: a majority (``summary.majority_value``)
    or every seed (the lowest)."""
    return majority_value(values) if rule == "majority" else min(values, default=float("nan"))


def _did_not_learn(rows: pd.DataFrame, arch: str, fraction: float) -> str | None:
    """Why ``arch`` did not learn the task in its budget, or None: the final validation loss
    of every seed at every width stayed above ``fraction`` x the informed-chance level
    ln(1 / chance) (MQAR: ln(pairs), a model that outputs a value of its context without
    knowing which). Such a mixer's width says nothing about what it needs."""
    mine = rows[(rows.arch == arch) & (rows.status == "ok")]
    if mine.empty or mine.chance.isna().any() or mine.eval_loss.isna().any():
        return None
    level = -math.log(float(mine.chance.iloc[0]))
    if (mine.eval_loss < fraction * level).any():
        return None
    return (f"{arch} did not learn the task in this budget: final validation loss {mine.eval_loss.min():.2f}--"
            f"{mine.eval_loss.max():.2f} at every width and seed ({len(mine)} runs), above {fraction:g} x the "
            f"informed-chance level ln {round(1 / float(mine.chance.iloc[0]))} = {level:.2f}")


def _width_verdict(rows: pd.DataFrame, claim: WidthToReach) -> ClaimResult:
    """eval_width_to_reach on ``rows`` (all seeds, or all but one)."""
    archs = [claim.arch, *claim.baselines]
    best = best_of_sweep(rows, claim.task, claim.per) if len(rows) else pd.DataFrame()
    if best.empty or set(archs) - set(best.arch):
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       f"{', '.join(sorted(set(archs) - set(best.arch) if len(best) else archs))} not swept on {claim.task}")
    rule, threshold, axis = claim.reached_by, claim.threshold, claim.per.split(".")[-1]
    needed, counts = {}, {}
    for a in archs:
        points = [(p.per_value, point_seeds(rows, p.task, a).test_value) for p in best[best.arch == a].itertuples()]
        counts[a] = ", ".join(f"{axis} {w:g}: {int((v >= threshold).sum())} of {len(v)}" for w, v in points)
        needed[a] = min((w for w, v in points if _reached(v, rule) >= threshold), default=math.inf)
    told = "; ".join(f"{a} {'never' if math.isinf(w) else f'at {axis} {w:g}'} ({counts[a]})" for a, w in needed.items())
    measured = (_sweep_scale(rows, claim.per, sorted(best.per_value.unique()))
                + f"; a width counts where {REACH_RULES[rule]} test {best.metric.iloc[0]} ≥ {threshold:g}: {told}")
    learned_below = claim.learned_below
    idle = {a: why for a in archs if learned_below is not None and (why := _did_not_learn(rows, a, learned_below))}
    if idle:
        measured += "; " + "; ".join(idle.values())
    if claim.arch in idle:
        return _result(claim, float("nan"), float("nan"), measured, "not testable",
                       f"{claim.arch} did not learn the task in this budget: its width says nothing")
    baselines = [b for b in claim.baselines if b not in idle]
    if not baselines:
        return _result(claim, float("nan"), float("nan"), measured, "not testable",
                       f"no baseline learned the task in this budget ({', '.join(idle)} did not)")
    aside = f"; {', '.join(idle)} did not learn the task (not counted)" if idle else ""
    # A mixer that never reaches the threshold needs at least twice the largest width swept:
    # its need is a lower bound, so the ratio is a lower bound (arch) or an upper bound (a
    # baseline), and decides the claim only where every value beyond that bound would.
    beyond = 2 * float(best.per_value.max())
    never = [a for a in [claim.arch, *baselines] if math.isinf(needed[a])]
    base = max(needed[b] for b in baselines)
    if math.isinf(base) and claim.arch in never:
        return _result(claim, float("nan"), float("nan"), measured, "not testable",
                       f"neither {claim.arch} nor {', '.join(b for b in never if b != claim.arch)} reaches "
                       f"{threshold:g} at the widths swept: each need is only a lower bound{aside}")
    if math.isinf(base):
        value = math.log2(needed[claim.arch] / beyond)
        if value >= claim.agree_if.floor:
            return _result(claim, float("nan"), float("nan"), measured, "not testable",
                           f"{', '.join(never)} never reaches {threshold:g} at the widths swept: the ratio is "
                           f"at most {value:.3g}, a bound that does not decide {criterion(claim.agree_if)}{aside}")
        result = _decide(claim, value, float("nan"), measured, [])
        return dataclasses.replace(result, ours=f"≤ {value:.3g}",
                                   why=result.why + f" ({', '.join(never)} never reached it: an upper bound){aside}")
    mine = needed[claim.arch] if claim.arch not in never else beyond
    value = math.log2(mine / base)
    result = _decide(claim, value, float("nan"), measured, [])
    if claim.arch in never:
        result = dataclasses.replace(result, ours=f"≥ {value:.3g}", why=result.why + f" ({claim.arch} never reached it: a lower bound)")
    return dataclasses.replace(result, why=result.why + aside)


def _without_seed(rows: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``rows`` without ``seed``'s runs, but for the mixers that have no other seed (a profile
    may give some mixers one seed only: leaving it out would leave them unmeasured)."""
    others = rows[rows.seed != seed].groupby("arch").size()
    alone = [a for a in rows.arch.unique() if a not in others.index]
    return rows[(rows.seed != seed) | rows.arch.isin(alone)]


def eval_width_to_reach(res: Results, claim: WidthToReach) -> ClaimResult:
    """How much more of a swept axis (width) ``arch`` needs than the ``baselines`` to reach
    ``threshold``: log2(needed[arch] / max(needed[baseline])), where a mixer needs the
    smallest width at which ``reached_by`` of its seeds reach it (``majority``: more than
    half; ``every``). A mixer never reaching it within the sweep counts as needing at least
    twice the largest value swept: ``arch`` so, the ratio is a lower bound; a baseline so, an
    upper bound, which decides only a claim it fails; both so, nothing is decided. With
    ``learned_below``, a mixer whose final validation loss stayed above that fraction of the
    informed-chance level at every width and seed did not learn the task in this budget: it
    is listed as such, not counted as a bound. A verdict that changes when any one seed is
    left out is inconclusive, naming the seeds that change it."""
    rows = _group_rows(res, claim)
    result = _width_verdict(rows, claim)
    seeds = sorted(rows.seed.unique()) if len(rows) else []
    if result.verdict not in ("agrees", "disagrees") or len(seeds) < 2:
        return result
    would = {"agrees": "would agree", "disagrees": "would disagree", "not testable": "would not be testable"}
    flips = [f"without seed {s} it {would[alt.verdict]} ({alt.ours})"
             for s in seeds if (alt := _width_verdict(_without_seed(rows, s), claim)).verdict != result.verdict]
    if not flips:
        return result
    return dataclasses.replace(result, verdict="inconclusive",
                               why=f"{result.why}; one seed decides it: " + "; ".join(flips))


def eval_recall_beyond_reach(res: Results, claim: RecallBeyondReach) -> ClaimResult:
    """Accuracy minus chance on the queries whose key lies beyond the model's reach (the
    positions its output can read), of ``arch``'s best point: mean and 95% t-interval over
    its seeds (one seed: the binomial interval over its queries). Requires recall within
    reach, on all its seeds' queries together (else the test says nothing)."""
    rows = _group_rows(res, claim)
    task = best_point(rows, claim.task, claim.arch) if len(rows) else None
    table = res.table("summary/breakdown.csv")
    if task is None or table is None:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"{claim.arch} not trained on {claim.task}")
    runs = point_seeds(rows, task, claim.arch)
    if runs.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"no run of {claim.arch} on {task} finished")
    reach, chance = runs.reach.iloc[0], float(runs.chance.iloc[0])
    if pd.isna(reach):
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"{claim.arch} has no finite reach")
    split = runs.test_split.iloc[0]
    acc_in, n_in, acc_out, n_out = reach_split(table, task, claim.arch, split, reach)  # every seed's queries
    splits = [reach_split(table, task, claim.arch, split, reach, seed=s) for s in runs.seed]
    if len(splits) > 1:
        mean, half, _ = mean_ci([p[2] - chance for p in splits])
        spread = f"seeds {', '.join(f'{p[2]:.3f}' for p in splits)} beyond reach; 95% interval over {len(splits)} seeds"
    else:
        mean, half = acc_out - chance, (1.96 * math.sqrt(acc_out * (1 - acc_out) / n_out) if n_out else float("nan"))
        spread = "binomial 95% interval over its queries (one seed)"
    measured = (f"{task} (best point), reach {int(reach)} tokens, chance {chance:.3f}: "
                f"accuracy {acc_in:.3f} on {n_in:,} queries within reach, {acc_out:.3f} on {n_out:,} beyond; {spread}")
    unmet = []
    floor = claim.requires.min_accuracy_within_reach
    if not n_out:
        unmet.append(f"no test query lies beyond the reach of {int(reach)} tokens")
    if floor is not None and not acc_in >= floor:
        unmet.append(f"{claim.arch} does not recall within its reach (accuracy {acc_in:.3f} < {floor}), "
                     "so its accuracy beyond it says nothing about the reach")
    return dataclasses.replace(_decide(claim, mean, half, measured, unmet), values=[p[2] - chance for p in splits])


def eval_copy_beyond_reach(res: Results, claim: CopyBeyondReach) -> ClaimResult:
    """Accuracy minus chance of ``arch``'s copy probe at the lags beyond its reach (the token
    to copy lies further back than its output can read), its accuracy at the lags within
    reach required to be clearly above chance (else the probe says nothing about the reach).
    The probe trains one seed: the interval is the binomial one over its scored positions,
    the lags beyond reach pooled."""
    probe = res.table("analysis/copy_probe.csv")
    if probe is None:
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       "no copy probe in this profile (analysis.copy_probe)")
    if not {"lag", "reach", "scored"} <= set(probe.columns):
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       "analysis/copy_probe.csv has no lag, reach or scored column: it predates the probe's lags "
                       "(rerun python -m seqmix copy-probe)")
    rows = probe[probe.arch == claim.arch]
    if rows.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"{claim.arch} not in the copy probe")
    reach, chance = rows.reach.iloc[0], float(rows.chance.iloc[0])
    if pd.isna(reach):
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"{claim.arch} has no finite reach")
    within, beyond = rows[rows.lag <= reach], rows[rows.lag > reach]
    r = rows.iloc[0]
    at = "; ".join(f"lag {int(x.lag)} ({'within' if x.lag <= reach else 'beyond'}): {x.accuracy:.3f}" for x in rows.itertuples())
    measured = (f"copy probe: d {int(r.d_model)}, {int(r.n_layers)} layers, L {int(r.seq_len)}, vocabulary "
                f"{int(r.vocab_size)}, {int(r.steps):,} steps, seed {int(r.seed)}; reach {int(reach)} tokens, "
                f"chance {chance:.4f}; accuracy {at}")
    if beyond.empty:
        return _result(claim, float("nan"), float("nan"), measured, "not testable",
                       f"no lag of the copy probe lies beyond {claim.arch}'s reach of {int(reach)} tokens "
                       f"(add one to analysis.copy_probe.lags, below its seq_len {int(r.seq_len)})")
    n_out = beyond.scored.astype(float)
    acc_out = float((beyond.accuracy * n_out).sum() / n_out.sum())
    half = 1.96 * math.sqrt(acc_out * (1 - acc_out) / n_out.sum())
    measured += f"; binomial 95% interval over the {int(n_out.sum()):,} positions beyond reach (one seed)"
    unmet, floor = [], claim.requires.min_accuracy_within_reach
    acc_in = float(within.accuracy.min()) if len(within) else float("nan")
    if floor is not None and not acc_in >= floor:
        unmet.append(f"{claim.arch} does not copy within its reach (accuracy "
                     f"{'not measured' if math.isnan(acc_in) else f'{acc_in:.3f}'}, needs ≥ {floor}), "
                     "so its accuracy beyond it says nothing about the reach")
    return dataclasses.replace(_decide(claim, acc_out - chance, half, measured, unmet), values=[acc_out - chance])


def eval_gap_trend(res: Results, claim: GapTrend) -> ClaimResult:
    """The slope of the per-seed gap against log10(parameters) over a size ladder
    (seqmix.report.trend), judged as any value with its 95% interval: agrees with a claim
    that the gap narrows (``agree_if: {max: 0}``) where the whole interval is below zero."""
    gaps = ladder_gaps(res.runs, claim.tasks, claim.arch, claim.baseline, claim.split)
    if gaps.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       f"no finished pair of {claim.arch} and {claim.baseline} runs on a task matching {claim.tasks} "
                       "(the size-ladder study is not recorded yet: python -m seqmix record --config config/size-ladder.yaml)")
    trend = fit_trend(gaps)
    sizes = "; ".join(f"{p / 1e6:.2f}M: " + "/".join(f"{v:.1f}" for v in g.gap) for p, g in gaps.groupby("params"))
    measured = (f"{gaps.task.nunique()} sizes of {claim.tasks}, {trend.points} seed pairs, {claim.split} metric; "
                f"gap per seed (%) at {sizes}; least squares on log10(params), 95% t-interval")
    req, unmet = claim.requires, []
    if trend.sizes < req.min_sizes:
        unmet.append(f"{trend.sizes} size(s) with two or more seed pairs, the trend needs ≥ {req.min_sizes}")
    if not trend.span >= req.min_span:
        unmet.append(f"the sizes span {trend.span:.1f}x in parameters, the trend needs ≥ {req.min_span:g}x")
    result = _decide(claim, trend.slope, trend.half, measured, unmet)
    if not unmet:
        result = dataclasses.replace(result, why=f"{trend.direction}: {result.why}")
    return dataclasses.replace(result, values=[float(v) for v in gaps.gap])


COST_TITLES = {"fwdbwd_ms": "time", "fwd_ms": "fwd time", "flops_fwdbwd": "FLOPs", "flops_fwd": "fwd FLOPs",
               "bytes_written_fwdbwd": "bytes written", "bytes_written_fwd": "fwd bytes written",
               "peak_fwdbwd_bytes": "memory", "peak_fwd_bytes": "fwd memory", "flops_stated": "stated FLOPs"}


def _exponent_interval(f) -> tuple[float, float]:
    """The interval a cost exponent is judged on: a timed fit's 95% CI; for an exact count,
    the range of its exponents between consecutive lengths of the fit (every doubling in
    the range must meet the criterion, so a count still converging cannot agree)."""
    if getattr(f, "kind", "timed") == "timed":
        return f.ci_low, f.ci_high
    return f.local_min, f.local_max


def _time_beside(fits: pd.DataFrame, growth: pd.DataFrame | None, arch: str) -> str:
    """Wall time of ``arch`` as supporting evidence: its fitted exponent, and its growth
    per doubling at the longest timed pair of lengths beside the counts' growth there."""
    t = fits[(fits.arch == arch) & (fits.measure == "fwdbwd_ms")]
    if t.empty:
        return ""
    t = t.iloc[0]
    text = (f"{arch} time {t.slope:.2f} [{t.ci_low:.2f}, {t.ci_high:.2f}] over L = {int(t.min_len)}--{int(t.max_len)}"
            if pd.notna(t.slope) else f"{arch} timed at {int(t.points)} length(s) only, up to L = {int(t.max_len)}")
    g = growth[(growth.arch == arch) & growth.growth_fwdbwd_ms.notna()] if growth is not None else None
    if g is not None and len(g):
        last = g.iloc[-1]
        counted = ", ".join(f"{COST_TITLES[m]} ×{last[f'growth_{m}']:.2f}"
                            for m in ("flops_fwdbwd", "bytes_written_fwdbwd", "peak_fwdbwd_bytes"))
        text += (f"; per doubling at L = {int(last.len_from)}→{int(last.len_to)}: "
                 f"time ×{last.growth_fwdbwd_ms:.2f}, {counted}")
    return text


def _cost_context(fits: pd.DataFrame, growth: pd.DataFrame | None, archs: list[str], measures: list[str]) -> str:
    """What the cost verdict was measured on, with the wall time beside it."""
    mine = fits[fits.arch.isin(archs) & fits.measure.isin(measures)]
    if mine.empty:
        return "--"
    modes = sorted({m for ms in mine.get("count_mode", pd.Series(dtype=str)).dropna() for m in str(ms).split("+")}
                   & {"fake", "real"})
    how = f"counted on {' and '.join(modes)} CPU tensors" if modes else "measured"
    width = f" at d = {int(mine.d_model.iloc[0])}" if "d_model" in mine and mine.d_model.notna().any() else ""
    on = (f"one layer{width}, {how}, fit over L = {int(mine.min_len.min())}--{int(mine.max_len.max())} "
          "(the longest lengths)")
    beside = [t for a in archs if (t := _time_beside(fits, growth, a))]
    if beside:
        on += f"; wall time on {mine.device.iloc[0]}, not deciding: " + "; ".join(beside)
    return on


def eval_complexity(res: Results, claim: ComplexityExponent) -> ClaimResult:
    fits = res.table("analysis/complexity_fit.csv")
    archs = claim.arch if isinstance(claim.arch, list) else [claim.arch]
    if fits is None:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", "no complexity measurement")
    parts, judged, short, values = [], {}, [], []
    for arch in archs:
        for measure in claim.measures:
            f = fits[(fits.arch == arch) & (fits.measure == measure)]
            if f.empty or f.slope.isna().all():
                short.append(f"{arch} {COST_TITLES.get(measure, measure)} not measured")
                continue
            f = f.iloc[0]
            low, high = _exponent_interval(f)
            title = COST_TITLES.get(measure, measure)
            parts.append(f"{arch} {title} {f.slope:.2f}")
            values.append(float(f.slope))
            if f.max_len < claim.requires.min_length:
                short.append(f"{arch} measured only up to L = {int(f.max_len)}")
            judged[f"{arch} {title} {f.slope:.2f} [{low:.2f}, {high:.2f}]"] = judge(
                (low + high) / 2, (high - low) / 2, claim.agree_if)
    on = _cost_context(fits, res.table("analysis/complexity_growth.csv"), archs, claim.measures)
    value = max(values) if values else float("nan")
    base = dict(id=claim.id, claim=claim.claim, source=claim.source, reported=claim.reported,
                ours="; ".join(parts) or "--", value=value, measured_on=on, values=values)
    if short or not values:
        return ClaimResult(**base, verdict="not testable", why="; ".join(short) or "not measured")
    # One exponent outside the band disagrees; all inside agree; otherwise they cannot tell.
    outside = [k for k, v in judged.items() if v == "disagrees"]
    straddle = [k for k, v in judged.items() if v == "inconclusive"]
    band = criterion(claim.agree_if)
    if outside:
        verdict, why = "disagrees", f"outside {band}: " + ", ".join(outside)
    elif straddle:
        verdict, why = "inconclusive", f"straddles {band}: " + ", ".join(straddle)
    else:
        verdict, why = "agrees", f"every exponent {band} at every doubling of the fit range: " + ", ".join(judged)
    return ClaimResult(**base, verdict=verdict, why=why)


def eval_su(res: Results, claim: SuClosedForm) -> ClaimResult:
    from seqmix.analysis.su import closed_form

    table = res.table("analysis/sparsity_analytic.csv")
    if table is None:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", "no analytic sparsity table")
    k = table[table.kernel == claim.kernel]
    closed = k[k.method == "closed_form"]
    if closed.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", f"no closed-form rows of {claim.kernel}")
    if claim.statistic == "min":
        value = closed.S.min()
    else:  # at_beta_zero
        value = closed.loc[(closed.beta.abs() == closed.beta.abs().min()), "S"].mean()
    mc = k[k.method == "monte_carlo"]
    mc = mc[mc.n == mc.n.max()] if len(mc) else mc
    z = [abs(r.S - closed_form(claim.kernel, r.beta, r.gamma)) / r.S_se for r in mc.itertuples() if r.S_se > 0]
    grid = f"{closed.beta.nunique()} × {closed.gamma.nunique()} (β, γ) grid"
    on = f"closed form on a {grid}" + (f"; Monte Carlo at n = {int(mc.n.max()):,}" if len(mc) else "")
    ours = f"{value:.4f}" + (f" (Monte Carlo within {max(z):.1f} SE)" if z else "")
    if z and max(z) > 4:
        return ClaimResult(claim.id, claim.claim, claim.source, claim.reported, ours, value, on,
                           "disagrees", f"Monte Carlo differs from the closed form by {max(z):.1f} standard errors")
    verdict = "agrees" if claim.agree_if.holds(value) else "disagrees"
    return ClaimResult(claim.id, claim.claim, claim.source, claim.reported, ours, value, on,
                       verdict, f"{claim.unit} {criterion(claim.agree_if)}: {value:.4f}")


def _sparsity_task_of(res: Results, claim: MeasuredSparsity, arch: str) -> str:
    """The task whose rows stand for ``arch``: the claim's task, or for a swept task the
    arch's best point (the model that learned the task best)."""
    runs = res.runs
    if runs is not None and claim.task in set(runs.group) and claim.task not in set(runs.task):
        return best_point(runs, claim.task, arch) or claim.task
    return claim.task


def eval_measured_sparsity(res: Results, claim: MeasuredSparsity) -> ClaimResult:
    sp = res.table("analysis/sparsity.csv")
    if sp is None or sp.empty:
        return _result(claim, float("nan"), float("nan"), "--", "not testable", "no measured sparsity")
    att = sp[sp.kind == "attention"]
    if claim.positions is not None:
        att = att[att.positions == claim.positions]
    tasks = {a: _sparsity_task_of(res, claim, a) for a in (claim.arch, claim.baseline)}
    per_seed = {a: att[(att.arch == a) & (att.task == t)].groupby("seed").S_mean.mean() for a, t in tasks.items()}
    missing = [a for a, s in per_seed.items() if s.empty]
    if missing:
        return _result(claim, float("nan"), float("nan"), "--", "not testable",
                       f"no trained attention rows of {', '.join(missing)} on {claim.task}")
    seeds = sorted(set(per_seed[claim.arch].index) & set(per_seed[claim.baseline].index))
    diffs = [per_seed[claim.arch][s] - per_seed[claim.baseline][s] for s in seeds]
    mean, half, _ = mean_ci(diffs)
    ref, _, _ = mean_ci(per_seed[claim.arch])
    base, _, _ = mean_ci(per_seed[claim.baseline])
    where = f"{claim.positions} rows" if claim.positions is not None else "rows"
    on = (f"{', '.join(sorted(set(tasks.values())))} held-out {where}, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}; "
          f"S {claim.arch} {ref:.3f}, {claim.baseline} {base:.3f}")
    why = []
    limit = claim.requires.max_reference_sparsity
    if limit is not None and ref > limit:
        why.append(f"trained {claim.arch} attention is still near-uniform (S = {ref:.3f} > {limit}): "
                   "the models have not learned to attend at this scale")
    return dataclasses.replace(_decide(claim, mean, half, on, why), values=[float(d) for d in diffs])


def _decide(claim: AnyClaim, mean: float, half: float, measured_on: str, unmet: list[str]) -> ClaimResult:
    if unmet:
        return _result(claim, mean, half, measured_on, "not testable", "; ".join(unmet))
    if math.isnan(mean):
        return _result(claim, mean, half, measured_on, "not testable", "no finished run")
    verdict = judge(mean, half, claim.agree_if)
    verb = {"agrees": "meets", "disagrees": "misses", "inconclusive": "straddles"}[verdict]
    ci = "" if math.isnan(half) else " (95% CI)"
    why = f"{claim.unit} {_fmt(mean, half)}{ci} {verb} {criterion(claim.agree_if)}"
    return _result(claim, mean, half, measured_on, verdict, why)


def _result(claim: AnyClaim, mean, half, measured_on, verdict, why) -> ClaimResult:
    return ClaimResult(claim.id, claim.claim, claim.source, claim.reported, _fmt(mean, half),
                       float(mean), measured_on, verdict, why)


# Each claim kind's evaluator (seqmix.report.claims_file: its model).
EVALUATORS: dict[str, Callable[[Results, AnyClaim], ClaimResult]] = {
    "width_to_reach": eval_width_to_reach,
    "recall_beyond_reach": eval_recall_beyond_reach,
    "copy_beyond_reach": eval_copy_beyond_reach,
    "gap_trend": eval_gap_trend,
    "relative_gap": eval_paired,
    "accuracy_difference": eval_paired,
    "metric_threshold": eval_threshold,
    "complexity_exponent": eval_complexity,
    "su_closed_form": eval_su,
    "measured_sparsity": eval_measured_sparsity,
}


def task_in_profile(res: Results, claim: AnyClaim) -> AnyClaim:
    """The claim with ``task`` resolved: a list of tasks names where each profile tests it
    (the quick profile's MQAR cell, the paper profile's Zoology cells); the first one this
    profile trained (a task or a sweep's group) is the one judged, else the first listed."""
    if not isinstance(claim, OnTask) or not isinstance(claim.task, list):
        return claim
    tasks = claim.task
    runs = res.runs
    ran = set(runs.task) | set(runs.get("group", [])) if runs is not None else set()
    return claim.model_copy(update={"task": next((t for t in tasks if t in ran), tasks[0])})


class RecordedResults(Results):
    """A recording's accepted runs in the place of a profile's runs.csv."""

    def __init__(self, recording: Recording):
        super().__init__(recording.path)
        self._cache["summary/runs.csv"] = recording.runs()


def eval_recorded(res: Results, claim: AnyClaim, recordings: list[Recording]) -> ClaimResult:
    """A claim marked ``runs: recorded`` (its scale needs a GPU this profile may lack): decided
    by its kind's evaluator on the newest recorded study whose runs are the headline study's
    now (seqmix.report.recorded), the row naming the device, date and commit they came from.
    Without one, this profile's own runs decide, as for any claim, and the row says so. Every
    refused recorded run is named with its reason either way: nothing is left out unsaid."""
    evaluate, pick, refused = EVALUATORS[claim.kind], chosen(recordings), refusal_lines(recordings)
    if pick is None:
        result = evaluate(res, task_in_profile(res, claim))
        said = "; ".join(refused) if refused else "no study recorded (python -m seqmix record)"
        return dataclasses.replace(result, why=f"{result.why} (this profile's runs: {said})")
    rec = RecordedResults(pick)
    result = evaluate(rec, task_in_profile(rec, claim))
    return dataclasses.replace(result, measured_on=f"recorded on {pick.describe()} ({pick.name}): {result.measured_on}"
                               + partial_note(pick, result), why="; ".join([result.why, *refused]))


def partial_note(pick: Recording, result: ClaimResult) -> str:
    """Where the recording is partial (a GPU call that ran out of time: meta.json's
    ``unfinished``), how many seeds decided the claim (those that finished for every
    architecture it compares) and which runs did not finish; "" for a whole recording."""
    unfinished = pick.meta.get("unfinished") or []
    if not unfinished:
        return ""
    n = len(result.values)
    return (f"; partial recording: decided by {n} seed{'s' if n != 1 else ''} ({len(unfinished)} run"
            f"{'s' if len(unfinished) != 1 else ''} unfinished: {', '.join(unfinished)})")


def evaluate_claims(claims_path: str | Path, results_dir: str | Path,
                    recordings: list[Recording] | None = None) -> pd.DataFrame:
    """Every claim of ``claims_path`` on the results in ``results_dir``; ``recordings``
    (seqmix.report.recorded.read_recordings) decide the claims marked ``runs: recorded``
    (None: not read, this profile's runs decide every claim)."""
    res = Results(results_dir)
    out = [eval_recorded(res, c, recordings) if recordings is not None and c.runs == "recorded"
           else EVALUATORS[c.kind](res, task_in_profile(res, c)) for c in load_claims(claims_path)]
    return pd.DataFrame([dataclasses.asdict(r) for r in out])


__all__ = ["ClaimResult", "ClaimsError", "VERDICTS", "evaluate_claims", "load_claims"]
