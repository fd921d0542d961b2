"""The study's numerics (seqmix/numerics.py, docs/reference/numerics.md): read before torch, applied to
every job, oneMKL's shim (seqmix/mkl_shim.c) built, checked and loaded, refused on a host below the minimum, recorded and reported; and the fingerprint that
proves the pinning: unchanged on this host made to look AVX2-only (while native changes),
changed without the shim (and the same with the shim preloaded instead), and equal to the one
docs/reference/hosts.md keeps."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from seqmix import catalogue, fingerprint, mkl_shim, numerics
from seqmix.errors import ConfigError
from seqmix.expansion.table import expand, job_table
from seqmix.expansion.validate import validate_study
from seqmix.report import collect, quality_tables
from seqmix.study import dag
from tests.conftest import skip_or_fail, tiny_config

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "docs" / "reference" / "hosts.md"

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Test CPU
flags\t\t: fpu sse sse2 avx fma avx2 avx512f
"""


# ------------------------------------------------------------------------------------------
# The setting: what each mode sets, the host it needs, where a command reads it.
# ------------------------------------------------------------------------------------------


def test_portable_pins_each_library_and_native_pins_nothing():
    assert numerics.environment("portable") == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                                "MKL_CBWR": "AVX2,STRICT", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert numerics.environment("native") == {} and numerics.shell_exports("native") == ""
    assert numerics.shell_exports("portable").startswith("export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ")
    with pytest.raises(ValueError, match="unknown numerics 'fast'; choose from: portable, native"):
        numerics.environment("fast")


def test_the_host_is_read_from_cpuinfo():
    assert numerics.cpu_model(CPUINFO) == "Intel(R) Xeon(R) Test CPU"
    assert numerics.cpu_vendor(CPUINFO) == "GenuineIntel"
    assert numerics.cpu_flags(CPUINFO) == ["avx", "avx2", "avx512f", "fma", "fpu", "sse", "sse2"]
    assert numerics.vector_isa(numerics.cpu_flags(CPUINFO)) == "AVX-512"
    assert numerics.vector_isa(["avx", "avx2", "fma"]) == "AVX2" and numerics.vector_isa(["sse2", "avx"]) == "AVX"


def test_a_host_below_the_minimum_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(mkl_shim, "compiler", lambda: "cc")  # one without: the next test
    assert numerics.host_problem("portable", ["avx", "avx2", "fma"], "x86_64") is None
    assert numerics.host_problem("native", [], "aarch64") is None
    problem = numerics.host_problem("portable", ["sse2", "avx"], "x86_64", model="Old CPU")
    assert problem == ("numerics: portable needs a CPU with AVX2 and FMA (x86-64-v3), and this host's (Old CPU) "
                       "lacks avx2, fma: run on such a host, or set numerics: native in the config (its results "
                       "then depend on the CPU that runs them)")
    assert "this host is aarch64" in numerics.host_problem("portable", [], "aarch64")


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """A machine without a C compiler, whose shim cache is empty."""
    monkeypatch.setitem(mkl_shim.CONFIGURED, "cache_home", str(tmp_path / "cache"))
    monkeypatch.setenv(mkl_shim.CACHE_ENV, str(tmp_path / "cache"))  # as the CLI reads it
    monkeypatch.setattr(mkl_shim, "compiler", lambda: None)


def test_a_host_without_a_compiler_is_refused_with_the_fix(no_compiler):
    problem = numerics.host_problem("portable", ["avx2", "fma"], "x86_64", model="AMD EPYC")
    assert problem == ("numerics: portable loads a small C library into every job so that oneMKL computes alike on "
                       "any vendor's CPU (seqmix/mkl_shim.py), built once per machine, and this host has no C compiler "
                       "(cc): install one (e.g. apt-get install gcc), or set numerics: native in the config (its "
                       "results then depend on the CPU that runs them)")
    assert numerics.shim_problem("portable").startswith("numerics: portable cannot build the library every job loads")
    assert numerics.host_problem("native", ["avx2", "fma"], "x86_64") is None and numerics.shim_problem("native") is None


