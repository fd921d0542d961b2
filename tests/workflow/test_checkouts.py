"""Any checkout runs its own code: two copies of the repository side by side, nothing of
theirs installed (the venv's editable install is of another checkout, the hard case), each
parses its DAG and trains a run from its own src/ and kernels/: a softmax run in one, a
Mamba run in the other, whose fused CPU scan is built from that checkout's C++ source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_config
from tests.helpers import copy_workflow, planned_jobs, snakemake


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkouts")
    copies = {name: copy_workflow(root / name) for name in ("a", "b")}
    # Tell the two apart by their kernels alone.
    with open(copies["b"] / "kernels" / "__init__.py", "a") as f:
        f.write('\nCHECKOUT_MARK = "b"\n')
    # Mamba in b's study only: a Snakemake run's preflight runs each mixer of the complexity
    # analysis once (seqmix.preflight), which builds Mamba's scan: in a, about 70 CPU s for a
    # run that never calls it.
    archs = {"a": ("softmax", "grassmann"), "b": ("softmax", "mamba")}
    for name, copy in copies.items():
        (copy / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(copy, None, archs=archs[name])))
    return copies


def in_checkout(copy: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m seqmix ...`` as a rule runs it there: PYTHONPATH=src, from the checkout."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=copy)


def test_each_checkout_imports_its_own_seqmix_and_kernels(checkouts):
    for name, copy in checkouts.items():
        code = "import json, seqmix.kernels as k; print(json.dumps([k.__file__, getattr(k, 'CHECKOUT_MARK', None)]))"
        proc = in_checkout(copy, "-c", code)
        assert proc.returncode == 0, proc.stderr[-2000:]
        path, mark = json.loads(proc.stdout)
        # src/seqmix/kernels is the link to the checkout's own kernels/
        assert Path(path).resolve().is_relative_to((copy / "kernels").resolve()), (name, path)
        assert mark == ("b" if name == "b" else None)


def test_each_checkout_parses_its_dag_and_trains_with_its_own_kernels(checkouts, tmp_path):
    # Mamba in b (the checkout whose kernels differ), built into a folder of this test's own:
    # one compile, and the user's cache of the extension is left to the checkout it serves.
    arch = {"a": "softmax", "b": "mamba"}
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    for name, copy in checkouts.items():
        tiny = yaml.safe_load((copy / "tiny.yaml").read_text())
        dry = planned_jobs(snakemake(copy, copy, "-n", "--configfile", str(copy / "tiny.yaml")))
        assert dry["train"] == 2, (name, dry)
        # A training job as the DAG runs it.
        run = Path(tiny["results_dir"]) / "runs" / "mqar" / arch[name] / "seed0"
        snakemake(copy, copy, str(run / "metrics.json"), "--configfile", str(copy / "tiny.yaml"), env=env)
        provenance = json.loads((run / "provenance.json").read_text())
        code = provenance["code"]
        assert {k: code[k] for k in ("seqmix", "kernels")} == {"seqmix": str(copy / "src" / "seqmix"),
                                                               "kernels": str(copy / "kernels")}, (name, code)
        # The sources it recorded are that checkout's, named within it (seqmix.sources).
        assert f"src/seqmix/mixers/{arch[name]}.py" in code["sources"]
        if arch[name] == "mamba":  # the fused CPU scan, from this checkout's C++ source
            assert "kernels/selective_scan_cpu.cpp" in code["sources"]
            assert provenance["implementation"]["paths"].get("mamba") == "fused_cpu", provenance["implementation"]
    assert list((tmp_path / "torch_extensions").rglob("*.so")), "the scan was not built for checkout b"
