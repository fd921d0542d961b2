"""A result is never older than the code it names (seqmix.sources): a job's code is found from
the imports of what it runs, as one digest; a run is identified by it, so that a checkpoint
made by other code is never resumed; and on a finished study a functional edit reruns exactly
the jobs whose code it changes, which retrain. Digests are of the files' bytes: a comment edit
reruns what the file reaches like any other, a bare touch nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seqmix import sources
from seqmix.expansion.table import expand
from seqmix.expansion.validate import validate_study
from seqmix.sources import Code, file_digest
from seqmix.train import loop
from tests.conftest import tiny_config
from tests.helpers import copy_workflow, planned_jobs, planned_wildcards, snakemake

# ------------------------------------------------------------------------------------------
# The digest: a file's code, not its bytes.
# ------------------------------------------------------------------------------------------


def test_a_files_digest_is_of_its_bytes_the_same_in_any_checkout(tmp_path):
    # Bytes, not a parse: the same on every Python version (a GPU machine's 3.12 records runs
    # that this checkout's 3.11 compares), so that any edit counts, a comment too.
    module = tmp_path / "mod.py"
    module.write_text("def f(x):\n    return 2 * x\n")
    first = file_digest(module)
    assert first == hashlib.sha256(module.read_bytes()).hexdigest()
    module.write_text("def f(x):\n    return 2 * x  # twice\n")
    assert file_digest(module) != first
    copy = tmp_path / "elsewhere" / "mod.py"
    copy.parent.mkdir()
    copy.write_text("def f(x):\n    return 2 * x  # twice\n")
    assert file_digest(copy) == file_digest(module)


def test_a_notebooks_code_is_its_cells_and_what_they_import(tmp_path):
    nb = tmp_path / "topic.ipynb"
    cells = [{"cell_type": "markdown", "source": ["# Title"]},
             {"cell_type": "code", "source": ["%matplotlib inline\n", "from seqmix.report.latex import write_text\n"]}]
    nb.write_text(json.dumps({"cells": cells}))
    files = {sources.shown(p) for p in sources.closure([nb])}
    assert {str(nb), "src/seqmix/report/latex.py", "src/seqmix/report/__init__.py"} <= files
    first = file_digest(nb)
    cells[0]["source"] = ["# Another title"]
    nb.write_text(json.dumps({"cells": cells}))
    assert file_digest(nb) == first  # prose is no code
    cells[1]["source"].append("x = 1\n")
    nb.write_text(json.dumps({"cells": cells}))
    assert file_digest(nb) != first


def test_imports_are_read_in_every_form_and_not_under_type_checking(tmp_path):
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("import a.b as c, d\nfrom e import (\n    f,  # why\n    g as h,\n)\n"
                      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import never\n"
                      "def late():\n    from . import sibling\n    from .sub import x\n")
    found = sources.imported_names(module, "pkg.mod")
    assert found >= {"a.b", "d", "e", "e.f", "e.g", "pkg", "pkg.sibling", "pkg.sub", "pkg.sub.x"}
    assert "never" not in found


def test_a_runs_code_is_narrow():
    # A run depends on its mixer, its task, the model, training and the kernels it reaches;
    # not on another mixer's kernel.
    def names(arch):
        return {sources.shown(p) for p in sources.code_of(sources.run_modules(arch, "mqar")).files}

    softmax, mamba = names("softmax"), names("mamba")
    assert {"src/seqmix/mixers/softmax.py", "src/seqmix/train/loop.py", "src/seqmix/tasks/mqar.py"} <= softmax
    assert not {p for p in softmax if p.startswith("kernels/")}, sorted(softmax)
    assert {"kernels/selective_scan_cpu.py", "kernels/selective_scan_cpu.cpp"} <= mamba
    # Nor on the words (the glossary is read, not imported).
    assert "src/seqmix/study/glossary.py" not in softmax | mamba
    # Evaluation and the analyses do not depend on the training loop.
    for module in (sources.EVALUATION, "seqmix.analysis.throughput", "seqmix.analysis.complexity",
                   "seqmix.analysis.sparsity"):
        assert "src/seqmix/train/loop.py" not in {sources.shown(p) for p in sources.closure([module])}, module


# ------------------------------------------------------------------------------------------
# A run's identity: its settings and its code.
# ------------------------------------------------------------------------------------------


@pytest.fixture
def spec(prepared_mqar, tmp_path):
    cfg = json.loads(json.dumps(prepared_mqar))
    cfg["results_dir"] = str(tmp_path / "results")
    return expand(validate_study(cfg)).run_spec("mqar", "softmax", 0)


def other_code(monkeypatch) -> None:
    """Make the run's code look edited: same files, another digest."""
    real = loop.code_of

    def edited(entries):
        code = real(entries)
        return Code(code.files, "0" * 16)

    monkeypatch.setattr(loop, "code_of", edited)


class Interrupt(Exception):
    pass


