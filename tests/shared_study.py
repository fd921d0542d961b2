"""The one tiny study the DAG tests share: built to its report once per test session, by
whichever pytest worker asks first (the others wait on a lock and read what it recorded).

Its config holds what each of them asserts on (tests/workflow/test_dag.py, test_extension.py,
test_studies.py, tests/faults/test_files.py):

- three tasks and two architectures, as a study of the README (MQAR, WikiText-2, SNLI);
- a 13th mixer added as docs/reference/extending.md's "Adding a mixer" says (a module in a package of its own
  and the catalogue entry, nothing else edited), trained on MQAR and on a task variant with a
  sweep (config only);
- results and data folders whose names hold spaces, quotes and shell metacharacters, and a
  task whose every run diverges, listed first (its panel holds the legends).

After the build, what the tests ask of a study that changes is done here, in order, and what
each step planned or left is recorded (``Study.seen``): dry runs after editing a mixer, a task
kind and a notebook (each edit undone, its file's time too); a recording committed and its
notebooks rerun (undone and rebuilt); a second study built in the same working directory and
the first switched back to. The study ends as it was built: up to date, its report the latest.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import traceback
from contextlib import contextmanager
from pathlib import Path

import yaml

from .conftest import tiny_config
from .helpers import REPO, copy_workflow, planned_jobs, snakemake

# --- the 13th mixer, as docs/reference/extending.md's "Adding a mixer" prints it (the README points there) --

GUIDE_PAGE = (REPO / "docs" / "reference" / "extending.md").read_text()
GUIDE = GUIDE_PAGE[GUIDE_PAGE.index("## Adding a mixer"):GUIDE_PAGE.index("## Adding a task")]
ENTRY = re.search(r"```python\n\s*(MixerEntry\(.*?\),)\n\s*```", GUIDE, re.S).group(1)  # step 2's entry
TEST_COMMAND = re.search(r"`(python -m pytest tests/mixers/test_mixers\.py -k \w+)`", GUIDE).group(1)  # step 4's
NAME, PATH, TITLE = (re.search(rf'{key}="([^"]+)"', ENTRY).group(1) for key in ("name", "path", "title"))

# Step 1: a module in a package of its own, with an option bounded in its metadata.
PLUGIN = textwrap.dedent('''
    """A causal running mean: y_t = W (scale / (t+1) * sum_{s<=t} x_s). A mixer a researcher
    might add to compare with attention."""
    import dataclasses

    import torch
    from torch import nn

    from seqmix.mixers.base import Mixer


    @dataclasses.dataclass
    class CausalMeanOptions:
        scale: float = dataclasses.field(default=1.0, metadata={"gt": 0})


    class CLASS(Mixer):
        Options = CausalMeanOptions
        supports_noncausal = False

        def __init__(self, d_model, options, *, causal=True, max_len=None):
            super().__init__(d_model, options, causal=causal, max_len=max_len)
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
            return self.proj(self.options.scale * x.cumsum(1) / count)
''').replace("CLASS", PATH.rpartition(":")[2])
VARIANT = "mqar/L32-kv4"  # a second MQAR cell, swept over the model width

# --- paths a shell would misread, and a task that diverges ----------------------------------------

INJECTED = "PWNED"  # a file of this name appears where a path ran as a shell command
RESULTS = f"""my results/it's "q" $(touch {INJECTED}1) `touch {INJECTED}2`"""
DATA = f"inj;touch {INJECTED}3;#/da ta"
DIVERGE = "mqar/diverge"


def study_config(mirror: Path) -> dict:
    """The shared study's config (module docstring); its folders relative to the working
    directory."""
    cfg = tiny_config(Path("."), mirror)
    cfg.update(profile="study-a", results_dir=RESULTS, architectures=["softmax", "grassmann", NAME])
    cfg["data"]["dir"] = DATA
    cfg["mixers"][NAME] = {"scale": 0.5}
    tasks = cfg["tasks"]
    for kind in ("wikitext2", "snli"):
        tasks[kind]["architectures"] = ["softmax", "grassmann"]
    diverge = json.loads(json.dumps(tasks["mqar"]))
    diverge["train"].update(lr=1e6, grad_clip=0.0, warmup_steps=0)  # NaN at step 1 or 2; first eval at 3
    diverge["architectures"] = ["softmax", "grassmann"]
    variant = {**tasks["mqar"], "vocab_size": 48, "seq_len": 32, "num_kv_pairs": 4,
               "architectures": ["softmax", NAME], "sweep": {"model.d_model": [8, 16]}}
    cfg["tasks"] = {DIVERGE: diverge, **tasks, VARIANT: variant}
    cfg["analysis"]["sparsity"].update(tasks=["wikitext2", f"{VARIANT}/d8"], min_row_len=4)
    cfg["analysis"]["geometry"] = {"task": "mqar"}  # not the first MQAR task: that one diverges
    return cfg


