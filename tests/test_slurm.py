"""The SLURM profile on a real SLURM cluster: tests/cluster/slurm-up.sh brings up slurmctld,
slurmd, slurmdbd (MariaDB) and munge on localhost, and these tests run
`snakemake --profile workflow/executors/slurm` as the README's cluster section says.

- The tiny DAG reaches report.pdf with every job submitted through sbatch, and what each job
  asked SLURM for (cpus, memory, time limit, a GPU for training) is what its rule declares.
- A training job killed with scancel mid-run is resubmitted, resumes from its checkpoint
  and ends bitwise equal to an uninterrupted run; the GPU request is switched off there.

Where the cluster cannot start (not root, no apt-get) the tests skip; in CI
($SEQMIX_REQUIRE_SLURM=1) they fail instead. `pytest -rP tests/test_slurm.py` prints the
jobs each run submitted and the states it saw."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import REPO, skip_or_fail, tiny_config
from .test_dag import copy_workflow

pytestmark = pytest.mark.slurm

CLUSTER = REPO / "tests" / "cluster"
REQUIRE_SLURM_ENV = "SEQMIX_REQUIRE_SLURM"
# The only metrics that differ between a resumed and an uninterrupted run.
TIME_FIELDS = {"wall_time_s", "resumed_from_steps"}
SACCT_FIELDS = ["JobIDRaw", "Comment", "State", "ReqTRES", "ReqMem", "Timelimit"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict:
    """The environment in which snakemake and the SLURM commands reach the test cluster.
    One cluster per machine: concurrent sessions wait for each other on a lock."""
    lock = open(os.environ.get("SEQMIX_SLURM_DIR", "/tmp/seqmix-slurm") + ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    up = subprocess.run(["bash", str(CLUSTER / "slurm-up.sh")], capture_output=True, text=True)
    if up.returncode == 2:
        lock.close()
        skip_or_fail(f"no SLURM cluster: {up.stderr.strip()}", REQUIRE_SLURM_ENV, "the cluster path")
    if up.returncode != 0:
        lock.close()
        pytest.fail(f"tests/cluster/slurm-up.sh failed:\n{up.stderr[-4000:]}", pytrace=False)
    started_here = "already up" not in up.stderr
    conf = re.search(r"^SLURM_CONF=(.+)$", up.stdout, re.M).group(1)
    env = {**os.environ, "SLURM_CONF": conf,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    yield env
    if started_here:
        subprocess.run(["bash", str(CLUSTER / "slurm-down.sh")], capture_output=True)
    lock.close()


# -- what Snakemake said ---------------------------------------------------------------------


def job_blocks(log: str) -> dict[int, dict]:
    """{snakemake job id: {rule, wildcards, threads, resources}} of every job a run printed
    (a resubmitted job prints its block again, with the same id)."""
    jobs = {}
    for m in re.finditer(r"^rule (\w+):\n((?:    .*\n)+)", log, re.M):
        fields = dict(re.findall(r"^    (\w+): (.*)$", m.group(2), re.M))
        resources = dict(item.split("=", 1) for item in fields.get("resources", "").split(", ") if "=" in item)
        jobs[int(fields["jobid"])] = {
            "rule": m.group(1), "wildcards": fields.get("wildcards", ""),
            "threads": int(fields.get("threads", 1)),
            "mem_mb": int(resources.get("mem_mb", 0)), "runtime": int(resources.get("runtime", 0)),
            "gpu": int(resources.get("gpu", 0)),
        }
    return jobs


def submissions(log: str) -> list[tuple[int, str]]:
    """(snakemake job id, SLURM job id) of every sbatch the executor plugin made, in order."""
    return [(int(a), b) for a, b in re.findall(r"^Job (\d+) has been submitted with SLURM jobid (\d+) ", log, re.M)]


def declared(blocks: dict[int, dict]) -> dict[tuple[str, str], dict]:
    """What each job declares, keyed by (rule, wildcards)."""
    return {(b["rule"], b["wildcards"]): {k: b[k] for k in ("threads", "mem_mb", "runtime", "gpu")}
            for b in blocks.values()}


# -- what SLURM recorded ---------------------------------------------------------------------


def sacct(env: dict, ids: list[str], timeout: float = 60) -> dict[str, dict]:
    """{job id: sacct's record}, waiting until every job has reached the database in a
    final state (slurmctld sends job ends to slurmdbd asynchronously)."""
    deadline = time.time() + timeout
    while True:
        out = subprocess.run(["sacct", "-X", "-P", "-n", "-j", ",".join(ids), f"--format={','.join(SACCT_FIELDS)}"],
                             capture_output=True, text=True, env=env, check=True).stdout
        rows = {r["JobIDRaw"]: r for r in (dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines())}
        final = all(rows.get(i, {}).get("State", "").split()[0:1] in (["COMPLETED"], ["CANCELLED"], ["FAILED"])
                    for i in ids)
        if final or time.time() > deadline:
            return rows
        time.sleep(1)


def tres(record: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in record["ReqTRES"].split(",") if item)


def megabytes(value: str) -> int:
    number, unit = re.fullmatch(r"([\d.]+)([KMGT])", value).groups()
    return round(float(number) * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[unit])


def time_limit(minutes: int) -> str:
    """sacct's Timelimit for a --time of this many minutes: [D-]HH:MM:SS."""
    days, rest = divmod(minutes, 24 * 60)
    clock = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{clock}" if days else clock


def comment(rule: str, wildcards: str) -> str:
    """The --comment the executor plugin gives a job: its rule and wildcard values."""
    values = "_".join(v.split("=", 1)[1] for v in wildcards.split(", ")) if wildcards else ""
    return f"rule_{rule}_wildcards_{values.replace('/', '_')}" if values else f"rule_{rule}"


def requested(record: dict) -> dict:
    """What a job asked SLURM for, in the rules' units."""
    t = tres(record)
    return {"cpus": int(t["cpu"]), "mem_mb": megabytes(t["mem"]), "timelimit": record["Timelimit"],
            "gpus": int(t.get("gres/gpu", 0))}


def expected_request(job: dict) -> dict:
    # The plugin asks for --cpus-per-task=threads, or --cpus-per-gpu=threads with --gpus.
    return {"cpus": job["threads"] * max(job["gpu"], 1), "mem_mb": job["mem_mb"],
            "timelimit": time_limit(job["runtime"]), "gpus": job["gpu"]}


# -- running snakemake -----------------------------------------------------------------------


def cluster_snakemake(work: Path, env: dict, *args: str, targets=()) -> subprocess.Popen:
    """The README's command, in a scratch copy of the repository: output to snakemake.log.
    (Targets go first: --configfile and --set-resources take every word after them.)"""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--profile", "workflow/executors/slurm", *args]
    out = open(work / "snakemake.log", "w")
    return subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def watch(proc: subprocess.Popen, env: dict, timeout: float, step=None) -> dict[str, list[str]]:
    """Wait for snakemake, polling squeue: {SLURM job id: the states seen, in order}. `step`,
    if given, is called with them on every poll."""
    seen: dict[str, list[str]] = {}
    deadline = time.time() + timeout
    while proc.poll() is None:
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"snakemake did not finish within {timeout} s")
        out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T"], capture_output=True, text=True,
                             env=env).stdout
        for line in out.splitlines():
            job, state = line.split("|")
            if not seen.get(job) or seen[job][-1] != state:
                seen.setdefault(job, []).append(state)
        if step:
            step(seen)
        time.sleep(0.5)
    return seen


