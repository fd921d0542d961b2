"""The copy probe (seqmix/analysis/copy_probe.py): its task, that it can tell a mixer that
copies from one that does not, its CSV, and where the study has no probe."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from seqmix.analysis import copy_probe
from seqmix.expansion.table import expand, job_table
from seqmix.expansion.validate import ConfigError, validate_study
from seqmix.io import columns
from seqmix.study.dag import Jobs
from tests.conftest import tiny_config

# The MQAR task's model as config/config.yaml has it (pre-norm, no feed-forward), 2 layers.
MODEL = {"d_model": 16, "n_layers": 2, "d_ff_mult": 0, "dropout": 0.0, "block": "pre", "budget": {"params": None}}
# Small enough for a second per model; softmax copies at it (accuracy 1.0 on seeds 0 and 1).
PROBE = {"d_model": 32, "seq_len": 12, "vocab_size": 16, "steps": 150, "batch_size": 32, "lr": 1e-2,
         "warmup_steps": 15, "eval_sequences": 256}


def tiny_study(tmp_path, archs=("softmax",), **probe):
    cfg = tiny_config(tmp_path, None, archs=archs)
    cfg["tasks"]["mqar"]["model"] = MODEL
    cfg["analysis"]["copy_probe"] = {**PROBE, **probe}
    return validate_study(cfg)


def test_the_label_at_t_is_the_token_at_t_minus_1():
    tokens = torch.tensor([[5, 3, 9, 1], [0, 7, 7, 2]])
    x, y = copy_probe.copy_batch(tokens)
    assert torch.equal(x, tokens)
    assert y[:, 0].tolist() == [-100, -100]
    assert torch.equal(y[:, 1:], tokens[:, :-1])


def test_softmax_learns_to_copy_and_an_untrained_model_stays_at_chance(tmp_path):
    torch.set_num_threads(1)
    trained = copy_probe.probe(expand(tiny_study(tmp_path)).copy_probe_job(), "softmax")
    frozen = copy_probe.probe(expand(tiny_study(tmp_path, lr=1e-9)).copy_probe_job(), "softmax")
    assert trained["chance"] == frozen["chance"] == 1 / 16
    assert trained["accuracy"] > 0.9 and trained["loss"] < 0.5
    assert frozen["accuracy"] < 2 * frozen["chance"] and frozen["loss"] > 2.5  # ln 16 = 2.77


def test_the_held_out_tokens_are_not_the_training_tokens():
    train, held_out = copy_probe._generators(0)
    a = copy_probe.random_tokens(4, 12, 16, train)
    b = copy_probe.random_tokens(4, 12, 16, held_out)
    assert not torch.equal(a, b)


def test_the_csv_has_the_documented_columns(tmp_path):
    job = expand(tiny_study(tmp_path, archs=("softmax", "tssa"), steps=2, eval_sequences=8)).copy_probe_job()
    out = tmp_path / "copy_probe.csv"
    assert copy_probe.write_copy_probe(job, out, threads=1, progress=False) == 2
    table = pd.read_csv(out)
    documented = re.findall(r"^  (\w+) {2,}", copy_probe.__doc__, re.M)
    assert list(table.columns) == documented == columns(copy_probe.CopyProbeRow)
    assert table.arch.tolist() == ["softmax", "tssa"] and (table.chance == 1 / 16).all()
    assert (table.steps == 2).all() and (table.n_layers == 2).all() and (table.d_model == 32).all()


def test_the_probe_takes_the_mqar_tasks_model_and_mixer_options(tmp_path):
    cfg = tiny_config(tmp_path, None, archs=("softmax", "gla"))
    cfg["tasks"]["mqar"]["model"] = {**MODEL, "positions": {"default": "learned", "gla": "none"}}
    cfg["tasks"]["mqar"]["mixers"] = {"softmax": {"n_heads": 1}}
    cfg["tasks"]["mqar"]["train"]["lr"] = 5e-4  # the task's own schedule is not the probe's
    del cfg["analysis"]["copy_probe"]  # the defaults
    job = expand(validate_study(cfg)).copy_probe_job()
    assert job.task == "mqar" and job.architectures == ["softmax", "gla"]
    assert job.mixers["softmax"]["n_heads"] == 1 and job.train.lr == 3e-3 and job.train.steps == 300
    softmax, gla = copy_probe.build_model(job, "softmax"), copy_probe.build_model(job, "gla")
    assert softmax.pos_emb is not None and gla.pos_emb is None and softmax.cfg.d_model == 64
    assert softmax.cfg.block == "pre" and softmax.cfg.d_ff_mult == 0


@pytest.mark.parametrize("probe, key", [({"task": "wikitext2"}, "analysis.copy_probe.task"),
                                        ({"architectures": ["linformer"]}, "analysis.copy_probe.architectures")])
def test_a_bad_probe_setting_names_its_key(tmp_path, probe, key):
    cfg = tiny_config(tmp_path, None)
    cfg["analysis"]["copy_probe"] = probe
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")) as e:
        validate_study(cfg)
    if key.endswith("task"):
        assert "choose one of: auto, mqar, or null" in str(e.value)


def test_without_a_recall_task_there_is_no_probe_and_the_recall_notebook_does_not_wait_for_it(tmp_path):
    off = tiny_config(tmp_path, None)
    off["analysis"]["copy_probe"] = {"task": None}
    snli_only = {"architectures": ["softmax"], "seeds": [0], "tasks": {"snli": {}}}
    for study in (validate_study(off), validate_study(snli_only)):
        assert expand(study).copy_probe_job() is None
        jobs = Jobs(job_table(expand(study)))
        assert not jobs.has_analysis("copy_probe")
        assert not [f for f in jobs.notebooks()["recall"].inputs if f.endswith("copy_probe.csv")]
    on = Jobs(job_table(expand(tiny_study(tmp_path))))
    assert f"{on.results}/analysis/copy_probe.csv" in on.notebooks()["recall"].inputs
