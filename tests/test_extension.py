"""Extending seqmix the way docs/extending.md says: a 13th mixer is a module in any package
plus the guide's catalogue entry, its options in a config and the guide's test command (its
"Adding a mixer", step by step, nothing else edited); a new task variant (a second MQAR
cell, and a sweep over it) is config only. One tiny DAG with both runs through every
notebook to report.pdf, and each addition shows up in the runs, the analyses and the report."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from .conftest import REPO
from .test_dag import copy_workflow, snakemake

GUIDE_PAGE = (REPO / "docs" / "extending.md").read_text()  # the README points here
GUIDE = GUIDE_PAGE[GUIDE_PAGE.index("## Adding a mixer"):GUIDE_PAGE.index("## Adding a task")]
# Step 2's entry and step 4's command, as the guide prints them.
ENTRY = re.search(r"```python\n\s*(MixerEntry\(.*?\),)\n\s*```", GUIDE, re.S).group(1)
TEST_COMMAND = re.search(r"`(python -m pytest tests/test_mixers\.py -k \w+)`", GUIDE).group(1)
NAME, PATH, TITLE = (re.search(rf'{key}="([^"]+)"', ENTRY).group(1) for key in ("name", "path", "title"))

# Step 1: a module in a package of its own, with an option bounded in its metadata.
PLUGIN = textwrap.dedent('''
    """A causal running mean: y_t = W (scale / (t+1) * sum_{s<=t} x_s). A mixer a researcher
    might add to compare with attention."""
    import dataclasses

    import torch
    from torch import nn

    from seqmix.mixers.base import Mixer


    @dataclasses.dataclass
    class CausalMeanOptions:
        scale: float = dataclasses.field(default=1.0, metadata={"gt": 0})


    class CLASS(Mixer):
        Options = CausalMeanOptions
        supports_noncausal = False

        def __init__(self, d_model, options, *, causal=True, max_len=None):
            super().__init__(d_model, options, causal=causal, max_len=max_len)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
            return self.proj(self.options.scale * x.cumsum(1) / count)
''').replace("CLASS", PATH.rpartition(":")[2])
VARIANT = "mqar/L32-kv4"


def add_catalogue_entry(src: Path) -> None:
    """Step 2: the guide's entry, appended to MIXERS."""
    path = src / "src" / "seqmix" / "catalogue.py"
    text = path.read_text()
    anchor = "\n)\n\nTASKS"  # the end of MIXERS
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, f"\n    {ENTRY}{anchor}"))


def add_plugin(root: Path) -> Path:
    """Step 1: the module at the guide's import path, in a package outside the repository."""
    module, _, _ = PATH.partition(":")
    file = root / "plugins" / Path(*module.split(".")).with_suffix(".py")
    for package in [file.parent, *[p for p in file.parent.parents if p > root / "plugins"]]:
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    file.write_text(PLUGIN)
    return root / "plugins"


def extended_config(work: Path) -> dict:
    model = {"d_model": 16, "n_layers": 1, "dropout": 0.0, "budget": {"params": None}}
    train = {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 3, "eval_batches": 2,
             "log_every": 2, "checkpoint_every": 3, "threads": 1}
    return {
        "profile": "extension-test",
        "architectures": ["softmax", "grassmann", NAME],
        "seeds": [0],
        "tasks": {
            "mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "num_train": 64, "num_test": 16,
                     "model": model, "train": train},
            VARIANT: {"vocab_size": 48, "seq_len": 32, "num_kv_pairs": 4, "num_train": 64, "num_test": 16,
                      "model": model, "train": train, "architectures": ["softmax", NAME],
                      "sweep": {"model.d_model": [8, 16]}},
        },
        "mixers": {"grassmann": {"rank": 4, "offsets": [1, 2]}, NAME: {"scale": 0.5}},
        "analysis": {
            "complexity": {"lengths": [8, 16, 32], "d_model": 16, "repeats": 2, "warmup": 0},
            "throughput": {"lengths": [8, 16], "d_model": 16, "vocab_size": 64, "tokens_per_batch": 32,
                           "warmup": 0, "steps": 1, "repeats": 2},
            "sparsity": {"tasks": ["mqar", f"{VARIANT}/d8"], "num_sequences": 2, "min_row_len": 4},
        },
    }


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    root = tmp_path_factory.mktemp("extension")
    src = copy_workflow(root / "src")
    add_catalogue_entry(src)
    plugins = add_plugin(root)
    # The plugin package is importable the way a researcher's own package would be.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")]))}
    # Step 4, in the copy: its tests against its catalogue.
    shutil.copytree(REPO / "tests", src / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", src / "pyproject.toml")
    step4 = subprocess.run([sys.executable, *shlex.split(TEST_COMMAND)[1:], "-v", "-p", "no:cacheprovider"], cwd=src,
                           capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "src"), env["PYTHONPATH"]])})
    work = root / "work"
    work.mkdir()
    (work / "extended.yaml").write_text(yaml.safe_dump(extended_config(work)))
    snakemake(src, work, "--configfile", str(work / "extended.yaml"), env=env)
    return work, step4


