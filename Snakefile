# seqmix: data -> train (task x arch x seed) -> eval -> analyses -> notebooks -> report.pdf
# Thin on purpose: the config is validated here, before any job runs, and every rule
# calls the library through `python -m seqmix ...` (workflow/rules/*.smk).
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("8.0")

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from seqmix.config import ConfigError, validate_config  # noqa: E402  (yaml + jsonschema only)


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


try:
    _resolved = validate_config(config, source="the snakemake config")
except ConfigError as _e:
    sys.exit(f"error: {_e}")
config.clear()
config.update(_resolved)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        "paper/report.pdf",
