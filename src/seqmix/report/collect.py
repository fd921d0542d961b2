"""`python -m seqmix collect`: one row per run (metrics.json + eval.json + config.json) in
runs.csv, and what each evaluation broke its scores down by in breakdown.csv, so that every
number in the report traces back to a run directory. Rows: ``RunRow``, ``BreakdownRow``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from seqmix import numerics
from seqmix.io import read_json, write_json, write_rows
from seqmix.sources import changed


class RunRow(TypedDict):
    """One row of runs.csv: one training run, with its final evaluation."""

    profile: str
    task: str  # the task's name, sweep point included
    kind: str  # the task's kind
    group: str  # the task it was swept from (= task outside a sweep)
    sweep: str  # JSON of the sweep's settings at this point ({} outside one)
    arch: str
    seed: int
    status: str  # ok | diverged
    metric: str  # the task's primary metric
    higher_is_better: bool
    params: int  # the trained model's size (after budget solving)
    d_model: int
    n_layers: int
    lr: float  # peak learning rate
    steps_planned: int
    steps_completed: int  # the step it ended at
    ended: str  # why: solved (train.early_stop) | plateau (train.plateau) | budget (all its steps) | diverged
    plateau_rule: str  # JSON of train.plateau ({} when off)
    diverged_at_step: int | None
    seen: int  # training progress, in seen_unit
    seen_unit: str  # tokens | examples
    reach: int | None  # positions back the output can read (sum of the layers'); empty: unbounded
    chance: float | None  # chance level of the metric (MQAR: 1 / key-value pairs); empty: none
    final_gain: float | None  # improvement over the last quarter of the steps (``final_gain``)
    blind_loss: float | None  # loss of a model that reads nothing of the input (MQAR: ln values); empty: none
    first_eval_loss: float | None  # loss at the first and last periodic evaluation
    last_eval_loss: float | None
    late_loss_drop: float | None  # relative fall of the evaluation loss over the plateau window (else the last quarter)
    grad_norm_first: float | None  # mean gradient norm (before clipping) of the first and last
    grad_norm_last: float | None  # GRAD_ROWS logged training rows
    eval_split: str  # final evaluation on the eval split ...
    eval_value: float
    eval_loss: float
    eval_scored: int
    test_split: str  # ... and on the test split
    test_value: float
    test_loss: float
    test_scored: int
    scored_unit: str  # what *_scored counts: tokens | queries | examples
    train_data: str  # what the data were (from the manifests)
    train_complete: bool
    eval_data: str
    test_data: str
    tokenizer: str
    device: str
    numerics: str  # as the run ran (numerics_of): portable, native, "portable, not pinned (oneMKL AUTO)"; "" unrecorded
    cpu: str  # the CPU that ran it and its widest vector instruction set ('' unrecorded)
    wall_time_s: float
    commit: str  # the commit it was trained at ('' unknown)
    dirty: bool | None  # with uncommitted changes in that checkout
    code_changed: str  # its recorded sources that differ in this checkout now, space-separated; "?" unrecorded
    run_dir: str
    recording: str  # the recording it was read from (<profile>/<device>-<date>); "" for the study's own runs


class BreakdownRow(TypedDict):
    """One row of breakdown.csv: the scores of one run's split at one value of what its
    task breaks them down by."""

    task: str  # the run, as in runs.csv
    kind: str
    group: str
    sweep: str
    arch: str
    seed: int
    split: str  # the evaluated split
    by: str  # what the scores are broken down by (MQAR: query_distance, tokens from query to key)
    value: str  # the value of ``by`` (e.g. a distance in tokens)
    correct: int  # correct predictions at that value
    scored: int  # scored units at that value


def run_row(run_dir: Path, recording: str = "") -> RunRow:
    m = read_json(run_dir / "metrics.json")
    e = read_json(run_dir / "eval.json")
    cfg = read_json(run_dir / "config.json")
    prov = read_json(run_dir / "provenance.json")
    splits, metric = m["data"]["splits"], m["metric"]
    ev, te = e["splits"].get(m["eval_split"], {}), e["splits"].get(m["test_split"], {})
    tok = m["data"].get("tokenizer") or {}
    return {
        "profile": m["profile"], "task": m["task"], "kind": m["kind"], "group": m["group"],
        "sweep": json.dumps(m["axes"], sort_keys=True), "arch": m["arch"], "seed": m["seed"],
        "status": m["status"], "metric": metric, "higher_is_better": m["higher_is_better"],
        "params": m["params"], "d_model": m["d_model"], "n_layers": m["n_layers"], "lr": cfg["train"]["lr"],
        "steps_planned": m["steps_planned"], "steps_completed": m["steps_completed"], "ended": m["ended"],
        "plateau_rule": json.dumps(m["plateau"] or {}, sort_keys=True),
        "diverged_at_step": m["diverged_at_step"], "seen": m["seen"], "seen_unit": m["seen_unit"],
        "reach": m["reach"], "chance": m["chance"], "final_gain": final_gain(run_dir, m),
        "blind_loss": m.get("blind_loss"), **curve_ends(run_dir, (m["plateau"] or {}).get("window")),
        "eval_split": m["eval_split"], "eval_value": ev.get(metric), "eval_loss": ev.get("loss"),
        "eval_scored": ev.get("scored"), "test_split": m["test_split"], "test_value": te.get(metric),
        "test_loss": te.get("loss"), "test_scored": te.get("scored"), "scored_unit": m["scored_unit"],
        "train_data": splits[m["train_split"]]["description"],
        "train_complete": splits[m["train_split"]]["complete"],
        "eval_data": splits[m["eval_split"]]["description"], "test_data": splits[m["test_split"]]["description"],
        "tokenizer": tok.get("description", ""), "device": m["device"], **numerics_of(prov),
        "wall_time_s": m["wall_time_s"], **code_of(prov), "run_dir": str(run_dir), "recording": recording,
    }


def numerics_of(provenance: dict) -> dict:
    """The numerics a run ran under and the CPU it ran on (seqmix.train.provenance.numerics_record):
    ``portable`` where every library ran the path portable pins now, ``native`` where the host
    chose, ``portable, not pinned (oneMKL AUTO,STRICT)`` where portable was asked and a library ran
    another path, named: a call from within Python, a oneMKL that ignored its shim, a run made
    under an earlier portable (its oneMKL branch COMPATIBLE)."""
    rec = provenance.get("numerics") or {}
    if not rec:
        return {"numerics": "", "cpu": ""}
    mode = "native"
    if rec.get("mode") == "portable":
        mode = f"portable, not pinned ({', '.join(missed)})" if (missed := numerics.differences(rec)) else "portable"
    return {"numerics": mode, "cpu": f"{rec.get('cpu', '')} ({rec.get('vector_isa', '')})"}


def code_of(provenance: dict) -> dict:
    """The commit a run was made at, whether its tree was dirty, and which of the sources it
    recorded (seqmix.sources) differ from this checkout's now: a run made by other code."""
    git, sources = provenance.get("git") or {}, (provenance.get("code") or {}).get("sources")
    return {"commit": git.get("commit") or "", "dirty": git.get("dirty"),
            "code_changed": "?" if not sources else " ".join(changed(sources))}