def test_the_readmes_steps_are_the_ones_this_test_takes():
    assert (NAME, TITLE) == ("mymixer", "My mixer") and PATH.endswith(":MyMixer")
    assert f"mixers: {{{NAME}: {{...}}}}" in GUIDE and TEST_COMMAND.endswith(f"-k {NAME}")


def test_the_readmes_test_command_passes_on_the_new_mixer(extended):
    _, step4 = extended
    assert step4.returncode == 0, step4.stdout[-3000:] + step4.stderr[-3000:]
    passed = set(re.findall(rf"::(\w+)\[{NAME}\] PASSED", step4.stdout))
    # What a causal-only mixer without step or scores must pass (the plugin's flags).
    assert passed == {"test_shape_and_finite", "test_causal_output_ignores_the_future", "test_gradcheck",
                      "test_option_bounds_are_in_the_schema_and_refused_with_their_key"}, step4.stdout[-3000:]


def report_text(work: Path) -> str:
    return subprocess.run(["pdftotext", str(work / "results" / "report" / "report.pdf"), "-"], capture_output=True,
                          text=True, check=True).stdout


def test_a_13th_mixer_is_trained_analysed_and_drawn(extended):
    work, _ = extended
    runs = pd.read_csv(work / "results" / "summary" / "runs.csv")
    mine = runs[runs.arch == NAME]
    assert len(mine) == 3 and (mine.status == "ok").all()  # mqar + the variant's two sweep points
    config = json.loads((work / mine.run_dir.iloc[0] / "config.json").read_text())
    assert config["mixer_options"] == {"scale": 0.5}  # its options reached the run
    for csv in ("complexity.csv", "sparsity.csv"):
        assert NAME in set(pd.read_csv(work / "results" / "analysis" / csv).arch), csv
    text = report_text(work)
    assert text.count(TITLE) >= 3  # quality, complexity and sparsity tables
    for name in ("complexity", "quality", "sparsity", "geometry", "claims"):
        assert (work / "results" / "notebooks" / f"{name}.ipynb").exists(), name


def test_a_task_variant_and_its_sweep_are_config_only(extended):
    work, _ = extended
    runs = pd.read_csv(work / "results" / "summary" / "runs.csv")
    variant = runs[runs.group == VARIANT]
    assert sorted(variant.task.unique()) == [f"{VARIANT}/d16", f"{VARIANT}/d8"]
    assert sorted(variant.d_model.unique()) == [8, 16]
    assert {json.loads(a)["model.d_model"] for a in variant["sweep"]} == {8, 16}  # rows carry their axes
    assert set(variant.arch) == {"softmax", NAME}
    # The sweep's points share their group's data: one manifest, read by every point's runs.
    assert (work / "data" / VARIANT / "manifest.json").exists()
    assert all(json.loads((work / d / "config.json").read_text())["data_dir"] == f"data/{VARIANT}"
               for d in variant.run_dir)
    sparsity = pd.read_csv(work / "results" / "analysis" / "sparsity.csv")
    assert f"{VARIANT}/d8" in set(sparsity.task)
    assert "MQAR L32-kv4/d8" in report_text(work)
