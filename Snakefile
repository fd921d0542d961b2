# seqmix: data -> train (task x arch x seed) -> eval -> analyses -> notebooks -> report.pdf
# Thin on purpose: one library call, seqmix.study.dag.read_jobs, gives the study's job table before
# any job runs, and every rule calls the library through `python -m seqmix ...` with the spec
# of what that job reads (workflow/rules/*.smk). The table is made by a subprocess, cached:
# validating a profile imports each mixer's and task's module (torch), parsing must not.
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("8.0")

# The seqmix beside this Snakefile, here and in every job (a scratch copy runs its own code).
sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from seqmix.study import dag  # noqa: E402


report: "workflow/report/workflow.rst"


# A profile is exactly one config file (and what it `extends:`) plus the defaults. There is
# no `configfile:` directive, which Snakemake would merge under every --configfile: without
# one the quick profile (config/config.yaml) is read, with any --config KEY=VALUE on top.
try:
    JOBS = dag.read_jobs(config, workflow.overwrite_configfiles)
except dag.StudyError as _e:
    sys.exit(str(_e))

# Every job's shell: strict bash, this seqmix, and the study's numerics pinned (seqmix.numerics).
shell.prefix(dag.shell_prefix(JOBS.numerics))


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


# The claims the report tests (the claims notebook's file, paper/claims.yaml), read as typed
# data at every parse like the config (no torch): a malformed claim stops here, dry runs
# included, one line per problem naming the claim and the key (seqmix.report.claims_file).
from seqmix.report.claims_file import ClaimsError, load_claims  # noqa: E402

try:
    load_claims(NOTEBOOKS["claims"].params["claims_file"])
except ClaimsError as _e:
    sys.exit(f"error: {_e}")


# Before the first job (not in a dry run): what would fail at this study's shapes (budgets
# that cannot be met, bf16 on a machine without a GPU, analysis lengths beyond its memory)
# stops the run here, each problem with its config key and the fix (seqmix.preflight). It
# reads the jobs' specs from the table: the study was validated once, when the table was made.
onstart:
    from seqmix.preflight import Specs, preflight

    _problems = preflight(Specs.of_table(JOBS.table), local=workflow.local_exec)
    if _problems:
        sys.exit("error: the study would fail at its shapes:\n" + "\n".join(f"  - {p}" for p in _problems))


rule all:
    default_target: True
    localrule: True
    input:
        f"{REPORT}/report.pdf",
        "paper/report.pdf",  # a copy of it (rule latest_report)
