"""How long `snakemake -n` takes on a profile, in two checkouts side by side: on a cache miss
(the job table made again: `python -m seqmix jobs` in a subprocess) and on a hit (the cached
table read back). A ratio above 1 is the second checkout being slower.

The checkouts are timed in alternation, round after round, each round a miss (the job-table
cache, ``.snakemake/seqmix/``, removed first) then a hit, so that the machine's load falls
on both alike; medians over the rounds. Both run with the same interpreter (``--python``);
each Snakefile imports the seqmix of its own checkout.

    git worktree add /tmp/before <commit>
    python tools/bench_dry_run.py /tmp/before . [--rounds 5] [--configfile config/paper.yaml]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def dry_run(checkout: Path, python: str, configfile: str | None) -> float:
    command = [python, "-m", "snakemake", "-n", "--cores", "2", "--quiet", "rules"]
    if configfile:
        command += ["--configfile", configfile]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: snakemake -n failed in {checkout}:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a checkout (e.g. a worktree of the commit before)")
    parser.add_argument("second", type=Path, help="another checkout (e.g. .)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configfile", help="a profile, relative to each checkout (default: config/config.yaml)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter both run with")
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
    print(f"snakemake -n, {args.configfile or 'config/config.yaml'}, {args.rounds} alternated rounds, "
          f"{platform.node()} ({platform.processor() or platform.machine()})")
    for (name, mode), values in times.items():
        print(f"  {name:6} {checkouts[name]}  {mode:4} median {statistics.median(values):5.2f} s  "
              f"({' '.join(f'{v:.2f}' for v in values)})")
    for mode in ("miss", "hit"):
        ratio = statistics.median(times[("second", mode)]) / statistics.median(times[("first", mode)])
        print(f"  {mode}: second / first = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
