"""Recorded studies of any profile (seqmix.report.recorded, seqmix.report.collect): a run keeps
its final weights' and optimiser state's sha256 (hashes.json); a recording keeps every file's
sha256; a study's ``recordings`` name the studies its report reads, checked at validation; one
rule accepts a recorded run (its files as recorded, its config.json and code digest what its
profile resolves to now), and the accepted runs join runs.csv with the recording named, every
other one left out with one line saying which and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from seqmix.errors import ConfigError
from seqmix.report import recorded as recorded_module
from seqmix.report.collect import RECORDINGS, collect
from seqmix.report.quality_tables import recordings_macros
from seqmix.report.recorded import RUN_FILES, read_named, read_recordings, recorded_runs
from seqmix.train.hashes import HASHES, state_sha256
from tests.conftest import tiny_config
from tests.recording import PROFILE, record, tiny_study

RUNS = ["mqar/grassmann/seed0", "mqar/softmax/seed0"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    return tiny_study(tmp_path_factory.mktemp("recordings"))


@pytest.fixture(scope="module")
def recording(study) -> Path:
    return record(study, study.parent / "recorded")


@pytest.fixture
def copy(recording, tmp_path) -> Path:
    """A copy of the recording (results/recorded/<profile>/<dir>) to alter; tmp_path/recorded is its recorded_dir."""
    dest = tmp_path / "recorded" / recording.parent.name / recording.name
    shutil.copytree(recording, dest)
    return dest


def collected(tmp_path: Path, config_dir: Path, own: list[Path] = (), recorded_dir: Path | None = None):
    """runs.csv and recordings.json of ``own`` runs and the study's recording, as `seqmix collect` writes them."""
    out = tmp_path / "summary" / "runs.csv"
    recorded, accounts = recorded_runs(own, [PROFILE], recorded_dir=recorded_dir or tmp_path / "recorded",
                                       config_dir=config_dir)
    collect(list(own), out, out.with_name("breakdown.csv"), recorded, accounts)
    return pd.read_csv(out, keep_default_na=False), json.loads(out.with_name(RECORDINGS).read_text())


def test_a_run_keeps_its_final_weights_and_optimizer_states_sha256(study):
    run = study.parent / "results" / "runs" / "mqar" / "softmax" / "seed0"
    hashes = json.loads((run / HASHES).read_text())
    weights = torch.load(run / "model.pt", weights_only=True)["model"]
    assert hashes["weights_sha256"] == state_sha256(weights)
    assert len(hashes["optimizer_sha256"]) == 64 and hashes["optimizer_sha256"] != hashes["weights_sha256"]
    assert HASHES in RUN_FILES


