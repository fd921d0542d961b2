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


# --- the repository stands on its own -----------------------------------------------------

# Notes that live beside the repository on the machine it was built on, and that machine's
# paths: a user of a clone has none of them. Sources are cited as papers (authors, year,
# arXiv id or venue, section); what the project derived from them is in its own docs.
OUTSIDE = re.compile(r"\bREFERENCE\b|\bDESIGN\.md\b|\bSTYLE\.md\b|/work/|/root/")
# The data mirror's default location beside a checkout: only where the mirror is set up or
# explained (README instructions, Makefile and CI defaults, the config's comment, and the
# test fixture that follows the Makefile).
MIRROR_DEFAULT = "../shared"
MIRROR_DEFAULT_FILES = {"Makefile", ".ci/run", "README.md", "config/config.yaml", "tests/conftest.py"}


def tracked_text_files() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if f != "tests/test_repository.py" and b"\0" not in (REPO / f).read_bytes()[:8192]]


def test_no_tracked_file_points_outside_the_repository():
    files = tracked_text_files()
    assert "src/seqmix/mixers/grassmann.py" in files and "paper/claims.yaml" in files
    found = []
    for f in files:
        for n, line in enumerate((REPO / f).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line) or (MIRROR_DEFAULT in line and f not in MIRROR_DEFAULT_FILES):
                found.append(f"{f}:{n}: {line.strip()}")
    assert not found, "references to files outside the repository:\n" + "\n".join(found)


def test_the_rule_catches_what_it_is_for():
    ref, design = "REFERENCE", "DESIGN"  # spelled apart, so that this file names no note itself
    for line in (f"see {ref}.md §1.4", f"({ref} §6)", f"{design}.md: fast path", "/work/shared/x",
                 f"# {ref}: 1/√6"):
        assert OUTSIDE.search(line), line
    for line in ("SEQMIX_REFERENCE_MIXERS=1", "_FORCE_REFERENCE = flag", "attention_reference(q, k, v)"):
        assert not OUTSIDE.search(line), line
