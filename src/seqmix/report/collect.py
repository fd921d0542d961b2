"""`python -m seqmix collect`: one row per run (metrics.json + eval.json) in a CSV that the
notebooks read, so that every number in the report traces back to a run directory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

FIELDS = [
    "profile", "task", "arch", "seed", "status", "metric", "higher_is_better", "params",
    "d_model", "n_layers", "steps_planned", "steps_completed", "diverged_at_step", "seen",
    "seen_unit", "eval_split", "eval_value", "eval_loss", "eval_scored", "test_split",
    "test_value", "test_loss", "test_scored", "train_data", "train_complete", "eval_data",
    "test_data", "tokenizer", "device", "wall_time_s", "run_dir",
]


def run_row(run_dir: Path) -> dict:
    m = json.loads((run_dir / "metrics.json").read_text())
    e = json.loads((run_dir / "eval.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    splits = m["data"]["splits"]
    train_split = cfg["task_config"].get("train_split", "train")
    eval_name, test_name = m["eval_split"], cfg["task_config"].get("test_split", "test")
    ev, te = e["splits"].get(eval_name, {}), e["splits"].get(test_name, {})
    metric = m["metric"]

    def scored(res: dict):
        return res.get("tokens") or res.get("queries") or res.get("examples")

    tok = m["data"].get("tokenizer") or {}
    return {
        "profile": m["profile"], "task": m["task"], "arch": m["arch"], "seed": m["seed"],
        "status": m["status"], "metric": metric, "higher_is_better": m["higher_is_better"],
        "params": m["params"], "d_model": m["d_model"], "n_layers": m["n_layers"],
        "steps_planned": m["steps_planned"], "steps_completed": m["steps_completed"],
        "diverged_at_step": m["diverged_at_step"], "seen": m["seen"], "seen_unit": m["seen_unit"],
        "eval_split": eval_name, "eval_value": ev.get(metric), "eval_loss": ev.get("loss"),
        "eval_scored": scored(ev), "test_split": test_name, "test_value": te.get(metric),
        "test_loss": te.get("loss"), "test_scored": scored(te),
        "train_data": splits[train_split]["description"],
        "train_complete": splits[train_split]["complete"],
        "eval_data": splits[eval_name]["description"], "test_data": splits[test_name]["description"],
        "tokenizer": tok.get("description", ""), "device": m["device"],
        "wall_time_s": m["wall_time_s"], "run_dir": str(run_dir),
    }


def collect(run_dirs: list[Path], out: Path) -> int:
    rows = [run_row(Path(d)) for d in run_dirs]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return len(rows)
