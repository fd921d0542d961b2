"""A result's sources (seqmix.sources): the modules that compute it and what of this project
they import, read from the code; what a run records of them, and how a report tells a run
made by other code. (How a code change reruns and retrains: tests/test_reruns.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from seqmix import REPO_ROOT
from seqmix.report.collect import code_of
from seqmix.report.quality_tables import code_text
from seqmix.sources import changed, closure, digests, run_modules

PACKAGE = REPO_ROOT / "src" / "seqmix"


def names(paths) -> set[str]:
    return {str(p.relative_to(REPO_ROOT)) for p in paths}


def test_a_runs_sources_are_its_mixer_its_task_and_training_not_the_other_mixers():
    found = names(closure(run_modules("mamba", "mqar")))
    assert {"src/seqmix/mixers/mamba.py", "src/seqmix/tasks/mqar.py", "src/seqmix/data/mqar.py",
            "src/seqmix/train/loop.py", "src/seqmix/models/lm.py", "src/seqmix/mixers/base.py"} <= found
    # Its kernels, imported inside functions, with the C++ source built at first use.
    assert {"kernels/selective_scan_cpu.py", "kernels/selective_scan_cpu.cpp", "kernels/selective_scan.py"} <= found
    assert not {"src/seqmix/mixers/grassmann.py", "src/seqmix/tasks/snli.py", "kernels/grassmann.py",
                "src/seqmix/cli/commands.py", "src/seqmix/cli/inputs.py", "src/seqmix/study/profile.py",
                "src/seqmix/expansion/validate.py"} & found
    # Libraries are not followed, wherever they are installed (`make install`'s .venv/ is in the
    # checkout): every source is the project's own.
    assert all(p.startswith(("src/seqmix/", "kernels/")) for p in found), sorted(found)[:5]


def test_a_library_installed_inside_the_checkout_is_not_the_projects(tmp_path, monkeypatch):
    import seqmix.sources as sources

    venv = REPO_ROOT / ".venv-test-sources" / "lib" / "site-packages"
    monkeypatch.setattr(sources, "library_dirs", lambda: frozenset({venv.resolve()}))
    assert not sources.of_this_project(venv / "torch" / "__init__.py")
    assert sources.of_this_project(PACKAGE / "io.py") and sources.of_this_project(tmp_path / "mymixer.py")


def test_a_run_made_by_other_code_is_told_apart(tmp_path, monkeypatch):
    made = digests([PACKAGE / "mixers" / "softmax.py", PACKAGE / "catalogue.py"])
    assert set(made) == {"src/seqmix/mixers/softmax.py", "src/seqmix/catalogue.py"}
    assert changed(made) == []
    assert changed({**made, "src/seqmix/catalogue.py": "0" * 64}) == ["src/seqmix/catalogue.py"]
    assert changed({"src/seqmix/no_such_module.py": "0" * 64}) == ["src/seqmix/no_such_module.py"]
    row = code_of({"git": {"commit": "abc123", "dirty": True}, "code": {"sources": {**made, "src/seqmix/io.py": "1"}}})
    assert row == {"commit": "abc123", "dirty": True, "code_changed": "src/seqmix/io.py"}
    assert code_of(json.loads('{"git": {"commit": null, "dirty": null}}'))["code_changed"] == "?"


def test_the_report_states_each_runs_commit_and_flags_dirty_and_changed_code():
    runs = pd.DataFrame({"commit": ["abcdef123456", "abcdef123456", ""], "dirty": [False, True, None],
                         "code_changed": ["", "src/seqmix/mixers/grassmann.py", "?"], "task": ["mqar"] * 3,
                         "arch": ["softmax", "grassmann", "gla"], "seed": [0, 0, 1]})
    text = code_text(runs)
    assert "2 runs at \\texttt{abcdef1234} (1 with uncommitted changes)" in text
    assert "1 run at an unknown commit" in text
    assert "grassmann.py} differ): 1 run, mqar/grassmann/seed0." in text
    assert "1 run recorded no sources to compare." in text
    clean = runs.iloc[:1]
    assert code_text(clean) == "The code of each run: 1 run at \\texttt{abcdef1234}. Every run's recorded sources are this checkout's."


def test_training_records_the_digests_of_its_sources(prepared_mqar):
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import validate_study
    from seqmix.train.loop import run_code as train_code
    from seqmix.train.loop import train

    spec = expand(validate_study(prepared_mqar)).run_spec("mqar", "softmax", 0)
    train(spec, progress=False)
    code = json.loads((Path(spec.run_dir) / "provenance.json").read_text())["code"]
    assert code["sources"] == digests(closure(run_modules("softmax", "mqar")))
    assert "src/seqmix/mixers/softmax.py" in code["sources"]
    assert code["digest"] == train_code(spec).digest
