"""tools.bench_suite on a checkout of two tests: it runs the checkout's own `make test` recipe
and gives a test the CPU time of the processes it waited for, counting each worker once and
the xdist controller not at all."""

from __future__ import annotations

import textwrap

from tools.bench_suite import by_file, make_test_command, run_suite

BURN = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"


def test_a_tests_children_are_its_cpu_and_the_recipe_is_the_checkouts(tmp_path):
    (tmp_path / "Makefile").write_text("test: install latex\n\tpython -m pytest -n $(TEST_WORKERS) --dist loadfile\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text("")
    (tests / "test_burns.py").write_text(textwrap.dedent(f"""
        import subprocess, sys
        def test_a_child_burns_cpu():
            subprocess.run([sys.executable, "-c", {BURN!r}], check=True)
    """))
    (tests / "test_idle.py").write_text("def test_nothing():\n    pass\n")
    assert make_test_command(tmp_path, 2) == ["-n", "2", "--dist", "loadfile"]

    result = run_suite(tmp_path, 2, [])
    assert result["returncode"] == 0 and result["summary"].startswith("2 passed"), result["summary"]
    assert len(result["sessions"]) == 2  # the two workers; the controller's children are they
    files = by_file(result)
    assert files["test_burns.py"][0] == 1 and files["test_burns.py"][1] >= 0.5, files
    assert files["test_idle.py"][0] == 1 and files["test_idle.py"][1] < 0.5, files
    assert files["outside any test"][1] > 0  # the workers' start and collection
