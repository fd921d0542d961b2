"""The tests are laid out as tests/README.md says: every test file in the folder of what it
tests (none at the top of tests/), each under 600 lines, and the files conftest.LONGEST runs
first all there."""

from __future__ import annotations

from tests.conftest import LONGEST
from tests.helpers import REPO

TESTS = REPO / "tests"
FOLDERS = {"analysis", "core", "data", "expansion", "faults", "kernels", "mixers", "models", "project",
           "report", "study", "tasks", "tools", "train", "workflow"}


def test_every_test_file_is_in_a_folder_of_the_layout_and_under_600_lines():
    files = sorted(TESTS.rglob("test_*.py"))
    assert files
    assert not [p.name for p in files if p.parent == TESTS], "a test file at the top of tests/"
    assert {p.relative_to(TESTS).parts[0] for p in files} <= FOLDERS
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) >= 600}
    assert not long, f"split these by concern: {long}"


def test_the_folders_are_packages_and_the_readme_names_each():
    readme = (TESTS / "README.md").read_text()
    for folder in FOLDERS:
        assert (TESTS / folder / "__init__.py").exists(), folder
        assert f"`{folder}/`" in readme, folder


def test_the_longest_files_conftest_runs_first_exist():
    assert [name for name in LONGEST if not (REPO / name).is_file()] == []