def test_the_shim_is_built_once_whole_and_keyed_by_its_source(tmp_path, monkeypatch):
    if mkl_shim.compiler() is None:
        skip_or_fail("no C compiler (cc) here: portable numerics build their oneMKL shim with it", "SEQMIX_REQUIRE_COMPILER")
    first = mkl_shim.build(tmp_path)
    digest = first.with_name(first.name + mkl_shim.DIGEST)
    assert first == mkl_shim.path(tmp_path) and first.is_file() and first.name.startswith(mkl_shim.PREFIX)
    assert mkl_shim.build(tmp_path) == first and sorted(tmp_path.iterdir()) == [first, digest]  # no build left behind
    assert mkl_shim.intact(first) and digest.read_text().strip() == hashlib.sha256(first.read_bytes()).hexdigest()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(first)], capture_output=True, text=True).stdout
    assert {"mkl_serv_intel_cpu_true", "mkl_serv_intel_cpu", "mkl_serv_cpuiszen", "vmsSqrt"} <= set(symbols.split())
    # Built elsewhere, the same bytes: two jobs building at once rename the same library into place.
    assert mkl_shim.build(tmp_path / "again").read_bytes() == first.read_bytes()
    # The probe's build of the vendor answer alone: the same function, another key.
    vendor = mkl_shim.build(tmp_path / "probe", vendor_check_only=True)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(vendor)], capture_output=True, text=True).stdout
    assert "mkl_serv_intel_cpu" in symbols.split() and "vmsSqrt" not in symbols.split() and vendor.name != first.name
    edited = tmp_path / "source" / "mkl_shim.c"
    edited.parent.mkdir()
    edited.write_text(mkl_shim.SOURCE.read_text() + "/* edited */\n")
    monkeypatch.setattr(mkl_shim, "SOURCE", edited)
    assert mkl_shim.build(tmp_path) != first  # another source, another library
    edited.write_text("not C")
    with pytest.raises(mkl_shim.ShimError, match="failed"):
        mkl_shim.build(tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.is_file()]) == 4  # two libraries and their digests


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "no digest"])
def test_a_cached_shim_that_is_not_the_one_built_is_built_again(tmp_path, damage):
    """A cached library is checked before it is loaded: one truncated (a full disk, a copy cut
    short), overwritten or without its digest is built again, whole. Loaded as it was, a
    truncated one killed every command with SIGBUS (exit 135) and no message."""
    if mkl_shim.compiler() is None:
        skip_or_fail("no C compiler (cc) here: portable numerics build their oneMKL shim with it", "SEQMIX_REQUIRE_COMPILER")
    library = mkl_shim.build(tmp_path / "seqmix")
    built = library.read_bytes()
    if damage == "truncated":
        os.truncate(library, 4096)
    elif damage == "overwritten":
        library.write_bytes(built[:1000] + bytes(64) + built[1064:])
    else:
        library.with_name(library.name + mkl_shim.DIGEST).unlink()
    assert not mkl_shim.intact(library)
    env = {**{k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"},
           "PYTHONPATH": str(REPO / "src"), mkl_shim.CACHE_ENV: str(tmp_path)}
    code = ("import sys, types; from seqmix import mkl_shim; from seqmix.cli import environment; "
            "environment.pin_numerics(types.SimpleNamespace(asked_numerics='portable')); print(mkl_shim.loaded())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip() == str(library) and library.read_bytes() == built and mkl_shim.intact(library)
    # A command, as every job runs one: the same, from a damaged cache.
    os.truncate(library, 4096)
    proc = subprocess.run([sys.executable, "-m", "seqmix", "where", "results", "--config", str(REPO / "config" / "config.yaml")],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert library.read_bytes() == built


def test_jobs_building_the_shim_at_once_each_load_a_whole_one(tmp_path):
    """Four processes building into one empty cache at once (a study's first jobs): each loads
    a whole library, and the cache ends with one library and its digest, intact."""
    if mkl_shim.compiler() is None:
        skip_or_fail("no C compiler (cc) here: portable numerics build their oneMKL shim with it", "SEQMIX_REQUIRE_COMPILER")
    code = "import sys; from pathlib import Path; from seqmix import mkl_shim; print(mkl_shim.load(Path(sys.argv[1])))"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [(p.communicate(), p.returncode) for p in procs]
    assert all(rc == 0 for _, rc in outs), [err[-500:] for (_, err), _ in outs]
    library = mkl_shim.path(tmp_path)
    assert {out.strip() for (out, _), _ in outs} == {str(library)} and mkl_shim.intact(library)
    assert sorted(tmp_path.iterdir()) == [library, library.with_name(library.name + mkl_shim.DIGEST)]


def test_the_cli_loads_the_shim_for_portable_only(tmp_path):
    """In a fresh process (no torch): the pins set and the shim loaded for portable, on any
    vendor's CPU (its vendor check and square root are the same code everywhere); neither for
    native."""
    if mkl_shim.compiler() is None:
        skip_or_fail("no C compiler (cc) here: portable numerics build their oneMKL shim with it", "SEQMIX_REQUIRE_COMPILER")
    code = ("import sys, types, os; from seqmix import mkl_shim, numerics; from seqmix.cli import environment; "
            "numerics.cpu_vendor = lambda cpuinfo=None: sys.argv[2]; "
            "environment.pin_numerics(types.SimpleNamespace(asked_numerics=sys.argv[1])); "
            "print(bool(mkl_shim.loaded()), os.environ.get('MKL_CBWR'), 'torch' in sys.modules)")
    env = {**{k: v for k, v in os.environ.items() if k not in numerics.VARIABLES}, "PYTHONPATH": str(REPO / "src"),
           mkl_shim.CACHE_ENV: str(tmp_path)}

    def run(mode, vendor):
        return subprocess.run([sys.executable, "-c", code, mode, vendor], env=env, capture_output=True, text=True,
                              check=True).stdout.split()

    for vendor in ("AuthenticAMD", "GenuineIntel"):
        assert run("portable", vendor) == ["True", "AVX2,STRICT", "False"]
    assert run("native", "AuthenticAMD") == ["False", "None", "False"]


def test_the_mode_is_read_from_spec_run_and_config_without_torch(tmp_path):
    from seqmix.errors import ConfigError
    from seqmix.study.profile import read_profile

    assert numerics.mode_in_spec('{"numerics": "native", "arch": "h3"}') == "native"
    assert numerics.mode_in_spec('{"arch": "h3"}') is None and numerics.mode_in_spec("not json") is None
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"numerics": "portable"}))
    assert numerics.mode_in_run(tmp_path / "run") == "portable" and numerics.mode_in_run(tmp_path) is None
    (tmp_path / "base.yaml").write_text("numerics: native\nseeds: [0]\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\n")
    (tmp_path / "mine.yaml").write_text("extends: base.yaml\nnumerics: portable\n")

    def mode(name, overrides=None):  # the profile's numerics, from its one reading
        return read_profile(tmp_path / name, overrides).numerics

    assert mode("child.yaml") == "native"  # from what it extends
    assert mode("mine.yaml") == "portable"  # the nearest wins
    assert mode("mine.yaml", {"numerics": "native"}) == "native"
    assert read_profile('{"numerics": "native"}').numerics == "native"
    assert read_profile('{"seeds": [0]}').numerics is None
    with pytest.raises(ConfigError, match="missing.yaml does not exist"):
        mode("missing.yaml")  # the command pins the default, and its reading says so (below)
    (tmp_path / "broken.yaml").write_text("numerics: [\n")
    with pytest.raises(ConfigError, match="broken.yaml is not valid YAML"):
        mode("broken.yaml")
    (tmp_path / "child.yaml").write_text("numerics: fast\n")
    with pytest.raises(ValueError, match=r"child.yaml: numerics is 'fast'; choose from: portable, native"):
        mode("child.yaml")
    (tmp_path / "grandchild.yaml").write_text("extends: child.yaml\n")
    with pytest.raises(ConfigError, match=r"child.yaml: numerics is 'fast'; .* \(fix the key 'numerics'\)"):
        mode("grandchild.yaml")  # named where it is set
    with pytest.raises(ConfigError, match=r"--overrides: numerics is 'fast'"):
        mode("mine.yaml", {"numerics": "fast"})


