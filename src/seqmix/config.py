"""Configuration: load, validate against workflow/schemas/config.schema.yaml, fill defaults.

This module imports only yaml and jsonschema so that the Snakefile can validate a config
before any job runs, even in an environment without torch (snakemake --use-conda).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"
MIRROR_ENV = "SEQMIX_DATA_MIRROR"
TASKS = ("wikitext2", "snli", "mqar")
# Language-modelling tasks train a causal LM; snli trains a pair classifier.
LM_TASKS = ("wikitext2", "mqar")


class ConfigError(ValueError):
    """A configuration that does not match the schema; the message names every bad key."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    with open(path) as f:
        schema = yaml.safe_load(f)
    return _inline_refs(schema, schema.get("definitions", {}))


def _inline_refs(node: Any, definitions: Mapping[str, Any]) -> Any:
    # The schema has no recursive definitions, so inlining every "#/definitions/x" gives a
    # plain tree whose "default" values are visible where the defaults are filled in.
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].removeprefix("#/definitions/")
            merged = dict(_inline_refs(definitions[name], definitions))
            merged.update({k: _inline_refs(v, definitions) for k, v in node.items() if k != "$ref"})
            return merged
        return {k: _inline_refs(v, definitions) for k, v in node.items() if k != "definitions"}
    if isinstance(node, list):
        return [_inline_refs(v, definitions) for v in node]
    return node


def _default_filling_validator(schema: dict):
    """A Draft-7 validator that fills in schema defaults while it validates."""
    # Imported here: jsonschema takes ~2 s to import (its format checkers), and training and
    # evaluation jobs, which receive an already validated spec, never need it.
    import jsonschema

    def fill_defaults(validator, properties, instance, schema) -> Iterator:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if name not in instance and isinstance(sub, dict) and "default" in sub:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from jsonschema.Draft7Validator.VALIDATORS["properties"](validator, properties, instance, schema)

    cls = jsonschema.validators.extend(jsonschema.Draft7Validator, {"properties": fill_defaults})
    return cls(schema)


def _key_path(error) -> str:
    parts: list[str] = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (f".{p}" if parts else str(p)))
    return "".join(parts) or "<top level>"


def _describe(error) -> str:
    key = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = f" under '{key}'" if error.absolute_path else ""
        return (
            f"unknown key(s) {', '.join(repr(e) for e in extra)}{where}; "
            f"allowed: {', '.join(allowed)}"
        )
    if error.validator == "enum":
        allowed = ", ".join(str(v) for v in error.validator_value)
        return f"config key '{key}': {error.instance!r} is not one of the allowed values: {allowed}"
    if error.validator == "propertyNames":
        allowed = ", ".join(error.validator_value.get("enum", []))
        return f"config key '{key}': {error.instance!r} is not an allowed name; allowed: {allowed}"
    if error.validator == "required":
        return f"config key '{key}': {error.message}"
    return f"config key '{key}': {error.message}"


