"""The study as the Snakefile sees it, without importing torch.

``read_jobs`` returns the job table of `python -m seqmix jobs` (the validated study, every job's
spec and code, the path patterns and each rule's resources: ``seqmix.expansion.table.job_table``
of the study's ``Expansion``).
The table is made in a subprocess, which reads the profile once (seqmix.study.profile),
validates and expands it with the task and mixer classes (torch), and cached under
``.snakemake/seqmix/`` with the sha256 of every file it was made from or describes: the
profile's files as that one reading found them, every module the subprocess imported and every
file of every job's code (seqmix.sources: the digests it holds are of those files). While they
are all unchanged, parsing the Snakefile again (a dry run, each SLURM job on its node) reads one
JSON file; one changed byte in any of them makes the table again. The study is validated there
and nowhere else: the onstart's preflight reads the table's specs (seqmix.preflight.Specs).

Everything here is standard library and PyYAML, like seqmix.catalogue; seqmix.study is the
bottom of the stack, below the tasks and mixers, and imports none of them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqmix import REPO_ROOT, catalogue, mkl_shim, numerics
from seqmix.io import sha256_file, yaml_data
from seqmix.sources import imported_files

SRC = Path(__file__).resolve().parents[2]  # the src/ this seqmix was imported from
CACHE_DIR = Path(".snakemake") / "seqmix"  # in Snakemake's working directory
KEEP = 8  # tables kept in the cache, the most recently made ones


class StudyError(Exception):
    """The study could not be resolved; the message is what the resolver printed
    (``error: ...`` naming the file or key and the fix, for a bad config)."""


# ------------------------------------------------------------------------------------------
# Resolving and caching.
# ------------------------------------------------------------------------------------------


def read_jobs(config: Mapping[str, Any], configfiles: Sequence[str | os.PathLike] = (),
         cache_dir: str | os.PathLike = CACHE_DIR) -> Jobs:
    """The job table of the study Snakemake was given: the last of ``configfiles`` (its
    ``extends`` resolved; none: config/config.yaml) with ``config`` on top (what Snakemake
    merged from those files and ``--config``). A profile is that one file plus the defaults."""
    mkl_shim.configure(os.environ.get(mkl_shim.CACHE_ENV))  # where the preflight builds the jobs' shim
    overrides = {k: v for k, v in config.items() if k != "extends"}
    command = [sys.executable, "-m", "seqmix", "jobs"]
    if configfiles:
        command += ["--config", str(Path(configfiles[-1]).resolve())]
    if overrides:
        command += ["--overrides", json.dumps(overrides, default=str)]
    # What could make another table from the same files: the request, the interpreter,
    # which seqmix and which packages it finds, and seqmix's settings in the environment.
    environment = {k: v for k, v in sorted(os.environ.items()) if k == "PYTHONPATH" or k.startswith("SEQMIX_")}
    key = hashlib.sha256(json.dumps([command, str(SRC), environment]).encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"jobs-{key}.json"
    made = _cached(path)
    if made is None:
        made = _resolve(command)
        _store(path, made)
    return Jobs(made["jobs"])


def _cached(path: Path) -> dict | None:
    """The stored table, if every file it was made from or describes still has its sha256 and
    every folder listing it read is the same."""
    try:
        made = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not all(sha256_of(f) == digest for f, digest in made.get("read", {}).items()):
        return None
    if not all(sorted(str(p) for p in REPO_ROOT.glob(pattern)) == files for pattern, files in made.get("listed", {}).items()):
        return None
    return made


def _resolve(command: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise StudyError(proc.stderr.strip() or f"{shlex.join(command[:4])} failed (exit status {proc.returncode})")
    try:  # the table is the last line; anything printed before it is not ours
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise StudyError(f"{shlex.join(command[:4])} printed no job table: {proc.stdout[-500:]!r}") from None


def _store(path: Path, made: dict) -> None:
    # Atomic, so that concurrent parses (SLURM jobs starting together) read a whole table.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(made))
    os.replace(tmp, path)
    for old in sorted(path.parent.glob("jobs-*.json"), key=_made_at)[:-KEEP]:
        old.unlink(missing_ok=True)


def _made_at(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another parse
        return 0.0


def sha256_of(path: str | os.PathLike) -> str | None:
    """A file's sha256 (seqmix.io.sha256_file), None when it is gone or unreadable."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def imported_sources() -> list[Path]:
    """The files of the modules this process imported that are this project's code
    (seqmix.sources.imported_files: seqmix itself, and a user's own mixers or tasks), never a
    library's, wherever it is installed."""
    return imported_files()


