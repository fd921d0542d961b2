"""Fault injection, the files a job reads: missing, truncated and corrupted files of each
kind give the exact error; limits the data or the config decide are checked before work
starts; the report's words for a task whose every run diverged."""


from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seqmix.cli import main as cli
from seqmix.data.manifest import DataError, read_manifest, write_manifest
from seqmix.data.raw import RAW_FILES, mirror_file, resolve_source
from seqmix.expansion.table import expand
from seqmix.expansion.validate import ConfigError, validate_study
from seqmix.io import FileError
from seqmix.study.settings import MIRROR_ENV, DataSettings
from seqmix.train import loop
from seqmix.train.evaluate import evaluate_run
from tests.conftest import tiny_config
from tests.faults.conftest import (
    damaged,
)
from tests.helpers import (
    REPO,
    digest,
    run_spec_in,
)

# ------------------------------------------------------------------------------------------
# Missing, truncated and corrupted files of each kind: the exact error.
# ------------------------------------------------------------------------------------------


@pytest.fixture
def prepared_copy(study, tmp_path) -> Path:
    """A private copy of the module's prepared MQAR data directory."""
    src = Path(study["data"]["dir"]) / "mqar"
    dst = tmp_path / "data" / "mqar"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_raw_data_of_the_mirror(tmp_path, monkeypatch, how):
    # A stand-in for the official file, registered with its own digest: intact, it passes.
    key, good = ("wikitext2", "validation"), b" = Homarus gammarus = \n" * 1000
    raw = dataclasses.replace(RAW_FILES[key], sha256=hashlib.sha256(good).hexdigest())
    monkeypatch.setitem(RAW_FILES, key, raw)
    mirror = tmp_path / "mirror"
    target = mirror / raw.paths[0]
    target.parent.mkdir(parents=True)
    target.write_bytes(good)
    source = resolve_source(DataSettings(mirror=str(mirror), source="mirror"))
    assert mirror_file(source, *key) == target
    damaged(target, how)
    fix = ("copy the official file there (the mirror's SHA256SUMS lists every digest) or point the config key "
           "'data.mirror' at a mirror that has a good copy")
    with pytest.raises(DataError) as e:
        mirror_file(source, *key)
    if how == "missing":
        names = " or ".join(str(mirror / p) for p in raw.paths)
        assert str(e.value) == (f"data file {names} is missing from the mirror ({raw.description}; "
                                f"expected sha256 {raw.sha256}); {fix}.")
    else:
        assert str(e.value) == (f"data file {target} has sha256 {digest(target)}, expected {raw.sha256}: it is "
                                f"corrupted or not the file this pipeline was built for; {fix}")


