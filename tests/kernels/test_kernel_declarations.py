"""The kernels of kernels/, each declared once, by the mixer module that runs it
(``seqmix.mixers.base.kernel``), with the plain reference it equals and the test module that
compares the two forward and backward (the comparisons themselves are in those modules);
``seqmix.mixers.declared_kernels()`` lists them for the tests and tools/. A declaration adds
no file to any run's code but its own mixer's: a run's code holds its mixer's kernels only."""

from __future__ import annotations

import ast
import re

import pytest

from seqmix import catalogue
from seqmix.mixers import Kernel, declared_kernels, triton_kernels
from seqmix.sources import EVALUATION, TRAINING, Reader, module_file, run_modules
from tests.conftest import REPO, require_triton

KERNELS = REPO / "kernels"
MIXERS = REPO / "src" / "seqmix" / "mixers"


@pytest.mark.parametrize("name", list(declared_kernels()))
def test_each_kernel_is_beside_its_reference_and_a_test_compares_them(name):
    kernel = declared_kernels()[name]
    if kernel.form == "triton":
        require_triton()
    assert kernel.module == f"seqmix.kernels.{name}", kernel  # its module is kernels/<name>.py
    assert kernel.reference.__module__.startswith("seqmix.mixers."), kernel
    assert kernel.declared_by.startswith("seqmix.mixers."), kernel
    assert callable(kernel.importer()) and callable(kernel.reference)
    test = (REPO / kernel.test).read_text()
    for function in (kernel.fast.partition(":")[2], kernel.reference.__name__):
        assert re.search(rf"\b{function}\b", test), f"{kernel.test} never names {function} ({name})"


def test_every_module_of_kernels_is_a_declared_kernel():
    # A fast path added to kernels/ without its declaration (reference, test) fails here.
    modules = {p.stem for p in KERNELS.glob("*.py")} - {"__init__", "_common"}
    assert modules == set(declared_kernels())


def test_the_triton_kernels_are_the_declared_triton_ones():
    assert set(triton_kernels()) == {n for n, k in declared_kernels().items() if k.form == "triton"}
    assert {"grassmann", "gla", "tssa", "selective_scan"} <= set(triton_kernels())
    assert "selective_scan_chunked" in declared_kernels() and "selective_scan_chunked" not in triton_kernels()


def test_a_declaration_calls_its_kernel():
    import torch

    from seqmix.kernels.linear_scan import linear_scan
    from seqmix.mixers.scan import pytorch_linear_scan

    a, b = torch.rand(7, 3), torch.randn(7, 3)
    assert isinstance(pytorch_linear_scan, Kernel)
    assert torch.equal(pytorch_linear_scan(a, b, 2), linear_scan(a, b, 2))


def test_a_kernel_is_declared_once(monkeypatch):
    from seqmix.mixers import scan

    twin = Kernel("gla", "pytorch", lambda: None, scan.linear_scan_reference, "tests/mixers/test_mixers_scan.py")
    monkeypatch.setattr(scan, "twin", twin, raising=False)
    with pytest.raises(ValueError, match="two kernels are declared as 'gla'"):
        declared_kernels()


def _function_imports(path):
    """(function, its decorators' names, the modules it imports) of every function of a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            decorators = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
            imported = {n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.module}
            yield node.name, decorators, imported


def test_a_mixer_imports_a_kernel_in_a_function_only_to_declare_it():
    # The lazy import of a kernel is written once, in its declaration (``kernel``): no other
    # function of a mixer module imports from seqmix.kernels.
    found = [f"{path.name}:{name}" for path in sorted(MIXERS.glob("*.py"))
             for name, decorators, imported in _function_imports(path)
             if any(m.startswith("seqmix.kernels") for m in imported) and "kernel" not in decorators]
    assert not found, f"import the kernel in its declaration: {found}"


def test_no_mixer_module_holds_a_hand_written_backward():
    # Hand-written autograd (the scans', H3's FFT convolution and S4D kernel) lives on the
    # kernels' side; the mixers keep the references.
    found = [p.name for p in sorted(MIXERS.glob("*.py")) if "autograd.Function" in p.read_text()]
    assert not found, found
    assert "def selective_scan_reference(" in (MIXERS / "mamba.py").read_text()
    assert "def causal_conv_reference(" in (MIXERS / "h3.py").read_text()


def test_a_runs_code_holds_its_own_mixers_kernels_and_no_tool():
    # Every module of seqmix.kernels imports the package's __init__, and every mixer module
    # the mixers' package, base and dispatch: none of them may reach a kernel or another
    # mixer (declared_kernels imports the mixer modules by name, at run time), or every run
    # would hold every kernel and an edit of one would retrain all. A run holds the kernels
    # its mixer declares (with what they import) and the shared ones (declared outside any
    # mixer's module: the linear scan), never another mixer's.
    reader = Reader()
    in_kernels = lambda files: {f for f in files if f.is_relative_to(KERNELS.resolve())}  # noqa: E731
    own_module = {arch: catalogue.mixer_entry(arch).path.partition(":")[0] for arch in catalogue.mixer_names()}
    mixer_files = {module_file(m) for m in own_module.values()}
    shared = reader.closure(["seqmix.mixers", "seqmix.mixers.base", "seqmix.mixers.dispatch"])
    assert not in_kernels(shared) and not set(shared) & mixer_files, shared
    declared = declared_kernels().values()
    by_file = lambda keep: in_kernels(reader.closure([f"seqmix.kernels.{k.name}" for k in declared if keep(k)]))  # noqa: E731
    shared_kernels = by_file(lambda k: k.declared_by not in own_module.values())
    held = set()
    for arch, module in own_module.items():
        own = set(reader.closure([module]))
        allowed = shared_kernels | by_file(lambda k, module=module: k.declared_by == module)
        for kind in catalogue.task_kinds():
            for step in (TRAINING, EVALUATION):
                files = set(reader.code(run_modules(arch, kind, step)).files)
                assert in_kernels(files) == in_kernels(own), (arch, kind, step)  # reached by its mixer only
                assert in_kernels(files) <= allowed, (arch, sorted(in_kernels(files) - allowed))
                assert files & mixer_files == own & mixer_files, (arch, kind, step)
                assert not [f for f in files if f.is_relative_to((REPO / "tools").resolve())], (arch, kind, step)
                held |= in_kernels(files)
    assert (KERNELS / "__init__.py").resolve() in held  # the check can see a kernels/ file


def test_the_kernels_package_init_holds_nothing():
    # It is part of the code of every run that takes a kernel (seqmix.sources): anything in it
    # would retrain GLA, Performer, Mamba and H3 at each edit.
    body = ast.parse((KERNELS / "__init__.py").read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), "kernels/__init__.py: a docstring, nothing else"
