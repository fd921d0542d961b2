"""What the repository says about itself holds: CI lints and tests with the data mirror
required, the tests that need the mirror skip without it locally and fail without it in
CI, and every rule that runs a command names the conda environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO, REQUIRE_MIRROR_ENV

# A test that needs nothing but the mirror fixture.
NEEDS_MIRROR = "tests/test_data.py::test_the_trained_tokenizer_is_the_same_in_every_process"


def run_pytest_without_mirror(tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != REQUIRE_MIRROR_ENV}
    environ.update({"SEQMIX_DATA_MIRROR": str(tmp_path / "no-mirror"), **env})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", NEEDS_MIRROR],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def test_without_a_mirror_a_test_that_needs_it_skips_locally(tmp_path):
    proc = run_pytest_without_mirror(tmp_path)
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]
    assert "no data mirror" in proc.stdout


def test_without_a_mirror_a_test_that_needs_it_fails_in_ci(tmp_path):
    proc = run_pytest_without_mirror(tmp_path, **{REQUIRE_MIRROR_ENV: "1"})
    assert proc.returncode != 0 and "1 error" in proc.stdout, proc.stdout[-2000:]
    assert f"{REQUIRE_MIRROR_ENV}=1" in proc.stdout and "no data mirror" in proc.stdout


def test_ci_lints_and_tests_with_the_mirror_required():
    script = (REPO / ".ci" / "run").read_text()
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert f"export {REQUIRE_MIRROR_ENV}=1" in commands
    assert "time make lint" in commands and "time make test" in commands
    makefile = (REPO / "Makefile").read_text()
    lint = makefile.split("\nlint:")[1].split("\n\n")[0]
    assert "ruff check src kernels tests notebooks" in lint and "snakemake --lint" in lint


def rules_of(text: str) -> dict[str, str]:
    """{rule name: its body} of a Snakefile or .smk file (named rules, and the notebook
    rules written as `rule:` with a `name:`)."""
    out = {}
    for match in re.finditer(r"^([ \t]*)rule[ \t]*(\w*)[ \t]*:\n((?:\1[ \t]+.*\n|[ \t]*\n)+)", text, re.M):
        name = match.group(2) or re.search(r"name:\s*\n\s*(.+)", match.group(3)).group(1).strip()
        out[name] = match.group(3)
    return out


def test_every_rule_that_runs_a_command_names_the_conda_environment():
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    rules = {name: body for f in files for name, body in rules_of(f.read_text()).items()}
    assert {"train", "eval", "collect", "complexity", "report", 'f"notebook_{_name}"'} <= set(rules)
    commands = {n: b for n, b in rules.items() if re.search(r"^\s*(shell|run|script|notebook):", b, re.M)}
    assert len(commands) >= 10
    missing = [n for n, b in commands.items() if '"../../envs/seqmix.yaml"' not in b]
    assert not missing, f"rules without `conda: envs/seqmix.yaml`: {missing}"
    assert (REPO / "envs" / "seqmix.yaml").exists()


@pytest.mark.parametrize("path", ["README.md", "pyproject.toml"])
def test_the_python_version_stated_is_the_one_the_pins_need(path):
    # numpy 2.4, pandas 3.1, scipy 1.17 and snakemake 9 (requirements.txt) need Python 3.11.
    text = (REPO / path).read_text()
    assert "3.10" not in text
    assert ('requires-python = ">=3.11"' in text) if path == "pyproject.toml" else ("Python ≥ 3.11" in text)
