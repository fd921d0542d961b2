"""What a finished study found, for the README: ``python -m tools.readme_results --config
config/config.yaml --images docs/results --markdown results/readme-results.md``.

Reads the study's results (``<results_dir>/summary/runs.csv``, its analyses and the recorded
runs, as the report's claims notebook does), evaluates ``paper/claims.yaml`` on them
(seqmix.report.claims), draws the test metric of every task not swept and the recall
accuracy against width with the functions that draw the report's panels, as PNG images, and
writes a Markdown block: the commit and host its runs were made at, the claims table (verdict,
our value with its 95 % interval, the criterion) and the images. ``make readme-results`` puts
the block into README.md (tools.docs); nothing in it is typed by hand. A study whose report
was not built (``make report``) is refused: its numbers would not be the report's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from seqmix import REPO_ROOT

CLAIMS_FILE = REPO_ROOT / "paper" / "claims.yaml"
VERDICT_MARK = {"agrees": "agrees", "disagrees": "**disagrees**", "inconclusive": "inconclusive",
                "not testable": "not testable"}


def provenance_line(results: Path) -> str:
    """The commits, machines and hosts the study's runs recorded (provenance.json)."""
    from seqmix.report.benchmarks import measured_on

    hosts = sorted({json.loads(p.read_text()).get("host") or "unknown"
                    for p in results.glob("runs/**/provenance.json")})
    line = measured_on(results).removesuffix(".")
    return f"{line} (host {', '.join(hosts)})." if hosts else f"{line}."


def claims_rows(results: Path, claims_file: Path, recorded_dir: Path | None, headline: Path | None) -> pd.DataFrame:
    """Every claim evaluated as the report's claims notebook does, with its criterion."""
    from seqmix.report.claims import criterion, evaluate_claims, load_claims
    from seqmix.report.recorded import HEADLINE_CONFIG, RECORDED_DIR, read_recordings

    recordings = read_recordings(recorded_dir or RECORDED_DIR, headline or HEADLINE_CONFIG)
    table = evaluate_claims(claims_file, results, recordings)
    table["criterion"] = table.id.map({c.id: criterion(c.agree_if) for c in load_claims(claims_file)})
    return table


def draw(results: Path, images: Path) -> list[tuple[str, str]]:
    """The README's figures as PNGs under ``images``: (alt text, file) of each."""
    import matplotlib.pyplot as plt

    from seqmix.catalogue import title as task_title
    from seqmix.report.quality_tables import draw_test_metric
    from seqmix.report.recall_tables import best_by_width, draw_width, selection_text, width_groups
    from seqmix.report.style import apply_style, palette, save_figure
    from seqmix.report.summary import summarise

    apply_style()
    runs, colours = pd.read_csv(results / "summary" / "runs.csv"), palette()
    images.mkdir(parents=True, exist_ok=True)
    out = []
    points = runs.groupby("group").task.nunique()
    single = [t for t, g in dict.fromkeys(zip(runs.task, runs.group)) if points[g] == 1]  # the tasks not swept
    if single:
        fig, axes = plt.subplots(1, len(single), figsize=(4.2 * len(single), 3.4), squeeze=False)
        summ = summarise(runs)
        for ax, task in zip(axes[0], single):
            draw_test_metric(ax, runs, summ, task, colours)
        fig.tight_layout()
        path = save_figure(fig, images / "quality.png")
        out.append((f"Test metric per architecture ({', '.join(task_title(t) for t in single)}): bars the mean "
                    "over seeds with its 95 % interval, dots the seeds", path.name))
    groups = width_groups(runs)
    if groups:
        best = best_by_width(runs, groups)
        fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups), 3.4), squeeze=False)
        for ax, g in zip(axes[0], groups):
            draw_width(ax, runs, best[g], colours, task_title(g))
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
        fig.tight_layout()
        path = save_figure(fig, images / "recall.png")
        out.append((f"MQAR test accuracy against model width ({selection_text(runs, groups)}): circles the seeds, "
                    "the line what a majority of them reach, dotted chance", path.name))
    return out


def markdown(config: str, results: Path, claims: pd.DataFrame, figures: list[tuple[str, str]], link: str) -> str:
    runs = pd.read_csv(results / "summary" / "runs.csv")
    counts = claims.verdict.value_counts()
    tally = ", ".join(f"{int(counts[v])} {said}" for v, said in (("agrees", "agree"), ("disagrees", "disagree"),
                                                                ("inconclusive", "inconclusive"),
                                                                ("not testable", "not testable")) if v in counts)
    lines = [f"`{config}`, {len(runs)} runs. {provenance_line(results)} Of its {len(claims)} claims: {tally}.",
             "",
             "| claim | verdict | ours (± 95 % interval) | agrees if |",
             "|---|---|---|---|"]
    lines += [f"| `{r.id}` | {VERDICT_MARK[r.verdict]} | {r.ours} | {r.criterion} |" for r in claims.itertuples()]
    for alt, name in figures:
        lines += ["", f"![{alt}]({link}/{name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.readme_results", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml", help="the study (default: the quick one)")
    ap.add_argument("--images", type=Path, default=Path("docs/results"), help="where the PNGs go")
    ap.add_argument("--markdown", type=Path, required=True, help="write the README's block here")
    ap.add_argument("--readme", type=Path, default=Path("README.md"), help="the page the images are linked from")
    ap.add_argument("--claims", type=Path, default=CLAIMS_FILE)
    ap.add_argument("--recorded-dir", type=Path, default=None, help="default: results/recorded")
    ap.add_argument("--headline-config", type=Path, default=None, help="default: config/paper-headline.yaml")
    args = ap.parse_args(argv)

    from seqmix.errors import ConfigError
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study

    try:
        expansion = expand(load_study(args.config))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results, report = Path(expansion.study.results_dir), expansion.report_dir
    if not (report / "report.pdf").is_file() or not (results / "summary" / "runs.csv").is_file():
        print(f"error: {args.config}'s study is not finished here: {report / 'report.pdf'} or "
              f"{results / 'summary' / 'runs.csv'} is missing (run `make report`, or snakemake with "
              f"--configfile {args.config}, first)", file=sys.stderr)
        return 4
    claims = claims_rows(results, args.claims, args.recorded_dir, args.headline_config)
    figures = draw(results, args.images)
    link = Path(os.path.relpath(args.images.resolve(), args.readme.resolve().parent)).as_posix()
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown(args.config, results, claims, figures, link))
    print(f"wrote {args.markdown} and {', '.join(str(args.images / f) for _, f in figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
