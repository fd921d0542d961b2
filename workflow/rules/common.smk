# What the rules read: JOBS (seqmix.study.dag.Jobs, the study's job table) and the names below.
# Every path comes from the table (a run's directory is seqmix.expansion.table.Expansion.run_dir's),
# every spec is the JSON its command takes, every size is the config's `resources`.
import re

from seqmix import catalogue

RESULTS = JOBS.results
REPORT = JOBS.report  # <results>/report: this study's figures, tables, report.pdf and report.html
REPO = Path(workflow.basedir)  # the repository: notebooks/ and paper/ live here (not src/)
RUN = "{task}/{arch}/seed{seed}"  # the name of a run's log and benchmark
NOTEBOOKS = JOBS.notebooks(REPO / "notebooks" / "outputs.yaml")
run_file = JOBS.run_file  # run_file("model.pt"): that file of the run {task}/{arch}/seed{seed}
log_file = JOBS.log_file  # <results>/logs/<rule>[/<job>].log
benchmark_file = JOBS.benchmark_file  # <results>/benchmarks/<rule>[/<job>].tsv
resources_of = JOBS.resources  # {mem_mb, runtime} of a rule's jobs


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


wildcard_constraints:
    task=_alternatives(JOBS.tasks),
    group=_alternatives(JOBS.groups),
    arch=_alternatives(catalogue.mixer_names()),
    seed=r"\d+",


def train_threads(w):
    # A task's train.threads, else every core Snakemake gives (the profile's `cores`).
    return JOBS.threads(w.task) or workflow.cores


def flagged_for_report(nb):
    # A notebook's outputs, its figures flagged for `snakemake --report` (the HTML beside the
    # PDF). (`report` cannot start a line here: the Snakemake parser reads it as a keyword.)
    caption = str(REPO / "workflow" / "report" / "figure.rst")
    return [report(f, caption=caption, category=nb.name) for f in nb.figures] + nb.tables
