"""The one registry of fast paths, ``seqmix.kernels.KERNELS``: each fast path lives on the
kernels' side and its plain reference in a mixer module, both import, and the test module it
names compares the two (it names both). The comparisons themselves are in those modules."""

from __future__ import annotations

import importlib
import re

import pytest
from seqmix.kernels import KERNELS, triton_kernels

from .conftest import REPO


def resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", list(KERNELS))
def test_each_fast_path_is_beside_its_reference_and_a_test_compares_them(name):
    kernel = KERNELS[name]
    if kernel.form == "triton":
        pytest.importorskip("triton")
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
