"""A profile validated at the door, every bad key named, into a study: typed, frozen pydantic
models (``seqmix.study.settings``) that hold every default once. A task kind's own settings
live on its ``Settings`` model and a mixer's options on its ``Options`` dataclass, so adding
either never touches this file: this is the one place that validates what needs those
classes, hence torch, and it sits above seqmix.tasks and seqmix.mixers. Reading the profile
(its file, ``extends``, overrides, numerics) is seqmix.study.profile's, below them.
Tasks are named ``<kind>`` or ``<kind>/<variant>`` (several instances of one kind, each with
its own data, runs and rows); a task's ``sweep`` expands it into one task per grid point
(seqmix.expansion.table).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError, create_model

from seqmix import REPO_ROOT, catalogue
from seqmix.errors import ConfigError, problem_lines  # ConfigError: re-exported
from seqmix.mixers import mixer_class, options_model
from seqmix.study.profile import Profile, read_profile
from seqmix.study.settings import Study, StudyFile, TaskCommon, TaskSettings
from seqmix.study.sweep import sweep_points, sweep_problems
from seqmix.tasks import task_class

SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.json"
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*(/[A-Za-z0-9][A-Za-z0-9_.+-]*)*$")

# ------------------------------------------------------------------------------------------
# Validation.
# ------------------------------------------------------------------------------------------

_SECTION_MODELS: dict[str, type[TaskCommon]] = {}


def task_section_model(kind: str) -> type[TaskCommon]:
    """The model of a ``tasks.<kind>[/<variant>]`` section: the kind's settings + TaskCommon."""
    if kind not in _SECTION_MODELS:
        settings = task_class(kind).Settings
        _SECTION_MODELS[kind] = create_model(f"{settings.__name__}Section", __base__=(settings, TaskCommon))
    return _SECTION_MODELS[kind]


def settings_of(kind: str, section: TaskCommon) -> TaskSettings:
    """The kind's own settings of a task section (without model, train, seeds, sweep)."""
    settings_cls = task_class(kind).Settings
    return settings_cls.model_validate(section.model_dump(include=set(settings_cls.model_fields)))


def _options_model(arch: str) -> type[BaseModel]:
    """The pydantic model of a mixer's options (seqmix/mixers/options.py): types, defaults,
    bounds from each field's metadata, and its cross-field checks."""
    return options_model(mixer_class(arch).Options)


def mixer_options(arch: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """A mixer's complete options: ``given`` validated, its Options defaults filled in."""
    return _options_model(arch).model_validate(dict(given)).model_dump(mode="json")


def _allowed_keys(model: type[BaseModel], prefix: tuple = ()) -> dict[tuple, list[str]]:
    """Allowed keys of every nested section of ``model``, by location."""
    out = {prefix: list(model.model_fields)}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_allowed_keys(ann, prefix + (name,)))
    return out


def _errors_of(exc: ValidationError, prefix: tuple = ()) -> list[dict]:
    return [{**e, "loc": prefix + tuple(e["loc"])} for e in exc.errors()]


def _validate_tasks(raw_tasks: Mapping, errors: list, allowed: dict) -> dict[str, TaskCommon]:
    out = {}
    for name, body in raw_tasks.items():
        kind = catalogue.kind_of(name)
        if not TASK_NAME.match(name):
            errors.append({"type": "value_error", "loc": ("tasks", name), "msg": "a task name is <kind> or <kind>/<variant>, of letters, digits and _.+- only"})
            continue
        if kind not in catalogue.task_kinds():
            errors.append({"type": "value_error", "loc": ("tasks", name),
                           "msg": f"unknown task kind {kind!r}; the catalogue (seqmix/catalogue.py) has: {', '.join(catalogue.task_kinds())}"})
            continue
        model = task_section_model(kind)
        allowed.update(_allowed_keys(model, ("tasks", name)))
        try:
            out[name] = model.model_validate(body or {})
        except ValidationError as e:
            errors.extend(_errors_of(e, ("tasks", name)))
    return out


