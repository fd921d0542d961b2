"""Recorded runs: a finished study's small outputs copied into the repository as data, and
what every report reads of them.

A GPU reaches this project by chance and for minutes; the runs it makes are kept as files
(``python -m seqmix record``) under ``results/recorded/<profile>/<device>-<date>/``:

    meta.json                                how they were made (study, commit, device, host,
                                             date, command, each run's wall time, status and
                                             numerics) and every file's sha256
    runs/<task>/<arch>/seed<k>/              each run's RUN_FILES, no weights

A study names the recorded studies its report reads (``recordings: [<profile>, ...]``:
the newest recording of each, ``read_named``); the headline's claims marked ``runs: recorded``
read the headline study's (``read_recordings``). One rule accepts a recorded run for either
(``check``): its files are those meta.json's sha256 names, and its ``config.json`` and its
code digest (provenance.json) are what its study's config (config/<profile>.yaml; the
headline's: HEADLINE_CONFIG) resolves to at this checkout, keys that say where files were
(LOCATION_KEYS) aside. Any other run is refused with one line naming it and the first
difference, and left out of the report, which prints that line where the run would have
counted: a report whose config or code moved on since the recording still builds, and says
what it left out. ``python -m seqmix verify`` trains recorded runs again
(seqmix.report.verify) and keeps what it found beside the recording (VERIFICATIONS), which
the report states.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
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
RUN_FILES = ("config.json", "metrics.json", "eval.json", "log.csv", "provenance.json", "hashes.json")
# The run files that name the recording machine's paths (its checkout, data mirror, shim cache).
NAMES_PATHS = ("metrics.json", "provenance.json")
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
            if f in NAMES_PATHS:
                write_json(tmp / "runs" / name / f, without_locations(read_json(d / f)))
            else:
                shutil.copy2(d / f, tmp / "runs" / name / f)
    # Every recorded file's sha256: a recording altered after the fact is refused naming the file.
    meta["sha256"] = {f"runs/{name}/{f}": sha256_file(tmp / "runs" / name / f) for name in dirs for f in RUN_FILES}
    write_json(tmp / "meta.json", meta)
    # The whole recording appears at once; one of the same study, device and day is replaced.
    old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


# An absolute path inside a string ("local mirror /data/wikitext"), not a ratio ("1/8") or a URL.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/[^\s\"'<>|;,()]+")


def without_locations(value: Any) -> Any:
    """``value`` (a run's provenance or metrics) with every absolute path made one a reader of
    the recording can follow on any machine: relative to the checkout where it is inside it,
    else ``.../`` and its last name (the data mirror, the oneMKL shim in a user's cache)."""
    if isinstance(value, dict):
        return {k: without_locations(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_locations(v) for v in value]
    if isinstance(value, str):
        return ABSOLUTE_PATH.sub(lambda m: _shown_anywhere(m.group(0)), value)
    return value


def _shown_anywhere(path: str) -> str:
    inside = shown(path)  # relative where inside the checkout, else still absolute
    return f".../{Path(path).name}" if Path(inside).is_absolute() else inside


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def altered(recording: Path, meta: dict) -> dict[str, str]:
    """{file: what is wrong} of the recording's files that are not those meta.json's sha256
    names (changed, missing, or not recorded), relative to the recording; {} for a recording
    made before files were hashed (it has no ``sha256``: nothing to check against)."""
    sums = meta.get("sha256")
    if sums is None:
        return {}
    found = {str(p.relative_to(recording)) for p in (recording / "runs").rglob("*") if p.is_file()}
    out = {f: "missing" for f in sums if f not in found}
    out |= {f: "not in meta.json's sha256 (added after recording)" for f in sorted(found - set(sums))}
    out |= {f: "its sha256 is not the one meta.json records (altered after recording)"
            for f in sorted(found & set(sums)) if sha256_file(recording / f) != sums[f]}
    return dict(sorted(out.items()))


def _one(values: Iterable[Any]) -> Any:
    """The value all runs share, else their distinct values joined (a study resumed elsewhere)."""
    distinct = {json.dumps(v): v for v in values}
    return next(iter(distinct.values())) if len(distinct) == 1 else " + ".join(sorted(str(v) for v in distinct.values()))


def _meta(study, config, dirs: dict[str, Path], command: str, made_by: str | None, commit: str | None) -> dict:
    from seqmix.device import device_slug
    from seqmix.report.collect import numerics_of

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
                  "device": m.get("device"), "numerics": numerics_of(prov[name])["numerics"],
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


class Resolved:
    """A study's run specs and code digests, resolved from its config at this checkout once
    (or why they cannot be): what a recorded run of that study is checked against. ``noun``
    names the study in refusals, ``fix`` says how to record it again."""

    def __init__(self, config: str | os.PathLike, noun: str = "the headline study",
                 fix: str = "make paper-headline on a GPU"):
        from seqmix.expansion.table import expand
        from seqmix.expansion.validate import ConfigError, load_study

        self.config, self.name, self.noun, self.fix = Path(config), shown(Path(config)), noun, fix
        self.expansion, self.problem, self.runs, self._code = None, None, {}, {}
        if not self.config.is_file():
            self.problem = f"{noun}'s config {self.name} does not exist in this checkout"
            return
        try:
            self.expansion = expand(load_study(self.config))
        except ConfigError as e:
            self.problem = f"{noun}'s config {self.name} is not valid ({e})"
            return
        self.runs = {f"{r.task}/{r.arch}/seed{r.seed}": r for r in self.expansion.runs}

    @classmethod
    def of_profile(cls, profile: str, config_dir: str | os.PathLike) -> Resolved:
        config = Path(config_dir) / f"{profile}.yaml"
        return cls(config, f"study {profile}", f"run it and `python -m seqmix record --config {shown(config)}`")

    def code_digest(self, arch: str, kind: str) -> str:
        """The digest of the code that trains (arch, kind) at this checkout (seqmix.sources)."""
        from seqmix.sources import code_of, run_modules

        if (arch, kind) not in self._code:
            self._code[arch, kind] = code_of(run_modules(arch, kind)).digest
        return self._code[arch, kind]

    def refusal(self, run_dir: Path) -> str | None:
        """Why the recorded run in ``run_dir`` is not a run of the study as its config and code
        resolve now (None: it is): its config.json, then its code digest."""
        if self.problem:
            return f"{self.problem}; restore it or record again"
        recorded = read_json(run_dir / "config.json")
        name = f"{recorded['task']}/{recorded['arch']}/seed{recorded['seed']}"
        if name not in self.runs:
            return (f"{name} is not a run of {self.noun} ({self.name} runs {', '.join(self.runs)}); "
                    f"record that study again ({self.fix})")
        current = self.expansion.run_spec(*self.runs[name]).model_dump(mode="json")
        found = first_difference(recorded, current)
        if found is not None:
            key, was, now = found
            return (f"config.json is not {self.noun}'s run spec ({self.name} at this checkout): first at "
                    f"{key}, recorded {_value(was)}, current {_value(now)}; record the study again at this commit "
                    f"({self.fix}) or restore the config")
        return self._code_refusal(run_dir, recorded)

    def _code_refusal(self, run_dir: Path, recorded: dict) -> str | None:
        from seqmix.sources import changed

        code = read_json(run_dir / "provenance.json").get("code") or {}
        now = self.code_digest(recorded["arch"], recorded["kind"])
        if code.get("digest") == now:
            return None
        files = changed(code.get("sources") or {})
        return (f"its code digest {code.get('digest')} is not the one this checkout computes for it ({now}"
                + (f"; changed: {' '.join(files)}" if files else "") + f"); record the study again ({self.fix})")


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

        return pd.DataFrame([run_row(d, self.name) for d in self.accepted], columns=list(RunRow.__annotations__))


def _run_dirs(recording: Path) -> Iterator[Path]:
    yield from sorted(p.parent for p in (recording / "runs").rglob("config.json"))


def check(path: Path, resolved: Resolved) -> Recording:
    """The recording at ``path`` with each run accepted or refused by the one rule: its files
    are those meta.json's sha256 names, and its config.json and code digest are what
    ``resolved``'s study resolves to at this checkout."""
    meta = read_json(path / "meta.json")
    bad = altered(path, meta)
    where, accepted, refused = f"{path.parent.name}/{path.name}", [], []
    for d in _run_dirs(path):
        run = str(d.relative_to(path / "runs"))
        mine = [f for f in bad if f.startswith(f"runs/{run}/")]
        reason = (f"its {Path(mine[0]).name} is not the file recorded ({bad[mine[0]]}); record the study again"
                  if mine else resolved.refusal(d))
        if reason is None:
            accepted.append(d)
        else:
            refused.append(Refusal(where, run, reason))
    return Recording(path, meta, accepted, refused)


def read_recordings(recorded_dir: str | os.PathLike = RECORDED_DIR,
                    headline_config: str | os.PathLike = HEADLINE_CONFIG) -> list[Recording]:
    """Every recording of the headline study under ``recorded_dir`` (<profile>/, its profile
    as ``headline_config`` names it, else the file's name as config/<profile>.yaml), newest
    first (by date, then name), each run checked against that study as it resolves now. Other
    studies' recordings are not the headline's to refuse: a study reads those it names.
    Resolving the study (seconds, torch) waits until it has a recording to check."""
    stem = Path(headline_config).stem
    if not any(recordings_of(p, recorded_dir) for p in {written_profile(headline_config), stem}):
        return []
    headline = Resolved(headline_config)
    profile = headline.expansion.study.profile if headline.expansion else stem
    return sorted((check(p, headline) for p in recordings_of(profile, recorded_dir)),
                  key=lambda r: (r.meta["date"], r.name), reverse=True)


def written_profile(config: str | os.PathLike) -> str:
    """The profile ``config`` names as written (seqmix.study.profile: no torch, not validated),
    the default where it names none; the file's name where it cannot be read."""
    from seqmix.errors import ConfigError
    from seqmix.study.profile import read_profile
    from seqmix.study.settings import StudyFile

    try:
        profile = read_profile(config).raw.get("profile", StudyFile.model_fields["profile"].default)
    except ConfigError:
        profile = None
    return profile if isinstance(profile, str) else Path(config).stem


def recordings_of(profile: str, recorded_dir: str | os.PathLike = RECORDED_DIR) -> list[Path]:
    """The recordings of ``profile`` under ``recorded_dir`` (<profile>/<device>-<date>/)."""
    return [m.parent for m in (Path(recorded_dir) / profile).glob("*/meta.json")]


def newest(profile: str, recorded_dir: str | os.PathLike = RECORDED_DIR) -> Path | None:
    """The newest recording of ``profile`` (by its date, then name), None if there is none."""
    return max(recordings_of(profile, recorded_dir), key=lambda p: (read_json(p / "meta.json")["date"], p.name),
               default=None)


def read_named(profiles: Iterable[str], recorded_dir: str | os.PathLike = RECORDED_DIR,
               config_dir: str | os.PathLike = REPO_ROOT / "config") -> tuple[list[Recording], dict[str, str]]:
    """The newest recording of each of ``profiles`` (a study's ``recordings``), each run
    checked against config_dir/<profile>.yaml as it resolves now; and a line for each
    profile with no recording at all, by profile."""
    found, missing = [], {}
    for profile in profiles:
        path = newest(profile, recorded_dir)
        if path is None:
            missing[profile] = (f"no recording of study {profile} in {shown(Path(recorded_dir) / profile)}: run "
                                f"config/{profile}.yaml and `python -m seqmix record --config config/{profile}.yaml`")
        else:
            found.append(check(path, Resolved.of_profile(profile, config_dir)))
    return found, missing


def recorded_runs(own: Iterable[str | os.PathLike], profiles: Iterable[str],
                  **where) -> tuple[list[tuple[Path, str]], list[dict]]:
    """The accepted runs of the newest recording of each of ``profiles`` (a study's
    ``recordings``) as (run directory, recording) for runs.csv, a run the study trains itself
    (one of ``own``, its run directories) refused: its own counts; and per profile what was
    read (seqmix.report.collect.RECORDINGS): the recording, where and when it was made and last
    verified, how many runs count, one line per run left out. ``where``: read_named's."""
    found, missing = read_named(profiles, **where)
    ids = {_run_id(read_json(Path(d) / "config.json")) for d in own} if found else set()
    runs, accounts = [], [{"profile": p, "recording": None, "accepted": 0, "refused": [line]}
                          for p, line in missing.items()]
    for rec in found:
        for d in list(rec.accepted):
            if (run := _run_id(read_json(d / "config.json"))) in ids:
                rec.accepted.remove(d)
                rec.refused.append(Refusal(rec.name, run, "this study trains that run itself: its own run counts"))
            else:
                runs.append((d, rec.name))
                ids.add(run)
        accounts.append({"profile": rec.path.parent.name, "recording": rec.name, "made": rec.describe(),
                         "verified": last_verified(rec.path), "accepted": len(rec.accepted),
                         "refused": [f.line for f in rec.refused]})
    return runs, accounts


def _run_id(config: dict) -> str:
    return f"{config['task']}/{config['arch']}/seed{config['seed']}"


VERIFICATIONS = "verifications.jsonl"  # beside a recording's meta.json: each `seqmix verify`, one line


def last_verified(recording: Path) -> str:
    """Where and when the recording was last verified (python -m seqmix verify), and what it found."""
    path = Path(recording) / VERIFICATIONS
    lines = path.read_text().splitlines() if path.is_file() else []
    if not lines:
        return f"never verified (python -m seqmix verify {shown(recording)})"
    v = json.loads(lines[-1])
    return (f"last verified on {v['host']} ({v['cpu']}), {v['date']}, commit {str(v['commit'])[:10]}, "
            f"{v['numerics']} numerics: {v['summary']}")


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
        parts = [f"recorded study {pick.name} ({pick.describe()}; {len(pick.accepted)} runs), {last_verified(pick.path)}"]
    elif recordings:
        parts = [f"no recorded study accepted ({len(recordings)} in {where})"]
    else:
        parts = [f"no study recorded in {where} (python -m seqmix record)"]
    older = [r.name for r in recordings if r.accepted and r is not pick]
    if older:
        parts.append(f"older recordings, not used: {', '.join(older)}")
    return "; ".join(parts + refusal_lines(recordings))
