"""`python -m seqmix verify` (seqmix.report.verify): a portable recording's runs trained again here
give the same bits (hashes.json, log.csv and eval.json, wall-clock fields aside), and each
verification is kept beside the recording; a recording altered by one byte is refused naming
the file, before anything trains; a difference is found and named; a native recording is
refused with its own status; the budget picks the least verified runs that fit. CI verifies
one recorded run on whatever host it runs (``test_one_recorded_run_verifies_on_this_host``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqmix.cli import main as cli
from seqmix.report import verify as verify_module
from seqmix.report.recorded import RECORDED_DIR, VERIFICATIONS, last_verified, read_json
from seqmix.report.verify import DIFFERS, NATIVE, NOTHING, chosen_runs, verify, without_timing
from tests.recording import record, rehash, tiny_study


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """The tiny study trained by `python -m seqmix` processes and recorded (kept pristine: tests copy it)."""
    root = tmp_path_factory.mktemp("verify")
    return record(tiny_study(root), root / "recorded")


@pytest.fixture
def copy(recording, tmp_path) -> Path:
    dest = tmp_path / "recorded" / recording.parent.name / recording.name
    shutil.copytree(recording, dest)
    return dest


def lines_of(call) -> tuple[int, list[str]]:
    out: list[str] = []
    return call(out.append), out


def committed_candidate() -> tuple[Path, str] | None:
    """A committed portable recording's shortest run whose code digest is this checkout's, if any."""
    for meta_path in sorted(RECORDED_DIR.glob("*/*/meta.json")):
        path, meta = meta_path.parent, read_json(meta_path)
        if "sha256" not in meta or verify_module.native_reason(meta):
            continue
        for r in sorted(meta["runs"], key=lambda r: r["wall_time_s"]):
            run_dir = path / "runs" / r["run"]
            if verify_module.code_moved(run_dir, read_json(run_dir / "config.json")) is None:
                return path, r["run"]
    return None


def test_one_recorded_run_verifies_on_this_host(recording, tmp_path):
    # A committed recording's run where one is of this checkout's code, else the tiny one's:
    # either way one run is trained again and compared, never nothing.
    found = committed_candidate()
    source, run = found if found else (recording, "mqar/grassmann/seed0")
    dest = tmp_path / source.parent.name / source.name
    shutil.copytree(source, dest)  # its verifications.jsonl is written in the copy, not the checkout
    kept = dest / VERIFICATIONS
    before = kept.read_text().splitlines() if kept.exists() else []  # a committed one has its history
    status, out = lines_of(lambda o: verify(str(dest), run=run, out=o))
    print("\n".join(out))
    assert status == 0, out
    assert out[1].startswith(f"  {run}: same bits (weights sha256 ") and len(out) == 3
    after = kept.read_text().splitlines()
    assert after[:len(before)] == before and len(after) == len(before) + 1
    entry = json.loads(after[-1])
    assert entry["runs"][run]["result"] == "same" and entry["numerics"] == "portable" and entry["commit"]
    assert last_verified(dest).startswith(f"last verified on {entry['host']} ") and "1 same of 1 runs" in last_verified(dest)


def test_every_run_of_a_tiny_recording_verifies_and_each_verification_is_kept(copy, capsys):
    assert cli(["verify", str(copy)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("training 2 of 2 recorded runs again")
    assert sorted(line.split(":")[0].strip() for line in out[1:3]) == ["mqar/grassmann/seed0", "mqar/softmax/seed0"]
    assert all("same bits" in line for line in out[1:3]) and "2 same of 2 runs chosen" in out[3]
    assert cli(["verify", str(copy), "--run", "mqar/softmax/seed0"]) == 0
    history = [json.loads(line) for line in (copy / VERIFICATIONS).read_text().splitlines()]
    assert [sorted(h["runs"]) for h in history] == [["mqar/grassmann/seed0", "mqar/softmax/seed0"], ["mqar/softmax/seed0"]]
    assert {"host", "cpu", "date", "commit", "numerics", "torch", "summary"} <= set(history[-1])


@pytest.mark.parametrize("name", ["eval.json", "log.csv", "hashes.json"])
def test_a_recording_altered_by_one_byte_is_refused_naming_the_file(copy, capsys, name):
    target = copy / "runs" / "mqar" / "softmax" / "seed0" / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 1
    target.write_bytes(bytes(data))
    assert cli(["verify", str(copy)]) == 4
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"refused: {target}" in err and "altered after recording" in err
    assert not (copy / VERIFICATIONS).exists()  # refused before anything was trained


def test_a_result_that_differs_is_found_and_named(copy, capsys):
    # The recorded eval.json changed and meta.json's sha256 made to match: only training again catches it.
    path = copy / "runs" / "mqar" / "softmax" / "seed0" / "eval.json"
    evaluation = json.loads(path.read_text())
    split = next(iter(evaluation["splits"]))
    evaluation["splits"][split]["loss"] += 1e-6
    path.write_text(json.dumps(evaluation, indent=2))
    rehash(copy)
    assert cli(["verify", str(copy), "--run", "mqar/softmax/seed0"]) == DIFFERS
    out = capsys.readouterr().out
    assert "mqar/softmax/seed0: DIFFERS: eval.json line " in out
    assert "first difference: mqar/softmax/seed0: DIFFERS: eval.json" in out
    (entry,) = [json.loads(line) for line in (copy / VERIFICATIONS).read_text().splitlines()]
    assert entry["runs"]["mqar/softmax/seed0"]["result"] == "differs"


def test_a_native_recording_is_refused_with_its_own_status(copy, capsys):
    meta = json.loads((copy / "meta.json").read_text())
    meta["device"] = "NVIDIA H100 80GB HBM3"
    for r in meta["runs"]:
        r.update(device="cuda", numerics="native")
    (copy / "meta.json").write_text(json.dumps(meta))
    assert cli(["verify", str(copy)]) == NATIVE
    out = capsys.readouterr().out
    assert "not verifiable here: recording made on NVIDIA H100 80GB HBM3 under native numerics" in out
    assert "only portable recordings" in out and not (copy / VERIFICATIONS).exists()


def test_runs_of_other_code_are_not_trained_again(copy, capsys, monkeypatch):
    monkeypatch.setattr(verify_module, "code_moved", lambda d, recorded: "not trained again: its code digest x")
    assert cli(["verify", str(copy)]) == NOTHING
    assert capsys.readouterr().out.count("not trained again") == 2


def test_the_budget_picks_the_least_verified_runs_that_fit(copy):
    meta = read_json(copy / "meta.json")
    costs = {r["run"]: verify_module.recorded_time(copy, r) for r in meta["runs"]}
    order = [r["run"] for r in meta["runs"]]
    assert [r["run"] for r in chosen_runs(copy, meta, None, sum(costs.values()))] == order
    # Room for one run: the first never verified, then, once it has been, the other.
    budget = max(costs.values())
    (first,) = chosen_runs(copy, meta, None, budget)
    assert first["run"] == order[0]
    (copy / VERIFICATIONS).write_text(json.dumps({"runs": {order[0]: {}}}) + "\n")
    assert [r["run"] for r in chosen_runs(copy, meta, None, budget)] == [order[1]]
    assert chosen_runs(copy, meta, None, min(costs.values()) / 2) == []
    status, out = lines_of(lambda o: verify(str(copy), budget=min(costs.values()) / 2, out=o))
    assert status == NOTHING and "no run fits the budget" in out[0]


def test_wall_clock_fields_are_all_that_is_left_out_of_the_comparison():
    log = b"step,phase,loss,elapsed_s\n1,train,2.5,0.31\n"
    assert without_timing("log.csv", log) == b"step,phase,loss\n1,train,2.5"
    assert without_timing("log.csv", log.replace(b"0.31", b"9.99")) == without_timing("log.csv", log)
    assert without_timing("log.csv", log.replace(b"2.5", b"2.50")) != without_timing("log.csv", log)
    a, b = ({"splits": {"test": {"loss": 1.0}}, "eval_time_s": t} for t in (1.0, 2.0))
    assert without_timing("eval.json", json.dumps(a).encode()) == without_timing("eval.json", json.dumps(b).encode())
    assert without_timing("eval.json", json.dumps({**a, "splits": {}}).encode()) != without_timing(
        "eval.json", json.dumps(a).encode())
