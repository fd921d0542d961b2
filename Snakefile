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
from seqmix.config import DEFAULT_CONFIG, ConfigError, deep_merge, read_config_file, validate_config  # noqa: E402


report: "workflow/report/workflow.rst"


# A profile is exactly one config file plus the defaults. There is no `configfile:`
# directive, which Snakemake would merge under every --configfile: without one the quick
# profile (config/config.yaml) is read, with any --config KEY=VALUE on top.
if not workflow.overwrite_configfiles:
    _raw = deep_merge(read_config_file(DEFAULT_CONFIG), config)
    config.clear()
    config.update(_raw)
try:
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


rule all:
    default_target: True
    input:
        "paper/report.pdf",
