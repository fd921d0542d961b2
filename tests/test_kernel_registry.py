"""The one registry of fast paths, ``seqmix.kernels.registry.KERNELS``: each fast path lives on
the kernels' side and its plain reference in a mixer module, both import, and the test module
it names compares the two (it names both). The comparisons themselves are in those modules.
The registry is a module of its own, in no run's code: editing it retrains nothing."""

from __future__ import annotations

import importlib
import re

import pytest
from seqmix.kernels.registry import KERNELS, triton_kernels

from .conftest import REPO, require_triton


def resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", list(KERNELS))
def test_each_fast_path_is_beside_its_reference_and_a_test_compares_them(name):
    kernel = KERNELS[name]
    if kernel.form == "triton":
        require_triton()
    assert kernel.fast.startswith("seqmix.kernels.") and kernel.reference.startswith("seqmix.mixers."), kernel
    assert callable(resolve(kernel.fast)) and callable(resolve(kernel.reference))
    test = (REPO / kernel.test).read_text()
    for target in (kernel.fast, kernel.reference):
        function = target.partition(":")[2]
        assert re.search(rf"\b{function}\b", test), f"{kernel.test} never names {function} ({name})"


def test_the_triton_kernels_are_the_registrys_triton_entries():
    assert set(triton_kernels()) == {n for n, k in KERNELS.items() if k.form == "triton"}
    assert {"grassmann", "gla", "tssa", "selective_scan"} <= set(triton_kernels())
    assert "selective_scan_chunked" in KERNELS and "selective_scan_chunked" not in triton_kernels()


def test_no_mixer_module_holds_a_hand_written_scan_of_mamba():
    # The chunked scan's autograd lives on the kernels' side; the mixer keeps its reference.
    source = (REPO / "src" / "seqmix" / "mixers" / "mamba.py").read_text()
    assert "def selective_scan_reference(" in source
    assert "autograd.Function" not in source and "def _scan_gradients" not in source


def test_the_registry_is_in_no_runs_code_and_the_package_init_holds_nothing():
    # Every module of seqmix.kernels imports the package's __init__, so that file is part of
    # the code of every run that takes a kernel (seqmix.sources): a registry there would make
    # each edit of it retrain GLA, Performer and Mamba. It is a module of its own instead.
    import ast

    from seqmix import catalogue
    from seqmix.sources import EVALUATION, TRAINING, Reader, run_modules

    init, registry = (REPO / "kernels" / name for name in ("__init__.py", "registry.py"))
    reader = Reader()
    codes = [reader.code(run_modules(arch, kind, step)).files for arch in catalogue.mixer_names()
             for kind in catalogue.task_kinds() for step in (TRAINING, EVALUATION)]
    assert any(init.resolve() in files for files in codes)  # the check can see a kernels/ file
    assert not [files for files in codes if registry.resolve() in files]
    body = ast.parse(init.read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), "kernels/__init__.py: a docstring, nothing else"