def _validate_mixers(raw_mixers: Mapping, errors: list, allowed: dict) -> dict[str, dict]:
    out = {}
    for arch, options in raw_mixers.items():
        model = _options_model(arch)
        allowed[("mixers", arch)] = list(model.model_fields)
        try:
            out[arch] = model.model_validate(options or {}).model_dump(mode="json")
        except ValidationError as e:
            errors.extend(_errors_of(e, ("mixers", arch)))
    return out


def validate_study(raw: Mapping[str, Any], source: str = "config") -> Study:
    """The validated, typed study of a raw config mapping.

    Raises ConfigError listing every problem, each with its dotted key and the allowed
    keys or values, before any work starts.
    """
    raw = copy.deepcopy(dict(raw))
    allowed = _allowed_keys(StudyFile)
    try:
        shape = StudyFile.model_validate(raw)
        errors: list[dict] = []
    except ValidationError as e:
        errors, shape = _errors_of(e), None
    tasks = _validate_tasks(raw.get("tasks") or {}, errors, allowed) if isinstance(raw.get("tasks"), Mapping) else {}
    mixers = (_validate_mixers(raw.get("mixers") or {}, errors, allowed)
              if shape is not None else {})
    if errors or shape is None:
        _raise(source, problem_lines(errors, allowed))
    study = Study.model_validate({**shape.model_dump(exclude={"tasks", "mixers"}), "tasks": tasks, "mixers": mixers})
    problems = _cross_checks(study)
    if problems:
        _raise(source, problems)
    return study


def _raise(source: str, lines: list[str]) -> None:
    body = "\n".join(f"  - {line}" for line in lines)
    raise ConfigError(f"{source} is not a valid seqmix config:\n{body}")


def _cross_checks(study: Study) -> list[str]:
    """Constraints between sections: analyses name tasks of this study, sweeps name settings."""
    problems = []
    # A task with a sweep can be named whole (every point) or one point at a time.
    names = [n for name, section in study.tasks.items()
             for n in [name, *(f"{name}/{point}" for point, _, _ in sweep_points(section))]]
    sp, geo = study.analysis.sparsity, study.analysis.geometry
    for key, value in [("analysis.sparsity.tasks", t) for t in (sp.tasks or [])] + [
            ("analysis.sparsity.fallback_task", None if sp.fallback_task == "auto" else sp.fallback_task),
            ("analysis.geometry.task", geo.task)]:
        if value is not None and value not in names:
            problems.append(f"config key '{key}': {value!r} is not a task of this study; tasks: {', '.join(names)}")
    problems += _copy_probe_problems(study, names)
    for name, section in study.tasks.items():
        problems += sweep_problems(name, section)
        problems += _task_mixer_problems(study, name, section)
        problems += _pack_problems(study, name, section)
    return problems


def _pack_problems(study: Study, name: str, section: TaskCommon) -> list[str]:
    """``train.pack`` only where every packed run can be vectorised: its mixer's and task's
    ``packable`` (seqmix.train.pack refuses them at step 0 otherwise, after the DAG started)."""
    kind, problems = catalogue.kind_of(name), []
    sections = [section, *(at for _, _, at in sweep_points(section))]
    if not any(s.train.pack is not False for s in sections):
        return problems
    where = f"config key 'tasks.{name}.train.pack'"
    archs = section.architectures or study.architectures
    if task_class(kind).is_language_model:
        archs = [a for a in archs if mixer_class(a).supports_causal]
    packed = [a for a in archs if any(s.train.pack_for(a) for s in sections)]
    if packed and task_class(kind).packable is not True:
        problems.append(f"{where}: a {kind} task cannot train in seed packs: {task_class(kind).packable}; "
                        "set it false")
        return problems
    for arch in packed:
        reason = mixer_class(arch).packable
        if reason is not True:
            problems.append(f"{where}: {arch} cannot train in a seed pack: {reason}; set it false for {arch} "
                            f"(pack: {{default: true, {arch}: false}})")
    return problems