def shell_prefix(numerics_mode: str | None = None) -> str:
    """Snakemake's shell prefix: strict bash, this seqmix first on PYTHONPATH, so that every
    job runs the code that resolved its spec, and the variables of the study's numerics
    (seqmix.numerics), so that every process of a job starts with its libraries pinned."""
    src = shlex.quote(str(SRC)).replace("{", "{{").replace("}", "}}")  # the prefix is formatted
    pins = numerics.shell_exports(numerics_mode) if numerics_mode else ""
    return f"set -euo pipefail; export PYTHONPATH={src}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; {pins}"


# ------------------------------------------------------------------------------------------
# The table, as the rules read it.
# ------------------------------------------------------------------------------------------


class Jobs:
    """One study's jobs: paths, specs (as the JSON each command takes) and resources.

    Path patterns keep Snakemake's wildcards: ``run_file("model.pt")`` is
    ``<results>/runs/{task}/{arch}/seed{seed}/model.pt`` (seqmix.expansion.table.Expansion.run_dir)."""

    def __init__(self, table: dict[str, Any]):
        self.table = table
        self.results: str = table["paths"]["results"]
        self.report: str = table["paths"]["report"]  # the study's own report folder (Expansion.report_dir)
        self._runs = {(r["task"], r["arch"], str(r["seed"])): r for r in table["runs"]}
        self._sparsity = {(r["task"], r["arch"], str(r["seed"])): r for r in table["sparsity_runs"]}
        # Seed packs by "<task>/<arch>" (the train_pack rules' wildcard), in the study's order
        self._packs = {f"{p['task']}/{p['arch']}": p for p in table.get("packs", [])}

    # -- names and paths ---------------------------------------------------------------------

    @property
    def tasks(self) -> list[str]:
        return list(self.table["tasks"])

    @property
    def groups(self) -> list[str]:
        return list(self.table["groups"])

    def run_file(self, name: str, task: str = "{task}", arch: str = "{arch}", seed: str | int = "{seed}") -> str:
        run = self.table["paths"]["run"].replace("{task}", task).replace("{arch}", arch)
        return f"{run.replace('{seed}', str(seed))}/{name}"

    def pack_file(self, name: str, seed: int) -> str:
        """That file of seed ``seed``'s run of the pack ``{pack}`` (``<task>/<arch>``, the
        train_pack rules' one wildcard): ``run_file``'s path, whatever the pack's task."""
        return self.run_file(name, seed=seed).replace("{task}/{arch}", "{pack}")

    def run_files(self, name: str, run_dirs: list[str] | None = None) -> list[str]:
        """That file of every run (in the study's order), or of each of ``run_dirs``."""
        dirs = self.table["analyses"]["collect"]["run_dirs"] if run_dirs is None else run_dirs
        return [f"{d}/{name}" for d in dirs]

    def recorded_files(self) -> list[str]:
        """The meta.json and verifications of every recording of the studies the study's
        ``recordings`` name (results/recorded/<profile>/*/): what its collected runs read."""
        found = []
        for profile in self.table["study"].get("recordings", []):
            for name in ("meta.json", "verifications.jsonl"):
                found += sorted(glob.glob(str(REPO_ROOT / "results" / "recorded" / glob.escape(profile) / "*" / name)))
        return found

    def data_file(self, name: str, group: str = "{group}") -> str:
        return f"{self.table['paths']['data'].replace('{group}', group)}/{name}"

    def tokenizer_file(self, name: str) -> str:
        return f"{self.table['paths']['tokenizer']}/{name}"

    def log_file(self, rule: str, job: str = "") -> str:
        """``<results>/logs/<rule>[/<job>].log``: beside its benchmark, at the same name."""
        return f"{self.results}/logs/{rule}{'/' + job if job else ''}.log"

    def benchmark_file(self, rule: str, job: str = "") -> str:
        """Snakemake's benchmark of a job (wall time, peak memory), read per rule by
        `python -m seqmix benchmarks`."""
        return f"{self.results}/benchmarks/{rule}{'/' + job if job else ''}.tsv"

    # -- what each job reads -----------------------------------------------------------------

    def group_of(self, task: str) -> str:
        return self.table["tasks"][task]["group"]

    def needs_tokenizer(self, group: str) -> bool:
        return self.table["groups"][group]["needs_tokenizer"]

    def threads(self, task: str) -> int | None:
        """A task's ``train.threads`` (None: as many as Snakemake gives)."""
        return self.table["tasks"][task]["threads"]

    def tokenizer_spec(self) -> str:
        return self.table["tokenizer"]["spec"]

    def data_spec(self, group: str) -> str:
        return self.table["groups"][group]["spec"]

    def run_spec(self, task: str, arch: str, seed: str | int) -> str:
        return self._runs[(task, arch, str(seed))]["spec"]

    def pack_groups(self) -> dict[tuple[int, ...], list[str]]:
        """The study's seed packs (``<task>/<arch>``) by their members' seeds: one train_pack
        rule per seeds, whose outputs are those seeds' run files (workflow/rules/train.smk)."""
        groups: dict[tuple[int, ...], list[str]] = {}
        for name, pack in self._packs.items():
            groups.setdefault(tuple(pack["seeds"]), []).append(name)
        return groups

    def pack(self, name: str) -> dict[str, Any]:
        """A seed pack by ``<task>/<arch>``: its task, arch, seeds, name and spec (a PackJob)."""
        return self._packs[name]

    def spec(self, analysis: str) -> str:
        """The spec of a one-job analysis: collect, complexity, throughput,
        sparsity_analytic, geometry or copy_probe."""
        return self.table["analyses"][analysis]["spec"]

    def has_analysis(self, analysis: str) -> bool:
        """Whether the study has that analysis job (copy_probe: only with a recall task)."""
        return analysis in self.table["analyses"]

    def sparsity_spec(self, task: str, arch: str, seed: str | int) -> str:
        return self._sparsity[(task, arch, str(seed))]["spec"]

    def sparsity_runs(self) -> list[tuple[str, str, int]]:
        return [(r["task"], r["arch"], r["seed"]) for r in self.table["sparsity_runs"]]

    def geometry_runs(self) -> list[str]:
        """The run directories the geometry job reads (it measures those that finished)."""
        return self.table["analyses"]["geometry"]["run_dirs"]

    def code(self, job: str, name: str | None = None, arch: str | None = None) -> dict[str, Any]:
        """A job's code (seqmix.sources.code_of): ``{"files": [...], "digest": ...}``. ``job``:
        ``train``, ``eval`` or ``train_pack`` of a run (``name`` its task), ``data`` of a group (``name``),
        ``tokenizer``, ``notebook`` (``name``) or an analysis by name (collect, concat,
        complexity, throughput, sparsity_run, sparsity_analytic, geometry, copy_probe)."""
        code = self.table["code"]
        if job in ("train", "eval", "train_pack"):
            return code[job][f"{arch} {catalogue.kind_of(name)}"]
        if job in ("data", "notebook"):
            return code["data" if job == "data" else "notebooks"][name]
        return code["tokenizer"] if job == "tokenizer" else code["analyses"][job]

    def code_digest(self, job: str, name: str | None = None, arch: str | None = None) -> str:
        """The digest of a job's code (``code``), which every rule takes as a param: an edit to
        one of its files (a comment included) reruns the job, and nothing else; the train command
        also receives it and is identified by it (seqmix.train.loop.run_code). A param, not the
        files as inputs: ~50 files times hundreds of jobs as inputs cost Snakemake's scheduler
        half a core in `make report` (it sizes every ready job's inputs each round)."""
        return self.code(job, name, arch)["digest"]

    def resources(self, rule: str) -> dict[str, Any]:
        """``mem_mb`` and ``runtime`` of a rule's jobs, from the config's ``resources``;
        training and evaluation take their task's own where it sets them."""
        if rule in ("train", "eval"):
            return {k: (lambda w, k=k: self.table["tasks"][w.task]["resources"][rule][k]) for k in ("mem_mb", "runtime")}
        if rule == "train_pack":  # a pack's task's train resources (the wildcard is <task>/<arch>)
            return {k: (lambda w, k=k: self.table["tasks"][self.pack(w.pack)["task"]]["resources"]["train"][k])
                    for k in ("mem_mb", "runtime")}
        return dict(self.table["resources"][rule])

    def setting(self, key: str) -> Any:
        """A setting of the resolved study by its dotted key, e.g. ``report.scope``."""
        value: Any = self.table["study"]
        for part in key.split("."):
            if not isinstance(value, Mapping) or part not in value:
                raise KeyError(f"config key {key!r} is not a setting of the study")
            value = value[part]
        return value

    @property
    def numerics(self) -> str:
        """The study's numerics (seqmix.numerics): what every job's shell pins."""
        return self.table["study"]["numerics"]

    # -- notebooks ---------------------------------------------------------------------------

    def notebooks(self, path: str | os.PathLike = REPO_ROOT / "notebooks" / "outputs.yaml") -> dict[str, Notebook]:
        """Every notebook of ``notebooks/outputs.yaml`` with its references resolved."""
        spec = yaml_data(Path(path).read_text())
        out = {}
        for name, nb in spec.items():
            where = f"{path}: {name}"
            if name not in self.table["code"]["notebooks"]:
                raise StudyError(f"error: {where}: there is no notebook {name}.ipynb beside it; add it, or remove the entry")
            inputs = []
            for ref in nb.get("inputs", []):
                found = self.reference(ref, f"{where}.inputs")
                inputs += found if isinstance(found, list) else [found]
            params = {"results_dir": self.results, "paper_dir": self.report}
            for key, ref in nb.get("params", {}).items():
                value = self.reference(ref, f"{where}.params.{key}", param=True)
                if isinstance(value, list):
                    raise StudyError(f"error: {where}.params.{key}: {ref!r} names several files; a parameter takes one")
                params[key] = value
            out[name] = Notebook(name, inputs, params, [f"{self.report}/figures/{f}.pdf" for f in nb.get("figures", [])],
                                 [f"{self.report}/tables/{t}.tex" for t in nb.get("tables", [])],
                                 code=self.code_digest("notebook", name))
        return out

    def reference(self, ref: str, where: str = "notebooks/outputs.yaml", param: bool = False) -> str | list[str]:
        """What a reference of notebooks/outputs.yaml names (its header has the syntax):
        a path or a list of paths; a setting's value for a parameter (``param``)."""
        kind, _, rest = ref.partition(":") if REFERENCE_PREFIX.match(ref) else ("", "", ref)
        if kind == "":
            return f"{self.results}/{ref}"
        if kind == "runs":
            return self.run_files(rest)
        if kind == "src":  # the prefix's name before repo: (src/ is the code's folder, not the repository)
            raise StudyError(f"error: {where}: {ref!r}: a file of the repository is repo:{rest}")
        if kind == "repo":
            if rest.endswith(".py"):
                raise StudyError(f"error: {where}: {ref!r} names code; a notebook's code is what its cells import "
                                 "(seqmix.sources), so list only the data files it reads")
            return sorted(str(p) for p in REPO_ROOT.glob(rest)) if glob.has_magic(rest) else str(REPO_ROOT / rest)
        if kind == "analysis" and not param:
            if rest not in OPTIONAL_ANALYSES:
                raise StudyError(f"error: {where}: {ref!r}: analysis: names an analysis a study may lack "
                                 f"({', '.join(OPTIONAL_ANALYSES)}); list any other file as <path>")
            return [f"{self.results}/analysis/{rest}.csv"] if self.has_analysis(rest) else []
        if kind == "config" and param:
            try:
                return str(self.setting(rest))
            except KeyError as e:
                raise StudyError(f"error: {where}: {e.args[0]}") from None
        raise StudyError(f"error: {where}: {ref!r} is not a reference; write <file under results_dir>, "
                         "runs:<file>, repo:<path>, (inputs only) analysis:<name> or (a parameter only) config:<key>")


REFERENCE_PREFIX = re.compile(r"^[a-z]+:")
# Analyses whose job a study may lack (the copy probe needs a recall task): a notebook names
# their CSV as analysis:<name>, which is nothing where the job is absent.
OPTIONAL_ANALYSES = ("copy_probe",)


@dataclass(frozen=True)
class Notebook:
    name: str
    inputs: list[str]
    params: dict[str, str]  # papermill parameters
    figures: list[str]
    tables: list[str]
    code: str  # the digest of its code: the modules its cells import, transitively (seqmix.sources)

    @property
    def outputs(self) -> list[str]:
        return self.figures + self.tables

    def papermill_args(self) -> str:
        return " ".join(f"-p {k} {shlex.quote(v)}" for k, v in self.params.items())
