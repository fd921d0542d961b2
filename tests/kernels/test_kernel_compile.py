"""Every Triton kernel compiles for sm_80 and sm_90 at every launch the quick and paper
profiles, ``bench kernels`` and the kernel tests make (issue 24), on a machine without a GPU:
``tools.bench.compile_check``. Both sweeps are slow-marked, left out of CI: on the shared
2-core machine the ToST subset took 17 min with Triton 3.6.0, and recording the full sweep's
3,786 launches alone 9 min. ``make kernels-compile`` runs the full check with the pinned Triton,
``make kernels-compile-check`` with the oldest supported one (3.6.0, torch 2.11's).

The check runs in a subprocess: the kernels must be defined outside the Triton interpreter,
which tests/kernels/test_kernels.py switches on for the whole pytest process when it is collected.
A kernel is added to the check by its declaration in its mixer's module
(``seqmix.mixers.triton_kernels()``) and its launches in ``tools.bench.launches.LAUNCHES`` (see
there), which the kernel bench reads too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, require_triton

require_triton()

JOBS = max(1, min(2, os.cpu_count() or 1))  # CI's machine has 2 cores


def _run(args: list[str], cwd=None, timeout: int = 3000) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), str(REPO)])  # tools/: not installed
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _check(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The check's exit and its JSON report; a kernel that fails to compile is named with the
    compiler's first error lines."""
    out = tmp_path / "compile.json"
    proc = _run(["-m", "tools.bench.compile_check", "--json", str(out), "--jobs", str(JOBS), *args])
    print(proc.stdout)  # the table (pytest -s, or on failure)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    failed = [f"{r['kernel']} [{r['specialisation']}] ({r['origins'][0]}): "
              + "; ".join(f"sm_{a} {r.get(f'sm_{a}')}" for a in report["archs"] if r.get(f"sm_{a}") != "ok")
              for r in report["rows"] if any(r.get(f"sm_{a}") != "ok" for a in report["archs"])]
    assert not failed, f"Triton {report['triton']}:\n" + "\n".join(failed)
    assert not report["problems"], "\n".join(report["problems"])
    assert report["archs"] == [80, 90]
    assert proc.returncode == 0
    return proc, report


@pytest.mark.slow
def test_tssa_kernels_compile_at_the_bench_launches(tmp_path):
    """ToST's kernels at ``bench kernels``'s launches (4 heads of 64, bf16/fp16/fp32, L 1 to
    65,536, forward and backward): with Triton 3.6.0 the causal backward's scans failed to
    lower here (ScanOpToLLVM.cpp assertion) before kernels/tssa.py scanned full tiles."""
    _, report = _check(tmp_path, "--kernel", "tssa", "--source", "bench", "tests")
    kernels = {r["kernel"] for r in report["rows"]}
    assert {"tssa._causal_fwd_kernel", "tssa._causal_bwd_kernel"} <= kernels, kernels
    assert any("H_PAD=4 P_PAD=64 BT=32" in r["specialisation"] and "L=1 " in r["specialisation"]
               for r in report["rows"]), "the bench's L = 1 launch (an argument equal to 1) is compiled"


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_and_sm90_at_every_launch(tmp_path):
    from seqmix.mixers import triton_kernels
    from tools.bench.launches import CASES as BENCH_CASES

    _, report = _check(tmp_path)
    rows = report["rows"]
    # the cases reach every kernel module from every source that uses it (the bench times no
    # selective scan)
    benched = {op for op, impl, _ in BENCH_CASES if impl == "triton"}
    for name in triton_kernels():
        origins = {o.split()[0] for r in rows if r["kernel"].startswith(f"{name}.") for o in r["origins"]}
        assert {"config", "paper", "tests"} | ({"bench"} if name in benched else set()) <= origins, (name, origins)


