"""The SLURM profile on a real SLURM cluster: tests/cluster/slurm-up.sh brings up slurmctld,
slurmd, slurmdbd (MariaDB) and munge on localhost, and the test runs
`snakemake --profile workflow/executors/slurm` as docs/runbook/running.md's cluster section says, on what
proves the cluster path and no more: one run's data, training and evaluation, and one
analysis.

- Every job is submitted through sbatch, and what each asked SLURM for (cpus, memory, time
  limit, a GPU for training) is what its rule declares, the config's sizes included.
- The training job, held once it has written its first checkpoint (tests/harness/train.py),
  is killed there with scancel: Snakemake resubmits it, it resumes from that checkpoint and
  ends bitwise equal to an uninterrupted run. The kill waits for that event, never a clock.

Where the cluster cannot start (not root, no apt-get) the test skips; in CI
($SEQMIX_REQUIRE_SLURM=1) it fails instead. `pytest -rP tests/workflow/test_slurm.py` prints the
jobs the run submitted and their states."""

from __future__ import annotations

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

from tests.conftest import skip_or_fail, tiny_config
from tests.helpers import (
    REPO,
    copy_workflow,
    harness_env,
    run_spec_in,
    tool_env,
    wait_until_held,
    without_time,
)

pytestmark = pytest.mark.slurm

CLUSTER = REPO / "tests" / "cluster"
REQUIRE_SLURM_ENV = "SEQMIX_REQUIRE_SLURM"
SACCT_FIELDS = ["JobIDRaw", "Comment", "State", "ReqTRES", "ReqMem", "Timelimit"]


def cluster_up(environ: dict) -> subprocess.CompletedProcess:
    """tests/cluster/slurm-up.sh; a cluster that cannot start here is skip_or_fail (exit 2),
    one that fails to start a failure."""
    up = subprocess.run(["bash", str(CLUSTER / "slurm-up.sh")], capture_output=True, text=True, env=environ)
    if up.returncode == 2:
        skip_or_fail(f"no SLURM cluster: {up.stderr.strip()}", REQUIRE_SLURM_ENV)
    if up.returncode != 0:
        pytest.fail(f"tests/cluster/slurm-up.sh failed:\n{up.stderr[-4000:]}", pytrace=False)
    return up


@pytest.fixture(scope="module")
def slurm() -> dict:
    """The environment in which snakemake and the SLURM commands reach the test cluster.
    One cluster per machine: concurrent sessions wait for each other on a lock."""
    with open(os.environ.get("SEQMIX_SLURM_DIR", "/tmp/seqmix-slurm") + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        up = cluster_up(dict(os.environ))
        started_here = "already up" not in up.stderr
        conf = re.search(r"^SLURM_CONF=(.+)$", up.stdout, re.M).group(1)
        yield tool_env({"SLURM_CONF": conf})
        if started_here:
            subprocess.run(["bash", str(CLUSTER / "slurm-down.sh")], capture_output=True)


# -- what Snakemake said ---------------------------------------------------------------------


def block_of(match: re.Match) -> dict:
    fields = dict(re.findall(r"^    (\w+): (.*)$", match.group(2), re.M))
    resources = dict(item.split("=", 1) for item in fields.get("resources", "").split(", ") if "=" in item)
    return {"jobid": int(fields["jobid"]), "rule": match.group(1), "wildcards": fields.get("wildcards", ""),
            "threads": int(fields.get("threads", 1)), "mem_mb": int(resources.get("mem_mb", 0)),
            "runtime": int(resources.get("runtime", 0)), "gpu": int(resources.get("gpu", 0))}


BLOCK = re.compile(r"^rule (\w+):\n((?:    .*\n)+)", re.M)


def job_blocks(log: str) -> dict[int, dict]:
    """{snakemake job id: {rule, wildcards, threads, resources}} of every job a dry run printed."""
    return {(b := block_of(m))["jobid"]: b for m in BLOCK.finditer(log)}


def submissions(log: str) -> list[tuple[dict, str]]:
    """(the job as Snakemake printed it, SLURM job id) of every sbatch the executor plugin made,
    in order: each submission line's job is the last block before it with its job id (a
    failed job's own log, printed into the run's, holds blocks of the job run inside it)."""
    blocks = [(m.start(), block_of(m)) for m in BLOCK.finditer(log)]
    out = []
    for m in re.finditer(r"^Job (\d+) has been submitted with SLURM jobid (\d+) ", log, re.M):
        (block,) = [b for start, b in blocks if start < m.start() and b["jobid"] == int(m.group(1))][-1:]
        out.append((block, m.group(2)))
    return out


def declared(blocks: dict[int, dict]) -> dict[tuple[str, str], dict]:
    """What each job declares, keyed by (rule, wildcards)."""
    return {(b["rule"], b["wildcards"]): {k: b[k] for k in ("threads", "mem_mb", "runtime", "gpu")}
            for b in blocks.values()}


# -- what SLURM recorded ---------------------------------------------------------------------


def sacct(env: dict, ids: list[str], timeout: float = 600) -> dict[str, dict]:
    """{job id: sacct's record}, waiting until every job has reached the database in a
    final state (slurmctld sends job ends to slurmdbd asynchronously; the time limit only
    keeps a broken database from hanging the test: the wait ends at the event)."""
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


# -- running snakemake ---------------------------------------------------------------------


def cluster_snakemake(work: Path, env: dict, *args: str, targets=()) -> subprocess.Popen:
    """The README's command, in a scratch copy of the repository: output to snakemake.log.
    (Targets go first: --configfile and --set-resources take every word after them.)"""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--profile", "workflow/executors/slurm", *args]
    out = open(work / "snakemake.log", "w")
    return subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def dry_run(work: Path, env: dict, config: str, *args: str, targets=()) -> str:
    """The same config's jobs as the rules declare them, planned without submitting."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", *targets, "-n", "--configfile", config, "--cores", "2",
                           *args], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def states(env: dict, ids: list[str]) -> dict[str, str]:
    """{SLURM job id: its state}, as squeue shows ended jobs too (MinJobAge: an hour)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", ",".join(ids), "-o", "%i|%T"], capture_output=True,
                         text=True, env=env, check=True).stdout
    return dict(line.split("|") for line in out.splitlines())


