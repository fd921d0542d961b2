"""Profiles are self-contained: resolving config/paper.yaml gives exactly that file plus the
schema's defaults, key by key, whichever way it is invoked (the library's loader, the CLI,
the job table the Snakefile reads, Snakemake's --configfile, `make paper`);
config/paper-smoke.yaml is paper.yaml plus the cuts it lists and nothing else."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from seqmix import catalogue
from seqmix.expansion.table import expand
from seqmix.expansion.validate import ConfigError, load_study, task_section_model
from seqmix.mixers import mixer_class
from seqmix.study.profile import deep_merge, read_config_file
from seqmix.study.settings import StudyFile
from tests.conftest import REPO
from tests.helpers import flatten

PAPER = REPO / "config" / "paper.yaml"
SMOKE = REPO / "config" / "paper-smoke.yaml"
QUICK = REPO / "config" / "config.yaml"


def defaults_for(raw: dict) -> dict:
    """The schema's defaults for the sections ``raw`` has, built from the models alone (no
    config file read): every top-level section, each task section of its kind, each
    named mixer's Options."""
    top = {name: info.get_default(call_default_factory=True) for name, info in StudyFile.model_fields.items()
           if not info.is_required()}
    out = json.loads(json.dumps({k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v)
                                 for k, v in top.items()}))
    if not out.get("recordings", True):  # a study dumps no empty `recordings` (settings.without_empty_recordings)
        del out["recordings"]
    out["tasks"] = {name: task_section_model(catalogue.kind_of(name))().model_dump(mode="json")
                    for name in raw["tasks"]}
    out["mixers"] = {arch: json.loads(json.dumps(dataclasses.asdict(mixer_class(arch).Options())))
                     for arch in raw.get("mixers", {})}
    return out


def resolved(path) -> dict:
    return load_study(path).model_dump(mode="json")


def test_the_paper_profile_is_its_file_plus_the_defaults_key_by_key():
    raw = read_config_file(PAPER)
    expected = flatten(deep_merge(defaults_for(raw), raw))
    got = flatten(resolved(PAPER))
    assert set(got) == set(expected), f"keys only resolved: {sorted(set(got) - set(expected))}; only expected: {sorted(set(expected) - set(got))}"
    wrong = {k: (got[k], expected[k]) for k in got if got[k] != expected[k]}
    assert not wrong, f"resolved != paper.yaml + defaults at {wrong}"


def test_nothing_of_the_quick_profile_leaks_into_the_paper_profile():
    """Every key the quick profile sets to a non-default value and paper.yaml does not name
    resolves to the default in the paper profile (the issue's eval_max_tokens 32768,
    eval_max_examples 2000, jacobian_sequences 2)."""
    quick, paper = read_config_file(QUICK), read_config_file(PAPER)
    quick_flat, paper_flat = flatten(quick), flatten(paper)
    got = flatten(resolved(PAPER))
    defaults = flatten(deep_merge(defaults_for(paper), {}))
    leaks = {k: v for k, v in quick_flat.items()
             if k in got and k not in paper_flat and v != defaults.get(k) and got[k] == v}
    assert not leaks, f"quick-profile values in the paper profile: {leaks}"
    assert got["tasks.wikitext2.eval_max_tokens"] is None and got["tasks.snli.eval_max_examples"] is None
    assert got["analysis.sparsity.jacobian_sequences"] == paper["analysis"]["sparsity"]["jacobian_sequences"]


def test_the_smoke_profile_is_the_paper_profile_plus_its_listed_cuts():
    smoke_raw = read_config_file(SMOKE)
    assert smoke_raw["extends"] == "paper.yaml"
    cuts = flatten({k: v for k, v in smoke_raw.items() if k != "extends"})
    paper, smoke = flatten(resolved(PAPER)), flatten(resolved(SMOKE))
    # A cut that replaces a mapping by one value (train.pack: false for the paper's per-architecture
    # packs): the mapping's keys are the paper's, the value is the smoke's study's.
    replaced = {c for c in cuts if any(k.startswith(c + ".") for k in paper)}
    under = lambda k: any(k == c or k.startswith(c + ".") for c in replaced)  # noqa: E731
    for c in replaced:
        assert _setting(load_study(SMOKE), c) == cuts[c], c
    changed = {k for k in set(paper) | set(smoke) if paper.get(k) != smoke.get(k) and not under(k)}
    assert changed == {k for k in cuts if paper.get(k) != cuts[k] and not under(k)}, \
        "a difference the smoke file does not list"
    # The shapes the smoke proves are the paper's.
    for key in ("tokenizer.vocab_size", "tasks.wikitext2.block_size", "tasks.wikitext2.model.budget.params",
                "tasks.wikitext2.model.budget.tolerance", "tasks.mqar/L512-kv64.seq_len",
                "tasks.mqar/L512-kv64.train.batch_size", "tasks.mqar/L512-kv64.mixers.h3.d_state",
                "tasks.snli.max_sentence_tokens", "tasks.wikitext2.model.block"):
        assert smoke[key] == paper[key], key


