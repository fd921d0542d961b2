"""The shape of the code base: no import cycle between seqmix's modules (imports inside
functions included), no function over 60 lines outside the kernels, and no branching on
task or mixer names outside the modules that own them; and the library imports nothing of
the maintainer's tools (tools/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from seqmix import catalogue
from seqmix.sources import imported_names
from tests.conftest import REPO

PACKAGE = REPO / "src" / "seqmix"
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """seqmix modules ``name`` imports anywhere in its file (functions included), except
    under ``if TYPE_CHECKING:``: the one import scanner, seqmix.sources's."""
    return {m for m in imported_names(path, name) if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these into named steps: " + "; ".join(long)


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant of a Python file or a notebook's code cells,
    docstrings and comments excluded (prose may name what it describes)."""
    if path.suffix == ".ipynb":
        import json

        cells = json.loads(path.read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    else:
        sources = [path.read_text()]
    out = []
    for source in sources:
        tree = ast.parse(source)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [(n.lineno, n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
    return out


def _code_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "notebooks").glob("*.ipynb")) + [
        REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]


def _owners_of_task(kind: str) -> set[Path]:
    """The task's own module and the data layer may name a task kind."""
    own = PACKAGE / "tasks" / f"{kind}.py"
    return {own, *(PACKAGE / "data").rglob("*.py"), PACKAGE / "catalogue.py"}


@pytest.mark.parametrize("kind", catalogue.task_kinds())
def test_no_code_names_a_task_kind_outside_its_owners(kind):
    found = []
    for path in _code_files():
        if path in _owners_of_task(kind):
            continue
        text = path.read_text()
        if path.suffix in (".py", ".ipynb"):
            hits = [line for line, value in _string_literals(path) if value == kind]
        else:
            hits = [i + 1 for i, line in enumerate(text.splitlines())
                    if re.search(rf"""["']{re.escape(kind)}["']""", line.split("#")[0])]
        found += [f"{path.relative_to(REPO)}:{line}" for line in hits]
    assert not found, f"code branching on the task kind {kind!r}: {found}"


@pytest.mark.parametrize("name", catalogue.mixer_names())
def test_a_mixer_name_lives_in_the_catalogue_and_its_own_module(name):
    module = catalogue.mixer_entry(name).path.partition(":")[0]
    own = PACKAGE.parent / (module.replace(".", "/") + ".py")
    found = []
    for path in _code_files():
        if path in (own, PACKAGE / "catalogue.py"):
            continue
        if path.suffix in (".py", ".ipynb"):
            hits = [line for line, value in _string_literals(path) if value == name]
        else:
            hits = [i + 1 for i, line in enumerate(path.read_text().splitlines())
                    if re.search(rf"""["']{re.escape(name)}["']""", line.split("#")[0])]
        found += [f"{path.relative_to(REPO)}:{line}" for line in hits]
    assert not found, f"the mixer name {name!r} appears outside the catalogue and its module: {found}"


# The stack, top to bottom (issue 26): a module imports only modules of its own layer or
# below. (prefix, layer): the longest prefix that matches a module places it.
STACK = [
    ("seqmix.cli", 15), ("seqmix.__main__", 15),
    ("seqmix.report", 14),
    ("seqmix.analysis", 13),
    ("seqmix.fingerprint", 12),  # trains every mixer as training does (issue 42)
    ("seqmix.train", 12),
    ("seqmix.plan", 11),
    ("seqmix.preflight", 10),
    # A study validated with its task and mixer classes (torch), and expanded: above them.
    ("seqmix.expansion.table", 9),
    ("seqmix.expansion.validate", 8), ("seqmix.expansion", 8),
    ("seqmix.tasks", 7),
    ("seqmix.data", 6),
    ("seqmix.models", 5),
    ("seqmix.measure", 4),  # below models/: the plan, the preflight, the analyses and training use it
    ("seqmix.mixers", 3),
    ("seqmix.kernels", 2),
    # The config layer (CONFIG_LAYER): a profile read once, the settings, the job specs, the
    # sweeps, and the job table as the Snakefile reads it; no torch, no task or mixer class.
    ("seqmix.study", 1),
    ("seqmix.sources", 0),  # read by the job table (the Snakefile's side) and by training
    ("seqmix.device", 0),  # the torch device a config names, and a device's folder name
    ("seqmix.flop_formulas", 0),  # custom ops' FLOPs, registered by kernels and read by the counter
    ("seqmix.numerics", 0),  # read by the CLI before torch, by the config layer and provenance
    ("seqmix.mkl_shim", 0),  # loaded by the CLI before torch (numerics: portable)
    ("seqmix.catalogue", 0), ("seqmix.io", 0), ("seqmix.errors", 0), ("seqmix.allocator", 0), ("seqmix.slots", 0),
    ("seqmix", 0),
]
# Known imports up the stack, each with the change that removes it.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def layer(module: str) -> int | None:
    matches = [(len(prefix), rank) for prefix, rank in STACK if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def stack_modules() -> dict[str, Path]:
    """Every module of the stack: seqmix's, and kernels/ installed as seqmix.kernels."""
    return {**modules(), **{("seqmix.kernels" + ("" if p.stem == "__init__" else f".{p.stem}")): p
                            for p in sorted((REPO / "kernels").glob("*.py"))}}


def stack_graph() -> dict[str, set[str]]:
    """The import graph with kernels/ (installed as seqmix.kernels) in it."""
    mods = stack_modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def test_every_module_has_a_place_in_the_stack():
    unplaced = sorted(m for m in stack_graph() if layer(m) is None)
    assert not unplaced, f"give these a layer in STACK (tests/project/test_code_shape.py): {unplaced}"


def test_no_import_runs_up_the_stack():
    graph = stack_graph()
    upward = {(a, b) for a, targets in graph.items() for b in targets
              if None not in (layer(a), layer(b)) and layer(b) > layer(a)}
    assert not upward - set(KNOWN_UPWARD), "imports up the stack: " + "; ".join(
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, b in sorted(upward - set(KNOWN_UPWARD)))


def test_the_library_imports_no_tool():
    """src/seqmix (and kernels/, installed with it) is what the pipeline and a user's commands
    run; the maintainer's checks in tools/ are built on it and never under it (issue 36)."""
    mods = {**modules(), **{f"seqmix.kernels.{p.stem}": p for p in sorted((REPO / "kernels").glob("*.py"))}}
    found = sorted(f"{name} imports {m}" for name, path in mods.items() for m in imported_names(path, name)
                   if m == "tools" or m.startswith("tools."))
    assert not found, "move what the library needs out of tools/: " + "; ".join(found)


CONFIG_LAYER = "seqmix.study"


def in_config_layer(module: str) -> bool:
    return module == CONFIG_LAYER or module.startswith(CONFIG_LAYER + ".")


def test_the_config_layer_imports_nothing_above_it_nor_torch():
    """seqmix.study reads a study (the Snakefile's parse, the command line before it pins the
    numerics): nothing it imports, at any depth, is above it or imports torch (issue 47)."""
    graph, mods = stack_graph(), stack_modules()
    inside = sorted(m for m in graph if in_config_layer(m))
    assert {"seqmix.study.profile", "seqmix.study.settings", "seqmix.study.jobs", "seqmix.study.sweep",
            "seqmix.study.dag"} <= set(inside)
    above = sorted(f"{a} imports {b}" for a in inside for b in graph[a] if layer(b) > layer(CONFIG_LAYER))
    assert not above, f"the config layer imports above it: {above}"
    reached, todo = set(), list(inside)
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += graph[m]
    torch = sorted(m for m in reached if any(n == "torch" or n.startswith("torch.") for n in imported_names(mods[m], m)))
    assert not torch, f"the config layer reaches modules that import torch: {torch}"


def test_reading_a_profile_imports_no_torch_and_no_class():
    """In a fresh process: the config layer imported and a profile that extends another read
    (as the command line does before it pins the numerics), and neither torch nor the task and
    mixer classes imported."""
    import subprocess
    import sys

    code = ("import sys; from seqmix.study import dag, jobs, settings, sweep; from seqmix.study.profile import read_profile; "
            "p = read_profile('config/paper-smoke.yaml', {'seeds': [1]}); "
            "assert [f.name for f in p.files] == ['paper-smoke.yaml', 'paper.yaml'] and p.raw['seeds'] == [1]; "
            "assert p.numerics == p.raw['numerics'] and p.numerics_from.endswith('paper.yaml'); "
            "loaded = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'seqmix.tasks', "
            "'seqmix.mixers', 'seqmix.expansion'))]; print(loaded)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_training_imports_nothing_above_tasks_and_models():
    graph = stack_graph()
    above = sorted((a, b) for a, targets in graph.items() if a.startswith("seqmix.train") for b in targets
                   if not b.startswith("seqmix.train") and layer(b) > layer("seqmix.tasks"))
    assert not above, f"training imports above tasks/ and models/: {above}"


def test_the_measurement_module_sits_below_models():
    graph = stack_graph()
    assert {b for b in graph["seqmix.measure"] if layer(b) >= layer("seqmix.models")} == set()
    assert layer("seqmix.measure") < layer("seqmix.models")
    users = {a for a, targets in graph.items() if "seqmix.measure" in targets}
    assert {"seqmix.plan", "seqmix.preflight", "seqmix.analysis.complexity", "seqmix.train.loop"} <= users