def test_a_checkpoint_made_by_other_code_is_not_resumed(spec, monkeypatch, capsys):
    save = loop.save_checkpoint

    def save_then_stop(run):
        save(run)
        raise Interrupt

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)
    with pytest.raises(Interrupt):
        loop.train(spec, progress=False)
    monkeypatch.setattr(loop, "save_checkpoint", save)
    ckpt = Path(spec.run_dir) / loop.CHECKPOINT
    assert ckpt.exists()
    other_code(monkeypatch)
    capsys.readouterr()
    metrics = loop.train(spec, progress=False)
    assert f"ignoring {ckpt}: written with other settings or other code" in capsys.readouterr().err
    assert metrics["resumed_from_steps"] == [] and metrics["steps_completed"] == spec.train.steps
    provenance = json.loads((Path(spec.run_dir) / "provenance.json").read_text())
    assert provenance["code"]["digest"] == "0" * 16


def test_a_finished_run_trains_again_under_other_code_and_not_under_its_own(spec, monkeypatch, capsys):
    run_dir = Path(spec.run_dir)
    loop.train(spec, progress=False)
    code = loop.run_code(spec)
    assert json.loads((run_dir / "provenance.json").read_text())["code"]["digest"] == code.digest
    capsys.readouterr()
    loop.train(spec, progress=False)  # the same code: its results are written again, untrained
    assert "writing its results again without training" in capsys.readouterr().err
    other_code(monkeypatch)
    metrics = loop.train(spec, progress=False)
    err = capsys.readouterr().err
    assert f"ignoring {run_dir / loop.FINAL}: written with other settings or other code" in err
    assert "without training" not in err and metrics["resumed_from_steps"] == []