def test_a_command_takes_its_jobs_numerics_else_its_configs(tmp_path):
    from seqmix.cli.inputs import numerics_of, profile_of
    from seqmix.errors import ConfigError

    def args(**kw):
        return types.SimpleNamespace(**{"spec": None, "config": None, **kw})

    assert numerics_of(args(spec='{"numerics": "native"}', config='{"numerics": "portable"}')) == ("native", "--spec")
    assert numerics_of(args(spec='{"kind": "mqar"}')) == ("native", "--spec")  # a data job: nothing to pin
    assert numerics_of(args(config='{"numerics": "portable"}')) == ("portable", '{"numerics": "portable"}')
    assert numerics_of(args(config='{"numerics": "x"}', overrides='{"numerics": "native"}'))[0] == "native"
    assert numerics_of(args(asked_numerics="native", config='{"numerics": "portable"}')) == ("native", "--numerics")
    assert numerics_of(args()) == (numerics.DEFAULT, None)
    missing = args(config="/no/such/config.yaml")
    assert numerics_of(missing) == (numerics.DEFAULT, None)  # loading it says so:
    with pytest.raises(ConfigError, match="config file /no/such/config.yaml does not exist"):
        profile_of(missing)
    (tmp_path / "broken.yaml").write_text("numerics: [\n")
    assert numerics_of(args(config=str(tmp_path / "broken.yaml"))) == (numerics.DEFAULT, None)
    with pytest.raises(ConfigError, match=r"--overrides is not JSON"):
        profile_of(args(config='{"numerics": "native"}', overrides="{numerics"))


