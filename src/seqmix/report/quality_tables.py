"""The quality notebook's numbers: the quality table, the setup table (what every number was
measured on, read from the runs themselves) and the ``q`` macros, from ``runs.csv`` (its
summary: seqmix.report.summary) and each run's ``log.csv``, ``config.json`` and ``provenance.json``;
and what the recorded runs beside them are (seqmix.report.recorded)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd

from seqmix.catalogue import title as task_title
from seqmix.report.latex import escape, fmt, pm, series, table
from seqmix.report.recorded import Recording, account, chosen
from seqmix.report.style import arch_title, metric_title, ordered
from seqmix.report.summary import unfinished_tasks


def read_logs(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's log.csv in one frame, with its task, arch and seed."""
    logs = []
    for _, r in runs.iterrows():
        log = pd.read_csv(Path(r.run_dir) / "log.csv")
        log["task"], log["arch"], log["seed"] = r.task, r.arch, r.seed
        logs.append(log)
    return pd.concat(logs, ignore_index=True)


def task_summary(summ: pd.DataFrame, task: str) -> pd.DataFrame:
    """One task's summary rows, indexed by arch in catalogue order."""
    s = summ[summ.task == task]
    return s.set_index("arch").loc[ordered(s.arch)]


def draw_test_metric(ax, runs: pd.DataFrame, summ: pd.DataFrame, task: str, colours: dict[str, str],
                     title_size: float | None = None) -> None:
    """One task's panel of quality_main (and of the README's results): its test metric per
    architecture, bars the mean over seeds with the 95% interval, dots the seeds."""
    s = task_summary(summ, task)
    metric, higher = s.metric.iloc[0], bool(s.higher_is_better.iloc[0])
    y = range(len(s))
    ax.barh(list(y), s.test_mean.fillna(0), xerr=s.test_ci.fillna(0), color=[colours[a] for a in s.index], capsize=2)
    pts = runs[(runs.task == task) & (runs.status == "ok")]
    for i, arch in enumerate(s.index):
        v = pts[pts.arch == arch].test_value
        ax.scatter(v, [i] * len(v), color="black", s=6, zorder=3)
    ax.set_yticks(list(y), [arch_title(a) for a in s.index])
    ax.invert_yaxis()
    ax.set_xlabel(f"test {metric_title(metric)}" + (" (higher is better)" if higher else " (lower is better)"))
    ax.set_title(task_title(task), fontsize=title_size)
    # Linear axes: bars start at zero, and a 95% interval from two seeds can reach below it.
    ax.set_xlim(left=0)


def digits_of(metric: str) -> int:
    return 1 if metric == "ppl" else 3


def unfinished_text(runs: pd.DataFrame) -> str:
    """Tasks none of whose runs finished (every one diverged) have no quality result: said in
    the table note, the setup table and the abstract ("" when every task has one)."""
    unfinished = unfinished_tasks(runs)
    if not unfinished:
        return ""
    return (f"every run of {series([escape(task_title(t)) for t in unfinished])} diverged, so "
            + ("it has" if len(unfinished) == 1 else "they have") + " no quality result")


def quality_table(runs: pd.DataFrame, summ: pd.DataFrame) -> str:
    """tab:quality: per task and architecture, its size, runs ok, validation and test (best in bold)."""
    tasks = list(dict.fromkeys(runs.task))  # in config order
    body = []
    for task in tasks:
        s = task_summary(summ, task)
        metric, higher = s.metric.iloc[0], bool(s.higher_is_better.iloc[0])
        digits = digits_of(metric)
        best = s.test_mean.max() if higher else s.test_mean.min()
        for arch, r in s.iterrows():
            test = pm(r.test_mean, r.test_ci, digits)
            if r.test_mean == best:
                test = f"\\textbf{{{test}}}"
            body.append([escape(task_title(task)), escape(arch_title(arch)), fmt(int(r.params)), f"{r.d_model}/{r.n_layers}",
                         f"{r.ok}/{r.seeds}", pm(r.eval_mean, r.eval_ci, digits), test])
    unfinished = unfinished_text(runs)
    note = ("Mean $\\pm$ half-width of the 95\\% $t$ interval across seeds (no interval with one seed). "
            + "; ".join(f"{escape(task_title(t))}: {escape(metric_title(summ[summ.task == t].metric.iloc[0]))}" for t in tasks)
            + ". Data, budgets and evaluation sizes are in Table~\\ref{tab:setup}."
            + (f" {unfinished[0].upper()}{unfinished[1:]}." if unfinished else ""))
    return table(["Task", "Architecture", "Params", "$d$/layers", "Runs ok", "Validation", "Test"], body,
                 caption="Quality per architecture, measured by this pipeline.", label="tab:quality",
                 align="llrrrrr", note=note)