def validate_config(config: Mapping[str, Any], source: str = "config") -> dict:
    """Return a validated deep copy of ``config`` with schema defaults filled in.

    Raises ConfigError listing every problem, each with its dotted key and the allowed
    values, before any work starts.
    """
    resolved = copy.deepcopy(dict(config))
    validator = _default_filling_validator(load_schema())
    errors = sorted(validator.iter_errors(resolved), key=lambda e: list(e.absolute_path))
    # Defaults are filled while validating, so a second pass sees the complete tree.
    if not errors:
        errors = sorted(validator.iter_errors(resolved), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise ConfigError(
            f"{source} is not a valid seqmix config ({SCHEMA_PATH.relative_to(REPO_ROOT)}):\n{lines}"
        )
    _check_cross_fields(resolved, source)
    return resolved


def _check_cross_fields(cfg: dict, source: str) -> None:
    wt = cfg["tasks"].get("wikitext2")
    if wt and wt["train_split"] == wt["eval_split"]:
        raise ConfigError(
            f"{source}: config key 'tasks.wikitext2.eval_split' equals train_split "
            f"({wt['train_split']!r}); evaluate on a split the model did not train on"
        )


def load_config(path: str | os.PathLike | None = None, overrides: Mapping | None = None) -> dict:
    """Read a YAML config file (or a JSON string starting with '{'), validate it."""
    if path is None:
        path = REPO_ROOT / "config" / "config.yaml"
    text = str(path)
    if text.lstrip().startswith("{"):
        raw, source = json.loads(text), "config given as JSON"
    else:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist (try config/config.yaml)")
        with open(p) as f:
            raw = yaml.safe_load(f) or {}
        source = f"config file {p}"
    if overrides:
        raw = deep_merge(raw, overrides)
    return validate_config(raw, source)


def deep_merge(base: Mapping, override: Mapping) -> dict:
    out = copy.deepcopy(dict(base))
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def runs(cfg: Mapping) -> list[tuple[str, str, int]]:
    """Every (task, arch, seed) the config trains. Non-causal mixers skip LM tasks."""
    out = []
    for task in cfg["tasks"]:
        for arch in cfg["architectures"]:
            if task in LM_TASKS and arch in NONCAUSAL_ONLY:
                continue
            for seed in cfg["seeds"]:
                out.append((task, arch, seed))
    return out


def sparsity_runs(cfg: Mapping) -> list[tuple[str, str, int]]:
    """The runs whose trained attention the sparsity analysis measures: every run of
    ``analysis.sparsity.task``, and, for architectures with no run on it (non-causal-only
    mixers on a language-model task), their runs of ``analysis.sparsity.fallback_task``."""
    scfg = cfg["analysis"]["sparsity"]
    all_runs = runs(cfg)
    primary = [r for r in all_runs if r[0] == scfg["task"]]
    covered = {arch for _, arch, _ in primary}
    fallback = scfg.get("fallback_task")
    extra = [r for r in all_runs if fallback and r[0] == fallback and r[1] not in covered]
    return primary + extra


# Architectures with no causal form (they mix all positions); kept here, not in the mixer
# modules, because the Snakefile needs it without importing torch. A test holds it equal to
# the registry's `supports_causal` flags.
NONCAUSAL_ONLY = ("linformer",)


def run_dir(cfg: Mapping, task: str, arch: str, seed: int) -> Path:
    return Path(cfg["results_dir"]) / "runs" / task / arch / f"seed{seed}"


def run_spec(cfg: Mapping, task: str, arch: str, seed: int) -> dict:
    """Everything one training run needs, and nothing else (so that a change to another
    task's settings does not invalidate this run)."""
    if task not in cfg["tasks"]:
        raise ConfigError(f"task {task!r} is not in the config's tasks: {', '.join(cfg['tasks'])}")
    if arch not in cfg["architectures"]:
        raise ConfigError(
            f"architecture {arch!r} is not in the config's architectures: "
            f"{', '.join(cfg['architectures'])}"
        )
    task_cfg = copy.deepcopy(cfg["tasks"][task])
    return {
        "profile": cfg["profile"],
        "task": task,
        "arch": arch,
        "seed": int(seed),
        "data": {**copy.deepcopy(cfg["data"]), "tokenizer": copy.deepcopy(cfg["tokenizer"])},
        "task_config": {k: v for k, v in task_cfg.items() if k not in ("model", "train")},
        "model": task_cfg["model"],
        "train": task_cfg["train"],
        "mixer_options": copy.deepcopy(cfg.get("mixers", {}).get(arch, {})),
        "run_dir": str(run_dir(cfg, task, arch, seed)),
    }


def data_spec(cfg: Mapping, task: str) -> dict:
    """What preparing one task's data depends on."""
    spec = {"data": copy.deepcopy(cfg["data"]), "tokenizer": copy.deepcopy(cfg["tokenizer"])}
    if task in cfg["tasks"]:
        t = cfg["tasks"][task]
        spec["task_config"] = {k: v for k, v in t.items() if k not in ("model", "train")}
    return spec
