"""Recorded runs: a finished study's small outputs copied into the repository as data, and
what every report reads of them.

A GPU reaches this project by chance and for minutes; the runs it makes are kept as files
(``python -m seqmix record``) under ``results/recorded/<profile>/<device>-<date>/``:

    meta.json                                how they were made (study, commit, device, host,
                                             date, command, each run's wall time and status)
    runs/<task>/<arch>/seed<k>/              each run's RUN_FILES, no weights

A report cannot rerun them, so it checks them: a recorded run is accepted only where its
``config.json`` is the run spec the headline study's config (HEADLINE_CONFIG) resolves to at
this checkout, keys that say where files were (LOCATION_KEYS) aside. Any other run is
refused with one line naming it and the first difference, and left out of the report, which
prints that line where the run would have counted (the claims row, the figure's caption):
a report whose config moved on since the GPU run still builds, and says what it left out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqmix import REPO_ROOT
from seqmix.io import FileError, read_json, write_json

if TYPE_CHECKING:  # pandas only where a report reads recordings: `record` runs without it
    import pandas as pd

    from seqmix.expansion.table import Expansion

# The headline study (Zhang 2025's WikiText-2 setting, one GPU slice): what recorded runs
# are checked against. Tests and notebooks pass another path where they need one.
HEADLINE_CONFIG = REPO_ROOT / "config" / "paper-headline.yaml"
RECORDED_DIR = REPO_ROOT / "results" / "recorded"  # committed, beside results/bench/
RUN_FILES = ("config.json", "metrics.json", "eval.json", "log.csv", "provenance.json")
# Keys of a run spec that say where its files were, not what was run: a checkout on a GPU
# machine has other paths than the one building the report.
LOCATION_KEYS = ("run_dir", "data_dir", "tokenizer_dir", "data.dir", "data.mirror")
# Keys training adds to config.json, computed from the spec (the solved size, its hash).
DERIVED_KEYS = ("resolved_size", "spec_hash")
ABSENT = "(absent)"


# ------------------------------------------------------------------------------------------
# Recording a finished study.
# ------------------------------------------------------------------------------------------


def record(config: str | os.PathLike, out: str | os.PathLike, command: str = "",
           made_by: str | None = None, commit: str | None = None, partial: bool = False,
           expansion: Expansion | None = None) -> Path:
    """Copy every run's RUN_FILES of the study ``config`` into ``out``/<profile>/<device>-<date>/
    with a meta.json; returns that directory. Refuses (FileError) a study with a run that
    has not finished training and evaluation, before copying anything; ``partial``: records
    the runs that have finished, and meta.json's ``unfinished`` names the others (a GPU call
    that ran out of time: scripts/gpu-headline.sh), refusing only a study with none finished.
    ``commit``: the commit the runs were made at, for runs whose provenance has none (a
    checkout copied to another machine without its .git); it never overrides one they have.
    ``expansion``: the study of ``config``, expanded, where the caller has read it (the
    command line has)."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study

    expansion = expansion or expand(load_study(config))
    study = expansion.study
    dirs = {f"{r.task}/{r.arch}/seed{r.seed}": expansion.run_dir(r) for r in expansion.runs}
    unfinished = {}
    for name, d in dirs.items():
        if missing := [f for f in RUN_FILES if not (d / f).is_file()]:
            unfinished[name] = (f"run {name} of {config} has not finished ({d} has no {', '.join(missing)}): run the "
                                f"study to the end (snakemake --configfile {config}), then record it")
    if unfinished and (not partial or len(unfinished) == len(dirs)):
        raise FileError(next(iter(unfinished.values())))
    dirs = {name: d for name, d in dirs.items() if name not in unfinished}
    meta = {**_meta(study, config, dirs, command, made_by, commit), "unfinished": sorted(unfinished)}
    dest = Path(out) / study.profile / f"{meta['device_dir']}-{meta['date']}"
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, d in dirs.items():
        (tmp / "runs" / name).mkdir(parents=True)
        for f in RUN_FILES:
            shutil.copy2(d / f, tmp / "runs" / name / f)
    write_json(tmp / "meta.json", meta)
    # The whole recording appears at once; one of the same study, device and day is replaced.
    old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def _one(values: Iterable[Any]) -> Any:
    """The value all runs share, else their distinct values joined (a study resumed elsewhere)."""
    distinct = {json.dumps(v): v for v in values}
    return next(iter(distinct.values())) if len(distinct) == 1 else " + ".join(sorted(str(v) for v in distinct.values()))