def test_the_check_derives_the_real_specialisation_and_reports_a_kernel_that_does_not_compile(tmp_path):
    """A launch's integer argument equal to 1 becomes a constant and a multiple of 16 gets
    ``%16``, as Triton's JIT derives them; a kernel that fails to compile is a failed row
    with the compiler's message, not an exception."""
    (tmp_path / "badkernel.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def kernel(x_ptr, n, m, K: tl.constexpr):
            tl.static_assert(K >= 16, "this kernel needs K >= 16")
            a = tl.load(x_ptr + tl.arange(0, K)[:, None] * K + tl.arange(0, K)[None, :])
            tl.store(x_ptr + tl.arange(0, K)[:, None] * K + tl.arange(0, K)[None, :] + n + m, tl.dot(a, a))
    '''))
    script = textwrap.dedent('''
        import json, torch, badkernel
        from tools.bench import compile_check as cc
        from seqmix.kernels import _common
        x = torch.empty(64, dtype=torch.float32)
        launch = cc.Launch(badkernel.kernel, (cc._Pointer(x), 1, 32), {"K": K}, ["here"])
        (data, (kernel, origins)), = cc.specialise(90, [launch]).items()
        print(json.dumps([cc.describe(data)[1], cc.compile_one(90, "badkernel:kernel", data)[0]]))
    ''')
    got = {}
    for k in (8, 16):  # K = 8 does not compile
        proc = _run(["-c", f"K = {k}\n" + script], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[k] = json.loads(proc.stdout.strip().splitlines()[-1])
    spec, status = got[16]
    assert spec.startswith("x_ptr:*fp32%16 n=1 m:i32%16 K=16"), spec
    assert status == "ok"
    spec, status = got[8]
    assert status.startswith("failed: ") and "this kernel needs K >= 16" in status, status


def test_every_triton_kernel_module_is_in_the_check():
    """Each kernels/*.py with a ``@triton.jit`` kernel is a Triton kernel its mixer module
    declares (``seqmix.mixers.triton_kernels()``), by its module, and the tools launch each at
    its tests' shapes (``tools.bench.launches.LAUNCHES``): Mamba's scan, merged from another
    branch, once had no launches, and the check never compiled it."""
    from pathlib import Path

    from seqmix import kernels
    from seqmix.mixers import triton_kernels
    from tools.bench import launches

    with_jit = {p.stem for p in Path(kernels.__file__).parent.glob("*.py") if "@triton.jit" in p.read_text()}
    triton = triton_kernels()
    assert with_jit == set(triton), (with_jit, sorted(triton))
    assert all(k.module == f"seqmix.kernels.{name}" for name, k in triton.items())
    assert set(launches.kernel_launches()) == set(triton)  # it refuses otherwise: see below
    orphan = {**launches.LAUNCHES, "new_kernel": launches.LAUNCHES["tssa"]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launches, "LAUNCHES", orphan)
        with pytest.raises(LookupError, match="new_kernel is declared by no mixer module"):
            launches.kernel_launches()
        mp.setattr(launches, "LAUNCHES", {k: v for k, v in orphan.items() if k not in ("tssa", "new_kernel")})
        with pytest.raises(LookupError, match=r"must launch every Triton kernel of seqmix.mixers.triton_kernels\(\): add tssa"):
            launches.kernel_launches()


def test_the_check_reaches_the_selective_scan_and_reports_a_scan_that_does_not_compile():
    """The Mamba mixer of a profile case takes its Triton path under recording, and the scan's
    host code runs (its halves are custom ops, whose fake impls launch nothing): forward and
    backward launches are recorded, as from the scan's own test shapes; a scan launch the
    compiler rejects (a chunk of 12 tokens: not a power of 2) is a failed row."""
    script = textwrap.dedent('''
        import importlib, json
        from tools.bench import compile_check as cc
        from tools.bench.compile_cases import profile_cases
        from tools.bench.launches import kernel_launches

        kernels = kernel_launches()
        modules = [importlib.import_module(k.module) for k, _ in kernels.values()]
        scan_kernel, scan_launches = kernels["selective_scan"]
        scan = {scan_kernel.module}
        sources = {"profiles": [next(c for c in profile_cases() if " mamba " in c[0] and " train " in c[0])],
                   "tests": list(scan_launches.tests())[:2]}
        got = {}
        for source, cases in sources.items():
            launches, errors = cc.record(cases, modules, scan)
            got[source] = [sorted({launch.kernel.fn.__name__ for launch in launches}), errors]
        launch = next(launch for launch in launches if launch.kernel.fn.__name__ == "_fwd_kernel")
        launch.kwargs["BT"] = 12
        (data, _), = cc.specialise(90, [launch]).items()
        got["BT=12"] = cc.compile_one(90, "seqmix.kernels.selective_scan:_fwd_kernel", data)[0]
        print(json.dumps(got))
    ''')
    proc = _run(["-c", script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for source in ("profiles", "tests"):
        assert got[source] == [["_bwd_kernel", "_fwd_kernel"], []], (source, got[source])
    assert got["BT=12"].startswith("failed: ") and "power of 2" in got["BT=12"], got["BT=12"]


def test_a_profile_case_runs_a_mixer_as_training_and_evaluation_do():
    # What the profile cases call for every launch they record (on a CPU: the reference path);
    # it once imported a helper from where training no longer keeps it, unnoticed by the fast test.
    from seqmix import mixers
    from tools.bench.compile_cases import _mixer_call

    mixer = mixers.build("softmax", 8, causal=True, max_len=16)
    _mixer_call(mixer, 2, 5, "fp32", True)
    assert all(p.grad is not None for p in mixer.parameters() if p.requires_grad)
    _mixer_call(mixer, 1, 3, "bf16", False)
