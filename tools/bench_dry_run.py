"""How long `snakemake -n` takes on a profile, in two checkouts side by side: on a cache miss
(the job table made again: `python -m seqmix jobs` in a subprocess) and on a hit (the cached
table read back). A ratio above 1 is the second checkout being slower.

The checkouts are timed in alternation, round after round, each round a miss (the job-table
cache, ``.snakemake/seqmix/``, removed first) then a hit, so that the machine's load falls
on both alike; medians over the rounds. Both run with the same interpreter (``--python``);
each Snakefile imports the seqmix of its own checkout.

    git worktree add /tmp/before <commit>
    python -m tools.bench_dry_run /tmp/before . [--rounds 5] [--configfile config/paper.yaml] \
        [--markdown docs/costs/dry-run.md]

``--markdown`` puts the table, headed by both commits and the machine, into that page's
generated block (tools.docs).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from seqmix import numerics
from tools.docs import splice


def dry_run(checkout: Path, python: str, configfile: str | None) -> float:
    command = [python, "-m", "snakemake", "-n", "--cores", "2", "--quiet", "rules"]
    if configfile:
        command += ["--configfile", configfile]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: snakemake -n failed in {checkout}:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def commit(checkout: Path) -> str:
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (head.stdout.strip() or "?") + (" (dirty)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a checkout (e.g. a worktree of the commit before)")
    parser.add_argument("second", type=Path, help="another checkout (e.g. .)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configfile", help="a profile, relative to each checkout (default: config/config.yaml)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter both run with")
    parser.add_argument("--markdown", type=Path, help="a docs/ page whose generated block gets the table")
    args = parser.parse_args(argv)
    checkouts = {"first": args.first.resolve(), "second": args.second.resolve()}
    for path in checkouts.values():
        if not (path / "Snakefile").is_file():
            sys.exit(f"error: {path} has no Snakefile; give two checkouts of this repository")
    times: dict[tuple[str, str], list[float]] = {(k, m): [] for k in checkouts for m in ("miss", "hit")}
    for _ in range(args.rounds):
        for name, path in checkouts.items():
            shutil.rmtree(path / ".snakemake" / "seqmix", ignore_errors=True)
            times[(name, "miss")].append(dry_run(path, args.python, args.configfile))
            times[(name, "hit")].append(dry_run(path, args.python, args.configfile))
    profile = args.configfile or "config/config.yaml"
    head = (f"`snakemake -n` on {profile}, {args.rounds} alternated rounds (each a miss, then a hit), "
            f"on {numerics.cpu_model()} ({platform.node()}, {os.cpu_count()} cores), medians in seconds.")
    lines = ["| checkout | commit | miss | hit | misses | hits |", "|---|---|---|---|---|---|"]
    for name, path in checkouts.items():
        miss, hit = times[(name, "miss")], times[(name, "hit")]
        lines.append(f"| {name} | {commit(path)} | {statistics.median(miss):.2f} | {statistics.median(hit):.2f} | "
                     f"{' '.join(f'{v:.2f}' for v in miss)} | {' '.join(f'{v:.2f}' for v in hit)} |")
    ratios = [f"{mode}: second / first = "
              f"{statistics.median(times[('second', mode)]) / statistics.median(times[('first', mode)]):.2f}"
              for mode in ("miss", "hit")]
    table = "\n".join([head, "", *lines, "", "; ".join(ratios) + "."])
    print(table)
    if args.markdown:
        args.markdown.write_text(splice(args.markdown.read_text(), table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
