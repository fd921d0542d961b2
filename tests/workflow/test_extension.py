"""Extending seqmix the way docs/reference/extending.md says: a 13th mixer is a module in any package
plus the guide's catalogue entry, its options in a config and the guide's test command (its
"Adding a mixer", step by step, nothing else edited); a new task variant (a second MQAR
cell, and a sweep over it) is config only. The shared tiny study (tests/shared_study.py) took those
steps and runs both through every notebook to report.pdf: each addition shows up in the
runs, the analyses and the report."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pandas as pd

from tests.helpers import pdf_text
from tests.shared_study import GUIDE, NAME, PATH, TEST_COMMAND, TITLE, VARIANT


def test_the_guides_steps_are_the_ones_this_test_takes():
    assert (NAME, TITLE) == ("mymixer", "My mixer") and PATH.endswith(":MyMixer")
    assert f"mixers: {{{NAME}: {{...}}}}" in GUIDE and TEST_COMMAND.endswith(f"-k {NAME}")


def test_the_guides_test_command_passes_on_the_new_mixer(shared_study):
    # Step 4, in the scratch repository: its tests against its catalogue, the plugin package
    # importable the way a researcher's own package would be.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shared_study.src / "src"), shared_study.env["PYTHONPATH"]])}
    step4 = subprocess.run([sys.executable, *shlex.split(TEST_COMMAND)[1:], "-v", "-p", "no:cacheprovider"],
                           cwd=shared_study.src, capture_output=True, text=True, env=env)
    assert step4.returncode == 0, step4.stdout[-3000:] + step4.stderr[-3000:]
    passed = set(re.findall(rf"::(\w+)\[{NAME}\] PASSED", step4.stdout))
    # What a causal-only mixer without step or scores must pass (the plugin's flags).
    assert passed == {"test_shape_and_finite", "test_causal_output_ignores_the_future", "test_gradcheck",
                      "test_option_bounds_are_in_the_schema_and_refused_with_their_key"}, step4.stdout[-3000:]


def test_a_13th_mixer_is_trained_analysed_and_drawn(shared_study):
    runs = pd.read_csv(shared_study.results / "summary" / "runs.csv")
    mine = runs[runs.arch == NAME]
    assert len(mine) == 3 and (mine.status == "ok").all()  # mqar + the variant's two sweep points
    config = json.loads((shared_study.work / mine.run_dir.iloc[0] / "config.json").read_text())
    assert config["mixer_options"] == {"scale": 0.5}  # its options reached the run
    for csv in ("complexity.csv", "sparsity.csv"):
        assert NAME in set(pd.read_csv(shared_study.results / "analysis" / csv).arch), csv
    text = pdf_text(shared_study.report / "report.pdf")
    assert text.count(TITLE) >= 3  # quality, complexity and sparsity tables
    for name in ("complexity", "quality", "sparsity", "geometry", "claims"):
        assert (shared_study.results / "notebooks" / f"{name}.ipynb").exists(), name


def test_a_task_variant_and_its_sweep_are_config_only(shared_study):
    runs = pd.read_csv(shared_study.results / "summary" / "runs.csv")
    variant = runs[runs.group == VARIANT]
    assert sorted(variant.task.unique()) == [f"{VARIANT}/d16", f"{VARIANT}/d8"]
    assert sorted(variant.d_model.unique()) == [8, 16]
    assert {json.loads(a)["model.d_model"] for a in variant["sweep"]} == {8, 16}  # rows carry their axes
    assert set(variant.arch) == {"softmax", NAME}
    # The sweep's points share their group's data: one manifest, read by every point's runs.
    data = shared_study.config["data"]["dir"]
    assert (shared_study.data / VARIANT / "manifest.json").exists()
    assert all(json.loads((shared_study.work / d / "config.json").read_text())["data_dir"] == f"{data}/{VARIANT}"
               for d in variant.run_dir)
    sparsity = pd.read_csv(shared_study.results / "analysis" / "sparsity.csv")
    assert f"{VARIANT}/d8" in set(sparsity.task)
    assert "MQAR L32-kv4/d8" in pdf_text(shared_study.report / "report.pdf")
