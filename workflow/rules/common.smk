# Shared helpers for the rules: run lists, paths and the per-job JSON the commands receive.
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


def study_config():
    # The study without its analysis and report sections (what run lists depend on).
    return json.dumps(STUDY.model_dump(mode="json", exclude={"analysis", "report"}), sort_keys=True,
                      separators=(",", ":"))


def analysis_config(section):
    # What an analysis command needs: the study without the other analyses' sections, so
    # that editing one analysis does not rerun the others.
    cfg = STUDY.model_dump(mode="json", exclude={"analysis", "report"})
    cfg["analysis"] = {section: getattr(STUDY.analysis, section).model_dump(mode="json")}
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


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


# -- resources ------------------------------------------------------------------------------
# Memory (MB) and wall time (minutes) each job declares. A cluster executor turns them into
# its request (SLURM: sbatch --mem and --time; workflow/profiles/slurm adds nothing of its
# own); a local run counts them only against --resources. One size per rule until the
# config carries per-task estimates; a site overrides a rule with
# --set-resources RULE:mem_mb=MB (or RULE:runtime=MINUTES).
JOB_RESOURCES = {
    "data": (4000, 60),
    "train": (8000, 360),
    "eval": (4000, 60),
    "summary": (2000, 30),
    "complexity": (8000, 120),
    "sparsity_run": (8000, 120),
    "geometry": (4000, 60),
    "notebook": (2000, 30),
    "report": (2000, 30),
}


def job_resources(kind):
    mem_mb, runtime = JOB_RESOURCES[kind]
    return {"mem_mb": mem_mb, "runtime": runtime}


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
        params[key] = str(SRC / value.removeprefix("src:")) if value.startswith("src:") else value
    return " ".join(f"-p {k} {shlex.quote(v)}" for k, v in params.items())