def report(title: str, subs: list, records: dict, seen: dict) -> None:
    print(f"\n{title}: {len(subs)} sbatch submissions")
    for job, slurm_id in subs:
        r = records.get(slurm_id, {})
        print(f"  {slurm_id:>5} {job['rule']:<22} {job['wildcards']:<32} squeue {seen.get(slurm_id)}"
              f"; sacct {r.get('State')}; ReqTRES {r.get('ReqTRES')}; Timelimit {r.get('Timelimit')}")


# -- the test ----------------------------------------------------------------------------------

# Sizes in the config that no default has (the config's `resources` section and MQAR's own
# training and evaluation), so that a request equal to them can only have come from it.
CONFIG_RESOURCES = {"complexity": {"mem_mb": 1100, "runtime": 41}}
MQAR_RESOURCES = {"train": {"mem_mb": 1400, "runtime": 44}, "eval": {"mem_mb": 1500, "runtime": 45}}
RUN = "results/runs/mqar/softmax/seed0"
TARGETS = [f"{RUN}/eval.json", "results/analysis/complexity.csv"]  # data, train, eval; an analysis


def config_request(rule: str, wildcards: str) -> tuple[int, str] | None:
    """(MB, sacct Timelimit) the test config sets for a job of this rule, None where it
    leaves the rule to the defaults."""
    own = MQAR_RESOURCES if "task=mqar" in wildcards else {}
    size = own.get(rule) or CONFIG_RESOURCES.get(rule)
    return (size["mem_mb"], time_limit(size["runtime"])) if size else None


def cluster_config(work: Path) -> tuple[str, dict]:
    """The tiny study's MQAR task, softmax alone, checkpointed every 3 of its 12 steps."""
    cfg = tiny_config(work, None, archs=("softmax",))
    cfg["results_dir"], cfg["data"]["dir"] = "results", "data"
    cfg["resources"] = CONFIG_RESOURCES
    cfg["tasks"]["mqar"]["resources"] = MQAR_RESOURCES
    cfg["tasks"]["mqar"]["train"].update(steps=12, checkpoint_every=3, eval_every=6, log_every=3)
    (work / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    return "cluster.yaml", cfg


def held_then_cancelled(proc: subprocess.Popen, env: dict, marker: Path) -> str:
    """Wait until the training job holds (it wrote ``marker``: its first checkpoint is saved)
    and cancel it; its SLURM id. Fails if snakemake ends first."""
    wait_until_held(proc, marker, "snakemake (its training job)")
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"], capture_output=True, text=True,
                         env=env, check=True).stdout
    (job,) = [j for j, note in (line.split("|") for line in out.splitlines())
              if note == comment("train", "task=mqar, arch=softmax, seed=0")]
    subprocess.run(["scancel", job], env=env, check=True)
    return job


