"""GPU slots (seqmix/slots.py): several training and evaluation jobs on one GPU, each pinned to
one of the machine's GPUs by CUDA_VISIBLE_DEVICES, fake GPUs here; through the DAG, in a
working directory where another study was built first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from seqmix.slots import acquire, gpus, slot_dir
from tests.conftest import tiny_config
from tests.helpers import REPO, harness_env, slot_env, snakemake, tool_env


def test_the_gpus_come_from_the_setting_then_the_visible_devices():
    assert gpus({"SEQMIX_GPUS": "a, b", "CUDA_VISIBLE_DEVICES": "3"}) == ["a", "b"]
    assert gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpus({"CUDA_VISIBLE_DEVICES": ""}) == []  # every GPU hidden: nothing to pin to
    assert slot_dir({"SEQMIX_SLOT_DIR": "/x"}) == Path("/x")


def test_slots_fill_every_gpu_before_a_second_job_goes_to_any():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        held = [acquire(["g0", "g1"], Path(d)) for _ in range(5)]
        assert [(g, i) for g, i, _ in held] == [("g0", 0), ("g1", 0), ("g0", 1), ("g1", 1), ("g0", 2)]
        os.close(held[1][2])  # a job on g1 ends: its slot is the next one taken
        assert acquire(["g0", "g1"], Path(d))[:2] == ("g1", 0)


def test_a_job_runs_pinned_and_holds_its_slot_until_it_ends_however_it_ends(tmp_path):
    show = [sys.executable, "-m", "seqmix.slots", sys.executable, "-c",
            "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['SEQMIX_GPU_SLOT'])"]
    env = tool_env(slot_env(tmp_path, SEQMIX_GPUS="a,b"))
    assert subprocess.run(show, env=env, capture_output=True, text=True).stdout.split() == ["a", "a/0"]
    # A job that says which slot it holds, then sleeps on in it (exec keeps the lock).
    sleeper = subprocess.Popen([sys.executable, "-m", "seqmix.slots", "sh", "-c", 'echo "$SEQMIX_GPU_SLOT"; exec sleep 60'],
                               env=env, stdout=subprocess.PIPE, text=True)
    try:
        held = sleeper.stdout.readline().strip()
        assert held == "a/0"
        assert subprocess.run(show, env=env, capture_output=True, text=True).stdout.split() == ["b", "b/0"]
    finally:
        sleeper.kill()  # killed, not ended: its slot is free all the same
        sleeper.wait()
    assert subprocess.run(show, env=env, capture_output=True, text=True).stdout.split() == ["a", "a/0"]
    # No GPU: the command runs as it is, nothing pinned.
    bare = subprocess.run([sys.executable, "-m", "seqmix.slots", sys.executable, "-c",
                           "import os; print(os.environ.get('SEQMIX_GPU_SLOT'))"],
                          env=tool_env(slot_env(tmp_path, CUDA_VISIBLE_DEVICES="")), capture_output=True, text=True)
    assert bare.stdout.split() == ["None"]


def test_the_dag_packs_jobs_on_each_gpu_in_a_checkout_where_another_study_was_built(tmp_path):
    """Two fake GPUs, two slots each (gpu_slots=4): the four training jobs of a study, each
    held once it has its slot until all four have one (tests/harness/train.py), so that they
    run at once however loaded the machine: they spread over both GPUs, two on each. In a
    working directory where another study was built first, whose outputs stay as they were
    and which has nothing left to do afterwards."""
    work = tmp_path / "work"
    work.mkdir()
    configs = {}
    for name, archs, seeds in (("other", ("softmax",), (0,)), ("packed", ("softmax", "grassmann"), (0, 1))):
        cfg = tiny_config(work / name, None, archs=archs, seeds=seeds)
        cfg["profile"], cfg["results_dir"], cfg["data"]["dir"] = name, f"results/{name}", f"data/{name}"
        for section in cfg["tasks"].values():
            section["train"]["steps"] = 3
        configs[name] = work / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(cfg))
    env = slot_env(tmp_path, SEQMIX_GPUS="fake0,fake1")
    snakemake(REPO, work, "--configfile", str(configs["other"]), "--", "runs", env=env)
    other = {p: p.stat().st_mtime_ns for p in (work / "results" / "other").rglob("*") if p.is_file()}
    held = tmp_path / "held"
    snakemake(REPO, work, "--cores", "4", "--resources", "gpu_slots=4", "--set-threads", "train=1", "eval=1",
              "--configfile", str(configs["packed"]), "--", "runs",
              env={**env, **harness_env(SEQMIX_TEST_BARRIER=str(held), SEQMIX_TEST_BARRIER_COUNT="4")})
    slots = sorted(json.loads(p.read_text())["device"]["gpu_slot"]
                   for p in (work / "results" / "packed").rglob("provenance.json"))
    assert slots == ["fake0/0", "fake0/1", "fake1/0", "fake1/1"], slots  # two at once on each GPU, never three
    assert sorted((held / str(k)).read_text() for k in range(4)) == slots  # the slots the four held together
    assert {p: p.stat().st_mtime_ns for p in other} == other, "the other study's outputs changed"
    rest = snakemake(REPO, work, "-n", "--configfile", str(configs["other"]), "--", "runs", env=env)
    assert "Nothing to be done" in rest.stdout + rest.stderr