GRAD_ROWS = 4


def curve_ends(run_dir: Path, window: int | None = None) -> dict:
    """The first and last periodic evaluation losses, the relative fall of that loss over the
    last ``window`` steps (the plateau rule's window; None: the last quarter of the steps),
    and the mean gradient norms of the first and last GRAD_ROWS logged training rows: whether
    a run's loss moved at all, whether it was still falling when it stopped, and whether its
    gradients died (the recall report's reasons for a run below chance)."""
    rows = read_csv_rows(run_dir / "log.csv")
    evals = [(int(r["step"]), float(r["loss"])) for r in rows if r["phase"] == "eval" and r["loss"]]
    norms = [float(r["grad_norm"]) for r in rows if r["phase"] == "train" and r["grad_norm"]]

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    late_drop = None
    if evals:
        end, last = evals[-1]
        start = end - (window if window else end // 4)
        before = [loss for step, loss in evals if step <= start]
        late_drop = (before[-1] - last) / before[-1] if before and before[-1] else None
    return {"first_eval_loss": evals[0][1] if evals else None, "last_eval_loss": evals[-1][1] if evals else None,
            "late_loss_drop": late_drop,
            "grad_norm_first": mean(norms[:GRAD_ROWS]), "grad_norm_last": mean(norms[-GRAD_ROWS:])}


def final_gain(run_dir: Path, m: dict) -> float | None:
    """The periodic evaluation metric's improvement over the last quarter of a run's steps:
    last evaluation minus the last one at or before 75 % of the steps completed (sign such
    that positive is better); 0 for a run that stopped early at its target, None without
    two evaluations."""
    if m.get("stopped_early_at_step") is not None:
        return 0.0
    evals = [r for r in read_csv_rows(run_dir / "log.csv") if r["phase"] == "eval" and r["metric_value"]]
    earlier = [r for r in evals if int(r["step"]) <= 0.75 * m["steps_completed"]]
    if len(evals) < 2 or not earlier:
        return None
    gain = float(evals[-1]["metric_value"]) - float(earlier[-1]["metric_value"])
    return gain if m["higher_is_better"] else -gain


def read_csv_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def breakdown_rows(run_dir: Path, row: RunRow) -> list[BreakdownRow]:
    e = read_json(run_dir / "eval.json")
    ids = {k: row[k] for k in ("task", "kind", "group", "sweep", "arch", "seed")}
    return [{**ids, "split": split, "by": by, "value": value, "correct": counts[0], "scored": counts[1]}
            for split, res in e["splits"].items()
            for by, table in (res.get("breakdown") or {}).items()
            for value, counts in table.items()]


def collect(run_dirs: list[Path], out: Path, breakdown_out: Path | None = None,
            recorded: list[tuple[Path, str]] = (), accounts: list[dict] = ()) -> int:
    """runs.csv (and breakdown.csv) of ``run_dirs``, then of the ``recorded`` runs (run
    directory, the recording it is read from: seqmix.report.recorded.recorded_runs), and
    ``accounts`` (what was read of each recording) in recordings.json beside runs.csv
    (RECORDINGS). Returns the number of rows."""
    dirs = [Path(d) for d in run_dirs] + [Path(d) for d, _ in recorded]
    rows = [run_row(d) for d in run_dirs] + [run_row(Path(d), name) for d, name in recorded]
    write_rows(out, rows, RunRow)
    write_json(Path(out).with_name(RECORDINGS), list(accounts))
    if breakdown_out is not None:
        parts = [breakdown_rows(d, r) for d, r in zip(dirs, rows)]
        write_rows(breakdown_out, [b for part in parts for b in part], BreakdownRow)
    return len(rows)


RECORDINGS = "recordings.json"  # beside runs.csv: each recording the study reads, its accepted runs and refusals