def test_a_run_planned_with_other_code_fails_before_any_step(spec):
    planned = loop.run_code(spec).digest
    proc = subprocess.run([sys.executable, "-m", "seqmix", "train", "--quiet", "--spec", spec.model_dump_json(),
                           "--code", "f" * 16], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: the code of run {spec.run_name} changed after the workflow planned it (planned digest {'f' * 16}, "
        f"this checkout's {planned}): run the workflow again, which plans it with the code as it is now")
    assert not (Path(spec.run_dir) / "model.pt").exists()


# ------------------------------------------------------------------------------------------
# The reruns, run: a finished tiny study, edited.
# ------------------------------------------------------------------------------------------

# The report reads Grassmann's numbers; Grassmann and H3 each reach kernels of their own
# (kernels/grassmann.py; kernels/fft_conv.py, s4d.py), and neither is built at first use as
# Mamba's C++ scan is (a minute of compiling in every scratch copy: test_checkouts.py builds one).
ARCHS = ("softmax", "grassmann", "h3")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny MQAR study (ARCHS; one seed) run to its PDF in a scratch copy
    of the workflow, <root>/live/{src,work}, with a pristine copy of both in <root>/done (the
    jobs name absolute paths: each test edits the study where it was made)."""
    root = tmp_path_factory.mktemp("reruns")
    src = copy_workflow(root / "live" / "src")
    work = root / "live" / "work"
    work.mkdir()
    cfg = tiny_config(work, None, archs=ARCHS)
    cfg["results_dir"], cfg["data"]["dir"] = "results", "data"
    (work / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(src, work, "--configfile", "tiny.yaml")
    shutil.copytree(root / "live", root / "done", symlinks=True)
    return root


def restored(finished: Path) -> tuple[Path, Path]:
    """The finished study, as it was made: (src, work)."""
    live = finished / "live"
    shutil.rmtree(live)
    shutil.copytree(finished / "done", live, symlinks=True)
    return live / "src", live / "work"


def edited(finished: Path, file: str, old: str, new: str) -> tuple[Path, Path]:
    """The finished study, as it was made, with ``old`` replaced by ``new`` in ``file`` of its
    sources: (src, work). An edit that would leave the file as it was is refused."""
    src, work = restored(finished)
    path = src / file
    text = path.read_text()
    assert old and old != new and old in text, (file, old, new)
    path.write_text(text.replace(old, new, 1))
    assert path.read_text() != text, f"{file} unchanged"
    return src, work


def nothing_planned(proc: subprocess.CompletedProcess) -> bool:
    """A dry run said it has nothing to do: its own words, not only an empty job table (a run
    that printed no table at all has one too)."""
    out = proc.stdout + proc.stderr
    return "Nothing to be done (all requested files are present and up to date)." in out and planned_jobs(proc) == {}


def run_files(work: Path) -> dict[str, str]:
    """{path: sha256} of every file of every run directory."""
    runs = work / "results" / "runs"
    return {str(p.relative_to(runs)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(runs.rglob("*")) if p.is_file()}


def ran(proc: subprocess.CompletedProcess, rule: str) -> set[str]:
    """The architectures of the jobs of ``rule`` a run ran, or a dry run planned."""
    return {w["arch"] for w in planned_wildcards(proc.stdout + "\n\n" + proc.stderr, rule)}


def retrained(src: Path, work: Path, arch: str, before: dict[str, str]) -> set[str]:
    """Run what a plan retrains: ``arch``'s run, to its evaluation. The rest of a plan (the
    analyses, notebooks and report) reads runs and writes no run file: the dry run before it
    says which of those an edit reruns; this fixture's build and the shared study
    (tests/shared_study.py) run them, each a minute of jobs that would test nothing new here.
    Checks that it trained ``arch`` alone, from step 0, and left every other run's files as
    ``before`` (run_files before the edit) has them; returns the files it changed."""
    run = f"results/runs/mqar/{arch}/seed0"
    proc = snakemake(src, work, f"{run}/eval.json", "--configfile", "tiny.yaml")
    assert ran(proc, "train") == ran(proc, "eval") == {arch}, planned_jobs(proc)
    after = run_files(work)
    changed = {p for p in before if after.get(p) != before[p]}
    assert {p for p in changed if not p.startswith(f"mqar/{arch}/")} == set(), "another run's files changed"
    metrics = json.loads((work / run / "metrics.json").read_text())
    assert metrics["resumed_from_steps"] == [] and metrics["steps_completed"] == 6
    return changed


def test_a_functional_edit_to_one_mixer_retrains_its_runs_and_reruns_what_reads_them(finished):
    src, work = edited(finished, "src/seqmix/mixers/softmax.py",
                            "return self.out_proj(y.transpose(1, 2).reshape(B, L, D))",
                            "return 0.5 * self.out_proj(y.transpose(1, 2).reshape(B, L, D))")
    before = run_files(work)
    proc = snakemake(src, work, "-n", "--configfile", "tiny.yaml")
    jobs = planned_jobs(proc)
    assert ran(proc, "train") == ran(proc, "eval") == {"softmax"}, jobs
    assert jobs["train"] == 1 and "data_task" not in jobs
    # What reads the runs runs again: the analyses that build softmax, the per-run sparsity,
    # the table of runs, the notebooks and the report.
    assert {"collect", "complexity", "throughput", "copy_probe", "notebook_quality", "report"} <= set(jobs), jobs
    assert ran(proc, "sparsity_run") <= {"softmax"}
    changed = retrained(src, work, "softmax", before)
    assert {"mqar/softmax/seed0/model.pt", "mqar/softmax/seed0/log.csv"} <= changed  # new weights
    log = (work / "results" / "logs" / "train" / "mqar" / "softmax" / "seed0.log").read_text()
    assert "without training" not in log and "resuming" not in log
    assert "ignoring" in log and "written with other settings or other code" in log  # its final.pt
    # Retrained, the run is up to date: what is left to do is what reads it.
    left = planned_jobs(snakemake(src, work, "-n", "--configfile", "tiny.yaml"))
    assert "train" not in left and "eval" not in left and "report" in left, left


def test_a_bare_touch_reruns_nothing_and_a_comment_reruns_only_what_the_file_reaches(finished):
    src, work = restored(finished)
    (src / "src" / "seqmix" / "mixers" / "softmax.py").touch()
    (src / "kernels" / "grassmann.py").touch()
    proc = snakemake(src, work, "-n", "--configfile", "tiny.yaml")
    assert nothing_planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    src, work = edited(finished, "src/seqmix/mixers/softmax.py",
                       "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
                       "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        # a comment\n")
    proc = snakemake(src, work, "-n", "--configfile", "tiny.yaml")
    assert ran(proc, "train") == ran(proc, "eval") == {"softmax"}, planned_jobs(proc)


def test_an_edit_to_the_verdict_logic_reruns_the_claims_notebook_and_the_report_only(finished):
    src, work = edited(finished, "src/seqmix/report/claims.py", "\ndef ",
                            "\nVERDICT_LOGIC_EDITED = True\n\n\ndef ")
    before = run_files(work)
    proc = snakemake(src, work, "--configfile", "tiny.yaml")
    assert set(planned_jobs(proc)) == {"notebook_claims", "report", "latest_report", "all"}, planned_jobs(proc)
    assert run_files(work) == before


def test_an_edit_to_grassmanns_kernel_retrains_only_grassmanns_runs(finished):
    # H3 reaches kernels of its own and softmax none: neither retrains.
    src, work = edited(finished, "kernels/grassmann.py", "\n@triton.jit\n",
                            "\nKERNEL_EDITED = True\n\n\n@triton.jit\n")
    before = run_files(work)
    proc = snakemake(src, work, "-n", "--configfile", "tiny.yaml")
    assert ran(proc, "train") == ran(proc, "eval") == {"grassmann"}, planned_jobs(proc)
    # Retrained under the code as it is now (the edit changes no number: the same weights).
    assert "mqar/grassmann/seed0/provenance.json" in retrained(src, work, "grassmann", before)
