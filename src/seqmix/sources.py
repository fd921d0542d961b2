"""The source files a result depends on: the modules that compute it and every module of this
project they import (imports inside functions included), found by reading the code, not
by running it; a file beside a module with its name and another suffix (Mamba's C++ scan,
built at first use) counts with it. Standard-library and installed packages are not followed:
their versions are in each run's provenance.

The job table gives each job its sources as inputs, so that editing a module reruns exactly the
jobs whose results it computes (and what reads them); training records their digests in
provenance.json, so that a report can tell a run made by other code than the checkout's.
Standard library only: the Snakefile's side (seqmix.study.dag) imports it without torch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from seqmix import REPO_ROOT, catalogue

TRAINING = "seqmix.train.loop"  # what trains a run, beside its mixer's and its task's module
EVALUATION = "seqmix.train.evaluate"


@functools.cache
def library_dirs() -> frozenset[Path]:
    """The standard library's and installed packages' folders: code not of this project."""
    dirs = {Path(paths[k]).resolve() for paths in (sysconfig.get_paths(), sysconfig.get_paths(
            vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}))
            for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return frozenset(dirs | {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]})


def of_this_project(path: Path) -> bool:
    """The checkout's own files (src/, kernels/), and a user's modules outside any library;
    never a library's, even one inside the checkout (`make install` puts its venv in .venv/)."""
    path = path.resolve()
    return not any(path.is_relative_to(d) for d in library_dirs())


@functools.cache
def module_file(name: str) -> Path | None:
    """The file of module ``name`` where it is this project's, else None (not found, built in,
    a library's, or not a module: a name a module defines). A submodule is looked for in its
    package's folder, so that a name of a module (``pkg.mod.func``) imports nothing."""
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
    path = Path(origin).resolve()
    return path if of_this_project(path) else None


# import a.b, c / from a.b import (c, d) / from . import e: the names after "import" in a from
# form may be submodules. Read from the text (no parse: a run of the job table reads ~60 files).
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)|import[ \t]+([^\n#]*))", re.M)


@functools.cache
def imported_names(path: Path, module: str) -> frozenset[str]:
    """The modules a file imports anywhere in it (functions included); ``from pkg import x``
    names ``pkg`` and ``pkg.x``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for base, names, plain in IMPORT.findall(path.read_text()):
        if plain:
            out |= {n.split()[0] for n in plain.split(",") if n.strip()}
            continue
        if base.startswith("."):
            level = len(base) - len(base.lstrip("."))
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - level + 1] + ([base.lstrip(".")] if base.lstrip(".") else []))
        out.add(base)
        names = re.sub(r"#[^\n]*", "", names.strip("()"))  # comments inside (...)
        out |= {f"{base}.{n.split()[0]}" for n in names.split(",") if n.strip()}
    return frozenset(out)


def sources_of(modules: Iterable[str]) -> list[Path]:
    """``modules``, their packages and every module of this project they import, transitively,
    as files (sorted)."""
    return sorted(set().union(*(_sources_of_module(m) for m in modules)))


@functools.cache  # a job table asks for the same few modules' sources for every job
def _sources_of_module(module: str) -> frozenset[Path]:
    seen: dict[str, Path | None] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages run first
        seen[name] = path = module_file(name)
        if path is not None:
            todo += sorted(imported_names(path, name))
    files = {p for p in seen.values() if p is not None}
    return frozenset(files | {s for p in files for s in _siblings(p)})


@functools.cache
def _siblings(path: Path) -> tuple[Path, ...]:
    return tuple(s for s in path.parent.glob(f"{path.stem}.*") if s.suffix not in (".py", ".pyc"))


def run_modules(arch: str, kind: str, step: str = TRAINING) -> list[str]:
    """What computes a run's result: its mixer's module, its task kind's and ``step``'s
    (training, or ``EVALUATION``)."""
    return [catalogue.mixer_entry(arch).path.partition(":")[0], catalogue.task_entry(kind).path.partition(":")[0], step]


def shown(path: Path) -> str:
    """A source's name in provenance: relative to the checkout where it is in it."""
    path = path.resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def digests(paths: Iterable[Path]) -> dict[str, str]:
    """{name: sha256} of each file (provenance.json's ``code.sources``)."""
    return {shown(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def changed(recorded: dict[str, str]) -> list[str]:
    """The recorded sources whose file differs now, or is gone: a run made by other code."""
    now = {}
    for name in recorded:
        path = Path(name) if os.path.isabs(name) else REPO_ROOT / name
        now[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return sorted(n for n, digest in recorded.items() if now[n] != digest)
