"""A job's code: the modules its command runs and every module of this project they import,
transitively (imports inside functions included), found by reading the code, never listed by
hand. One scanner (Python's ``ast``) reads the import statements of a module or of a
notebook's code cells; a file beside a module with its name and another suffix (Mamba's C++
scan, oneMKL's shim, built at first use) counts with it. Only this project's modules are
followed (``of_this_project``: seqmix's, and those of a package the catalogue or the job names,
a user's own mixer or task), told by their names, never by where they are installed: the
standard library and every other package are not, in a venv, on PYTHONPATH or anywhere else
(their versions are in each run's provenance), so that a run's digest is the same on every
machine that has the same code.

A job's code is one digest (``Code.digest``) of its files' names and digests
(``file_digest``): every rule takes it as a param (seqmix.study.dag), so that an edit reruns
exactly the jobs whose code holds the file, and what reads them; a training run is identified
by it, so that a checkpoint made by other code is never resumed (seqmix.train.loop); and
provenance.json records it with each file's digest, so that a report can tell a run made by
other code than the checkout's. Standard library only: the Snakefile's side
(seqmix.study.dag) imports it without torch.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from seqmix import REPO_ROOT, catalogue

TRAINING = "seqmix.train.loop"  # what trains a run, beside its mixer's and its task's module
EVALUATION = "seqmix.train.evaluate"


PACKAGE = "seqmix"  # this project's package, wherever it is installed (kernels/ is seqmix.kernels)


def named_packages(entries: Iterable[str | Path] = ()) -> frozenset[str]:
    """The top-level packages whose modules are this project's code: seqmix, each package the
    catalogue names a mixer or a task in (a user's own), and each of ``entries`` (the modules a
    job names; a notebook, given by its file, names none)."""
    named = [e.path.partition(":")[0] for e in (*catalogue.MIXERS, *catalogue.TASKS)]
    named += [e for e in entries if isinstance(e, str)]
    return frozenset(n.partition(".")[0] for n in [PACKAGE, *named])


def of_this_project(name: str, packages: frozenset[str] | None = None) -> bool:
    """Whether module ``name`` is this project's code: in one of ``packages`` (default
    ``named_packages()``). By its name, not its file: a library is never the project's, whether
    a venv, PYTHONPATH, ``pip install --target`` or an environment module installed it."""
    return name.partition(".")[0] in (named_packages() if packages is None else packages)


def imported_files() -> list[Path]:
    """The files of the modules this process imported (``sys.modules``) that are this project's
    code (``of_this_project``): seqmix itself and a user's own mixers or tasks, never a library's."""
    ours = named_packages()
    files = set()
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        name = getattr(spec, "name", None) or name  # `python -m seqmix`: __main__ is seqmix.__main__
        file = getattr(module, "__file__", None)
        if of_this_project(name, ours) and isinstance(file, str) and os.path.isfile(file):
            files.add(Path(file).resolve())
    return sorted(files)


@functools.cache
def module_file(name: str) -> Path | None:
    """The source file of module ``name``, else None (not found, built in, compiled, or not a
    module: a name a module defines). A submodule is looked for in its package's folder, so
    that a name of a module (``pkg.mod.func``) imports nothing."""
    parent, _, child = name.rpartition(".")
    if parent:
        folder = module_file(parent)
        if folder is None or folder.name != "__init__.py":
            return None  # a library's submodule, or a name inside a module
        for path in (folder.parent / f"{child}.py", folder.parent / child / "__init__.py"):
            if path.is_file():
                return path.resolve()
    try:  # a top-level module, or a package's submodule elsewhere (seqmix.kernels: kernels/)
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or not os.path.isfile(origin) or not origin.endswith(".py"):
        return None
    return Path(origin).resolve()


# ------------------------------------------------------------------------------------------
# The scanner: one parse per file gives its imports and its digest.
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scan:
    """What one file says: ``imports`` as (level, module, names) of each import statement
    (``import a.b`` is (0, "a.b", ()); ``from ..c import d`` is (2, "c", ("d",))), and the
    ``digest`` of its code."""

    imports: tuple[tuple[int, str, tuple[str, ...]], ...]
    digest: str


def scan(path: Path) -> Scan:
    """The imports of a module or a notebook (its code cells) and the digest of its code: a
    module's bytes, a notebook's code cells (its prose and outputs are no code), any other
    file's bytes (a C++ source, no imports). Read every time, parsed once per content: the
    memo's key is exactly what it describes."""
    path = Path(path)
    return _scan(path.suffix, path.read_bytes())


@functools.cache
def _scan(suffix: str, data: bytes) -> Scan:
    if suffix == ".ipynb":
        cells = json.loads(data)["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        # IPython's `%` and `!` lines are no Python.
        source = "\n".join(line for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))
        return Scan(_imports(ast.parse(source)), hashlib.sha256(json.dumps(code).encode()).hexdigest())
    imports = _imports(ast.parse(data)) if suffix == ".py" else ()
    return Scan(imports, hashlib.sha256(data).hexdigest())