def second_config() -> dict:
    """Another study for the same working directory: MQAR only (no mirror), its own name,
    results and data folders (softmax and Grassmann: the report's text names Grassmann's
    numbers)."""
    cfg = tiny_config(Path("."), None)
    cfg.update(profile="study-b", results_dir="results-b")
    cfg["data"]["dir"] = "data-b"
    return cfg


# --- the built study -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Study:
    root: Path
    src: Path  # the scratch repository: the README's steps taken in it
    work: Path  # the working directory Snakemake runs in
    config: dict  # the study's config (study.yaml in work)
    env: dict  # what its Snakemake needs besides this environment (the plugin package)
    seen: dict  # what the steps after the build planned and left (module docstring)

    @property
    def config_file(self) -> Path:
        return self.work / "study.yaml"

    @property
    def results(self) -> Path:
        return self.work / RESULTS

    @property
    def data(self) -> Path:
        return self.work / DATA

    @property
    def report(self) -> Path:
        return self.results / "report"

    def snakemake(self, *args: str, check: bool = True, config: Path | None = None) -> subprocess.CompletedProcess:
        """Snakemake on this study (or ``config``) in its working directory (``--configfile``
        last: it takes every word after it)."""
        return snakemake(self.src, self.work, *args, "--configfile", str(config or self.config_file),
                         check=check, env=self.env)

    def dry_run(self, *targets: str, config: Path | None = None) -> subprocess.CompletedProcess:
        return self.snakemake("-n", *targets, config=config)


def digest_of(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@contextmanager
def edited(path: Path, edit):
    """``path`` with ``edit`` (text -> text) applied, then as it was, its time included."""
    text, stat = path.read_text(), path.stat()
    try:
        path.write_text(edit(text))
        yield
    finally:
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def take_readme_steps(src: Path, root: Path) -> Path:
    """Steps 1 and 2 of "Adding a mixer" in the scratch repository ``src`` (the module in a
    package under ``root``/plugins, the catalogue entry), and what step 4 needs there (the
    tests and pyproject.toml). Returns the plugin folder, for PYTHONPATH."""
    module, _, _ = PATH.partition(":")
    file = root / "plugins" / Path(*module.split(".")).with_suffix(".py")
    for package in [file.parent, *[p for p in file.parent.parents if p > root / "plugins"]]:
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    file.write_text(PLUGIN)
    catalogue = src / "src" / "seqmix" / "catalogue.py"
    anchor = "\n)\n\nTASKS"  # the end of MIXERS
    text = catalogue.read_text()
    assert text.count(anchor) == 1, "the guide's catalogue entry has nowhere to go"
    catalogue.write_text(text.replace(anchor, f"\n    {ENTRY}{anchor}"))
    shutil.copytree(REPO / "tests", src / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", src / "pyproject.toml")
    return root / "plugins"


def build(root: Path, mirror: Path) -> Study:
    """The study built and put through the steps of the module docstring, in ``root``."""
    src, work = copy_workflow(root / "src"), root / "work"
    work.mkdir()
    plugins = take_readme_steps(src, root)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")]))}
    cfg = study_config(mirror)
    (work / "study.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    study = Study(root, src, work, cfg, env, {})
    seen = study.seen
    study.snakemake()
    seen["nothing left"] = planned_jobs(study.dry_run())

    # Edits a researcher makes, each undone: what a dry run plans after it.
    for name, path in (("grassmann.py", src / "src" / "seqmix" / "mixers" / "grassmann.py"),
                       ("snli.py", src / "src" / "seqmix" / "tasks" / "snli.py")):
        # A statement, not a comment: a job's code is its files' bytes, a comment too, but the
        # edit a researcher makes to code is code (tests/workflow/test_reruns.py: what a comment does).
        with edited(path, lambda text: text + "\nEDITED_BY_A_TEST = True\n"):
            proc = study.dry_run()
            seen[f"after editing {name}"] = proc.stdout + proc.stderr
    notebook = src / "notebooks" / "complexity.ipynb"

    def edit_notebook(text: str) -> str:  # an edit of a code cell: a notebook's code is its cells
        content = json.loads(text)
        cell = next(c for c in content["cells"] if c["cell_type"] == "code")
        cell["source"] = ["".join(cell["source"]) + "\nedited_by_a_test = True\n"]
        return json.dumps(content)

    with edited(notebook, edit_notebook):
        seen["notebook edited, one figure"] = planned_jobs(
            study.dry_run(str(study.report.relative_to(work) / "figures" / "complexity_time.pdf")))
        seen["notebook edited"] = planned_jobs(study.dry_run())

    record_and_rebuild(study)
    switch_studies(study)
    return study


def record_and_rebuild(study: Study) -> None:
    """This study recorded into the scratch repository with its config at the headline
    study's path; what a dry run plans then, and what the notebooks that read the recording
    write; then the recording removed and the study rebuilt."""
    from seqmix.report.recorded import HEADLINE_CONFIG

    from .helpers import read_macros

    seen, src = study.seen, study.src
    headline = src / HEADLINE_CONFIG.relative_to(REPO)
    recorded = src / "results" / "recorded"
    before = planned_jobs(study.dry_run())
    with edited(headline, lambda text: study.config_file.read_text()):
        subprocess.run([sys.executable, "-m", "seqmix", "record", "--config", str(study.config_file), "--out",
                        str(recorded)], cwd=study.work, check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "src"), study.env["PYTHONPATH"]])})
        after = planned_jobs(study.dry_run())
        seen["recording committed"] = {"before": before, "after": after}
        tables, figures = study.report / "tables", study.report / "figures"
        study.snakemake(*(str(p.relative_to(study.work)) for p in (
            tables / "claims.tex", tables / "quality-macros.tex", figures / "quality_recorded.pdf")))
        (meta,) = [json.loads(p.read_text()) for p in recorded.glob("*/*/meta.json")]
        seen["recording"] = {"meta": meta, "claims.tex": (tables / "claims.tex").read_text(),
                             "qRecorded": read_macros(tables / "quality-macros.tex")["qRecorded"],
                             "quality_recorded.pdf bytes": (figures / "quality_recorded.pdf").stat().st_size}
        shutil.rmtree(recorded)
    study.snakemake()  # the notebooks that read the recording, and the report, again without it


