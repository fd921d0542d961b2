"""`python -m seqmix verify RECORDING`: train recorded runs again on this host and compare
their results with the recorded ones, bit for bit.

Under portable numerics a run is the same bits on every x86-64 host (README, Numerics), so a
recorded run (seqmix.report.recorded) is a claim anyone can check: each chosen run is trained
again from its ``config.json`` (its locations: a scratch directory, the data where its study
prepares them here) by the same commands the workflow runs (``train``, then ``eval``), and
its hashes.json (the final weights' and optimiser state's sha256), log.csv and eval.json are
compared byte for byte, the wall-clock fields aside (TIMING: when, not what). What was found
is appended to the recording's verifications.jsonl, which the report states.

Before anything, every recorded file is checked against meta.json's sha256 (a recording
altered by one byte is refused, naming the file); a native recording (a GPU's, or a CPU's
under native numerics) cannot be verified on another host and is refused with its own status.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seqmix import REPO_ROOT
from seqmix.errors import ConfigError
from seqmix.io import FileError, read_json
from seqmix.report.recorded import (
    DERIVED_KEYS,
    RECORDED_DIR,
    VERIFICATIONS,
    altered,
    newest,
    shown,
)

NATIVE = 5  # exit status: a recording that only its own kind of host can reproduce
NOTHING = 6  # exit status: no chosen run could be trained again here (code moved on, or none fits the budget)
DIFFERS = 1
COMPARED = ("hashes.json", "log.csv", "eval.json")
TIMING = {"log.csv": "elapsed_s", "eval.json": "eval_time_s"}  # when, not what: left out of the comparison


def find(recording: str) -> Path:
    """A recording named by its directory, by <profile>/<device>-<date> under results/recorded,
    or by a profile (its newest recording)."""
    for path in (Path(recording), RECORDED_DIR / recording):
        if (path / "meta.json").is_file():
            return path
    if (found := newest(recording)) is not None:
        return found
    raise ConfigError(f"no recording {recording}: give a directory with a meta.json, <profile>/<device>-<date> "
                      f"under {shown(RECORDED_DIR)}, or a profile recorded there")


def intact(path: Path) -> dict:
    """The recording's meta.json, after checking every recorded file against its sha256."""
    meta = read_json(path / "meta.json")
    if "sha256" not in meta:
        raise FileError(f"recording {shown(path)} refused: its meta.json has no sha256 of its files (recorded before "
                        "they were kept), so they cannot be checked; record the study again")
    if bad := altered(path, meta):
        name, why = next(iter(bad.items()))
        raise FileError(f"recording {shown(path)} refused: {shown(path / name)}: {why}"
                        + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    return meta


def native_reason(meta: dict) -> str | None:
    """Why the recording cannot be verified on another host (None: every run is portable on a CPU)."""
    runs = meta["runs"]
    other = [r for r in runs if r.get("numerics") != "portable" or r.get("device") not in ("cpu", None)]
    if not other:
        return None
    r = other[0]
    return (f"recording made on {meta['device']} under {r.get('numerics') or 'unrecorded'} numerics "
            f"({len(other)} of {len(runs)} runs, e.g. {r['run']}): only portable recordings (numerics: portable, "
            "on a CPU) give the same bits on another host; verify it on the same kind of device")


def history(path: Path) -> list[dict]:
    f = path / VERIFICATIONS
    return [json.loads(line) for line in f.read_text().splitlines() if line] if f.is_file() else []


def chosen_runs(path: Path, meta: dict, run: str | None, budget: float | None) -> list[dict]:
    """The runs to train again: ``run`` alone, or every run, or (``budget`` seconds) those
    verified least often first, in recorded order, each that fits in what is left of the
    budget (``recorded_time``)."""
    runs = [r for r in meta["runs"]]
    if run is not None:
        picked = [r for r in runs if r["run"] == run]
        if not picked:
            raise ConfigError(f"--run {run} is not a run of {shown(path)} (it has {', '.join(r['run'] for r in runs)})")
        return picked
    if budget is None:
        return runs
    times = {r["run"]: sum(1 for v in history(path) if r["run"] in v["runs"]) for r in runs}
    out, left = [], budget
    for r in sorted(runs, key=lambda r: times[r["run"]]):
        if (cost := recorded_time(path, r)) <= left:
            out.append(r)
            left -= cost
    return out


# Two `python -m seqmix` processes per run (train, eval), each importing torch and checking
# its data: a 6-step tiny run recorded in 0.3 s took 38-41 s to verify on the developers'
# 2-core host under load (docs: make verify). Counted per run so that a budget holds.
STARTUP_S = 40.0


def recorded_time(path: Path, r: dict) -> float:
    """What verifying the run costs: its training and evaluation where it was recorded, in
    seconds, and the processes' start (STARTUP_S)."""
    return STARTUP_S + r["wall_time_s"] + read_json(path / "runs" / r["run"] / "eval.json").get("eval_time_s", 0.0)


def without_timing(name: str, data: bytes) -> bytes:
    """The file's bytes with its wall-clock field taken out (TIMING), the rest as written."""
    if name == "eval.json":
        obj = json.loads(data)
        obj.pop(TIMING[name], None)
        return json.dumps(obj, indent=2, sort_keys=True).encode()
    if name == "log.csv":
        lines = data.decode().splitlines()
        at = lines[0].split(",").index(TIMING[name]) if lines else -1
        return "\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != at) for line in lines).encode()
    return data


def first_difference(recorded: Path, retrained: Path) -> str | None:
    """Where the retrained run's results first differ from the recorded ones (None: nowhere)."""
    for name in COMPARED:
        if not (retrained / name).is_file():
            return f"{name} was not written"
        was, now = (without_timing(name, (d / name).read_bytes()).splitlines() for d in (recorded, retrained))
        for i, (a, b) in enumerate(zip(was, now), 1):
            if a != b:
                return f"{name} line {i}: recorded {a.decode()[:80]!r}, now {b.decode()[:80]!r}"
        if len(was) != len(now):
            return f"{name}: recorded {len(was)} lines, now {len(now)}"
    return None


def study_here(meta: dict):
    """(config, expansion) of the recording's study as it resolves here (where its data are
    prepared): its recorded config if this checkout has it, else config/<profile>.yaml; (None,
    None) where neither resolves (the runs then train with their recorded locations)."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study

    for config in (REPO_ROOT / meta["study"]["config"], REPO_ROOT / "config" / f"{meta['study']['profile']}.yaml"):
        if config.is_file():
            try:
                return config, expand(load_study(config))
            except ConfigError:
                continue
    return None, None


def retrain_spec(recorded: dict, run_dir: Path, here: dict | None) -> dict:
    """The recorded run spec to train again into ``run_dir``: its locations (LOCATION_KEYS)
    this host's (``here``: the spec its study resolves to now), everything else as recorded."""
    spec = json.loads(json.dumps({k: v for k, v in recorded.items() if k not in DERIVED_KEYS}))
    if here is not None:
        for key in ("data_dir", "tokenizer_dir"):
            spec[key] = here[key]
        spec["data"] = {**spec["data"], "dir": here["data"]["dir"], "mirror": here["data"]["mirror"]}
    spec["run_dir"] = str(run_dir)
    return spec


def seqmix(*argv: str) -> subprocess.CompletedProcess:
    """A `python -m seqmix` command in its own process (which pins its numerics before torch)."""
    return subprocess.run([sys.executable, "-m", "seqmix", *argv], cwd=REPO_ROOT, capture_output=True, text=True)


def prepare_data(config: Path | None, expansion, spec: dict) -> str | None:
    """The run's data (and tokenizer) prepared here where they are not yet; why not, or None."""
    if config is None:
        return None
    needed = [("tokenizer", spec["tokenizer_dir"])] if expansion.needs_tokenizer(spec["group"]) else []
    for name, where in [*needed, (spec["group"], spec["data_dir"])]:
        if not (Path(where) / "manifest.json").is_file():
            done = seqmix("data", name, "--config", str(config))
            if done.returncode != 0:
                return f"its data ({name}) could not be prepared: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def code_moved(recorded_dir: Path, recorded: dict) -> str | None:
    """Why this checkout's code cannot retrain the run as recorded (None: it is the same code)."""
    from seqmix.sources import changed, code_of, run_modules

    code = read_json(recorded_dir / "provenance.json").get("code") or {}
    now = code_of(run_modules(recorded["arch"], recorded["kind"])).digest
    if code.get("digest") == now:
        return None
    files = changed(code.get("sources") or {})
    return (f"not trained again: its code digest {code.get('digest')} is not this checkout's ({now}"
            + (f"; changed: {' '.join(files)}" if files else "") + "); verify it at the recording's commit")


def verify_run(path: Path, name: str, scratch: Path, study) -> tuple[str, str, dict | None]:
    """(result, line, provenance) of one run trained again in ``scratch``: result is ``same``,
    ``differs``, ``skipped`` or ``failed``."""
    recorded_dir = path / "runs" / name
    recorded = read_json(recorded_dir / "config.json")
    if moved := code_moved(recorded_dir, recorded):
        return "skipped", moved, None
    config, expansion = study
    here = None
    if expansion is not None and name in {f"{r.task}/{r.arch}/seed{r.seed}" for r in expansion.runs}:
        here = expansion.run_spec(recorded["task"], recorded["arch"], recorded["seed"]).model_dump(mode="json")
    spec = retrain_spec(recorded, scratch / name, here)
    if problem := prepare_data(config if here else None, expansion, spec):
        return "failed", problem, None
    started = time.time()
    for step in (("train", "--spec", json.dumps(spec), "--quiet"), ("eval", "--run", spec["run_dir"])):
        done = seqmix(*step)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return "failed", f"`seqmix {step[0]}` failed (exit {done.returncode}): {last}", None
    took = time.time() - started
    prov = read_json(Path(spec["run_dir"]) / "provenance.json")
    if where := first_difference(recorded_dir, Path(spec["run_dir"])):
        return "differs", f"DIFFERS: {where}", prov
    weights = read_json(recorded_dir / "hashes.json")["weights_sha256"]
    return "same", f"same bits (weights sha256 {weights[:16]}, log.csv, eval.json) in {took:.1f} s", prov


def entry(results: dict[str, tuple[str, str]], prov: dict | None, budget: float | None) -> dict:
    """One line of verifications.jsonl: this host, when, at which commit, under which numerics, what each run gave."""
    from seqmix.report.collect import numerics_of

    counts = {k: sum(1 for r, _ in results.values() if r == k) for k in ("same", "differs", "skipped", "failed")}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" of {len(results)} runs chosen"
    prov = prov or {}
    git = prov.get("git") or {}
    return {"host": prov.get("host") or platform.node(), "cpu": numerics_of(prov)["cpu"] or platform.processor(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": git.get("commit"),
            "dirty": git.get("dirty"), "numerics": numerics_of(prov)["numerics"] or "portable",
            "torch": (prov.get("packages") or {}).get("torch"), "budget_s": budget,
            "runs": {name: {"result": r, "detail": line} for name, (r, line) in results.items()}, "summary": summary}


def verify(recording: str, run: str | None = None, budget: float | None = None,
           scratch: str | os.PathLike | None = None, out=print) -> int:
    """Verify the recording (see the module docstring); one line per run to ``out``; the exit status."""
    path = find(recording)
    meta = intact(path)
    if reason := native_reason(meta):
        out(f"{shown(path)}: not verifiable here: {reason}")
        return NATIVE
    runs = chosen_runs(path, meta, run, budget)
    if not runs:
        shortest = min(recorded_time(path, r) for r in meta["runs"])
        out(f"{shown(path)}: no run fits the budget of {budget:.0f} s (the shortest needs {shortest:.0f} s: its "
            f"recorded time and {STARTUP_S:.0f} s to start its processes)")
        return NOTHING
    out(f"{shown(path)}: training {len(runs)} of {len(meta['runs'])} recorded runs again"
        + (f" (a sample within {budget:.0f} s: recorded times and process starts)" if budget is not None and run is None else ""))
    study, results, prov = study_here(meta), {}, None
    with tempfile.TemporaryDirectory(prefix="seqmix-verify-", dir=scratch) as tmp:
        for r in runs:
            result, line, p = verify_run(path, r["run"], Path(tmp), study)
            results[r["run"]], prov = (result, line), prov or p
            out(f"  {r['run']}: {line}")
    record = entry(results, prov, budget)
    with open(path / VERIFICATIONS, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    out(f"{shown(path)}: {record['summary']} (kept in {shown(path / VERIFICATIONS)})")
    first = next(((n, line) for n, (res, line) in results.items() if res in ("differs", "failed")), None)
    if first:
        out(f"first difference: {first[0]}: {first[1]}")
        return DIFFERS
    return 0 if any(res == "same" for res, _ in results.values()) else NOTHING


def verify_all(recordings: list[str], run: str | None = None, budget: float | None = None,
               scratch: str | os.PathLike | None = None, out=print) -> int:
    """``verify`` each recording in turn, the budget shared (each gets what the ones before
    left); the first non-zero status, else 0."""
    if run is not None and len(recordings) != 1:
        raise ConfigError(f"--run names a run of one recording; {len(recordings)} given ({', '.join(recordings)})")
    statuses, started = [], time.time()
    for recording in recordings:
        left = None if budget is None else max(0.0, budget - (time.time() - started))
        statuses.append(verify(recording, run, left, scratch, out))
    return next((s for s in statuses if s), 0)
