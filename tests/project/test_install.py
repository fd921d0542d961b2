"""A non-editable install carries every package: what a bare GPU machine runs, installed as
scripts/gpu-site.sh installs it for scripts/gpu-check.sh (`pip install --target .gpu-site`,
in the checkout), on an interpreter where the install is the only place seqmix can come from."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def checkout_modules() -> list[str]:
    """Every module of the checkout, by the name it is imported as (but ``seqmix.__main__``,
    which runs a command: `python -m seqmix --help` runs it)."""
    src = REPO / "src"
    names = [".".join(p.relative_to(src).with_suffix("").parts) for p in src.rglob("*.py")]
    names += ["seqmix.kernels." + p.stem for p in (REPO / "kernels").glob("*.py")]
    return sorted(n.removesuffix(".__init__") for n in names if n != "seqmix.__main__")


def test_a_non_editable_install_imports_every_module_and_runs(tmp_path):
    # A copy of what a GPU machine gets (pip builds in the source tree, which it leaves a
    # build/), installed by the script gpu-check runs, into its .gpu-site/, empty before.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, project / name)
    for name in ("src", "kernels", "config", "scripts"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
                        symlinks=True)  # src/seqmix/kernels stays the link to kernels/ the build follows
    target = project / ".gpu-site"
    pip = subprocess.run(["bash", str(project / "scripts" / "gpu-site.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "no-wheels")})
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    assert (target / "seqmix" / "__init__.py").is_file() and (target / "seqmix" / "kernels" / "grassmann.py").is_file()
    shutil.rmtree(project / "src")  # the install, not the checkout's sources, is what imports
    # -S: no site module, hence no .pth file and no editable finder of this checkout; the
    # environment's packages (torch, pydantic, ...) on PYTHONPATH after the install.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *site.getsitepackages()]),
           "TRITON_INTERPRET": "1"}
    env.pop("PYTHONHOME", None)
    script = ("import importlib, sys, seqmix\n"
              f"assert seqmix.__file__.startswith({str(target)!r}), seqmix.__file__\n"
              f"assert seqmix.REPO_ROOT == __import__('pathlib').Path({str(project.resolve())!r}), seqmix.REPO_ROOT\n"
              "assert (seqmix.REPO_ROOT / 'config' / 'gpu-check.yaml').is_file()\n"
              "missing = []\n"
              "for name in sys.argv[1:]:\n"
              "    try:\n"
              "        module = importlib.import_module(name)\n"
              f"        assert module.__file__.startswith({str(target)!r}), (name, module.__file__)\n"
              "    except ModuleNotFoundError as e:\n"
              "        missing.append(f'{name}: {e}')\n"
              "assert not missing, missing\n"
              # oneMKL's shim is built from its C source, which counts in the code of what loads it.
              "from seqmix import mkl_shim, sources\n"
              f"assert mkl_shim.SOURCE.is_file() and str(mkl_shim.SOURCE).startswith({str(target)!r})\n"
              "assert mkl_shim.SOURCE in sources.closure(['seqmix.train.loop']), 'the shim source is not in the code'\n")
    imported = subprocess.run([sys.executable, "-S", "-c", script, *checkout_modules()], capture_output=True,
                              text=True, env=env, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr[-3000:]
    helped = subprocess.run([sys.executable, "-S", "-m", "seqmix", "--help"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr[-3000:]


def test_the_module_list_is_the_checkouts():
    # The list the install is checked against: both kinds of module, from both folders.
    names = checkout_modules()
    assert {"seqmix", "seqmix.study", "seqmix.study.dag", "seqmix.kernels", "seqmix.kernels.grassmann"} <= set(names)
    assert Path(REPO / "src" / "seqmix" / "study" / "__init__.py").is_file()
