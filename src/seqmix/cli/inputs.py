"""What a command reads, each once: its job spec (``--spec``: the JSON the Snakefile passes,
what that job reads and nothing else), its run (``eval --run``) or its study (``--config``, a
YAML file or a JSON object, with ``--overrides`` on top), and the numerics it runs under,
taken from the same before torch is imported (``numerics_of``).

A study is read once per command: ``profile_of`` reads the profile (seqmix.study.profile) and
keeps it with the command's arguments, so that the numerics pinned first and the study the
command then validates and expands (``study_of``, ``expansion_of``: seqmix.expansion, which
imports the task and mixer classes, hence torch) come from that one reading.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from seqmix import numerics
from seqmix.errors import ConfigError, problem_lines
from seqmix.study.profile import Profile, read_profile

if TYPE_CHECKING:
    from seqmix.expansion.table import Expansion
    from seqmix.study.settings import Study

_READ = "_profile_read"  # where profile_of keeps its one reading in the command's arguments


def numerics_of(args) -> tuple[str, str | None]:
    """The numerics a command runs under and where they were read (None: the default):
    ``--numerics``, its job spec's (``--spec``), its run's (``eval --run``), else its profile's
    (``--config``, with ``--overrides``). A profile that cannot be read pins the default: the
    command's own reading of it then says what is wrong."""
    spec, run, config = (getattr(args, k, None) for k in ("spec", "run", "config"))
    if asked := getattr(args, "asked_numerics", None):
        return asked, "--numerics"
    try:
        if spec:  # a job without numerics (a data job) computes nothing with torch: nothing to pin
            return numerics.mode_in_spec(spec) or "native", "--spec"
        if run and (mode := numerics.mode_in_run(run)):
            return mode, f"{run}/config.json"
    except ValueError as e:
        raise ConfigError(f"{e} (fix the key 'numerics')") from None
    if config:
        try:
            profile = profile_of(args)
        except ConfigError:
            return numerics.DEFAULT, None
        if mode := profile.numerics:
            return mode, str(config)
    return numerics.DEFAULT, None


def profile_of(args) -> Profile:
    """The profile of ``--config`` with ``--overrides`` on top, read at the first call and kept
    with ``args`` (a profile that cannot be read: the same ConfigError at every call)."""
    read = vars(args).get(_READ)
    if read is None:
        try:
            read = read_profile(args.config, overrides_of(args))
        except ConfigError as e:
            read = e
        setattr(args, _READ, read)
    if isinstance(read, ConfigError):
        raise read
    return read


def overrides_of(args) -> dict[str, Any] | None:
    """``--overrides``: config keys over the file's, as a JSON object (Snakemake's --config)."""
    text = getattr(args, "overrides", None)
    if not text:
        return None
    try:
        overrides = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--overrides is not JSON ({e}); give config keys as a JSON object") from None
    if not isinstance(overrides, dict):
        raise ConfigError(f"--overrides holds a {type(overrides).__name__}; give config keys as a JSON object")
    return overrides


def study_of(args) -> Study:
    """The validated study of the command's profile (seqmix.expansion.validate)."""
    from seqmix.expansion.validate import validate_profile

    return validate_profile(profile_of(args))


def expansion_of(args) -> Expansion:
    """The command's study, validated and expanded (seqmix.expansion.table.Expansion)."""
    from seqmix.expansion.table import expand

    return expand(study_of(args))


def job_of(args, model, build):
    """The job's spec: ``--spec`` as given, else built by ``build`` from the expansion of the
    study of ``--config``."""
    return parse_spec(model, args.spec) if args.spec else build(expansion_of(args))


def parse_spec(model, text: str):
    """A job spec given as JSON (``--spec``), validated: ConfigError naming every bad key."""
    from pydantic import ValidationError

    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        lines = problem_lines(e.errors(), what="key")
        problems = "; ".join(lines[:8]) + (f"; and {len(lines) - 8} more" if len(lines) > 8 else "")
        raise ConfigError(
            f"--spec is not a valid {model.__name__} ({problems}); pass the JSON the Snakefile writes "
            "(`snakemake -n -p` prints it), or use --config instead") from None