def switch_studies(study: Study) -> None:
    """A second study in the same working directory: its dry run, its build, this study's dry
    run and build after it; each report's digest at every step."""
    seen, work = study.seen, study.work
    b = work / "b.yaml"
    b.write_text(yaml.safe_dump(second_config()))
    report = {"a": study.report / "report.pdf", "b": work / "results-b" / "report" / "report.pdf"}
    copy = work / "paper" / "report.pdf"
    steps = {"a": digest_of(report["a"])}
    # B has its own data folder too, so its dry run must list what --forceall would run.
    steps["b planned"] = planned_jobs(study.dry_run(config=b))
    steps["b forced"] = planned_jobs(study.dry_run("--forceall", config=b))
    study.snakemake(config=b)
    steps |= {"a after b": digest_of(report["a"]), "b": digest_of(report["b"]), "copy after b": digest_of(copy)}
    steps["a planned again"] = planned_jobs(study.dry_run())
    study.snakemake()
    steps |= {"a again": digest_of(report["a"]), "b after a": digest_of(report["b"]), "copy after a": digest_of(copy)}
    seen["switch"] = steps


def build_and_record(root: Path, mirror: Path) -> None:
    """``build`` in ``root``, and what it recorded (or how it failed) in root.json, for the
    workers to read."""
    record = root.with_suffix(".json")
    try:
        study = build(root, mirror)
        record.write_text(json.dumps({"seen": study.seen, "env": study.env}))
    except BaseException:
        record.write_text(json.dumps({"failed": traceback.format_exc()}))
        raise


def start_building(root: Path, mirror: Path) -> subprocess.Popen | None:
    """The build in a process of its own, started now (as the session starts: the tests that
    need the study wait only for what is left of it), if no worker has started it; it holds
    the study's lock until it is done. None where another worker builds or built it."""
    lock = open(root.with_suffix(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    with lock:
        if root.with_suffix(".json").exists():
            return None
        with open(root.with_suffix(".log"), "w") as log:
            # The child inherits the locked file: the lock is held until it exits.
            return subprocess.Popen([sys.executable, "-m", "tests.shared_study", str(root), str(mirror)], cwd=REPO,
                                    stdout=log, stderr=subprocess.STDOUT, pass_fds=(lock.fileno(),),
                                    start_new_session=True)


def shared_study(root: Path, mirror: Path) -> Study:
    """The study in ``root``: built by the process start_building started (waited for on its
    lock), else here, now."""
    record = root.with_suffix(".json")
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            build_and_record(root, mirror)
    made = json.loads(record.read_text())
    if "failed" in made:
        log = root.with_suffix(".log")
        raise AssertionError(f"building the shared study failed ({log if log.exists() else 'here'}):\n{made['failed']}")
    return Study(root, root / "src", root / "work", study_config(mirror), made["env"], made["seen"])


if __name__ == "__main__":  # python -m tests.shared_study ROOT MIRROR: start_building's process
    build_and_record(Path(sys.argv[1]), Path(sys.argv[2]))