def _setting(study, key: str):
    """A setting of a validated study by its dotted key (sections by attribute, tasks by name)."""
    value = study
    for part in key.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def test_extends_names_its_file_and_refuses_cycles(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_study(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"missing.yaml does not exist \(the path is relative"):
        load_study(tmp_path / "c.yaml")


def test_the_cli_reads_the_same_profile():
    out = subprocess.run([sys.executable, "-m", "seqmix", "runs", "--config", str(PAPER)], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout.split()
    study = load_study(PAPER)
    assert len(out) == len(expand(study).runs) and out[0].startswith("results/paper/runs/")


def test_the_job_table_holds_the_same_profile():
    # What `python -m seqmix jobs` prints is what the Snakefile builds its rules from.
    out = subprocess.run([sys.executable, "-m", "seqmix", "jobs", "--config", str(PAPER)], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout
    table = json.loads(out)
    assert flatten(table["jobs"]["study"]) == flatten(resolved(PAPER))
    assert {str(PAPER), str(REPO / "src" / "seqmix" / "study" / "profile.py"),
            str(REPO / "src" / "seqmix" / "expansion" / "validate.py")} <= set(table["read"])


def test_make_paper_runs_snakemake_on_the_paper_file_alone():
    out = subprocess.run(["make", "-n", "paper"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    lines = [line for line in out.splitlines() if line.startswith("snakemake") and "--report" not in line]
    assert len(lines) == 1 and "--configfile config/paper.yaml" in lines[0], lines


@pytest.fixture(scope="module")
def paper_dry_run() -> str:
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["snakemake", "-n", "-p", "--configfile", "config/paper.yaml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _json_args(dry_run: str, command: str, flag: str) -> list[dict]:
    """The JSON passed as ``flag`` to every ``python -m seqmix <command>`` of a dry run."""
    found = []
    for line in dry_run.splitlines():
        if f"python -m seqmix {command} " in line:
            args = shlex.split(line)
            found.append(json.loads(args[args.index(flag) + 1]))
    return found


def test_snakemake_passes_the_paper_profile_key_by_key(paper_dry_run):
    """What every job of `snakemake --configfile config/paper.yaml` receives is the loader's
    study, each job its own part of it, and the issue's grep of leaked quick-profile caps
    comes back empty."""
    assert not re.search(r'eval_max_tokens":32768|eval_max_examples":2000|jacobian_sequences":2[,}]', paper_dry_run)
    study, loaded = resolved(PAPER), load_study(PAPER)
    (collect,) = _json_args(paper_dry_run, "collect", "--spec")
    expansion = expand(loaded)
    assert collect == {"run_dirs": [str(expansion.run_dir(r)) for r in expansion.runs]}
    sparsity = _json_args(paper_dry_run, "sparsity", "--spec")
    assert sparsity and all(s["sparsity"] == study["analysis"]["sparsity"] and len(s["run_dirs"]) == 1 for s in sparsity)
    for command, section in (("complexity", "complexity"), ("sparsity-analytic", None), ("geometry", "geometry"),
                             ("throughput", "throughput")):
        (spec,) = _json_args(paper_dry_run, command, "--spec")
        assert (spec[section] if section else spec) == study["analysis"][section or "sparsity_analytic"], command
    # a seed pack's members (train.pack) have their run specs in the pack's spec
    specs = _json_args(paper_dry_run, "train", "--spec") + [
        member for pack in _json_args(paper_dry_run, "train-pack", "--spec") for member in pack["specs"]]
    assert len(specs) == len(expansion.runs)
    assert {(s["task"].split("/")[0], s["arch"], s["model"]["block"]) for s in specs if s["task"] == "wikitext2"} == {
        ("wikitext2", a, catalogue.mixer_entry(a).block) for a in study["architectures"] if mixer_class(a).supports_causal}
