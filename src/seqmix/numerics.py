"""Which code path each CPU library takes, so that a study gives the same bits on every x86-64
host (the study's ``numerics:``; docs/reference/numerics.md).

Three libraries under PyTorch pick their code from the CPU they run on, and each path rounds
differently: ATen's vectorised kernels (AVX-512 or AVX2, from the CPU's flags), oneDNN's JIT
kernels (Mamba's conv1d, the feed-forward's GELU; from the flags) and oneMKL's matrix
products, FFTs and vector math (from the flags and the vendor). ``portable`` pins each to
one path every x86-64 host with AVX2 and FMA has, and fixes the thread count:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels (no approximate rcp/rsqrt instructions);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's AVX2 kernels (its AMD-only paths need AVX-512);
- ``MKL_CBWR=AVX2,STRICT``: oneMKL's AVX2 conditional-numerical-reproducibility branch, the
  same kernels on every CPU with AVX2 and FMA; STRICT keeps its matrix products' bits when the
  thread count or the arrays' alignment changes (a job may set ``train.threads``). The CLI
  loads oneMKL's shim before torch on every host (seqmix.mkl_shim); why oneMKL needs it: the
  vendor check, in seqmix/mkl_shim.c's header. oneMKL's COMPATIBLE branch (SSE2) needs no
  shim but costs about 1.5x native on an AVX-512 host (docs/costs/numerics-cost.md);
- ``MKL_ENABLE_INSTRUCTIONS=AVX2``: oneMKL capped at AVX2 as well, which changes nothing under
  that branch, but a cap of AVX512 set from outside overrides the branch (oneMKL then runs its
  AVX-512 kernels while still reporting AVX2; docs/investigations/numerics-probe.md);
- one OpenMP and one oneMKL thread (a job that sets its own count, ``train.threads``, keeps it).

``portable`` is the default: on an AVX-512 host it costs about what native costs, where the
target is 1.10x (docs/costs/numerics-cost.md: 0.94x on an AMD EPYC, Zen 5; Intel hosts are not
measured here). ``native`` leaves every library to the host: results that depend on the CPU.
Which library moves the bits: docs/investigations/numerics-probe.md; the hosts measured: docs/reference/hosts.md.

Standard library only, and nothing here touches the environment: the CLI decides the mode
from the job's spec, its run or its profile (seqmix.study.profile.Profile.numerics) before
torch is imported, sets these variables itself (the libraries read them when they load or
first run) and loads the shim (seqmix.cli.environment.pin_numerics); the Snakefile exports
the variables in every job's shell (seqmix.study.dag.shell_prefix).
"""

from __future__ import annotations

import json
import platform
import shlex
from pathlib import Path

from seqmix import mkl_shim

MODES = ("portable", "native")
DEFAULT = "portable"  # why: the module docstring

# What ``portable`` sets, and why each: the module docstring.
PINS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "AVX2,STRICT",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# What a portable process runs, as seqmix.train.provenance reads it back: ATen's capability and
# oneMKL's branch from the libraries, oneDNN's cap from the environment.
PINNED = {"aten_capability": ("ATen", "AVX2"), "mkl_branch": ("oneMKL", PINS["MKL_CBWR"]),
          "mkl_max_isa": ("oneMKL cap", PINS["MKL_ENABLE_INSTRUCTIONS"]),
          "onednn_max_isa": ("oneDNN cap", PINS["ONEDNN_MAX_CPU_ISA"])}
SHIM = "mkl_shim"  # the record's key for the shim's file (seqmix.mkl_shim.loaded), None: not loaded
VARIABLES = tuple(PINS)  # what a run's provenance records of its environment
# The flags every portable host has: AVX2 and FMA, the vector part of x86-64-v3.
MINIMUM = ("avx2", "fma")
MINIMUM_NAME = "AVX2 and FMA (x86-64-v3)"


def differences(record: dict) -> list[str]:
    """The paths a process ran that portable does not pin (``["oneMKL AUTO,STRICT"]``: the shim's
    vendor answer did not take effect; ``["oneMKL shim not loaded"]``), from its numerics record
    (seqmix.train.provenance.numerics_record); []: every pin held."""
    missed = [f"{library} {record.get(key) or 'none'}" for key, (library, pinned) in PINNED.items()
              if str(record.get(key) or "").upper() != pinned.upper()]
    return missed + ([] if record.get(SHIM) else ["oneMKL shim not loaded"])


