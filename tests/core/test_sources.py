"""A result's sources (seqmix.sources): the modules that compute it and what of this project
they import, read from the code; what a run records of them, and how a report tells a run
made by other code. (How a code change reruns and retrains: tests/workflow/test_reruns.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from seqmix import REPO_ROOT
from seqmix.report.collect import code_of
from seqmix.report.quality_tables import code_text
from seqmix.sources import changed, closure, digests, run_modules, shown

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
    # Told by name, not by folder: `make install`'s .venv/ is in the checkout, and torch there
    # is a library's all the same; seqmix is the project's wherever it is installed.
    import seqmix.sources as sources

    assert not sources.of_this_project("torch") and not sources.of_this_project("yaml.loader")
    assert sources.of_this_project("seqmix.io") and sources.of_this_project("seqmix.kernels.gla")
    assert not sources.of_this_project("mymixer")  # a user's module counts where the catalogue or a job names it
    assert sources.of_this_project("mymixer.helpers", sources.named_packages(["mymixer"]))
    venv = Path(sources.module_file("torch")).parents[1]
    assert not any(p.is_relative_to(venv) for p in closure(run_modules("mamba", "mqar")))


def test_a_users_mixer_counts_and_the_libraries_it_imports_do_not(tmp_path, monkeypatch):
    from seqmix import catalogue

    lab = tmp_path / "mylab"
    lab.mkdir()
    (lab / "__init__.py").write_text("")
    (lab / "mixer.py").write_text("import yaml\nfrom mylab import helpers\nfrom seqmix.mixers.base import Mixer\n")
    (lab / "helpers.py").write_text("import numpy as np\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = catalogue.MixerEntry(name="mine", path="mylab.mixer:Mine", title="Mine", colour="#000001")
    monkeypatch.setattr(catalogue, "MIXERS", (*catalogue.MIXERS, mine))
    found = closure(run_modules("mine", "mqar"))
    assert {lab / "__init__.py", lab / "mixer.py", lab / "helpers.py", PACKAGE / "mixers" / "base.py"} <= set(found)
    assert all(p.is_relative_to(lab) or p.is_relative_to(REPO_ROOT / "src") or p.is_relative_to(REPO_ROOT / "kernels")
               for p in found), [p for p in found if not p.is_relative_to(REPO_ROOT)]


# What `pip install --target deps` of PyYAML leaves, with deps on PYTHONPATH: seqmix.io imports
# yaml, and so does the README's single run (grassmann on wikitext2).
ON_A_PATH_ENTRY = """
import json, sys, yaml
from seqmix.sources import code_of, run_modules, shown
from seqmix.study import dag
assert yaml.__file__.startswith(sys.argv[1]), yaml.__file__
code = code_of(run_modules("grassmann", "wikitext2"))
print(json.dumps({"files": [shown(p) for p in code.files], "digest": code.digest,
                  "imported": [str(p) for p in dag.imported_sources()]}))
"""


def test_a_runs_code_is_the_same_with_its_libraries_on_a_path_entry(tmp_path):
    """A library reached through a path entry (PYTHONPATH, `pip install --target`, a cluster's
    environment modules) is no more the project's than one in site-packages: the same files and
    digest as here, and the job table's cache key (seqmix.study.dag.imported_sources) holds none
    of it either."""
    import shutil
    import subprocess
    import sys

    import yaml

    from seqmix.sources import code_of
    from seqmix.study import dag

    deps = tmp_path / "deps"
    installed = Path(yaml.__file__).parent
    shutil.copytree(installed, deps / "yaml", ignore=shutil.ignore_patterns("__pycache__"))
    for info in installed.parent.glob("[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info"):
        shutil.copytree(info, deps / info.name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(deps), str(REPO_ROOT / "src")])}
    out = subprocess.run([sys.executable, "-c", ON_A_PATH_ENTRY, str(deps)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    there = json.loads(out.stdout)
    here = code_of(run_modules("grassmann", "wikitext2"))
    assert there["files"] == [shown(p) for p in here.files] and there["digest"] == here.digest
    assert "src/seqmix/io.py" in there["files"]
    assert not [f for f in there["imported"] if f.startswith(str(deps))]
    assert str(PACKAGE / "study" / "dag.py") in there["imported"] and str(PACKAGE / "io.py") in there["imported"]
    assert set(map(str, dag.imported_sources())) >= {str(PACKAGE / "study" / "dag.py")}


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
