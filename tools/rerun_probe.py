"""Does a code edit retrain? A tiny study (softmax and GLA on MQAR, 30 steps, one seed) run
to its `runs` target in a scratch copy of CHECKOUT; then one functional edit (the softmax
mixer's output x 0.5); then the same snakemake command. Prints the jobs each snakemake ran
and, per run, whether model.pt, log.csv and provenance's code changed. (The probe of the
issue on code changes that retrain; tests/workflow/test_reruns.py holds the same claims.)

    python -m tools.rerun_probe CHECKOUT SCRATCH
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

EDIT = ("return self.out_proj(y.transpose(1, 2).reshape(B, L, D))",
        "return 0.5 * self.out_proj(y.transpose(1, 2).reshape(B, L, D))")
COPIED = ("Snakefile", "workflow", "notebooks", "src", "kernels", "config", "envs", "requirements.txt", "paper")


def jobs(out: str) -> dict[str, int]:
    table = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def state(work: Path) -> dict[str, dict[str, str]]:
    out = {}
    for run in sorted((work / "results" / "runs").glob("*/*/seed*")):
        code = json.loads((run / "provenance.json").read_text()).get("code", {})
        out[str(run.relative_to(work / "results" / "runs"))] = {
            "model": hashlib.sha256((run / "model.pt").read_bytes()).hexdigest(),
            "log_time": str((run / "log.csv").stat().st_mtime_ns),
            "log": hashlib.sha256((run / "log.csv").read_bytes()).hexdigest(),
            "code": hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()}
    return out


def main(checkout: Path, scratch: Path) -> None:
    sys.path.insert(0, str(checkout))
    from tests.conftest import tiny_config

    shutil.rmtree(scratch, ignore_errors=True)
    src, work = scratch / "src", scratch / "work"
    work.mkdir(parents=True)
    src.mkdir()
    for name in COPIED:
        path = checkout / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pdf"),
                            symlinks=True)  # src/seqmix/kernels: a link to kernels/
        else:
            shutil.copy2(path, src / name)
    cfg = tiny_config(work, None, archs=("softmax", "gla"))
    cfg["results_dir"], cfg["data"]["dir"] = "results", "data"
    cfg["tasks"]["mqar"]["train"].update(steps=30, eval_every=10, checkpoint_every=10, log_every=5)
    (work / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def snakemake(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(src / "Snakefile"), "--directory",
                               str(work), "--cores", "2", *args, "--configfile", str(work / "tiny.yaml")],
                              capture_output=True, text=True, env=env, cwd=work)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
        return proc.stdout + proc.stderr

    print("first run:", jobs(snakemake("runs")))
    before = state(work)
    mixer = src / "src" / "seqmix" / "mixers" / "softmax.py"
    mixer.write_text(mixer.read_text().replace(*EDIT, 1))
    print("dry run after the edit:", jobs(snakemake("runs", "-n")))
    print("the rerun:", jobs(snakemake("runs")))
    after = state(work)
    print("| run | `model.pt` | `log.csv` | provenance's code |\n|---|---|---|---|")
    for run, b in before.items():
        a = after[run]
        log = "untouched" if a["log_time"] == b["log_time"] else "rewritten, same bytes" if a["log"] == b["log"] else "rewritten, new rows"
        print(f"| {run} | {'the same bytes' if a['model'] == b['model'] else 'new weights'} | {log} | "
              f"{'the same' if a['code'] == b['code'] else 'new digests'} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
