"""What every job of a DAG run cost, from the benchmark file Snakemake writes per job
(``<results_dir>/benchmarks/<rule>/...tsv``), summarised per rule (``RuleCost``) for
docs/ by ``python -m seqmix benchmarks``, headed by the commits and machines its training
runs recorded (provenance.json). The DAG's elapsed time runs from the first job's start (its
file's time less its wall seconds) to the last job's end (its file's time).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TypedDict

from seqmix.io import columns


class RuleCost(TypedDict):
    """One row of the summary: the jobs of one Snakemake rule."""

    rule: str
    jobs: int  # jobs of that rule
    wall_s: float  # their wall time, summed
    max_wall_s: float  # the longest one's
    cpu_s: float  # their CPU time, summed
    max_rss_mb: float  # the largest peak resident memory of one job (MB)
    worst: str  # the job with that peak (its wildcards)


FIELDS = columns(RuleCost)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "NA" where the job was too short to sample
        return 0.0


def read_benchmarks(root: str | Path) -> list[dict]:
    """One row per job: rule, job (the file's path under its rule), s, max_rss, cpu_time."""
    rows = []
    for path in sorted(Path(root).rglob("*.tsv")):
        rel = path.relative_to(root).with_suffix("")
        rule, job = rel.parts[0], "/".join(rel.parts[1:]) or "-"  # <rule>.tsv: a one-job rule
        with open(path) as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                rows.append({"rule": rule, "job": job,
                             "s": _number(rec["s"]), "max_rss": _number(rec["max_rss"]),
                             "cpu_time": _number(rec.get("cpu_time", "0")), "end": path.stat().st_mtime})
    return rows


def summarise(rows: list[dict]) -> list[RuleCost]:
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


def elapsed_s(rows: list[dict]) -> float:
    """From the first job's start to the last job's end, in seconds."""
    return max(r["end"] for r in rows) - min(r["end"] - r["s"] for r in rows) if rows else 0.0


def measured_on(results_dir: str | Path) -> str:
    """Where the runs under ``results_dir`` were made: the commits and machines their
    provenance.json files recorded (a commit with uncommitted changes is marked "+ edits")."""
    commits, machines = set(), set()
    for path in Path(results_dir).glob("runs/**/provenance.json"):
        rec = json.loads(path.read_text())
        git, device = rec.get("git") or {}, rec.get("device") or {}
        if git.get("commit"):
            commits.add(git["commit"][:7] + (" + edits" if git.get("dirty") else ""))
        cpus = f", {device['cpus']} CPUs" if device.get("cpus") else ""
        machines.add(f"{device.get('name', 'unknown')}{cpus}")
    if not commits and not machines:
        return f"No run under {results_dir} recorded its commit and machine (no provenance.json)."
    return (f"Measured at commit {', '.join(sorted(commits)) or 'unknown'} on "
            f"{'; '.join(sorted(machines))}.")


def markdown(summary: list[dict], elapsed: float | None = None, source: str | None = None) -> str:
    lines = ([source, ""] if source else []) + ["| rule | jobs | wall s (sum) | wall s (longest) | CPU s (sum) | peak RSS MB (largest) | largest job |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['rule']} | {s['jobs']} | {s['wall_s']:.0f} | {s['max_wall_s']:.0f} | {s['cpu_s']:.0f} | "
                     f"{s['max_rss_mb']:.0f} | {s['worst']} |")
    total = sum(s["wall_s"] for s in summary), sum(s["cpu_s"] for s in summary)
    lines.append(f"| all | {sum(s['jobs'] for s in summary)} | {total[0]:.0f} | | {total[1]:.0f} | | |")
    if elapsed is not None:
        lines += ["", f"Elapsed, first job's start to last job's end: {elapsed / 60:.1f} min."]
    return "\n".join(lines) + "\n"