def test_a_command_reads_its_profile_once(tmp_path, monkeypatch, capsys):
    """The numerics pinned before torch and the study the command expands come from one reading
    of the profile and what it extends (seqmix.study.profile)."""
    from seqmix.cli import inputs, main
    from seqmix.study import profile

    (tmp_path / "base.yaml").write_text(json.dumps(tiny_config(tmp_path, None)))
    (tmp_path / "mine.yaml").write_text("extends: base.yaml\nnumerics: native\n")
    reads, opened = [], []
    read_file = profile.read_config_file
    monkeypatch.setattr(inputs, "read_profile", lambda *a: reads.append(a) or profile.read_profile(*a))
    monkeypatch.setattr(profile, "read_config_file", lambda path: opened.append(Path(path).name) or read_file(path))
    assert main(["runs", "--config", str(tmp_path / "mine.yaml")]) == 0
    assert len(reads) == 1 and opened == ["mine.yaml", "base.yaml"]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "results" / "runs" / "mqar" / arch / "seed0")
                                                    for arch in ("softmax", "grassmann")]


def test_the_command_line_imports_no_torch_before_it_pins():
    code = "import sys, seqmix.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO / "src")}).returncode == 0


def test_the_study_setting_reaches_every_job_and_the_run_identity(tmp_path):
    from seqmix.train.loop import spec_hash

    cfg = tiny_config(tmp_path, None)
    assert validate_study(cfg).numerics == numerics.DEFAULT
    tables = {mode: job_table(expand(validate_study({**cfg, "numerics": mode}))) for mode in numerics.MODES}
    for mode, table in tables.items():
        assert table["study"]["numerics"] == mode and dag.Jobs(table).numerics == mode
        specs = [r["spec"] for r in table["runs"]]
        assert specs and all(json.loads(s)["numerics"] == mode for s in specs)
    # Two modes train to other bits: a checkpoint of one is not resumed by the other.
    a, b = (expand(validate_study({**cfg, "numerics": m})).run_spec("mqar", "softmax", 0) for m in numerics.MODES)
    assert spec_hash(a) != spec_hash(b)
    with pytest.raises(Exception, match="numerics"):
        validate_study({**cfg, "numerics": "fast"})


def test_every_job_shell_starts_with_the_study_pins():
    portable, native = dag.shell_prefix("portable"), dag.shell_prefix("native")
    assert portable.startswith("set -euo pipefail; export PYTHONPATH=")
    assert portable.endswith(numerics.shell_exports("portable")) and "MKL_CBWR=AVX2,STRICT" in portable
    assert native == dag.shell_prefix() and "ATEN_CPU_CAPABILITY" not in native
    snakefile = (REPO / "Snakefile").read_text()
    assert "shell.prefix(dag.shell_prefix(JOBS.numerics))" in snakefile


