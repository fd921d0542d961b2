"""The error a bad configuration raises, low in the stack so that every layer (training
included) can raise it without importing the config loader; ``seqmix.expansion.validate``
re-exports it.
And the one way a validation error becomes lines a person reads: ``problem_lines`` turns
pydantic's errors (a config file, a job spec, a mixer's options, the claims file) into one
line per problem naming the key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# pydantic's error types for a key the model does not have
UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")


class ConfigError(ValueError):
    """A configuration that is not valid; the message names every bad key and the fix."""


def key_name(loc: Sequence) -> str:
    """A location as the file writes it: ``tasks.mqar.train.lr``, ``architectures[1]``."""
    parts: list[str] = []
    for p in loc:
        parts.append(f"[{p}]" if isinstance(p, int) else (f".{p}" if parts else str(p)))
    return "".join(parts)


def describe(error: Mapping, what: str = "config key") -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) as one line: ``what`` and
    the key, then what is wrong with it (a problem of the whole model: its message alone)."""
    loc, kind = tuple(error["loc"]), error["type"]
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        expected = str(error["ctx"]["expected"]).replace("'", "")
        message = f"{error['input']!r} is not one of the allowed values: {expected}"
    elif kind == "union_tag_invalid":
        expected = str(error["ctx"]["expected_tags"]).replace("'", "")
        message = f"{error['ctx']['tag']!r} is not one of the allowed values: {expected}"
    if not loc:
        return message
    if kind in ("missing", "union_tag_not_found"):
        return f"{what} '{key_name(loc)}' is required"
    return f"{what} '{key_name(loc)}': {message}"


def problem_lines(errors: Sequence[Mapping], allowed: Mapping[tuple, Sequence[str]] | None = None,
                  what: str = "config key") -> list[str]:
    """One line per problem of ``errors`` (pydantic's, their ``loc`` from the file's root);
    unknown keys are grouped under their parent, with the keys ``allowed`` there when known."""
    lines, unknown = [], {}
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] in UNKNOWN_KEY:
            unknown.setdefault(loc[:-1], []).append(loc[-1])
        else:
            lines.append(describe(e, what))
    for parent, keys in unknown.items():
        where = f" under '{key_name(parent)}'" if parent else ""
        ok = sorted((allowed or {}).get(parent, []))
        lines.append(f"unknown key(s) {', '.join(repr(k) for k in keys)}{where}"
                     + (f"; allowed: {', '.join(ok)}" if ok else ""))
    return lines


class CodeChanged(ConfigError):
    """A job's code differs from the code the workflow planned it with (an edit while the
    workflow ran): its results would name code that did not make them."""