def test_jobs_go_through_sbatch_as_declared_and_a_cancelled_training_resumes_to_the_same_model(slurm, tmp_path):
    work = copy_workflow(tmp_path / "repo")
    config, cfg = cluster_config(work)
    planned = declared(job_blocks(dry_run(work, slurm, config, targets=TARGETS)))
    marker = tmp_path / "held"
    env = {**slurm, **harness_env(SEQMIX_TEST_HOLD=str(marker))}
    proc = cluster_snakemake(work, env, "--configfile", config, "--cores", "2", targets=TARGETS)
    try:
        cancelled = held_then_cancelled(proc, slurm, marker)
        proc.wait(timeout=1200)
    finally:
        proc.kill()
    log = (work / "snakemake.log").read_text()
    assert proc.returncode == 0, log[-6000:]

    subs = submissions(log)
    records = sacct(slurm, [s for _, s in subs])
    seen = states(slurm, [s for _, s in subs])
    report("cluster path", subs, records, seen)
    # Every job of the plan was submitted through sbatch and completed; the training job
    # twice: cancelled, then resubmitted under a new SLURM id.
    train = [s for job, s in subs if job["rule"] == "train"]
    assert len(train) == 2 and train[0] == cancelled
    assert {(job["rule"], job["wildcards"]) for job, _ in subs} == set(planned)
    assert len(subs) == len(planned) + 1 and {"data_task", "train", "eval", "complexity"} == {r for r, _ in planned}
    for job, slurm_id in subs:
        record = records[slurm_id]
        assert record["Comment"] == comment(job["rule"], job["wildcards"]), record
        if slurm_id == cancelled:
            # sacct names who cancelled it: the state the executor plugin misses (the
            # profile's status command is squeue for that reason).
            assert seen[slurm_id] == "CANCELLED" and record["State"].startswith("CANCELLED by"), record
        else:
            assert seen[slurm_id] == "COMPLETED" and record["State"] == "COMPLETED", (slurm_id, record)
    assert f"SLURM-job '{cancelled}' failed, SLURM status is: 'CANCELLED'" in log

    # What each job asked SLURM for: what its rule declares, the config's sizes included.
    from_config = set()
    for job, slurm_id in subs:
        key = (job["rule"], job["wildcards"])
        # Every job declares its memory and time (a rule without them would run with no time
        # limit on most clusters, and be killed at the partition's default on others).
        assert job["mem_mb"] > 0 and job["runtime"] > 0, f"rule {job['rule']} declares no mem_mb/runtime"
        if (size := config_request(*key)) is not None:
            assert (megabytes(records[slurm_id]["ReqMem"]), records[slurm_id]["Timelimit"]) == size, key
            from_config.add(job["rule"])
        # The profile adds the GPU for training and nothing else: threads, memory and time
        # are what the rules declare for this config (planned locally, without the profile).
        assert {**planned[key], "gpu": 1 if job["rule"] == "train" else 0} == \
            {k: job[k] for k in ("threads", "mem_mb", "runtime", "gpu")}, key
        assert requested(records[slurm_id]) == expected_request(job), (key, records[slurm_id])
    assert all(tres(records[s])["gres/gpu"] == "1" for s in train)
    # The sizes differ by rule (the rules' own, not one default for every job), and the
    # config's sizes reached SLURM for training and evaluation (MQAR's own) and an analysis.
    assert len({(job["mem_mb"], job["runtime"]) for job, _ in subs}) > 1
    assert from_config == {"train", "eval", "complexity"}

    # Resumed from the checkpoint the cancelled job wrote (step 3), ...
    metrics = json.loads((work / RUN / "metrics.json").read_text())
    assert metrics["resumed_from_steps"] == [int(marker.read_text())] == [3]
    train_log = (work / "results" / "logs" / "train" / "mqar" / "softmax" / "seed0.log").read_text()
    assert f"resuming {RUN} from step 3" in train_log
    # ... and ended bitwise equal to an uninterrupted run (trained here, without SLURM, from
    # the working directory, as the job was: by the command, which pins the study's numerics).
    reference = run_spec_in(cfg, "reference")
    proc = subprocess.run([sys.executable, "-m", "seqmix", "train", "--quiet", "--spec", reference.model_dump_json()],
                          cwd=work, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    clean = json.loads((work / reference.run_dir / "metrics.json").read_text())
    assert clean["resumed_from_steps"] == [] and without_time(metrics) == without_time(clean)
    a = torch.load(work / RUN / "model.pt", weights_only=True)["model"]
    b = torch.load(work / reference.run_dir / "model.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_profile_sizes_no_job_itself():
    # Cpus, memory and time come from the rules; the profile holds only site settings and
    # the GPU switch for training.
    profile = yaml.safe_load((REPO / "workflow" / "executors" / "slurm" / "config.yaml").read_text())
    assert "default-resources" not in profile and "set-resources" in profile and "set-threads" not in profile
    assert profile["set-resources"] == {"train": {"gpu": 1}}
    assert profile["executor"] == "slurm" and profile["retries"] >= 1 and profile["rerun-incomplete"]


def test_every_rule_declares_its_memory_and_time_and_the_config_sets_them(tmp_path):
    # What a cluster is asked for, rule by rule, for the whole tiny DAG (planned here; the
    # test above submits a few of its jobs): a rule without mem_mb and runtime would run with
    # no time limit on most clusters, and be killed at the partition's default on others.
    cfg = tiny_config(tmp_path, None)
    cfg["resources"] = {"report": {"mem_mb": 1300, "runtime": 43}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    blocks = job_blocks(dry_run(REPO, tool_env(), str(tmp_path / "c.yaml"), "--forceall", "--directory", str(tmp_path)))
    rules = {b["rule"] for b in blocks.values()} - {"all", "latest_report"}  # no command (all), local (a copy)
    assert {"data_task", "train", "eval", "complexity", "collect", "report", "notebook_claims"} <= rules
    for b in blocks.values():
        if b["rule"] in rules:
            assert b["mem_mb"] > 0 and b["runtime"] > 0, f"rule {b['rule']} declares no mem_mb/runtime"
    assert len({(b["mem_mb"], b["runtime"]) for b in blocks.values() if b["rule"] in rules}) > 1  # each rule its own
    assert {(b["mem_mb"], b["runtime"]) for b in blocks.values() if b["rule"] == "report"} == {(1300, 43)}


def test_the_readmes_override_switches_the_gpu_request_off(slurm, tmp_path):
    # A CPU-only partition: `--set-resources train:gpu=0` over the profile's gpu=1.
    work = copy_workflow(tmp_path / "repo")
    config, _ = cluster_config(work)
    for extra, gpu in (((), 1), (("--set-resources", "train:gpu=0"), 0)):
        blocks = job_blocks(dry_run(work, slurm, config, "--profile", "workflow/executors/slurm", *extra,
                                    targets=[f"{RUN}/metrics.json"]))
        assert [b["gpu"] for b in blocks.values() if b["rule"] == "train"] == [gpu], extra


# -- where no cluster can start ----------------------------------------------------------------


@pytest.mark.parametrize("required", [False, True])
def test_without_a_cluster_the_test_skips_locally_and_fails_in_ci(tmp_path, monkeypatch, required):
    # One of the cluster's ports taken by another program: slurm-up.sh cannot start a cluster
    # (exit 2) and says why; the fixture skips on that locally and fails in CI.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        environ = {k: v for k, v in os.environ.items() if k != REQUIRE_SLURM_ENV}
        environ.update(SEQMIX_SLURM_DIR=str(tmp_path / "cluster"), SEQMIX_SLURM_PORT_BASE=str(taken.getsockname()[1]))
        monkeypatch.setenv(REQUIRE_SLURM_ENV, "1" if required else "0")
        with pytest.raises(pytest.fail.Exception if required else pytest.skip.Exception) as e:
            cluster_up(environ)
    assert str(e.value).startswith("no SLURM cluster: slurm-up: cannot start a cluster here")
    assert (f"({REQUIRE_SLURM_ENV}=1: this run must test the cluster path)" in str(e.value)) == required
