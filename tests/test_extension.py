"""Extending seqmix the way the README says: a 13th mixer is a module in any package plus
one catalogue line; a new task variant (a second MQAR cell, and a sweep over it) is config
only. One tiny DAG with both runs through every notebook to report.pdf, and each addition
shows up in the runs, the analyses and the report."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from .test_dag import copy_workflow, snakemake

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


    class CausalMean(Mixer):
        Options = CausalMeanOptions
        supports_noncausal = False

        def __init__(self, d_model, options, *, causal=True, max_len=None):
            super().__init__(d_model, options, causal=causal, max_len=max_len)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
            return self.proj(self.options.scale * x.cumsum(1) / count)
''')
CATALOGUE_LINE = '    MixerEntry("causal_mean", "mymixers.causal_mean:CausalMean", "Causal mean", True, False, "#17becf"),\n'
VARIANT = "mqar/L32-kv4"


def add_catalogue_line(src: Path) -> None:
    path = src / "src" / "seqmix" / "catalogue.py"
    text = path.read_text()
    anchor = "\n)\n\nTASKS"  # the end of MIXERS
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, "\n" + CATALOGUE_LINE.rstrip("\n") + "\n)\n\nTASKS"))


def extended_config(work: Path) -> dict:
    model = {"d_model": 16, "n_layers": 1, "dropout": 0.0, "budget": {"params": None}}
    train = {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 3, "eval_batches": 2,
             "log_every": 2, "checkpoint_every": 3, "threads": 1}
    return {
        "profile": "extension-test",
        "architectures": ["softmax", "grassmann", "causal_mean"],
        "seeds": [0],
        "tasks": {
            "mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "num_train": 64, "num_test": 16,
                     "model": model, "train": train},
            VARIANT: {"vocab_size": 48, "seq_len": 32, "num_kv_pairs": 4, "num_train": 64, "num_test": 16,
                      "model": model, "train": train, "architectures": ["softmax", "causal_mean"],
                      "sweep": {"model.d_model": [8, 16]}},
        },
        "mixers": {"grassmann": {"rank": 4, "offsets": [1, 2]}, "causal_mean": {"scale": 0.5}},
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
    add_catalogue_line(src)
    plugins = root / "plugins" / "mymixers"
    plugins.mkdir(parents=True)
    (plugins / "__init__.py").write_text("")
    (plugins / "causal_mean.py").write_text(PLUGIN)
    work = root / "work"
    work.mkdir()
    (work / "extended.yaml").write_text(yaml.safe_dump(extended_config(work)))
    # The plugin package is importable the way a researcher's own package would be.
    pythonpath = os.pathsep.join(filter(None, [str(plugins.parent), os.environ.get("PYTHONPATH")]))
    snakemake(src, work, "--configfile", str(work / "extended.yaml"), env={"PYTHONPATH": pythonpath})
    return work


def report_text(work: Path) -> str:
    return subprocess.run(["pdftotext", str(work / "paper" / "report.pdf"), "-"], capture_output=True,
                          text=True, check=True).stdout


def test_a_13th_mixer_is_trained_analysed_and_drawn(extended):
    runs = pd.read_csv(extended / "results" / "summary" / "runs.csv")
    mine = runs[runs.arch == "causal_mean"]
    assert len(mine) == 3 and (mine.status == "ok").all()  # mqar + the variant's two sweep points
    config = json.loads((extended / mine.run_dir.iloc[0] / "config.json").read_text())
    assert config["mixer_options"] == {"scale": 0.5}  # its options reached the run
    for csv in ("complexity.csv", "sparsity.csv"):
        assert "causal_mean" in set(pd.read_csv(extended / "results" / "analysis" / csv).arch), csv
    text = report_text(extended)
    assert text.count("Causal mean") >= 3  # quality, complexity and sparsity tables
    for name in ("complexity", "quality", "sparsity", "geometry", "claims"):
        assert (extended / "results" / "notebooks" / f"{name}.ipynb").exists(), name


def test_a_task_variant_and_its_sweep_are_config_only(extended):
    runs = pd.read_csv(extended / "results" / "summary" / "runs.csv")
    variant = runs[runs.group == VARIANT]
    assert sorted(variant.task.unique()) == [f"{VARIANT}/d16", f"{VARIANT}/d8"]
    assert sorted(variant.d_model.unique()) == [8, 16]
    assert {json.loads(a)["model.d_model"] for a in variant["sweep"]} == {8, 16}  # rows carry their axes
    assert set(variant.arch) == {"softmax", "causal_mean"}
    # The sweep's points share their group's data: one manifest, read by every point's runs.
    assert (extended / "data" / VARIANT / "manifest.json").exists()
    assert all(json.loads((extended / d / "config.json").read_text())["data_dir"] == f"data/{VARIANT}"
               for d in variant.run_dir)
    sparsity = pd.read_csv(extended / "results" / "analysis" / "sparsity.csv")
    assert f"{VARIANT}/d8" in set(sparsity.task)
    assert "MQAR L32-kv4/d8" in report_text(extended)
