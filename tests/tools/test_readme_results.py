"""The README's results block (tools/readme_results.py, ``make readme-results``): its figures
are drawn from a study's runs.csv by the report's own panel functions, and a study whose
report was not built is refused. On a finished study, end to end: tests/workflow/test_dag.py."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from tests.report.test_claims import run_row, sweep_row
from tools import readme_results


def test_the_figures_are_a_panel_per_unswept_task_and_the_recall_sweep(tmp_path):
    runs = [run_row("wikitext2", a, s, 100.0 + s, 110.0 + s, metric="ppl", higher_is_better=False)
            for a in ("softmax", "grassmann") for s in (0, 1)]
    runs += [sweep_row("mqar/s", a, d, 3e-3, 0.5, v, seed=s, chance=0.125, ended="budget", plateau_rule="{}")
             for a in ("softmax", "gla") for d in (8, 16) for s, v in ((0, 0.4), (1, 0.9))]
    for r in runs[4:]:
        r["sweep"] = json.dumps({"model.d_model": r["d_model"]})  # one learning rate: width only
    (tmp_path / "summary").mkdir()
    pd.DataFrame(runs).to_csv(tmp_path / "summary" / "runs.csv", index=False)
    figures = readme_results.draw(tmp_path, tmp_path / "images")
    assert [name for _, name in figures] == ["quality.png", "recall.png"]
    assert figures[0][0].startswith("Test metric per architecture (WikiText-2)")
    assert "(one learning rate, 0.003)" in figures[1][0]
    for _, name in figures:
        data = (tmp_path / "images" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_an_unfinished_study_is_refused(tmp_path, capsys):
    from tests.conftest import tiny_config

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path, None)))
    code = readme_results.main(["--config", str(tmp_path / "c.yaml"), "--markdown", str(tmp_path / "r.md")])
    assert code == 4 and "is not finished here" in capsys.readouterr().err and not (tmp_path / "r.md").exists()
