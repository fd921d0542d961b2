"""What every job of a DAG run cost: the benchmark files Snakemake wrote (one per job,
``<results_dir>/benchmarks/<rule>/...tsv``: wall seconds ``s``, peak resident memory
``max_rss`` in MB, CPU seconds ``cpu_time``), summarised per rule for the README.

``python -m seqmix benchmarks <results_dir>/benchmarks`` prints the table; columns:

    rule          the Snakemake rule
    jobs          jobs of that rule
    wall_s        their wall time, summed, and the longest (max_wall_s)
    cpu_s         their CPU time, summed
    max_rss_mb    the largest peak resident memory of one job (MB)
    worst         the job with that peak (its wildcards)
"""

from __future__ import annotations

import csv
from pathlib import Path

FIELDS = ["rule", "jobs", "wall_s", "max_wall_s", "cpu_s", "max_rss_mb", "worst"]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "NA" where the job was too short to sample
        return 0.0


def read_benchmarks(root: str | Path) -> list[dict]:
    """One row per job: rule, job (the file's path under its rule), s, max_rss, cpu_time."""
    rows = []
    for path in sorted(Path(root).rglob("*.tsv")):
        rel = path.relative_to(root)
        with open(path) as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                rows.append({"rule": rel.parts[0], "job": str(rel.with_suffix(""))[len(rel.parts[0]) + 1:] or "-",
                             "s": _number(rec["s"]), "max_rss": _number(rec["max_rss"]),
                             "cpu_time": _number(rec.get("cpu_time", "0"))})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = {}
    for r in rows:
        s = out.setdefault(r["rule"], {"rule": r["rule"], "jobs": 0, "wall_s": 0.0, "max_wall_s": 0.0, "cpu_s": 0.0,
                                       "max_rss_mb": 0.0, "worst": ""})
        s["jobs"] += 1
        s["wall_s"] += r["s"]
        s["max_wall_s"] = max(s["max_wall_s"], r["s"])
        s["cpu_s"] += r["cpu_time"]
        if r["max_rss"] >= s["max_rss_mb"]:
            s["max_rss_mb"], s["worst"] = r["max_rss"], r["job"]
    return sorted(out.values(), key=lambda s: -s["wall_s"])


def markdown(summary: list[dict]) -> str:
    lines = ["| rule | jobs | wall s (sum) | wall s (longest) | CPU s (sum) | peak RSS MB (largest) | largest job |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['rule']} | {s['jobs']} | {s['wall_s']:.0f} | {s['max_wall_s']:.0f} | {s['cpu_s']:.0f} | "
                     f"{s['max_rss_mb']:.0f} | {s['worst']} |")
    total = sum(s["wall_s"] for s in summary), sum(s["cpu_s"] for s in summary)
    lines.append(f"| all | {sum(s['jobs'] for s in summary)} | {total[0]:.0f} | | {total[1]:.0f} | | |")
    return "\n".join(lines) + "\n"