def setup_table(runs: pd.DataFrame) -> str:
    """tab:setup: the data and training budget each task actually used (its runs' manifest and config)."""
    rows = []
    for task in dict.fromkeys(runs.task):
        mine = runs[runs.task == task]
        done = mine[mine.status == "ok"]
        g = (done if len(done) else mine).iloc[0]  # a diverged run has no evaluation to count
        t = json.loads((Path(g.run_dir) / "config.json").read_text())["train"]
        held_out = [escape(data) + (f" ({fmt(int(scored))} {escape(g.scored_unit)} scored)" if len(done)
                                    else " (not evaluated: every run diverged)")
                    for data, scored in ((g.eval_data, g.eval_scored), (g.test_data, g.test_scored))]
        rows.append([escape(task_title(task)), escape(g.train_data), *held_out,
                     f"{fmt(int(t['steps']))} $\\times$ {t['batch_size']}", fmt(len(set(mine.seed)))])
    tokenizers = runs.tokenizer.dropna()
    return table(["Task", "Trained on", "Validation", "Test", "Steps $\\times$ batch", "Seeds"], rows,
                 caption="Data and training budget actually used (read from each run's manifest and config).",
                 label="tab:setup", align="p{1.3cm}p{3.2cm}p{3.2cm}p{3.2cm}rr", size="\\scriptsize",
                 note=escape("Tokenizer: " + tokenizers.iloc[0]) if len(tokenizers) else None)


def code_text(runs: pd.DataFrame) -> str:
    """The commit every run was made at, flagging runs made from a tree with uncommitted
    changes and runs whose recorded sources differ from this checkout's (made by other code
    than the report's; seqmix.sources): ``qCode``."""
    def tt(text: str) -> str:
        return "\\texttt{" + escape(text) + "}"

    def runs_of(n: int) -> str:
        return f"{n} run{'s' if n != 1 else ''}"

    parts = []
    for commit, group in runs.groupby(runs.commit.fillna("").astype(str), sort=True):
        dirty = int(group.dirty.fillna(False).astype(bool).sum())
        parts.append(f"{runs_of(len(group))} at {tt(commit[:10]) if commit else 'an unknown commit'}"
                     + (f" ({dirty} with uncommitted changes)" if dirty else ""))
    text = f"The code of each run: {series(parts)}."
    flags = runs.code_changed.fillna("").astype(str)
    changed = runs[~flags.isin(["", "?"])]
    if len(changed):
        files = sorted({f for fs in changed.code_changed for f in str(fs).split()})
        names = [escape(f"{r.task}/{r.arch}/seed{r.seed}") for r in changed.itertuples()]
        text += (f" Made by other code than this checkout's ({series([tt(f) for f in files])} differ): "
                 f"{runs_of(len(changed))}, {series(names)}.")
    else:
        text += " Every run's recorded sources are this checkout's."
    if unrecorded := int((flags == "?").sum()):
        text += f" {runs_of(unrecorded)} recorded no sources to compare."
    return text


def numerics_text(runs: pd.DataFrame) -> str:
    """Which numerics the runs ran under (docs/reference/numerics.md) and on which CPUs, flagging a study
    whose runs mix numerics or hosts, or portable runs whose libraries did not all take the pinned
    path (seqmix.report.collect.numerics_of): ``qNumerics``."""
    def runs_of(n: int) -> str:
        return f"{n} run{'s' if n != 1 else ''}"

    def counted(column: str) -> list[tuple[str, int]]:
        values = runs[column].fillna("").astype(str) if column in runs else pd.Series([""] * len(runs))
        return sorted(values.value_counts().items(), key=lambda kv: (-kv[1], kv[0]))

    modes, cpus = counted("numerics"), [(c, n) for c, n in counted("cpu") if c]
    known = [(m, n) for m, n in modes if m]
    if not known:
        return "No run recorded the numerics it ran under (runs made before seqmix recorded them)."
    where = (f"on one host, {escape(cpus[0][0])}" if len(cpus) == 1
             else f"on {len(cpus)} hosts ({series([f'{runs_of(n)} on {escape(c)}' for c, n in cpus])})")
    if len(modes) == 1:
        mode = known[0][0]
        text = f"Numerics: every run {escape(mode)} {where}."
    else:
        parts = series([f"{runs_of(n)} {escape(m or 'unrecorded')}" for m, n in modes])
        text = (f"\\textbf{{Runs of mixed numerics}}: {parts}, {where}; their last bits come from different code "
                "paths, and a run on a plateau can end otherwise.")
    if known == [("portable", len(runs))]:
        text += (" ATen, oneDNN and oneMKL were pinned to one code path on one thread, so any x86-64 host with "
                 "AVX2 and FMA gives the same bits (docs/reference/hosts.md).")
    elif len(cpus) > 1:
        text += (" \\textbf{Runs from several hosts} not all pinned: hosts of different instruction sets or vendors "
                 "give different last bits, and a run on a plateau can end otherwise.")
    elif any(m.startswith("portable, not pinned") for m, _ in known):
        text += (" \\textbf{Portable runs not pinned}: a library ran another path than portable pins (named above; "
                 "oneMKL AUTO: oneMKL's shim did not take effect), so another x86 host can give other last bits.")
    else:
        text += (" Not every library was pinned: another x86 host can give other last bits, and a run on a plateau "
                 "another outcome (numerics: portable pins them).")
    return text