def _meta(study, config, dirs: dict[str, Path], command: str, made_by: str | None, commit: str | None) -> dict:
    from seqmix.device import device_slug

    prov = {name: read_json(d / "provenance.json") for name, d in dirs.items()}
    metrics = {name: read_json(d / "metrics.json") for name, d in dirs.items()}
    # The day the study ended: its last evaluation.
    ended = max((d / "eval.json").stat().st_mtime for d in dirs.values())
    device = _one(p["device"]["name"] for p in prov.values())
    known = _one(p["git"]["commit"] for p in prov.values())
    return {
        "study": {"config": shown(Path(config)), "profile": study.profile, "results_dir": study.results_dir},
        "git": {"commit": known or commit, "from": "provenance" if known else ("--commit" if commit else None),
                "dirty": _one(p["git"]["dirty"] for p in prov.values())},
        "device": device,
        "device_dir": device_slug(device),
        "host": _one(p["host"] for p in prov.values()),
        "date": dt.datetime.fromtimestamp(ended, dt.UTC).date().isoformat(),
        "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "made_by": made_by,
        "files": list(RUN_FILES),
        "runs": [{"run": name, "status": m["status"], "wall_time_s": m["wall_time_s"],
                  "steps_completed": m["steps_completed"], "params": m["params"],
                  "commit": prov[name]["git"]["commit"], "dirty": prov[name]["git"]["dirty"],
                  "compiled": prov[name].get("training_step", {}).get("compiled")}
                 for name, m in metrics.items()],
    }


# ------------------------------------------------------------------------------------------
# Checking a recorded run against the headline study now.
# ------------------------------------------------------------------------------------------