def test_the_state_hash_sees_every_bit_dtype_shape_and_name():
    state = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": {"step": torch.tensor(3.0), "lr": 0.1}}
    same = {"b": {"lr": 0.1, "step": torch.tensor(3.0)}, "a": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    assert state_sha256(state) == state_sha256(same)
    flipped = state["a"].clone()
    flipped.view(torch.int32)[0, 1] ^= 1
    for other in ({**state, "a": flipped}, {**state, "a": state["a"].double()}, {**state, "a": state["a"].reshape(3, 2)},
                  {"c": state["a"], "b": state["b"]}, {**state, "b": {"step": torch.tensor(3.0), "lr": 0.2}}):
        assert state_sha256(other) != state_sha256(state)


def test_a_recording_keeps_every_files_sha256_and_each_runs_numerics(recording):
    meta = json.loads((recording / "meta.json").read_text())
    files = sorted(str(p.relative_to(recording)) for p in (recording / "runs").rglob("*") if p.is_file())
    assert sorted(meta["sha256"]) == files == sorted(f"runs/{r}/{f}" for r in RUNS for f in RUN_FILES)
    assert {(r["numerics"], r["device"]) for r in meta["runs"]} == {("portable", "cpu")}


def test_recordings_name_profiles_of_config_and_are_absent_from_a_study_without_them(tmp_path, monkeypatch):
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import validate_study
    from seqmix.study import settings

    monkeypatch.setattr(settings, "CONFIG_DIR", tmp_path)
    (tmp_path / "ladder.yaml").write_text("profile: ladder\n")
    cfg = tiny_config(tmp_path, None)
    plain = validate_study(cfg)
    assert "recordings" not in plain.model_dump() and "recordings" not in json.loads(expand(plain).collect_job().model_dump_json())
    named = validate_study({**cfg, "recordings": ["ladder"]})
    assert named.model_dump()["recordings"] == ["ladder"]
    assert json.loads(expand(named).collect_job().model_dump_json())["recordings"] == ["ladder"]
    with pytest.raises(ConfigError) as e:
        validate_study({**cfg, "recordings": ["ladder", "absent"]})
    assert "recordings" in str(e.value) and "names absent, with no config/absent.yaml in this checkout" in str(e.value)
    assert "name a profile of config/" in str(e.value)


def test_accepted_recorded_runs_join_runs_csv_naming_their_recording(study, copy, tmp_path):
    runs, accounts = collected(tmp_path, study.parent)
    assert sorted(f"{r.task}/{r.arch}/seed{r.seed}" for r in runs.itertuples()) == RUNS
    assert set(runs.recording) == {f"{PROFILE}/{copy.name}"} and set(runs.profile) == {PROFILE}
    assert runs.run_dir.map(lambda d: Path(d).is_relative_to(copy)).all()
    (account,) = accounts
    assert (account["profile"], account["recording"], account["accepted"], account["refused"]) == (
        PROFILE, f"{PROFILE}/{copy.name}", 2, [])
    text = recordings_macros(tmp_path / "summary")["recordings"]
    assert text.startswith(f"Runs recorded by study {PROFILE} ({PROFILE}/{copy.name}: ") and "2 read as this" in text
    assert "never verified (python -m seqmix verify" in text
    # A run the study trains itself counts once: its own.
    own = study.parent / "results" / "runs" / "mqar" / "softmax" / "seed0"
    runs, (account,) = collected(tmp_path, study.parent, own=[own])
    assert list(zip(runs.arch, runs.recording)) == [("softmax", ""), ("grassmann", f"{PROFILE}/{copy.name}")]
    assert account["refused"] == [f"recorded run {PROFILE}/{copy.name}/mqar/softmax/seed0 refused: this study trains "
                                  "that run itself: its own run counts"]


def test_a_recorded_run_of_other_settings_is_left_out_with_one_line_each(study, copy, tmp_path):
    moved = tmp_path / "config"
    moved.mkdir()
    cfg = yaml.safe_load(study.read_text())
    cfg["tasks"]["mqar"]["train"]["steps"] = 9
    (moved / f"{PROFILE}.yaml").write_text(yaml.safe_dump(cfg))
    runs, (account,) = collected(tmp_path, moved)
    assert len(runs) == 0 and account["accepted"] == 0 and len(account["refused"]) == 2
    for run, line in zip(RUNS, account["refused"]):
        assert line.startswith(f"recorded run {PROFILE}/{copy.name}/{run} refused: config.json is not study {PROFILE}'s run spec")
        assert "first at train.steps, recorded 6, current 9" in line and "\n" not in line


def test_a_mixer_whose_code_changed_has_its_recorded_runs_left_out(study, copy, tmp_path, monkeypatch):
    digest = recorded_module.Resolved.code_digest
    monkeypatch.setattr(recorded_module.Resolved, "code_digest",
                        lambda self, arch, kind: "0" * 16 if arch == "grassmann" else digest(self, arch, kind))
    runs, (account,) = collected(tmp_path, study.parent)
    assert list(runs.arch) == ["softmax"]
    (line,) = account["refused"]
    assert line.startswith(f"recorded run {PROFILE}/{copy.name}/mqar/grassmann/seed0 refused: its code digest ")
    assert f"is not the one this checkout computes for it ({'0' * 16}" in line
    # The headline's `runs: recorded` claims are read by the same rule.
    (rec,) = read_recordings(tmp_path / "recorded", study)
    assert [r.run for r in rec.refused] == ["mqar/grassmann/seed0"] and "its code digest" in rec.refused[0].reason


def test_a_recorded_file_altered_by_one_byte_leaves_its_run_out_naming_the_file(study, copy, tmp_path):
    log = copy / "runs" / "mqar" / "grassmann" / "seed0" / "log.csv"
    data = bytearray(log.read_bytes())
    data[-3] ^= 1
    log.write_bytes(bytes(data))
    runs, (account,) = collected(tmp_path, study.parent)
    assert list(runs.arch) == ["softmax"]
    assert account["refused"] == [f"recorded run {PROFILE}/{copy.name}/mqar/grassmann/seed0 refused: its log.csv is not "
                                  "the file recorded (its sha256 is not the one meta.json records (altered after "
                                  "recording)); record the study again"]


def test_a_named_profile_without_a_recording_is_said_and_the_newest_recording_is_read(study, copy, tmp_path):
    found, missing = read_named(["absent"], tmp_path / "recorded", study.parent)
    assert found == [] and missing["absent"].startswith("no recording of study absent in ")
    older = copy.with_name("cpu-2000-01-01")
    shutil.copytree(copy, older)
    meta = json.loads((older / "meta.json").read_text())
    (older / "meta.json").write_text(json.dumps({**meta, "date": "2000-01-01"}))
    (rec,), _ = read_named([PROFILE], tmp_path / "recorded", study.parent)
    assert rec.path == copy
