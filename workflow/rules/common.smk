# Shared helpers for the rules: run lists and the per-job JSON the commands receive.
import json

from seqmix.config import data_spec, run_spec, runs, sparsity_runs

RESULTS = config["results_dir"]
DATA = config["data"]["dir"]
RUNS = runs(config)
SRC = Path(workflow.basedir)  # the repository (notebooks/, paper/ sources live here)


def run_path(task, arch, seed, name):
    return f"{RESULTS}/runs/{task}/{arch}/seed{seed}/{name}"


def all_runs(name, task=None):
    return [run_path(t, a, s, name) for t, a, s in RUNS if task in (None, t)]


def as_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def analysis_config(section):
    # What an analysis command needs: its own section, the architectures, their options,
    # and where results are; nothing else, so other edits do not rerun it.
    keys = ("profile", "results_dir", "data", "tokenizer", "tasks", "architectures", "seeds", "mixers")
    cfg = {k: config[k] for k in keys if k in config}
    cfg["analysis"] = {section: config["analysis"][section]}
    return as_json(cfg)


wildcard_constraints:
    task="|".join(config["tasks"]),
    arch="[a-z0-9_]+",
    seed=r"\d+",