def first_difference(recorded: Any, current: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """(key path, recorded value, current value) of the first place two run specs differ,
    in the current spec's key order (then keys only the recording has); None if equal."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        for key in [*current, *(k for k in recorded if k not in current)]:
            where = f"{path}.{key}" if path else key
            if where in LOCATION_KEYS or (not path and key in DERIVED_KEYS):
                continue
            found = first_difference(recorded.get(key, ABSENT), current.get(key, ABSENT), where)
            if found:
                return found
        return None
    return None if recorded == current else (path or "<top level>", recorded, current)


@dataclasses.dataclass(frozen=True)
class Refusal:
    recording: str  # <profile>/<device>-<date>
    run: str  # <task>/<arch>/seed<k>
    reason: str

    @property
    def line(self) -> str:
        return f"recorded run {self.recording}/{self.run} refused: {self.reason}"


def shown(path: str | os.PathLike) -> str:
    """A path as a reader of the report finds it: relative to the repository when inside it."""
    path = Path(path).absolute()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


class Headline:
    """The headline study's run specs, resolved from its config once (or why they cannot be)."""

    def __init__(self, config: str | os.PathLike):
        from seqmix.expansion.table import expand
        from seqmix.expansion.validate import ConfigError, load_study

        self.config, self.name = Path(config), shown(Path(config))
        self.expansion, self.problem, self.runs = None, None, {}
        if not self.config.is_file():
            self.problem = f"the headline study's config {self.name} does not exist in this checkout"
            return
        try:
            self.expansion = expand(load_study(self.config))
        except ConfigError as e:
            self.problem = f"the headline study's config {self.name} is not valid ({e})"
            return
        self.runs = {f"{r.task}/{r.arch}/seed{r.seed}": r for r in self.expansion.runs}

    def refusal(self, run_dir: Path) -> str | None:
        """Why the recorded run in ``run_dir`` is not a run of the headline study as its config
        resolves now (None: it is)."""
        if self.problem:
            return f"{self.problem}; restore it or record again"
        recorded = read_json(run_dir / "config.json")
        name = f"{recorded['task']}/{recorded['arch']}/seed{recorded['seed']}"
        if name not in self.runs:
            return (f"{name} is not a run of the headline study ({self.name} runs {', '.join(self.runs)}); "
                    "record that study again (make paper-headline on a GPU)")
        current = self.expansion.run_spec(*self.runs[name]).model_dump(mode="json")
        found = first_difference(recorded, current)
        if found is None:
            return None
        key, was, now = found
        return (f"config.json is not the headline study's run spec ({self.name} at this checkout): first at "
                f"{key}, recorded {_value(was)}, current {_value(now)}; record the study again at this commit "
                "(make paper-headline on a GPU) or restore the config")


def _value(v: Any) -> str:
    return ABSENT if v is ABSENT else json.dumps(v)


# ------------------------------------------------------------------------------------------
# What a report reads.
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Recording:
    path: Path  # <recorded_dir>/<profile>/<device>-<date>
    meta: dict
    accepted: list[Path]  # run directories that are the headline study's runs now
    refused: list[Refusal]

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    def describe(self) -> str:
        """Which device, date and commit its runs came from."""
        git = self.meta["git"]
        commit = ", ".join(c[:10] for c in git["commit"].split(" + ")) if git["commit"] else "unknown (no git checkout)"
        tree = {True: " (dirty tree)", False: "", None: " (tree state unknown)"}.get(git["dirty"], " (dirty in part)")
        return f"{self.meta['device']}, {self.meta['date']}, commit {commit}" + ("" if not git["commit"] else tree)

    def runs(self) -> pd.DataFrame:
        """runs.csv's rows (seqmix.report.collect) of its accepted runs."""
        import pandas as pd

        from seqmix.report.collect import RunRow, run_row

        return pd.DataFrame([run_row(d) for d in self.accepted], columns=list(RunRow.__annotations__))


def _run_dirs(recording: Path) -> Iterator[Path]:
    yield from sorted(p.parent for p in (recording / "runs").rglob("config.json"))


def read_recordings(recorded_dir: str | os.PathLike = RECORDED_DIR,
                    headline_config: str | os.PathLike = HEADLINE_CONFIG) -> list[Recording]:
    """Every recording under ``recorded_dir``, newest first (by date, then name), each run
    checked against the headline study (``headline_config``) as it resolves now."""
    paths = [m.parent for m in Path(recorded_dir).glob("*/*/meta.json")]
    if not paths:
        return []
    headline = Headline(headline_config)
    out = []
    for path in paths:
        accepted, refused = [], []
        for d in _run_dirs(path):
            reason = headline.refusal(d)
            if reason is None:
                accepted.append(d)
            else:
                refused.append(Refusal(f"{path.parent.name}/{path.name}", str(d.relative_to(path / "runs")), reason))
        out.append(Recording(path, read_json(path / "meta.json"), accepted, refused))
    return sorted(out, key=lambda r: (r.meta["date"], r.name), reverse=True)


def chosen(recordings: list[Recording]) -> Recording | None:
    """The recording a report decides on: the newest with an accepted run."""
    return next((r for r in recordings if r.accepted), None)


def refusal_lines(recordings: list[Recording]) -> list[str]:
    """Every refused run of ``recordings``, runs refused for one reason in one line."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in recordings:
        for f in r.refused:
            grouped.setdefault((f.recording, f.reason), []).append(f.run)
    return [f"recorded run {where}/{runs[0]} refused: {reason}" if len(runs) == 1
            else f"recorded runs {', '.join(runs)} of {where} refused: {reason}"
            for (where, reason), runs in grouped.items()]


def account(recordings: list[Recording], recorded_dir: str | os.PathLike = RECORDED_DIR) -> str:
    """What a report did with the recordings, in one paragraph: the one it decides on, the
    others, and every refused run with its reason."""
    pick, where = chosen(recordings), shown(Path(recorded_dir))
    if pick:
        parts = [f"recorded study {pick.name} ({pick.describe()}; {len(pick.accepted)} runs)"]
    elif recordings:
        parts = [f"no recorded study accepted ({len(recordings)} in {where})"]
    else:
        parts = [f"no study recorded in {where} (python -m seqmix record)"]
    older = [r.name for r in recordings if r.accepted and r is not pick]
    if older:
        parts.append(f"older recordings, not used: {', '.join(older)}")
    return "; ".join(parts + refusal_lines(recordings))