def _imports(tree: ast.Module) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """The import statements of a module, in functions and classes too, not under ``if
    TYPE_CHECKING:`` (they never run). Statements only: an import is no expression."""
    out: list[tuple[int, str, tuple[str, ...]]] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [(0, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", tuple(a.name for a in node.names)))
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                todo += getattr(node, field, None) or []
    return tuple(out)


def imported_names(path: Path, module: str = "") -> frozenset[str]:
    """The modules a file imports anywhere in it (functions included); ``from pkg import x``
    names ``pkg`` and ``pkg.x`` (x may be a submodule). ``module`` is the file's own module
    name, against which relative imports resolve."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for level, base, names in scan(path).imports:
        if level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - level + 1] + ([base] if base else []))
        out.add(base)
        out |= {f"{base}.{n}" for n in names if n != "*"}
    return frozenset(out)


# ------------------------------------------------------------------------------------------
# A job's code.
# ------------------------------------------------------------------------------------------


class Reader:
    """One reading of the code for many closures (a job table asks for ~60 of them, sharing
    most modules): each module's imports and each file's digest are read once per Reader.
    Keep one only while the files do not change (a call, a process that runs one job)."""

    def __init__(self):
        self._imports: dict[str, tuple[str, ...]] = {}  # module name -> the names it imports
        self._digests: dict[Path, str] = {}

    def closure(self, entries: Iterable[str | Path]) -> list[Path]:
        """The files of ``entries`` (module names, or files a job runs: a notebook), their
        packages and every module of this project they import, transitively (sorted)."""
        entries = list(entries)
        ours = named_packages(entries)
        seen: dict[str, Path | None] = {}
        files: set[Path] = set()
        todo: list[str] = []
        for entry in entries:
            if isinstance(entry, Path):
                files.add(entry.resolve())
                todo += imported_names(entry.resolve())
            else:
                todo.append(entry)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen[name] = None  # a library's (or the standard library's): not followed
            if of_this_project(name, ours):
                seen[name] = path = module_file(name)
                todo += self._imported(name, path)
        files |= {p for p in seen.values() if p is not None}
        return sorted(files | {s for p in files for s in _siblings(p)})

    def _imported(self, name: str, path: Path | None) -> tuple[str, ...]:
        if name not in self._imports:
            parts = name.split(".")
            packages = [".".join(parts[:i]) for i in range(1, len(parts))]  # they run first
            self._imports[name] = (*packages, *(sorted(imported_names(path, name)) if path else ()))
        return self._imports[name]

    def code(self, entries: Iterable[str | Path]) -> Code:
        """The code of a job that runs ``entries``: their closure and one digest of its files'
        names (``shown``) and digests, so that the same code in another checkout has the same
        digest."""
        files = tuple(self.closure(entries))
        h = hashlib.sha256()
        for name, path in sorted((shown(p), p) for p in files):
            if path not in self._digests:
                self._digests[path] = file_digest(path)
            h.update(f"{name} {self._digests[path]}\n".encode())
        return Code(files, h.hexdigest()[:16])


def closure(entries: Iterable[str | Path]) -> list[Path]:
    """``Reader().closure``: the files of ``entries`` and of what they import, transitively."""
    return Reader().closure(entries)


def code_of(entries: Iterable[str | Path]) -> Code:
    """``Reader().code``: the code of a job that runs ``entries``."""
    return Reader().code(entries)


@functools.cache
def _siblings(path: Path) -> tuple[Path, ...]:
    return tuple(s for s in path.parent.glob(f"{path.stem}.*") if s.suffix not in (".py", ".pyc", ".ipynb"))


@dataclass(frozen=True)
class Code:
    """A job's code: its files and one digest of them (what Snakemake reruns the job on)."""

    files: tuple[Path, ...]
    digest: str

    def sources(self) -> dict[str, str]:
        """{file: digest} (provenance.json's ``code.sources``)."""
        return digests(self.files)


def run_modules(arch: str, kind: str, step: str = TRAINING) -> list[str]:
    """What computes a run's result: its mixer's module, its task kind's and ``step``'s
    (training, or ``EVALUATION``)."""
    return [catalogue.mixer_entry(arch).path.partition(":")[0], catalogue.task_entry(kind).path.partition(":")[0], step]


def shown(path: Path) -> str:
    """A source's name in provenance: relative to the checkout where it is in it."""
    name = str(path if path.is_absolute() else path.resolve())
    root = f"{REPO_ROOT}{os.sep}"
    return name[len(root):] if name.startswith(root) else name


def file_digest(path: Path) -> str:
    """The digest of a file's code (``scan``): its bytes, or a notebook's code cells. Bytes,
    not a parse: the same on every Python version (a GPU machine's 3.12 records runs that this
    checkout's 3.11 compares), so that a comment edit reruns what the file's code reaches, as
    any edit does, and a bare ``touch`` nothing."""
    return scan(Path(path)).digest


def digests(paths: Iterable[Path]) -> dict[str, str]:
    """{name: digest} of each file (provenance.json's ``code.sources``)."""
    return {shown(p): file_digest(p) for p in paths}


def changed(recorded: dict[str, str]) -> list[str]:
    """The recorded sources whose code differs now, or is gone: a run made by other code."""
    def now(name: str) -> str | None:
        path = Path(name) if os.path.isabs(name) else REPO_ROOT / name
        try:
            return file_digest(path)
        except (OSError, SyntaxError, ValueError):
            return None

    return sorted(n for n, digest in recorded.items() if now(n) != digest)