def quality_macros(runs: pd.DataFrame, summ: pd.DataFrame, scope: str) -> dict[str, str]:
    """The ``q`` macros: the study in numbers (the abstract's), and each task and mixer's test value."""
    prov = json.loads((Path(runs.run_dir.iloc[0]) / "provenance.json").read_text())
    tokenizers = runs.tokenizer.dropna()
    unfinished = unfinished_text(runs)
    macros = {
        "profile": escape(runs.profile.iloc[0]),
        "scope": escape(scope),
        "numRuns": fmt(len(runs)),
        "numArchs": fmt(runs.arch.nunique()),
        # The architectures by name, so the abstract describes this study's, whatever their number.
        "architectures": series([escape(arch_title(a)) for a in ordered(runs.arch.unique())]),
        "numSeeds": fmt(runs.seed.nunique()),
        "numDiverged": fmt(int((runs.status == "diverged").sum())),
        "unfinished": f"; {unfinished}" if unfinished else "",
        "device": escape(prov["device"]["name"]),
        "torchVersion": escape(prov["packages"]["torch"]),
        # The title's: the runs' one commit, or where they differ, where to read them.
        "commit": (f"at commit \\texttt{{{escape(commits[0][:10])}}}"
                   if len(commits := sorted(set(runs.commit.fillna("").astype(str)))) == 1 and commits[0]
                   else "at the commits listed in Appendix~\\ref{app:provenance}"),
        "code": code_text(runs),
        "numerics": numerics_text(runs),
        "tokenizer": escape(tokenizers.iloc[0]) if len(tokenizers) else "synthetic only",
        "trainHours": f"{runs.wall_time_s.sum() / 3600:.2f}",
    }
    for _, r in summ.iterrows():
        macros[f"{r.task}-{r.arch}-test"] = pm(r.test_mean, r.test_ci, digits_of(r.metric))
        macros[f"{r.task}-{r.arch}-params"] = fmt(int(r.params))
    return macros


def curves_title(runs: pd.DataFrame, task: str, whose: str) -> str:
    """A panel title of the recorded-runs figure: whose runs, the task, their size and budget."""
    mine = runs[runs.task == task]
    seeds = mine.seed.nunique()
    return (f"{textwrap.fill(whose, 60)}\n{task_title(task)}: {mine.params.min() / 1e6:.2f}M params, "
            f"{int(mine.steps_planned.max()):,} steps, {seeds} seed{'s' if seeds != 1 else ''}")


def recordings_macros(summary_dir: str | Path) -> dict[str, str]:
    """``qRecordings``: the recorded studies whose runs this report reads as its own (the
    study's ``recordings``; seqmix.report.collect.RECORDINGS): each one's device, date and
    commit, how many of its runs count, where and when it was last verified, and one line per
    run left out with why ("" when the study reads none)."""
    path = Path(summary_dir) / "recordings.json"
    accounts = json.loads(path.read_text()) if path.is_file() else []
    parts = []
    for a in accounts:
        if a["recording"] is None:
            parts.append(f"{a['refused'][0]}.")
            continue
        parts.append(f"Runs recorded by study {a['profile']} ({a['recording']}: {a['made']}): {a['accepted']} "
                     f"read as this study's own; {a['verified']}.")
        parts += [f"{line}." for line in a["refused"]]
    return {"recordings": escape(" ".join(parts))}


def recorded_macros(recordings: list[Recording], recorded_dir: str | Path) -> dict[str, str]:
    """``qRecorded``: the recorded study the figure draws (device, date, commit) or why none,
    and every recorded run refused with its reason (the figure's caption); ``qRecordedDrawn``:
    1 when there is one to draw, else 0 (the report then says so in a sentence, no figure)."""
    return {"recorded": escape(account(recordings, recorded_dir)), "recordedDrawn": "1" if chosen(recordings) else "0"}
