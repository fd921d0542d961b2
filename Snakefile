# seqmix: data -> train (task x arch x seed) -> eval -> analyses -> notebooks -> report.pdf
# Thin on purpose: the config is validated here, before any job runs, and every rule
# calls the library through `python -m seqmix ...` (workflow/rules/*.smk).
import shlex
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("8.0")

# The jobs run the seqmix beside this Snakefile, the same code that validated the config.
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
shell.prefix(
    "set -euo pipefail; export PYTHONPATH="
    + shlex.quote(_SRC).replace("{", "{{").replace("}", "}}")
    + "${{PYTHONPATH:+:$PYTHONPATH}}; "
)
from seqmix.config import (  # noqa: E402
    DEFAULT_CONFIG,
    ConfigError,
    deep_merge,
    read_config_file,
    resolve_extends,
    validate_config,
)


report: "workflow/report/workflow.rst"


# A profile is exactly one config file (and what it `extends:`) plus the defaults. There is
# no `configfile:` directive, which Snakemake would merge under every --configfile: without
# one the quick profile (config/config.yaml) is read, with any --config KEY=VALUE on top.
try:
    if workflow.overwrite_configfiles:
        _raw = resolve_extends(config, Path(workflow.overwrite_configfiles[-1]).parent)
    else:
        _raw = resolve_extends(deep_merge(read_config_file(DEFAULT_CONFIG), config), DEFAULT_CONFIG.parent)
    config.clear()
    config.update(_raw)
    STUDY = validate_config(config, source=f"the snakemake config ({', '.join(map(str, workflow.overwrite_configfiles)) or DEFAULT_CONFIG})")
except ConfigError as _e:
    sys.exit(f"error: {_e}")
config.clear()
config.update(STUDY.model_dump(mode="json"))


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


# Before the first job (not in a dry run): what would fail at this study's shapes (budgets
# that cannot be met, bf16 on a machine without a GPU, analysis lengths beyond its memory)
# stops the run here, each problem with its config key and the fix (seqmix.plan.preflight).
onstart:
    from seqmix.preflight import preflight

    _problems = preflight(STUDY, local=workflow.local_exec)
    if _problems:
        sys.exit("error: the study would fail at its shapes:\n" + "\n".join(f"  - {p}" for p in _problems))


rule all:
    default_target: True
    localrule: True
    input:
        "paper/report.pdf",