def _copy_probe_problems(study: Study, names: list[str]) -> list[str]:
    """``analysis.copy_probe`` names a recall (MQAR) task of this study and causal architectures."""
    probe, problems = study.analysis.copy_probe, []
    recall = [n for n in names if task_class(catalogue.kind_of(n)).is_recall]
    if probe.task not in (None, "auto", *recall):
        problems.append(f"config key 'analysis.copy_probe.task': {probe.task!r} is not a recall (MQAR) task of this "
                        f"study; choose one of: {', '.join(['auto', *recall])}, or null (no probe)")
    no_causal = [a for a in probe.architectures or [] if not mixer_class(a).supports_causal]
    if no_causal:
        problems.append(f"config key 'analysis.copy_probe.architectures': {', '.join(no_causal)} "
                        "has no causal form (the probe is a causal LM); leave it out")
    return problems


def _task_mixer_problems(study: Study, name: str, section: TaskCommon) -> list[str]:
    """A task's ``mixers.<arch>`` options, checked over the study's as the runs merge them."""
    problems = []
    for arch, options in section.mixers.items():
        where = ("tasks", name, "mixers", arch)
        try:
            _options_model(arch).model_validate({**study.mixers.get(arch, {}), **options})
        except ValidationError as e:
            problems += problem_lines(_errors_of(e, where), {where: list(_options_model(arch).model_fields)})
    return problems


# ------------------------------------------------------------------------------------------
# Loading: a profile read (seqmix.study.profile), then validated.
# ------------------------------------------------------------------------------------------


def validate_profile(profile: Profile) -> Study:
    """The study of a profile read by seqmix.study.profile.read_profile."""
    return validate_study(profile.raw, profile.source)


def load_study(config: str | os.PathLike | None = None, overrides: Mapping | None = None) -> Study:
    """Read one profile (default config/config.yaml) and what it ``extends``, apply
    ``overrides``, validate: ``validate_profile(read_profile(config, overrides))``.

    Exactly that profile plus the defaults: nothing is read from another profile unless the
    file says ``extends``.
    """
    return validate_profile(read_profile(config, overrides))


def config_schema() -> dict:
    """The JSON schema of a config file: the study's shape with every catalogued task kind's
    section spelled out (what workflow/schemas/ holds).

    What it says of mixers is open, so that a file written before a mixer was catalogued
    stays true: a mixer name is any string (``$defs/ArchName``, the catalogued ones as
    completions in ``examples``), and ``mixers`` describes each catalogued mixer's options,
    bounds included, and takes any other name's as an object. Validation (validate_study)
    still refuses an unknown mixer or option, naming the key."""
    schema = StudyFile.model_json_schema()
    sections = {}
    for kind in catalogue.task_kinds():
        section = task_section_model(kind).model_json_schema()
        schema["$defs"].update(section.pop("$defs", {}))  # one set of definitions, at the root
        sections[f"^{kind}(/[A-Za-z0-9][A-Za-z0-9_.+-]*)*$"] = section
    schema["properties"]["tasks"] = {
        "type": "object", "minProperties": 1, "description": StudyFile.model_fields["tasks"].description,
        "patternProperties": sections, "additionalProperties": False,
    }
    schema = _arch_names_by_reference(schema)
    schema["$defs"]["ArchName"] = {"type": "string", "description": "a mixer of the catalogue (seqmix/catalogue.py)",
                                   "examples": catalogue.mixer_names()}
    schema["properties"]["mixers"] = {
        "type": "object", "description": StudyFile.model_fields["mixers"].description,
        "propertyNames": {"$ref": "#/$defs/ArchName"},
        "properties": {arch: _options_model(arch).model_json_schema() for arch in catalogue.mixer_names()},
        "additionalProperties": {"type": "object"},
    }
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "seqmix study configuration"
    return schema


def _arch_names_by_reference(node: Any) -> Any:
    """``node`` with every enumeration of the catalogue's mixer names replaced by a
    reference to ``$defs/ArchName``."""
    if isinstance(node, dict):
        if node.get("enum") == catalogue.mixer_names():
            return {"$ref": "#/$defs/ArchName"}
        return {k: _arch_names_by_reference(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_arch_names_by_reference(v) for v in node]
    return node
