"""`python -m seqmix collect`: one row per run (metrics.json + eval.json + config.json) in a
CSV that the notebooks read, so that every number in the report traces back to a run
directory.

``results/summary/runs.csv``, columns:

    profile, task, kind, group   the task's name (sweep point included), its kind, and the
                                 task it was swept from (= task outside a sweep)
    sweep                        JSON of the sweep's settings at this point ({} outside one)
    arch, seed, status           the run; status ok | diverged
    metric, higher_is_better     the task's primary metric
    params, d_model, n_layers    the trained model's size (after budget solving)
    lr                           peak learning rate
    steps_planned, steps_completed, diverged_at_step
    seen, seen_unit              training progress (tokens or examples)
    reach                        how many positions back the model's output can read (the sum
                                 of its layers' reaches; empty: unbounded)
    chance                       the task's chance level of its metric (empty: none; MQAR:
                                 1 / key-value pairs, a model that outputs some value)
    final_gain                   how much the periodic evaluation metric improved over the last
                                 quarter of the run's steps (in the better direction; 0 when
                                 training stopped early at its target): a run still learning
                                 when its budget ran out has a large one
    eval_split, eval_value, eval_loss, eval_scored     final evaluation on the eval split
    test_split, test_value, test_loss, test_scored     ... and on the test split
    scored_unit                  what *_scored counts (tokens, queries, examples)
    train_data, train_complete, eval_data, test_data   what the data were (manifests)
    tokenizer, device, wall_time_s, run_dir

``results/summary/breakdown.csv``: what a task's evaluation reports beyond its metric, one
row per (run, split, by, value); columns:

    task, kind, group, sweep, arch, seed   the run, as above
    split                        eval or test split
    by                           what the scores are broken down by (MQAR: query_distance,
                                 the tokens from a query back to its key)
    value                        the value of ``by`` (e.g. a distance in tokens)
    correct, scored              correct predictions and scored units at that value
"""

from __future__ import annotations

import json
from pathlib import Path

from seqmix.io import read_json, write_csv

FIELDS = [
    "profile", "task", "kind", "group", "sweep", "arch", "seed", "status", "metric", "higher_is_better",
    "params", "d_model", "n_layers", "lr", "steps_planned", "steps_completed", "diverged_at_step",
    "seen", "seen_unit", "reach", "chance", "final_gain", "eval_split", "eval_value", "eval_loss", "eval_scored", "test_split",
    "test_value", "test_loss", "test_scored", "scored_unit", "train_data", "train_complete",
    "eval_data", "test_data", "tokenizer", "device", "wall_time_s", "run_dir",
]


def run_row(run_dir: Path) -> dict:
    m = read_json(run_dir / "metrics.json")
    e = read_json(run_dir / "eval.json")
    cfg = read_json(run_dir / "config.json")
    splits, metric = m["data"]["splits"], m["metric"]
    ev, te = e["splits"].get(m["eval_split"], {}), e["splits"].get(m["test_split"], {})
    tok = m["data"].get("tokenizer") or {}
    return {
        "profile": m["profile"], "task": m["task"], "kind": m["kind"], "group": m["group"],
        "sweep": json.dumps(m["axes"], sort_keys=True), "arch": m["arch"], "seed": m["seed"],
        "status": m["status"], "metric": metric, "higher_is_better": m["higher_is_better"],
        "params": m["params"], "d_model": m["d_model"], "n_layers": m["n_layers"], "lr": cfg["train"]["lr"],
        "steps_planned": m["steps_planned"], "steps_completed": m["steps_completed"],
        "diverged_at_step": m["diverged_at_step"], "seen": m["seen"], "seen_unit": m["seen_unit"],
        "reach": m["reach"], "chance": m["chance"], "final_gain": final_gain(run_dir, m),
        "eval_split": m["eval_split"], "eval_value": ev.get(metric), "eval_loss": ev.get("loss"),
        "eval_scored": ev.get("scored"), "test_split": m["test_split"], "test_value": te.get(metric),
        "test_loss": te.get("loss"), "test_scored": te.get("scored"), "scored_unit": m["scored_unit"],
        "train_data": splits[m["train_split"]]["description"],
        "train_complete": splits[m["train_split"]]["complete"],
        "eval_data": splits[m["eval_split"]]["description"], "test_data": splits[m["test_split"]]["description"],
        "tokenizer": tok.get("description", ""), "device": m["device"],
        "wall_time_s": m["wall_time_s"], "run_dir": str(run_dir),
    }


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


BREAKDOWN_FIELDS = ["task", "kind", "group", "sweep", "arch", "seed", "split", "by", "value", "correct", "scored"]


def breakdown_rows(run_dir: Path, row: dict) -> list[dict]:
    e = read_json(run_dir / "eval.json")
    ids = {k: row[k] for k in ("task", "kind", "group", "sweep", "arch", "seed")}
    return [{**ids, "split": split, "by": by, "value": value, "correct": counts[0], "scored": counts[1]}
            for split, res in e["splits"].items()
            for by, table in (res.get("breakdown") or {}).items()
            for value, counts in table.items()]


def collect(run_dirs: list[Path], out: Path, breakdown_out: Path | None = None) -> int:
    """runs.csv (and breakdown.csv) of ``run_dirs``; returns the number of runs."""
    rows = [run_row(Path(d)) for d in run_dirs]
    write_csv(out, rows, FIELDS)
    if breakdown_out is not None:
        parts = [breakdown_rows(Path(d), r) for d, r in zip(run_dirs, rows)]
        write_csv(breakdown_out, [b for part in parts for b in part], BREAKDOWN_FIELDS)
    return len(rows)
