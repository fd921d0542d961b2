"""What the repository says about itself holds: CI lints and tests with everything the suite
needs required (a test that needs what is missing skips locally and fails in CI, and no test
skips any other way), and every rule that runs a command names the conda environment."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from tests.conftest import REQUIREMENTS, require_mirror, skip_or_fail
from tests.helpers import REPO


def ci_commands() -> list[str]:
    script = (REPO / ".ci" / "run").read_text()
    return [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_ci_requires_everything_the_suite_needs_lints_and_tests():
    commands = ci_commands()
    assert {f"export {env}=1" for env in REQUIREMENTS} <= set(commands), "a requirement .ci/run does not set"
    assert "time make lint" in commands and "time make test" in commands
    makefile = (REPO / "Makefile").read_text()
    lint = makefile.split("\nlint:")[1].split("\n\n")[0]
    assert "ruff check src kernels tests notebooks" in lint and "snakemake --lint" in lint
    test = makefile.split("\ntest:")[1].split("\n\n")[0]
    assert "--durations=30" in test, "CI prints the slowest tests (make test)"


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_requirement_skips_locally_and_fails_in_ci(monkeypatch, tmp_path, required):
    # What every test that needs one of REQUIREMENTS does when it is missing; the mirror, as
    # its fixture finds it.
    monkeypatch.setenv("SEQMIX_DATA_MIRROR", str(tmp_path / "no-mirror"))
    for env in REQUIREMENTS:
        monkeypatch.delenv(env, raising=False)
    if required:
        monkeypatch.setenv("SEQMIX_REQUIRE_MIRROR", "1")
    with pytest.raises(pytest.fail.Exception if required else pytest.skip.Exception) as e:
        require_mirror()
    assert str(e.value).startswith(f"no data mirror at {tmp_path / 'no-mirror'}")
    if required:
        assert str(e.value).endswith("(SEQMIX_REQUIRE_MIRROR=1: this run must test the data layer)")
    for env, what in REQUIREMENTS.items():
        monkeypatch.setenv(env, "1" if required else "0")
        with pytest.raises(pytest.fail.Exception if required else pytest.skip.Exception) as e:
            skip_or_fail("it is missing", env)
        assert str(e.value) == (f"it is missing ({env}=1: this run must test {what})" if required else "it is missing")


# The ways a test can end without testing: pytest's skips, anywhere but in skip_or_fail, and
# an xfail that is not strict (a strict one fails when it passes).
SKIPS = {"skip", "importorskip", "skipif"}


def unchecked_skips(source: str, name: str) -> tuple[list[str], set[str]]:
    """The places in ``source`` (the file ``name``) where a test can skip without failing in
    CI, and the requirements its skip_or_fail calls name (each must be one of REQUIREMENTS,
    as a string or a module constant holding one)."""
    tree = ast.parse(source)
    constants = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "skip_or_fail"
              for n in ast.walk(f)}
    found, named = [], set()
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        skipping = (isinstance(node, ast.Call) and getattr(node.func, "attr", None) in SKIPS) or (
            isinstance(node, ast.Attribute) and node.attr in SKIPS and getattr(node.value, "attr", None) == "mark")
        if skipping:
            found.append(f"{where}: {getattr(node, 'attr', None) or node.func.attr}")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "xfail":
            if not any(k.arg == "strict" and getattr(k.value, "value", None) is True for k in node.keywords):
                found.append(f"{where}: an xfail that is not strict")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "skip_or_fail":
            env = node.args[1] if len(node.args) > 1 else None
            value = env.value if isinstance(env, ast.Constant) else getattr(env, "id", None)
            value = constants.get(value, value)
            if value in REQUIREMENTS:
                named.add(value)
            else:
                found.append(f"{where}: skip_or_fail with {ast.unparse(env) if env else 'no variable'}, "
                             "not one of conftest.REQUIREMENTS")
    return found, named


def test_no_test_skips_but_through_skip_or_fail_with_a_requirement_ci_sets():
    found, named = [], set()
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "test_repository.py":  # it calls skip_or_fail with each requirement in turn
            continue
        more, names = unchecked_skips(path.read_text(), str(path.relative_to(REPO)))
        found, named = found + more, named | names
    assert not found, "tests that can skip in CI without failing:\n" + "\n".join(found)
    assert named == set(REQUIREMENTS), f"requirements no test needs: {set(REQUIREMENTS) - named}"


@pytest.mark.parametrize("form, flagged", [
    ('pytest.importorskip("triton")', True),
    ('pytest.skip("no GPU")', True),
    ('@pytest.mark.skipif(True, reason="x")\ndef test_f(): pass', True),
    ('@pytest.mark.xfail(reason="x")\ndef test_f(): pass', True),
    ('skip_or_fail("no cluster", "SEQMIX_REQUIRE_NOTHING")', True),
    ('skip_or_fail("no mirror", "SEQMIX_REQUIRE_MIRROR")', False),
    ('ENV = "SEQMIX_REQUIRE_SLURM"\nskip_or_fail("no cluster", ENV)', False),
    ('@pytest.mark.xfail(strict=True, reason="x")\ndef test_f(): pass', False),
])
def test_the_skip_scan_catches_what_it_is_for(form, flagged):
    found, _ = unchecked_skips(form, "tests/test_x.py")
    assert bool(found) == flagged, found


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
# explained (docs/reference/data-mirror.md, Makefile and CI defaults, the config's comment, and
# the test fixture that follows the Makefile).
MIRROR_DEFAULT = "../shared"
MIRROR_DEFAULT_FILES = {"Makefile", ".ci/run", "docs/reference/data-mirror.md", "config/config.yaml", "tests/conftest.py"}


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def tracked_text_files() -> list[str]:
    return [f for f in tracked_files() if f != "tests/project/test_repository.py" and not (REPO / f).is_symlink()
            and b"\0" not in (REPO / f).read_bytes()[:8192]]


def test_no_tracked_file_points_outside_the_repository():
    links = [f for f in tracked_files() if (REPO / f).is_symlink()]
    assert "src/seqmix/kernels" in links  # the one way kernels/ is seqmix.kernels
    outside = [f"{f} -> {(REPO / f).readlink()}" for f in links
               if not (REPO / f).resolve().is_relative_to(REPO.resolve()) or (REPO / f).readlink().is_absolute()]
    assert not outside, f"links that leave the repository, or are absolute: {outside}"
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