def test_the_mirror_fix_names_the_setting_in_force(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    from_env = resolve_source(DataSettings(source="mirror"), env_mirror=str(mirror))  # as the CLI passes it
    from_config = resolve_source(DataSettings(mirror=str(mirror), source="mirror"))
    with pytest.raises(DataError, match=f"point the environment variable {MIRROR_ENV} at a mirror"):
        mirror_file(from_env, "snli", "validation")
    with pytest.raises(DataError, match="point the config key 'data.mirror' at a mirror") as e:
        mirror_file(from_config, "snli", "validation")
    assert MIRROR_ENV not in str(e.value)


def test_snli_train_has_no_digest_and_the_message_says_so(tmp_path):
    (tmp_path / "snli").mkdir()
    source = resolve_source(DataSettings(mirror=str(tmp_path), source="mirror"))
    with pytest.raises(DataError) as e:
        mirror_file(source, "snli", "train")
    msg = str(e.value)
    assert "no published sha256 exists for a converted snli/train.jsonl.gz, so it is used unchecked" in msg
    assert "ee95dfbc57800f7b1f62b7602ad2b176c2b983210435a49238e660324a01e963 as published by others; not checked here" in msg
    assert "train_sample_1pct" in msg


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_prepared_data(prepared_copy, how):
    target = prepared_copy / "train.npz"
    expected = read_manifest(prepared_copy, "mqar", verify=False)["files"]["train.npz"]["sha256"]
    damaged(target, how)
    fix = f"rerun `python -m seqmix data mqar` (or delete {prepared_copy} and rerun the DAG)"
    with pytest.raises(DataError) as e:
        read_manifest(prepared_copy, "mqar")
    if how == "missing":
        assert str(e.value) == f"data file {target} is missing (expected sha256 {expected}); {fix}"
    else:
        assert str(e.value) == (f"data file {target} has sha256 {digest(target)}, expected {expected}: it is "
                                f"corrupted or not the file this pipeline was built for; {fix}")


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted", "not a manifest"])
def test_manifest(prepared_copy, how):
    path = prepared_copy / "manifest.json"
    fix = f"rerun `python -m seqmix data mqar` (or delete {prepared_copy} and rerun the DAG)"
    if how == "corrupted":
        path.write_bytes(path.read_bytes().replace(b'"files"', b'"fi\xffes"'))
    elif how == "not a manifest":
        path.write_text("[1, 2]")
    else:
        damaged(path, how)
    with pytest.raises(DataError) as e:
        read_manifest(prepared_copy, "mqar")
    expected = {
        "missing": f"{path} is missing: the mqar data has not been prepared; {fix}",
        "truncated": f"{path} is truncated or corrupted (not valid JSON: ",
        "corrupted": f"{path} is corrupted (not UTF-8 text: ",
        "not a manifest": f"{path} is not a data manifest (no 'files' entry); {fix}",
    }[how]
    assert str(e.value).startswith(expected) and str(e.value).endswith(fix)


def test_data_prepared_with_other_settings_is_refused_before_step_one(study, tmp_path):
    spec = run_spec_in(study, tmp_path)
    other = json.loads(spec.model_dump_json())
    other["settings"]["num_kv_pairs"] = 3  # the config changed; the data did not
    with pytest.raises(DataError) as e:
        loop.train(type(spec).model_validate(other), progress=False)
    assert str(e.value).startswith(f"{Path(spec.data_dir) / 'manifest.json'} was generated with num_kv_pairs 2 (config: 3)")
    assert not (Path(spec.run_dir) / "config.json").exists()


@pytest.mark.parametrize("name", ["metrics.json", "config.json", "model.pt"])
@pytest.mark.parametrize("how", ["missing", "truncated", "corrupted"])
def test_run_files_read_by_evaluation(study, tmp_path, name, how):
    spec = run_spec_in(study, tmp_path, steps=3)
    loop.train(spec, progress=False)
    run_dir = Path(spec.run_dir)
    damaged(run_dir / name, how)
    fix = f"train the run again: delete {run_dir} and rerun the DAG, or run `python -m seqmix train` with its spec"
    with pytest.raises(FileError) as e:
        evaluate_run(run_dir, device="cpu")
    msg, path = str(e.value), run_dir / name
    assert msg.endswith(fix), msg
    if how == "missing":
        assert msg.startswith(f"{path} is missing; ")
    elif name == "model.pt":
        assert msg.startswith(f"{path} cannot be read: it is truncated or corrupted (")
    elif how == "truncated":
        assert msg.startswith(f"{path} is truncated or corrupted (not valid JSON: ")
    else:
        assert msg.startswith(f"{path} is corrupted (not UTF-8 text: ")


def test_a_bad_spec_is_named_before_any_work(tmp_path, capsys):
    assert cli(["train", "--spec", '{"profile": "quick"']) == 2
    assert capsys.readouterr().err.startswith("error: --spec is not a valid TrainJob (Invalid JSON")
    assert cli(["train", "--spec", json.dumps({"profile": "quick", "task": "mqar"})]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --spec is not a valid TrainJob (key 'kind' is required; key 'group' is required; ")
    assert "pass the JSON the Snakefile writes" in err
    assert cli(["data", "mqar", "--spec", "{}"]) == 2
    assert "error: --spec is not a valid DataJob (key 'kind' is required" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# Limits the data or the config decide, checked before work starts.
# ------------------------------------------------------------------------------------------


def fake_wikitext(directory: Path, tokens: dict[str, int]) -> None:
    """A prepared WikiText-2 directory with token streams of the given lengths (the check
    reads only the manifest; the streams make its digests real)."""
    directory.mkdir(parents=True)
    for split, n in tokens.items():
        np.save(directory / f"{split}.npy", np.arange(n, dtype=np.int32) % 64)
    write_manifest(directory, {f"{s}.npy": {"tokens": n} for s, n in tokens.items()},
                   {"dataset": "fake", "source": "test", "tokenizer": {"vocab_size": 64},
                    "splits": {s: {"tokens": n} for s, n in tokens.items()}})


@pytest.mark.parametrize("block, short, key, need", [(60, "train", "train_split", 62), (16, "validation", "eval_split", 17)])
def test_a_block_longer_than_a_wikitext_split_fails_before_step_one(tmp_path, capsys, block, short, key, need):
    fake_wikitext(tmp_path / "data" / "wikitext2", {"train": 50, "validation": 10, "test": 30})
    cfg = tiny_config(tmp_path, None, archs=("softmax",))
    cfg["tasks"] = {"wikitext2": {"block_size": block, **{k: cfg["tasks"]["mqar"][k] for k in ("model", "train")}}}
    cfg["analysis"]["sparsity"]["tasks"] = ["wikitext2"]
    spec = expand(validate_study(cfg)).run_spec("wikitext2", "softmax", 0)
    assert cli(["train", "--quiet", "--spec", spec.model_dump_json()]) == 3
    tokens = {"train": 50, "validation": 10}[short]
    manifest = tmp_path / "data" / "wikitext2" / "manifest.json"
    assert capsys.readouterr().err == (
        f"error: config key 'tasks.wikitext2.block_size' ({block}) is too long for the {short} split ({key}): "
        f"it has {tokens} tokens ({manifest}) and needs at least {need}; set block_size <= "
        f"{tokens - (need - block)}, or choose a longer split for '{key}'\n")
    assert not (Path(spec.run_dir) / "log.csv").exists() and not (Path(spec.run_dir) / "checkpoints").exists()


@pytest.mark.parametrize("settings, message", [
    ({"seq_len": 15}, "config key 'tasks.mqar': seq_len must be even, got 15"),
    ({"seq_len": 16, "vocab_size": 16}, "config key 'tasks.mqar': vocab_size (16) must exceed seq_len (16)"),
    ({"seq_len": 16, "num_kv_pairs": 5}, "config key 'tasks.mqar': num_kv_pairs * 4 (20) must be <= seq_len (16)"),
])
def test_mqar_generator_limits_fail_at_validation(tmp_path, settings, message):
    # (The generator's fourth limit, distinct keys: num_kv_pairs <= vocab_size/2 - 1, follows
    # from these three.)
    cfg = tiny_config(tmp_path, None, archs=("softmax",))
    cfg["tasks"]["mqar"].update(settings)
    with pytest.raises(ConfigError) as e:
        validate_study(cfg)
    assert message in str(e.value)


@pytest.mark.parametrize("key", ["results_dir", "data.dir"])
@pytest.mark.parametrize("value, why", [
    ("runs/{seed}", "'runs/{seed}' contains '{' and '}': Snakemake reads {...} in a path as a wildcard; choose a path without it"),
    ("runs/<x>", "'runs/<x>' contains '<' and '>': Snakemake reads <...> in a path as a path variable; choose a path without it"),
    ("~/results", "'~/results' starts with '~', which is not expanded here (it would make a directory named '~'); write the full path"),
    ("  ", "is empty; give a directory (e.g. 'results'): an empty one would put files at the file system root"),
])
def test_paths_the_workflow_cannot_use_are_refused_with_the_reason(tmp_path, key, value, why):
    cfg = tiny_config(tmp_path, None)
    if key == "results_dir":
        cfg["results_dir"] = value
    else:
        cfg["data"]["dir"] = value
    with pytest.raises(ConfigError) as e:
        validate_study(cfg)
    assert f"config key '{key}': {why}" in str(e.value)


# ------------------------------------------------------------------------------------------
# The report's words for a task whose every run diverged (its run through the DAG, and paths
# with shell metacharacters, are tests/workflow/test_dag.py's, on the shared study).
# ------------------------------------------------------------------------------------------


def test_the_report_words_come_from_the_runs():
    import pandas as pd

    from seqmix.report.latex import series
    from seqmix.report.summary import unfinished_tasks

    assert [series(x) for x in (["A"], ["A", "B"], ["A", "B", "C"])] == ["A", "A and B", "A, B and C"]
    runs = pd.DataFrame({"task": ["t1", "t1", "t2", "t2", "t3"], "status": ["ok", "diverged", "diverged", "diverged", "ok"]})
    assert unfinished_tasks(runs) == ["t2"]
    abstract = (REPO / "paper" / "sections" / "abstract.tex").read_text()
    assert "\\qArchitectures" in abstract and "\\qUnfinished" in abstract and "ten " not in abstract