def test_a_host_below_the_minimum_fails_before_the_first_job(tmp_path, monkeypatch, capsys):
    from seqmix import preflight
    from seqmix.cli import main

    monkeypatch.setattr(numerics, "cpu_flags", lambda cpuinfo=None: ["sse2", "avx"])
    study = validate_study({**tiny_config(tmp_path, None), "numerics": "portable"})
    assert preflight.numerics_problems(study.numerics) == [f"config key 'numerics': {numerics.host_problem('portable')}"]
    assert preflight.numerics_problems(validate_study({**tiny_config(tmp_path, None), "numerics": "native"}).numerics) == []
    assert main(["fingerprint", "--numerics", "portable"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: numerics: portable needs a CPU with AVX2 and FMA") and err.count("\n") == 1
    assert "(the numerics of --numerics)" in err


def test_a_host_without_the_means_to_build_the_shim_fails_before_the_first_job(tmp_path, monkeypatch, capsys,
                                                                                no_compiler):
    from seqmix import preflight
    from seqmix.cli import main

    monkeypatch.setattr(numerics, "cpu_flags", lambda cpuinfo=None: ["avx2", "fma"])
    study = validate_study({**tiny_config(tmp_path, None), "numerics": "portable"})
    assert preflight.numerics_problems(study.numerics) == [f"config key 'numerics': {numerics.host_problem('portable')}"]
    assert main(["fingerprint", "--numerics", "portable"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: numerics: portable loads a small C library") and err.count("\n") == 1
    assert "install one (e.g. apt-get install gcc), or set numerics: native" in err


# ------------------------------------------------------------------------------------------
# Provenance and the report.
# ------------------------------------------------------------------------------------------


def test_provenance_reads_what_the_libraries_run():
    from seqmix.train import provenance

    provenance.configure(numerics="portable", environment={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    try:
        rec = provenance.numerics_record()
    finally:
        provenance.configure()
    assert rec["mode"] == "portable" and rec["aten_capability"] in ("DEFAULT", "AVX2", "AVX512")
    assert rec["mkl_branch"].split(",")[0] in provenance.MKL_BRANCHES.values()
    assert rec["mkl_max_isa"] is None and not rec["pinned"]  # this process pinned nothing: oneMKL's cap is unset
    assert rec["mkl_shim"] == mkl_shim.loaded() is None  # this process imported torch before any shim
    assert {"oneMKL cap none", "oneMKL shim not loaded"} <= set(numerics.differences(rec))
    assert rec["cpu"] == numerics.cpu_model() and set(rec["cpu_flags"].split()) == set(numerics.cpu_flags())


RAN = {"aten_capability": "AVX2", "mkl_branch": "AVX2,STRICT", "mkl_max_isa": "AVX2", "onednn_max_isa": "AVX2",
       "mkl_shim": "/cache/seqmix/libseqmix_mkl_shim-0.so"}  # what a portable process reports


def test_the_pins_held_are_read_from_what_ran():
    assert numerics.differences(RAN) == []
    # A oneMKL that ignored the shim's vendor answer on AMD; an Intel host without the shim.
    assert numerics.differences({**RAN, "mkl_branch": "AUTO,STRICT"}) == ["oneMKL AUTO,STRICT"]
    assert numerics.differences({**RAN, "mkl_shim": None}) == ["oneMKL shim not loaded"]
    assert numerics.differences({**RAN, "mkl_branch": "COMPATIBLE", "mkl_max_isa": None, "mkl_shim": None}) == [
        "oneMKL COMPATIBLE", "oneMKL cap none", "oneMKL shim not loaded"]  # a run of the earlier portable
    assert numerics.differences({**RAN, "aten_capability": "AVX512"}) == ["ATen AVX512"]


def test_runs_csv_says_how_each_run_ran():
    pinned = {"numerics": {"mode": "portable", "pinned": True, "cpu": "AMD EPYC", "vector_isa": "AVX-512", **RAN}}
    assert collect.numerics_of(pinned) == {"numerics": "portable", "cpu": "AMD EPYC (AVX-512)"}
    unshimmed = {"numerics": {**pinned["numerics"], "pinned": False, "mkl_branch": "AUTO,STRICT"}}
    assert collect.numerics_of(unshimmed)["numerics"] == "portable, not pinned (oneMKL AUTO,STRICT)"
    assert collect.numerics_of({"numerics": {**unshimmed["numerics"], "mode": "native"}})["numerics"] == "native"
    assert collect.numerics_of({}) == {"numerics": "", "cpu": ""}


def runs_of(*rows: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame([{"numerics": m, "cpu": c} for m, c in rows])


def test_the_report_says_the_mode_and_flags_mixed_modes_and_hosts():
    amd, intel = "AMD EPYC (AVX-512)", "Intel Xeon (AVX2)"
    text = quality_tables.numerics_text(runs_of(("portable", amd), ("portable", intel)))
    assert text.startswith("Numerics: every run portable on 2 hosts (1 run on AMD EPYC (AVX-512) and 1 run on")
    assert "any x86-64 host with AVX2 and FMA gives the same bits" in text and "textbf" not in text
    text = quality_tables.numerics_text(runs_of(("native", amd), ("native", amd)))
    assert text.startswith("Numerics: every run native on one host, AMD EPYC (AVX-512).")
    assert "another x86 host can give other last bits" in text
    text = quality_tables.numerics_text(runs_of(("native", amd), ("native", intel)))
    assert "\\textbf{Runs from several hosts}" in text
    text = quality_tables.numerics_text(runs_of(("portable", amd), ("native", amd), ("native", amd)))
    assert text.startswith("\\textbf{Runs of mixed numerics}: 2 runs native and 1 run portable, on one host")
    unshimmed = "portable, not pinned (oneMKL AUTO,STRICT)"
    text = quality_tables.numerics_text(runs_of((unshimmed, amd), (unshimmed, amd)))
    assert text.startswith(f"Numerics: every run {unshimmed} on one host") and "Portable runs not pinned" in text
    text = quality_tables.numerics_text(runs_of(("portable", amd), (unshimmed, amd)))
    assert text.startswith("\\textbf{Runs of mixed numerics}: 1 run portable and 1 run portable, not pinned")
    assert quality_tables.numerics_text(pd.DataFrame({"arch": ["softmax"]})).startswith("No run recorded")


# ------------------------------------------------------------------------------------------
# The fingerprint: this host made to look like others, and the hosts docs/reference/hosts.md keeps.
# ------------------------------------------------------------------------------------------

# A host without AVX-512, as far as each library can be told from outside: ATen's capability,
# oneDNN's and oneMKL's caps, and glibc's own dispatch (libm, libmvec) told AVX-512 is missing.
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512DQ,-AVX512BW,-AVX512VL"}
INTEL = numerics.cpu_vendor() == "GenuineIntel"


def run_fingerprint(tmp_path: Path, mode: str, extra: dict | None = None, name: str = "fp",
                    torch_first: bool = False) -> dict:
    """`python -m seqmix fingerprint` in a fresh process with ``extra`` in its environment (none
    of the numerics variables of this one). ``torch_first``: the command runs in a process that
    imported torch before, where the CLI can neither set the pins nor load oneMKL's shim,
    so the process runs whatever ``extra`` sets."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"}
    env.update(extra or {}, PYTHONPATH=str(REPO / "src"))
    out = tmp_path / f"{name}-{mode}.json"
    args = ["fingerprint", "--numerics", mode, "--out", str(out)]
    command = ([sys.executable, "-c", f"import sys, torch; from seqmix.cli import main; sys.exit(main({args!r}))"]
               if torch_first else [sys.executable, "-m", "seqmix", *args])
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**json.loads(out.read_text()), "stdout": proc.stdout}


@pytest.fixture(scope="module")
def here(tmp_path_factory) -> dict:
    """This host's portable and native fingerprints, as they are."""
    tmp = tmp_path_factory.mktemp("fingerprint")
    return {mode: run_fingerprint(tmp, mode) for mode in numerics.MODES}


def differing(a: dict, b: dict) -> list[str]:
    return [name for name in a["digests"] if a["digests"][name] != b["digests"].get(name)]


def test_the_fingerprint_runs_pinned_and_prints_a_line_per_mixer(here):
    portable = here["portable"]["numerics"]
    assert portable["pinned"] and portable["threads"] == 1 and numerics.differences(portable) == []
    assert (portable["aten_capability"], portable["mkl_branch"], portable["mkl_max_isa"]) == (
        "AVX2", "AVX2,STRICT", "AVX2")
    assert portable["mkl_shim"] and not here["native"]["numerics"]["mkl_shim"]
    assert set(here["portable"]["digests"]) == {*catalogue.mixer_names(), fingerprint.ALL}
    assert not here["native"]["numerics"]["pinned"]
    names = [*catalogue.mixer_names(), fingerprint.ALL]
    assert [line.split() for line in here["portable"]["stdout"].splitlines()] == [
        [name, here["portable"]["digests"][name][:16]] for name in names]


def test_portable_does_not_change_on_a_host_made_to_look_avx2_only(here, tmp_path):
    capped = {mode: run_fingerprint(tmp_path, mode, AVX2_ONLY, "avx2only") for mode in numerics.MODES}
    assert differing(here["portable"], capped["portable"]) == [], "a pinned library still follows the host's ISA"
    # Where the host has AVX-512 the caps do something: native follows them (ATen's and oneDNN's
    # kernels, and oneMKL's on Intel), so that the portable half above can fail. On a host with
    # AVX2 at most, capping it changes nothing, native included: only the portable half holds.
    if numerics.vector_isa(numerics.cpu_flags()) == "AVX-512":
        assert differing(here["native"], capped["native"]), "capping the libraries changed nothing: the test proves nothing"


def test_the_shim_takes_effect_and_is_what_pins_onemkl(here, tmp_path):
    """Portable's variables without the shim give other bits (on a CPU not Intel's oneMKL runs
    AUTO; on any, oneMKL's own square root); the same file by LD_PRELOAD instead of loaded in
    the process gives portable's bits (the in-process load takes effect as the dynamic linker's)."""
    pins = numerics.environment("portable")
    bare = run_fingerprint(tmp_path, "portable", pins, "unshimmed", torch_first=True)
    assert bare["numerics"]["mkl_branch"] == ("AVX2,STRICT" if INTEL else "AUTO,STRICT")
    assert not bare["numerics"]["pinned"] and not bare["numerics"]["mkl_shim"]
    if not INTEL:  # on Intel oneMKL takes the AVX2 branch without the vendor answer: the same bits
        assert differing(here["portable"], bare), "portable without oneMKL's shim gave its bits: the shim proves nothing"
    preloaded = run_fingerprint(tmp_path, "portable", {**pins, "LD_PRELOAD": str(mkl_shim.build())}, "preloaded",
                                torch_first=True)
    assert preloaded["numerics"]["pinned"] and preloaded["numerics"]["mkl_branch"] == "AVX2,STRICT"
    assert differing(here["portable"], preloaded) == [], "the shim loaded in the process differs from LD_PRELOAD's"


SQRT = ("import sys, numpy as np, torch; torch.manual_seed(0); "
        "x = torch.rand(1 << 22, dtype=torch.float64).mul(136).sub(126).exp2().float(); "
        "exact = np.sqrt(x.numpy().astype(np.float64)).astype(np.float32); "
        "print(int((torch.sqrt(x).numpy().view(np.uint32) != exact.view(np.uint32)).sum()))")


def test_torch_sqrt_under_portable_is_ieees(tmp_path):
    """With the shim, torch.sqrt rounds 4M floats from 2^-126 to 2^10 as IEEE's square root does;
    without it (oneMKL's vector sqrt, from the CPU's vrsqrtps) some of those below 2^-104
    otherwise, so the test can fail."""
    env = {**{k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"},
           **numerics.environment("portable"), "PYTHONPATH": str(REPO / "src")}
    pinned = ("import types; from seqmix.cli import environment; "
              "environment.pin_numerics(types.SimpleNamespace(asked_numerics='portable')); "
              + SQRT)
    wrong = {name: int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout) for name, code in (("shim", pinned), ("none", SQRT))}
    assert wrong["shim"] == 0, f"{wrong['shim']} square roots not correctly rounded under portable"
    assert wrong["none"] > 0, "oneMKL's own square root rounded every one correctly here: the test proves nothing"


def test_no_notebook_imports_torch():
    """A notebook's kernel is a job process the CLI does not start: it must compute nothing with
    torch, which it would run without the pins and the shim (its tables read results files)."""
    import ast

    lines = set()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!")))
                lines |= {ast.unparse(node) for node in ast.walk(ast.parse(source))
                          if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert any("seqmix.report" in line for line in lines), "found no notebook imports: the test proves nothing"
    code = "\n".join(sorted(lines)) + "\nimport sys\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO / "notebooks", capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src"), "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", "a notebook imports torch: compute it in a `python -m seqmix` job instead"


def test_portable_fingerprint_is_the_one_docs_hosts_keeps(here):
    entries = [e for e in fingerprint.read_hosts(HOSTS) if e["mode"] == "portable" and e["pinned"]]
    assert entries, f"{HOSTS} keeps no portable fingerprint: record one (python -m seqmix fingerprint --numerics portable --record docs/reference/hosts.md)"
    mine = {k: v[:16] for k, v in here["portable"]["digests"].items()}
    recorded = entries[0]  # every portable entry holds the same digests (the next test)
    differ = [name for name in mine if mine[name] != recorded["digests"].get(name)]
    if not differ:
        return
    from seqmix.sources import changed

    stale = changed(recorded["sources"])
    assert not stale, (f"the portable fingerprint differs from {HOSTS}'s ({', '.join(differ)}), and the code it depends "
                       f"on changed since it was recorded ({', '.join(stale[:8])}): record it again on a listed host "
                       "(python -m seqmix fingerprint --numerics portable --record docs/reference/hosts.md)")
    host = f"{numerics.cpu_model()} ({numerics.cpu_vendor()}, {numerics.vector_isa(numerics.cpu_flags())})"
    pytest.fail(f"this host, {host}, trains {', '.join(differ)} to other bits than {recorded['cpu']} "
                f"({recorded['vendor']}) with the same code under portable numerics: a library these mixers call is "
                "not pinned here; find which (python -m tools.numerics_probe) and fix the pinning (seqmix/numerics.py)")


def test_every_recorded_portable_host_agrees():
    """Every two portable entries of one torch version hold the same digests, whatever code
    they were made from (a change that moves the bits is no refactoring); and there are such
    pairs, so that the test compares something."""
    entries = [e for e in fingerprint.read_hosts(HOSTS) if e["mode"] == "portable" and e["pinned"]]
    pairs = [(a, b) for i, a in enumerate(entries) for b in entries[i + 1:] if fingerprint.comparable(a, b)]
    assert pairs, f"{HOSTS} holds no two portable entries of one torch version: nothing to compare"
    assert {a["vendor"] for pair in pairs for a in pair} >= {"AuthenticAMD", "GenuineIntel"}
    for a, b in pairs:
        assert not fingerprint.differing(a, b), (
            f"{fingerprint.host_name(a)} and {fingerprint.host_name(b)} recorded other portable fingerprints: "
            f"{', '.join(fingerprint.differing(a, b))}")


def hosts_copy(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of docs/reference/hosts.md and its first portable entry."""
    copy = tmp_path / "hosts.md"
    copy.write_text(HOSTS.read_text())
    return copy, next(e for e in fingerprint.read_hosts(copy) if e["mode"] == "portable" and e["pinned"])


def test_a_portable_fingerprint_that_differs_is_refused_naming_the_mixers(tmp_path):
    hosts, recorded = hosts_copy(tmp_path)
    before = hosts.read_bytes()
    other = {**recorded, "cpu": "Test CPU", "vendor": "GenuineIntel",
             "digests": {**recorded["digests"], "mamba": "0" * 16, "softmax": "1" * 16, fingerprint.ALL: "2" * 16}}
    with pytest.raises(ConfigError) as refused:
        fingerprint.record(hosts, other, fingerprint.HOSTS_NOTES)
    text = str(refused.value)
    assert f"differs from #1 {fingerprint.host_name(recorded)} in 2 mixers: softmax (recorded " in text
    assert "mamba (recorded" in text and "Nothing recorded" in text and "python -m tools.numerics_probe" in text
    assert hosts.read_bytes() == before  # nothing replaced, nothing added
    # The same host recorded again, in agreement: in place of its own entry, the others kept.
    count = len(fingerprint.read_hosts(hosts))
    again = {**recorded, "date": "2099-01-01", "compiler": "c++ (Test) 1.0", "glibc": "glibc 2.99"}
    after = fingerprint.record(hosts, again, fingerprint.HOSTS_NOTES)
    assert len(after) == count and again in after and recorded not in after
    assert "c++ (Test) 1.0; glibc 2.99;" in hosts.read_text()
    # Another torch version is not held to these digests; an unpinned run, a native one neither.
    for entry in ({**other, "torch": "9.9.9"}, {**other, "pinned": False}, {**other, "mode": "native"}):
        assert entry in fingerprint.record(hosts, entry, fingerprint.HOSTS_NOTES)
    assert len(fingerprint.read_hosts(hosts)) == count + 3


def test_another_hosts_fingerprint_is_recorded_from_its_out_file(tmp_path, capsys):
    """`--record FILE --from OUT`: another host's `--out` JSON joins the hosts file by the same
    check as this host's, with nothing trained here."""
    from seqmix.cli import main

    hosts, recorded = hosts_copy(tmp_path)
    out = {**recorded, "cpu": "Test CPU", "flags": "avx avx2 fma", "torch": recorded["torch"],
           "digests": {k: v + "0" * 48 for k, v in recorded["digests"].items()}, "numerics": {"mode": "portable"}}
    (tmp_path / "agrees.json").write_text(json.dumps(out))
    assert main(["fingerprint", "--record", str(hosts), "--from", str(tmp_path / "agrees.json")]) == 0
    added = [e for e in fingerprint.read_hosts(hosts) if e["cpu"] == "Test CPU"]
    assert len(added) == 1 and added[0]["digests"] == recorded["digests"] and "numerics" not in added[0]
    assert capsys.readouterr().out.splitlines()[-1].split() == [fingerprint.ALL, recorded["digests"][fingerprint.ALL]]
    before = hosts.read_bytes()
    out["cpu"], out["digests"] = "Deviating CPU", {**out["digests"], "gla": "f" * 64, fingerprint.ALL: "e" * 64}
    (tmp_path / "differs.json").write_text(json.dumps(out))
    assert main(["fingerprint", "--record", str(hosts), "--from", str(tmp_path / "differs.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {hosts} records portable fingerprints of torch {recorded['torch']}")
    assert "in 1 mixer: gla (recorded" in err and err.count("\n") == 1 and hosts.read_bytes() == before
    (tmp_path / "other.json").write_text(json.dumps({"cpu": "x"}))
    assert main(["fingerprint", "--record", str(hosts), "--from", str(tmp_path / "other.json")]) == 2
    assert "other.json is not a fingerprint (no vendor," in capsys.readouterr().err
