"""A profile read once: the one place that tells a JSON object from a file name (``is_json``),
reads the file, resolves what it ``extends``, puts overrides on top and reads its numerics.

``read_profile`` returns a ``Profile``: its keys (what it extends under its own, the overrides
over both), the files it read, in order, and the numerics it sets with where it sets them. The
command line pins those numerics before torch is imported and validates the same keys after
(seqmix.expansion.validate); `python -m seqmix jobs` lists the same files for the Snakefile's
cache (seqmix.study.dag). Nothing reads a profile a second time.

Standard library, PyYAML and the bottom of seqmix only: no torch, no task or mixer class.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqmix import REPO_ROOT, numerics
from seqmix.errors import ConfigError
from seqmix.io import yaml_data

DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"  # the quick profile: what a command reads without --config
EXTENDS = "extends"


def is_json(config: str | os.PathLike) -> bool:
    """Whether ``config`` is a profile given as a JSON object rather than a file name."""
    return str(config).lstrip().startswith("{")


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profile as read (``read_profile``), not validated yet."""

    raw: dict[str, Any]  # its keys: those of what it extends, its own over them, the overrides over both
    source: str  # how messages name it: "config file <path>" or "config given as JSON"
    files: tuple[Path, ...]  # the files read, its own first, then what each extends (resolved paths)
    numerics_from: str | None  # where its numerics are set: --overrides, a file, --config (JSON); None: nowhere

    @property
    def numerics(self) -> str | None:
        """The numerics it sets (None: none, seqmix.numerics.DEFAULT applies), read before torch;
        a value that is not a mode is a ConfigError naming where it is set."""
        try:
            return numerics.checked_mode(self.raw.get("numerics"), str(self.numerics_from))
        except ValueError as e:
            raise ConfigError(f"{e} (fix the key 'numerics')") from None


def read_profile(config: str | os.PathLike | None = None, overrides: Mapping | None = None) -> Profile:
    """Read one profile (a file, default config/config.yaml, or a JSON object) and what it
    ``extends``, with ``overrides`` on top: exactly that profile, nothing of another unless
    it says ``extends``."""
    config = DEFAULT_CONFIG if config is None else config
    if is_json(config):
        source, origin, seen = "config given as JSON", None, ()
        chain = [("--config", None, _json_keys(str(config)))]
    else:
        path = Path(config)
        source, origin, seen = f"config file {path}", path.parent, (path.resolve(),)
        chain = [(str(path.resolve()), path.resolve(), read_config_file(path))]
    chain += _extended(chain[0][2], origin, seen)
    raw: dict[str, Any] = {}
    for _, _, keys in reversed(chain):  # the farthest first, each nearer one over it
        raw = deep_merge(raw, {k: v for k, v in keys.items() if k != EXTENDS})
    layers = [("--overrides", overrides or {}), *((where, keys) for where, _, keys in chain)]
    if overrides:
        raw = deep_merge(raw, overrides)
    return Profile(raw=raw, source=source, files=tuple(file for _, file, _ in chain if file is not None),
                   numerics_from=next((where for where, keys in layers if "numerics" in keys), None))


def _extended(keys: Mapping, origin: Path | None, seen: tuple[Path, ...]) -> list[tuple[str, Path, dict]]:
    """(where, file, its keys) of each file ``keys`` extends, nearest first. ``extends: <file>``
    is relative to ``origin``, the directory of the profile that names it: config/paper-smoke.yaml
    is config/paper.yaml plus its cuts, never a copy that can drift."""
    base_name = keys.get(EXTENDS)
    if base_name is None:
        return []
    if not isinstance(base_name, str):
        raise ConfigError(f"config key 'extends' must name one config file, got {base_name!r}")
    base_path = Path(origin or ".") / base_name
    if not base_path.exists():
        raise ConfigError(f"config key 'extends': {base_path} does not exist (the path is relative to the "
                          "directory of the file that names it)")
    if base_path.resolve() in seen:
        raise ConfigError(f"config key 'extends': {base_path} extends itself through "
                          + " -> ".join(map(str, seen)))
    base = read_config_file(base_path)
    resolved = base_path.resolve()
    return [(str(resolved), resolved, base), *_extended(base, base_path.parent, (*seen, resolved))]


def _json_keys(text: str) -> dict:
    import yaml

    try:
        raw = yaml_data(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config given as JSON is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config given as JSON holds a {type(raw).__name__}, not a mapping of config keys")
    return raw


def read_config_file(path: str | os.PathLike) -> dict:
    """The keys of one YAML profile file, as written (its ``extends`` not resolved)."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist (try config/config.yaml)")
    try:
        raw = yaml_data(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {p} holds a {type(raw).__name__}, not a mapping of config keys")
    return raw


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """``override`` on top of ``base``: mappings key by key, anything else (lists included) replaced."""
    out = copy.deepcopy(dict(base))
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
