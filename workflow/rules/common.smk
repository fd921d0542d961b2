# Shared helpers for the rules: run lists, paths and the per-job JSON the commands receive.
import functools
import json
import re
import shlex

import yaml

from seqmix import catalogue
from seqmix.study import (
    data_job,
    geometry_runs,
    groups,
    needs_tokenizer,
    run_spec,
    runs,
    sparsity_runs,
    tokenizer_job,
    variant,
    variants,
)

RESULTS = STUDY.results_dir
DATA = STUDY.data.dir
RUNS = runs(STUDY)
SRC = Path(workflow.basedir)  # the repository (notebooks/, paper/ sources live here)


def run_path(task, arch, seed, name):
    return f"{RESULTS}/runs/{task}/{arch}/seed{seed}/{name}"


def all_runs(name, among=None):
    return [run_path(t, a, s, name) for t, a, s in (RUNS if among is None else among)]


def group_of(task):
    return variant(STUDY, task).group


# Keys keep the config's order (no sort_keys): the order of tasks is meaningful (the first
# language-model task is the analyses' default), and the commands must read the same one.


def study_config():
    # The study without its analysis and report sections (what run lists depend on).
    return json.dumps(STUDY.model_dump(mode="json", exclude={"analysis", "report"}), separators=(",", ":"))


def analysis_config(section):
    # What an analysis command needs: the study without the other analyses' sections, so
    # that editing one analysis does not rerun the others.
    cfg = STUDY.model_dump(mode="json", exclude={"analysis", "report"})
    cfg["analysis"] = {section: getattr(STUDY.analysis, section).model_dump(mode="json")}
    return json.dumps(cfg, separators=(",", ":"))


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


wildcard_constraints:
    task=_alternatives(v.name for v in variants(STUDY)),
    group=_alternatives(groups(STUDY)),
    arch=_alternatives(catalogue.mixer_names()),
    seed=r"\d+",


# -- data -----------------------------------------------------------------------------------


def data_inputs(w):
    return [f"{DATA}/tokenizer/manifest.json"] if needs_tokenizer(STUDY, w.group) else []


# -- training -------------------------------------------------------------------------------


def train_threads(w):
    return variant(STUDY, w.task).section.train.threads or workflow.cores


# -- resources: memory and time every job declares (config `resources`, a task's own) ---------


def resources_of(name):
    return getattr(STUDY.resources, name)


def task_resources(name):
    # A task's own train/eval resources (tasks.<task>.resources), else the study's.
    def pick(w):
        return getattr(variant(STUDY, w.task).section.resources, name) or resources_of(name)

    return pick


def benchmark_file(rule_name, *parts):
    # Snakemake's benchmark: wall time and peak memory (max_rss, MB) of every job.
    return str(Path(RESULTS, "benchmarks", rule_name, *parts)) + ".tsv"


# -- notebooks ------------------------------------------------------------------------------

with open(SRC / "notebooks" / "outputs.yaml") as _f:
    NOTEBOOKS = yaml.safe_load(_f)


def notebook_outputs(name):
    nb = NOTEBOOKS[name]
    return [f"paper/figures/{f}.pdf" for f in nb["figures"]] + [f"paper/tables/{t}.tex" for t in nb["tables"]]


def notebook_outputs_for_report(name):
    # The same files, figures flagged for `snakemake --report` (the HTML beside the PDF).
    # (`report` cannot start a line here: the Snakemake parser reads it as a keyword.)
    caption = str(SRC / "workflow" / "report" / "figure.rst")
    flagged = [report(f, caption=caption, category=name) for f in notebook_outputs(name) if f.endswith(".pdf")]
    return flagged + [f for f in notebook_outputs(name) if not f.endswith(".pdf")]


def notebook_inputs(name):
    files = []
    for item in NOTEBOOKS[name]["inputs"]:
        if item.startswith("runs:"):
            files += all_runs(item.removeprefix("runs:"))
        elif item.startswith("src:"):
            files.append(str(SRC / item.removeprefix("src:")))
        elif item.startswith("bench:"):
            # Committed GPU benchmark CSVs (results/bench/), read when present.
            files += sorted(str(p) for p in (SRC / "results" / "bench").glob(item.removeprefix("bench:")))
        else:
            files.append(f"{RESULTS}/{item}")
    return files


def notebook_params(name):
    params = {"results_dir": RESULTS, "paper_dir": "paper"}
    for key, value in NOTEBOOKS[name].get("params", {}).items():
        if value.startswith("src:"):  # a path in the repository
            value = str(SRC / value.removeprefix("src:"))
        elif value.startswith("config:"):  # a setting of the study, e.g. config:report.scope
            value = functools.reduce(getattr, value.removeprefix("config:").split("."), STUDY)
        params[key] = value
    return " ".join(f"-p {k} {shlex.quote(v)}" for k, v in params.items())
