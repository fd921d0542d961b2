"""`make gpu-check` proven on the CPU before GPU minutes are spent on it: its --cpu-smoke
runs every part (kernels against references, the kernel bench, step times, compiled against
eager steps, a training run through the CLI) at tiny sizes, the Triton kernels under the
interpreter, and writes the files the GPU run writes, in the layout the report and the plan
read. It needs no GPU, and its numbers mean nothing: what is checked is what the script
produces."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from seqmix.mixers import triton_kernels
from seqmix.plan import read_step_times
from seqmix.report.complexity_tables import read_kernel_benchmarks
from tests.conftest import REPO

FILES = ["kernel_check.csv", "kernels.csv", "train_probe.csv", "compiled_step.csv", "train_run.csv", "summary.md",
         "meta.json"]


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_cpu_smoke_runs_every_part_and_writes_the_gpu_layout(tmp_path):
    out = tmp_path / "bench" / "cpu-smoke"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the CLI sets it for the smoke
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), str(REPO)])  # tools/: not installed
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.bench", "gpu-check", "--cpu-smoke", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    print(f"gpu-check --cpu-smoke: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    summary = (out / "summary.md").read_text()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["smoke"] and set(meta["parts"]) == {"kernel_check", "kernels", "train_probe", "compiled_step", "train"}
    assert all(p["status"] == "done" for p in meta["parts"].values()), meta["parts"]

    # Every declared Triton kernel reached through a mixer and equal to its reference.
    checked = rows(out / "kernel_check.csv")
    for name in triton_kernels():
        assert f"- {name}: via " in summary and any(
            name in r["kernels"].split() and r["status"] == "ok" for r in checked), name
    assert not [r for r in checked if r["status"] not in ("ok", "no kernel")]

    # The kernel bench: every case a row; the report's table reads <gpu>/kernels.csv.
    bench = rows(out / "kernels.csv")
    assert {(r["op"], r["impl"]) for r in bench} >= {("grassmann", "triton"), ("attention", "sdpa")}
    assert all(r["status"] == "ok" or r["status"].startswith("unavailable: fla") for r in bench)
    ok, files = read_kernel_benchmarks(out.parent)
    assert files == 1 and len(ok) == sum(r["status"] == "ok" for r in bench)

    # Step times per (task point, architecture), in the columns the plan reads.
    probe = read_step_times(out)
    assert {r["arch"] for r in probe} == {"softmax", "grassmann"} and all(r["status"] == "ok" for r in probe)
    assert all(float(r["step_ms"]) > 0 and int(r["params"]) > 0 for r in probe)

    # The compiled step beside the eager one: the same losses (fp32), its compilation recorded.
    (compiled,) = rows(out / "compiled_step.csv")
    assert compiled["status"] == "ok" and float(compiled["max_loss_rel_diff"]) < 1e-5
    assert float(compiled["first_compiled_step_s"]) > 0 and int(compiled["graphs"]) >= 1

    # A real training run through `python -m seqmix train`, eager and compiled.
    runs = rows(out / "train_run.csv")
    assert [(r["compile"], r["status"]) for r in runs] == [("False", "ok"), ("True", "ok")]
    assert json.loads(runs[1]["training_step"])["compiled"] is True
    assert abs(float(runs[0]["train_loss_last"]) / float(runs[1]["train_loss_last"]) - 1) < 1e-5


def test_gpu_check_runs_native_numerics():
    """A GPU image may have no C compiler, which portable numerics' oneMKL shim needs: gpu-check
    asks for native (seqmix.cli.inputs.numerics_of reads it before anything else)."""
    from seqmix.cli.inputs import numerics_of
    from tools.bench.__main__ import build_parser

    assert numerics_of(build_parser().parse_args(["gpu-check"])) == ("native", "--numerics")
    assert numerics_of(build_parser().parse_args(["gpu-check", "--cpu-smoke"])) == ("native", "--numerics")
