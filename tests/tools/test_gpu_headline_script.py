"""scripts/gpu-headline.sh on a CPU (issue 48 item 4), through both of its paths, in a copy of
the checkout with a tiny one-task headline (MQAR: no mirror, a few steps):

- fits: the measurement's choice fits the time left, the runs train and are recorded, and
  $OUT holds the log, the measurement and headline.tar.gz with the recording (exit 0);
- does not fit: a limit that leaves the runs no time; no run starts, the config is left as it
  was, $OUT holds the log and the measurement, and the script says so (exit 3).

What each returned and its wall time are printed (pytest -s). Its time is the processes the
script starts (each imports torch): on the team's 2-core CPU under a load average of 10-14,
minutes per path (tests/tools/test_gpu_headline_script.py's printed wall times)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, copy_workflow

TINY = """\
profile: tiny-headline
results_dir: {root}/results
numerics: native
data: {{dir: {root}/data, source: auto}}
architectures: [softmax, grassmann]
seeds: [0]
tasks:
  mqar:
    vocab_size: 32
    seq_len: 16
    num_kv_pairs: 2
    num_train: 64
    num_test: 16
    model: {{d_model: 16, n_layers: 1, dropout: 0.0, budget: {{params: null}}}}
    train:
      steps: 2
      batch_size: 4
      eval_every: 2
      eval_batches: 1
      log_every: 2
      checkpoint_every: 2
      threads: 1
      compile: false
      pack: true          # as the headline; the choice sets it false (it timed single runs)
mixers:
  grassmann: {{rank: 4, offsets: [1, 2]}}
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The checkout as a GPU machine gets it (no .git), with the tiny headline in config/."""
    root = copy_workflow(tmp_path / "checkout")
    for name in ("scripts", "tools"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "Makefile", root / "Makefile")
    (root / "config" / "tiny-headline.yaml").write_text(TINY.format(root=tmp_path / "study"))
    return root


def run_script(root: Path, out: Path, **env) -> tuple[subprocess.CompletedProcess, float]:
    full = {k: v for k, v in os.environ.items() if k not in ("SEQMIX_GPUS", "CUDA_VISIBLE_DEVICES")}
    full.update(PYTHON=sys.executable, HEADLINE="config/tiny-headline.yaml", OUT=str(out), PACK_JOBS="2",
                PACK_MODES="eager", PACK_STEPS="2", PACK_WINDOW="1", JOB_THREADS="1", BENCH="results/bench/headline",
                SEQMIX_SLOT_DIR=str(root / "slots"), **env)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(root / "scripts" / "gpu-headline.sh")], cwd=root, env=full,
                          capture_output=True, text=True, timeout=1500)
    return proc, time.monotonic() - t0


def said(out: Path) -> list[str]:
    return [line for line in (out / "gpu-headline.log").read_text().splitlines() if line.startswith("== gpu-headline:")]


def test_the_fits_path_trains_records_and_returns_everything(checkout, tmp_path):
    out = tmp_path / "out"
    proc, wall = run_script(checkout, out, LIMIT_S="1500", MARGIN_S="60", MEASURE_S="600")
    print(f"fits path: exit {proc.returncode} in {wall:.0f} s; $OUT: {sorted(p.name for p in out.iterdir())}; "
          f"said: {said(out)}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["choice.json", "gpu-headline.log", "headline.tar.gz", "packing.csv"]
    choice = json.loads((out / "choice.json").read_text())
    assert choice["fits"] and choice["seeds"] == [0]
    assert {r["status"] for r in csv.DictReader(io.StringIO((out / "packing.csv").read_text()))} == {"ok"}
    with tarfile.open(out / "headline.tar.gz") as tar:
        names = tar.getnames()
        metas = [n for n in names if n.startswith("results/recorded/tiny-headline/") and n.endswith("/meta.json")]
        assert len(metas) == 1, names
        meta = json.load(tar.extractfile(metas[0]))
    assert meta["unfinished"] == [] and sorted(r["run"] for r in meta["runs"]) == [
        "mqar/grassmann/seed0", "mqar/softmax/seed0"]
    assert "--partial" in meta["command"]
    # The measurement timed one run per process, so the study ran that: train jobs, no packs.
    logs = [n for n in names if "/logs/train" in n]
    assert sorted(logs) == [f"{tmp_path}/study/results/logs/train/mqar/{a}/seed0.log".lstrip("/")
                            for a in ("grassmann", "softmax")], logs
    assert "config/tiny-headline.yaml" in names and "results/bench/headline/choice.json" in names
    assert any("record: exit status 0" in line for line in said(out))


def test_the_does_not_fit_path_starts_nothing_and_says_so(checkout, tmp_path):
    """A limit 20 s past the stop margin: whatever the measurement finds, nothing fits."""
    out = tmp_path / "out"
    before = (checkout / "config" / "tiny-headline.yaml").read_text()
    proc, wall = run_script(checkout, out, LIMIT_S="80", MARGIN_S="60", MEASURE_S="600")
    print(f"does-not-fit path: exit {proc.returncode} in {wall:.0f} s; $OUT: {sorted(p.name for p in out.iterdir())}; "
          f"said: {said(out)}")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {"choice.json", "gpu-headline.log", "packing.csv", "headline.tar.gz"} == {p.name for p in out.iterdir()}
    assert json.loads((out / "choice.json").read_text())["fits"] is False
    assert any("started no run" in line for line in said(out))
    assert (checkout / "config" / "tiny-headline.yaml").read_text() == before
    assert not (tmp_path / "study" / "results" / "runs").exists()


def test_a_partial_record_keeps_the_finished_runs_and_names_the_others(tmp_path):
    """What the script records at its deadline (``record(partial=True)``): the runs that
    finished, with ``unfinished`` naming the others; a study with no finished run is refused,
    and without ``partial`` any unfinished run is (as ``seqmix record`` does)."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.io import FileError
    from seqmix.report.recorded import RUN_FILES, record

    config = tmp_path / "tiny-headline.yaml"
    config.write_text(TINY.format(root=tmp_path / "study").replace("seeds: [0]", "seeds: [0, 1]"))
    expansion = expand(load_study(config))
    finished = [r for r in expansion.runs if r.seed == 0]
    with pytest.raises(FileError, match="has not finished"):
        record(config, tmp_path / "recorded", partial=True)
    for run in finished:
        d = expansion.run_dir(run)
        d.mkdir(parents=True)
        for name in RUN_FILES:
            (d / name).write_text("{}")
        (d / "provenance.json").write_text(json.dumps({"device": {"name": "cpu"}, "git": {"commit": "abc", "dirty": False},
                                                       "host": "h", "training_step": {"compiled": False}}))
        (d / "metrics.json").write_text(json.dumps({"status": "ok", "wall_time_s": 1.0, "steps_completed": 4,
                                                    "params": 100}))
    with pytest.raises(FileError, match="seed1 of .* has not finished"):
        record(config, tmp_path / "recorded")
    dest = record(config, tmp_path / "recorded", partial=True)
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["unfinished"] == ["mqar/grassmann/seed1", "mqar/softmax/seed1"]
    assert sorted(r["run"] for r in meta["runs"]) == ["mqar/grassmann/seed0", "mqar/softmax/seed0"]
    assert sorted(p.name for p in (dest / "runs" / "mqar").glob("*/*")) == ["seed0", "seed0"]