def environment(mode: str) -> dict[str, str]:
    """The variables a job of this mode runs with (native: none set)."""
    if mode not in MODES:
        raise ValueError(f"unknown numerics {mode!r}; choose from: {', '.join(MODES)}")
    return dict(PINS) if mode == "portable" else {}


def shell_exports(mode: str) -> str:
    """The exports of ``environment(mode)`` as a shell command ('' for none)."""
    pins = environment(mode)
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in pins.items()) + "; " if pins else ""


# ------------------------------------------------------------------------------------------
# The host.
# ------------------------------------------------------------------------------------------


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _field(name: str, cpuinfo: str | None) -> str | None:
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    return _field("model name", cpuinfo) or platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The CPU's feature flags, sorted ([] where /proc/cpuinfo has none)."""
    return sorted(set((_field("flags", cpuinfo) or "").split()))


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... ('' unknown)."""
    return _field("vendor_id", cpuinfo) or ""


def vector_isa(flags: list[str]) -> str:
    """The widest vector instruction set the flags name, as the libraries choose by it."""
    have = set(flags)
    if "avx512f" in have:
        return "AVX-512"
    if set(MINIMUM) <= have:
        return "AVX2"
    return "AVX" if "avx" in have else "SSE"


FIX = "or set numerics: native in the config (its results then depend on the CPU that runs them)"


def host_problem(mode: str, flags: list[str] | None = None, machine: str | None = None,
                 model: str | None = None) -> str | None:
    """Why this host cannot run ``mode`` (None: it can): portable needs an x86-64 CPU with
    AVX2 and FMA, and a C compiler to build oneMKL's shim once (unless it is built)."""
    if mode != "portable":
        return None
    machine = machine or platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        return (f"numerics: portable pins the x86-64 code paths of ATen, oneDNN and oneMKL, and this host is "
                f"{machine}: run on an x86-64 host with {MINIMUM_NAME}, {FIX}")
    flags = cpu_flags() if flags is None else flags
    missing = [f for f in MINIMUM if f not in flags]
    if missing:
        return (f"numerics: portable needs a CPU with {MINIMUM_NAME}, and this host's "
                f"({model or cpu_model()}) lacks {', '.join(missing)}: run on such a host, {FIX}")
    if not mkl_shim.path().exists() and mkl_shim.compiler() is None:
        return ("numerics: portable loads a small C library into every job so that oneMKL computes alike on any "
                "vendor's CPU (seqmix/mkl_shim.py), built once per machine, and this host has no C compiler (cc): "
                f"install one (e.g. apt-get install gcc), {FIX}")
    return None


def shim_problem(mode: str) -> str | None:
    """Build oneMKL's shim where ``mode`` needs it (seqmix.mkl_shim): None once it is built or
    where it is not needed, else why not, with the fix."""
    if mode != "portable":
        return None
    try:
        mkl_shim.build()
    except mkl_shim.ShimError as e:
        return (f"numerics: portable cannot build the library every job loads so that oneMKL computes alike on "
                f"any vendor's CPU (seqmix/mkl_shim.py, into {mkl_shim.cache_dir()}): {e}; fix the C compiler (cc) "
                f"or the cache folder (${mkl_shim.CACHE_ENV}), {FIX}")
    return None


# ------------------------------------------------------------------------------------------
# The mode of a command, read before torch is imported: from its job spec or its run (a
# profile's: seqmix.study.profile.Profile.numerics).
# ------------------------------------------------------------------------------------------


def checked_mode(mode, where: str) -> str | None:
    """``mode`` where it is one (None: not set), else a ValueError naming ``where`` it is set."""
    if mode is None or mode in MODES:
        return mode
    raise ValueError(f"{where}: numerics is {mode!r}; choose from: {', '.join(MODES)}")


def mode_in_spec(spec: str) -> str | None:
    """The ``numerics`` of a job spec given as JSON (None: it has none, or it is not JSON:
    the spec's own validation names what is wrong)."""
    try:
        data = json.loads(spec)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("specs"), list) and data["specs"]:
        data = data["specs"][0]  # a seed pack's (seqmix.study.jobs.PackJob): its members' one numerics
    return checked_mode(data.get("numerics"), "--spec") if isinstance(data, dict) else None


def mode_in_run(run_dir: str | Path) -> str | None:
    """The ``numerics`` a run was trained with (its config.json; None: not recorded)."""
    try:
        data = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return checked_mode(data.get("numerics"), f"{run_dir}/config.json") if isinstance(data, dict) else None