def dry_run(work: Path, env: dict, config: str, *targets: str) -> str:
    """The same config's jobs as the rules declare them, planned locally without the profile."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", config, "--cores", "2", *targets],
                          cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def report(title: str, blocks: dict, subs: list, records: dict, seen: dict) -> None:
    print(f"\n{title}: {len(subs)} sbatch submissions")
    for sm_id, slurm_id in subs:
        b, r = blocks[sm_id], records.get(slurm_id, {})
        print(f"  {slurm_id:>5} {b['rule']:<22} {b['wildcards']:<32} states seen {'>'.join(seen.get(slurm_id, []))}"
              f"; sacct {r.get('State')}; ReqTRES {r.get('ReqTRES')}; Timelimit {r.get('Timelimit')}")


# -- the tests -------------------------------------------------------------------------------


def write_config(work: Path, cfg: dict) -> str:
    cfg["results_dir"], cfg["data"]["dir"] = "results", "data"
    (work / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    return "cluster.yaml"


@pytest.fixture(scope="module")
def dag_run(slurm, mirror, tmp_path_factory):
    """The tiny DAG of tests/test_dag.py (three tasks, softmax and Grassmann) to report.pdf
    through SLURM with the profile as it is, the GPU request on."""
    work = copy_workflow(tmp_path_factory.mktemp("slurm") / "repo")
    cfg = tiny_config(work, mirror)
    cfg.update(resources=CONFIG_RESOURCES)
    cfg["tasks"]["mqar"]["resources"] = MQAR_RESOURCES
    config = write_config(work, cfg)
    planned = declared(job_blocks(dry_run(work, slurm, config)))
    planned.pop(("all", ""))  # the target rule: no command, nothing to submit
    planned.pop(("latest_report", ""))  # a local rule (a copy): Snakemake runs it itself
    started = time.time()
    proc = cluster_snakemake(work, slurm, "--configfile", config, "--cores", "2")
    seen = watch(proc, slurm, timeout=1800)
    log = (work / "snakemake.log").read_text()
    assert proc.returncode == 0, log[-6000:]
    print(f"\ntiny DAG through SLURM: {time.time() - started:.0f} s")
    return work, log, planned, seen


# Sizes in the config that no default has (the config's `resources` section and MQAR's own
# training and evaluation), so that a request equal to them can only have come from it.
CONFIG_RESOURCES = {"train": {"mem_mb": 1100, "runtime": 41}, "eval": {"mem_mb": 1200, "runtime": 42},
                    "report": {"mem_mb": 1300, "runtime": 43}}
MQAR_RESOURCES = {"train": {"mem_mb": 1400, "runtime": 44}, "eval": {"mem_mb": 1500, "runtime": 45}}


def config_request(rule: str, wildcards: str) -> tuple[int, str] | None:
    """(MB, sacct Timelimit) the test config sets for a job of this rule, None where it
    leaves the rule to the defaults."""
    own = MQAR_RESOURCES if "task=mqar" in wildcards else {}
    size = own.get(rule) or CONFIG_RESOURCES.get(rule)
    return (size["mem_mb"], time_limit(size["runtime"])) if size else None


def test_the_dag_reaches_the_report_through_sbatch(dag_run, slurm):
    work, log, planned, seen = dag_run
    pdf = work / "results" / "report" / "report.pdf"
    assert pdf.exists() and pdf.stat().st_size > 10_000
    blocks, subs = job_blocks(log), submissions(log)
    records = sacct(slurm, [s for _, s in subs])
    report("tiny DAG", blocks, subs, records, seen)
    # Every job of the plan was submitted through sbatch, once, and ran to completion.
    assert {(blocks[j]["rule"], blocks[j]["wildcards"]) for j, _ in subs} == set(planned)
    assert len(subs) == len(planned) > 10
    for sm_id, slurm_id in subs:
        record = records[slurm_id]
        assert record["State"] == "COMPLETED", (slurm_id, record)
        assert record["Comment"] == comment(blocks[sm_id]["rule"], blocks[sm_id]["wildcards"]), record
        assert seen[slurm_id][-1] == "COMPLETED", (slurm_id, seen[slurm_id])


def test_each_job_asked_slurm_for_what_its_rule_declares(dag_run, slurm):
    _, log, planned, _ = dag_run
    blocks, subs = job_blocks(log), submissions(log)
    records = sacct(slurm, [s for _, s in subs])
    from_config = set()
    for sm_id, slurm_id in subs:
        job = blocks[sm_id]
        key = (job["rule"], job["wildcards"])
        # Every job declares its memory and time (a rule without them would run with no time
        # limit on most clusters, and be killed at the partition's default on others).
        assert job["mem_mb"] > 0 and job["runtime"] > 0, f"rule {job['rule']} declares no mem_mb/runtime"
        if (size := config_request(*key)) is not None:
            assert (megabytes(records[slurm_id]["ReqMem"]), records[slurm_id]["Timelimit"]) == size, key
            from_config.add(key)
        # The profile adds the GPU for training and nothing else: threads, memory and time
        # are what the rules declare for this config (planned locally, without the profile).
        assert {**planned[key], "gpu": 1 if job["rule"] == "train" else 0} == \
            {k: job[k] for k in ("threads", "mem_mb", "runtime", "gpu")}, key
        assert requested(records[slurm_id]) == expected_request(job), (key, records[slurm_id])
        assert records[slurm_id]["ReqMem"] and megabytes(records[slurm_id]["ReqMem"]) == job["mem_mb"]
    train = [records[s] for j, s in subs if blocks[j]["rule"] == "train"]
    assert train and all(tres(r)["gres/gpu"] == "1" for r in train)
    # The sizes differ by rule (the rules' own, not one default for every job), and the
    # config's sizes reached SLURM for training, evaluation (MQAR's own) and the report.
    assert len({(blocks[j]["mem_mb"], blocks[j]["runtime"]) for j, _ in subs}) > 1
    assert {rule for rule, _ in from_config} == {"train", "eval", "report"}
    assert {w for rule, w in from_config if rule == "train" and "task=mqar" in w}


def test_the_profile_sizes_no_job_itself():
    # Cpus, memory and time come from the rules; the profile holds only site settings and
    # the GPU switch for training.
    profile = yaml.safe_load((REPO / "workflow" / "executors" / "slurm" / "config.yaml").read_text())
    assert "default-resources" not in profile and "set-threads" not in profile
    assert profile["set-resources"] == {"train": {"gpu": 1}}
    assert profile["executor"] == "slurm" and profile["retries"] >= 1 and profile["rerun-incomplete"]


KILL_SETTINGS = dict(steps=2000, checkpoint_every=50, eval_every=500, log_every=50)


def uninterrupted(work: Path, cfg: dict) -> Path:
    """The same run trained in one go, without SLURM, in work/reference."""
    from seqmix.study.load import validate_study
    from seqmix.study.table import expand

    ref = copy.deepcopy(cfg)
    ref["results_dir"] = "reference"
    spec = expand(validate_study(ref)).run_spec("mqar", "softmax", 0)
    proc = subprocess.run([sys.executable, "-m", "seqmix", "train", "--quiet", "--spec", spec.model_dump_json()],
                          cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work / spec.run_dir


def test_a_training_job_killed_with_scancel_resumes_to_the_same_model(slurm, tmp_path):
    work = copy_workflow(tmp_path / "repo")
    cfg = tiny_config(work, None, archs=("softmax",))
    cfg["tasks"]["mqar"]["train"].update(KILL_SETTINGS)
    config = write_config(work, cfg)
    run = work / "results" / "runs" / "mqar" / "softmax" / "seed0"
    ckpt = run / "checkpoints" / "last.pt"
    killed: dict = {}

    def kill_once_checkpointed(seen):
        # The training job, once it has written a checkpoint and before it ends.
        if killed or not ckpt.exists():
            return
        out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"], capture_output=True, text=True,
                             env=slurm).stdout
        for line in out.splitlines():
            job, note = line.split("|")
            if note == comment("train", "task=mqar, arch=softmax, seed=0"):
                subprocess.run(["scancel", job], env=slurm, check=True)
                killed.update(job=job, metrics_existed=(run / "metrics.json").exists())

    # The GPU switch off (a CPU-only partition): the README's override.
    proc = cluster_snakemake(work, slurm, "--configfile", config, "--cores", "2", "--set-resources", "train:gpu=0",
                             targets=[str(run.relative_to(work) / "metrics.json")])
    seen = watch(proc, slurm, timeout=1200, step=kill_once_checkpointed)
    log = (work / "snakemake.log").read_text()
    assert proc.returncode == 0, log[-6000:]
    assert killed, "the training job ended before it could be killed; make it longer"
    assert not killed["metrics_existed"]

    blocks, subs = job_blocks(log), submissions(log)
    train = [s for j, s in subs if blocks[j]["rule"] == "train"]
    records = sacct(slurm, [s for _, s in subs])
    report("scancel", blocks, subs, records, seen)
    # Killed, seen cancelled, resubmitted under a new SLURM id, which completed.
    assert train[0] == killed["job"] and len(train) == 2
    assert seen[train[0]][-1] == "CANCELLED" and seen[train[1]][-1] == "COMPLETED"
    assert f"SLURM-job '{train[0]}' failed, SLURM status is: 'CANCELLED'" in log
    # sacct names who cancelled it: the state the executor plugin misses (the profile's
    # status command is squeue for that reason).
    assert records[train[0]]["State"].startswith("CANCELLED by") and records[train[1]]["State"] == "COMPLETED"
    assert all("gres/gpu" not in tres(records[s]) for s in train)

    # Resumed from the checkpoint the killed job wrote, ...
    metrics = json.loads((run / "metrics.json").read_text())
    (step,) = metrics["resumed_from_steps"]
    assert 0 < step < KILL_SETTINGS["steps"] and step % KILL_SETTINGS["checkpoint_every"] == 0
    train_log = (work / "results" / "logs" / "train" / "mqar" / "softmax" / "seed0.log").read_text()
    assert f"resuming results/runs/mqar/softmax/seed0 from step {step}" in train_log
    print(f"\nscancel: job {train[0]} cancelled, job {train[1]} resumed from step {step} of {KILL_SETTINGS['steps']}")
    # ... and ended bitwise equal to an uninterrupted run.
    ref = uninterrupted(work, cfg)
    clean = json.loads((ref / "metrics.json").read_text())
    assert clean["resumed_from_steps"] == []
    assert {k: v for k, v in metrics.items() if k not in TIME_FIELDS} == \
        {k: v for k, v in clean.items() if k not in TIME_FIELDS}
    a = torch.load(run / "model.pt", weights_only=True)["model"]
    b = torch.load(ref / "model.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- where no cluster can start ----------------------------------------------------------------


def run_without_a_cluster(tmp_path, **env) -> subprocess.CompletedProcess:
    """The scancel test in a pytest of its own, with one of the cluster's ports taken by
    another program: slurm-up.sh cannot start a cluster (exit 2)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        environ = {k: v for k, v in os.environ.items() if k != REQUIRE_SLURM_ENV}
        environ.update(SEQMIX_SLURM_DIR=str(tmp_path / "cluster"), SEQMIX_SLURM_PORT_BASE=str(taken.getsockname()[1]),
                       **env)
        test = f"{Path(__file__).relative_to(REPO)}::test_a_training_job_killed_with_scancel_resumes_to_the_same_model"
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                              cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def test_without_a_cluster_the_tests_skip_locally(tmp_path):
    proc = run_without_a_cluster(tmp_path)
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]
    assert "no SLURM cluster: slurm-up: cannot start a cluster here" in proc.stdout


def test_without_a_cluster_the_tests_fail_in_ci(tmp_path):
    proc = run_without_a_cluster(tmp_path, **{REQUIRE_SLURM_ENV: "1"})
    assert proc.returncode != 0 and "1 error" in proc.stdout, proc.stdout[-2000:]
    assert f"{REQUIRE_SLURM_ENV}=1" in proc.stdout
