"""Which library changes the bits, on this host: issue 42's table, measured here.

    python -m tools.numerics_probe [--steps 80] [--scan] [--markdown docs/investigations/numerics-probe.md]

A small 2-layer attention language model (the fingerprint's softmax run: MQAR's cell, width
64, GELU feed-forward, dropout; seqmix/fingerprint.py) trained ``--steps`` AdamW steps on one
thread on one fixed batch, in a fresh process per setting, and the SHA-256 of its weights:
each library's pin on and off (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA), the host
made to look like one without AVX-512 (MKL_ENABLE_INSTRUCTIONS=AVX2 on top), seqmix's two
numerics, and the same with oneMKL's shim (seqmix/mkl_shim.c: what it answers and why), loaded
in the process as the CLI loads it or by LD_PRELOAD. Each row names the oneMKL branch and ATen capability the process reported running,
and its time (noisy where the machine is shared). Then oneMKL's single square root, the one
kernel of its AVX2 branch that ATen calls and that uses an approximate instruction
(``vrsqrtps``; why that matters: seqmix/mkl_shim.c's header): how many positive
floats it rounds otherwise than IEEE's square root, as torch.sqrt without the shim and with
it, and as tools/vml_sqrt.c recomputes it from ``vrsqrtps`` and from another approximation.
``--scan`` adds Mamba's fused CPU scan compiled here with other flags: whether its bits are
the compiler's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seqmix import mkl_shim, numerics

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python -m tools.numerics_probe"

ATEN, MKL, ONEDNN = {"ATEN_CPU_CAPABILITY": "avx2"}, {"MKL_CBWR": "AVX2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PORTABLE = numerics.environment("portable")
PINNED = {**ATEN, **MKL, **ONEDNN}
# How a row's process gets oneMKL's shim: not at all, loaded in the process before torch
# (as seqmix.cli.environment.pin_numerics does), or by the dynamic linker (LD_PRELOAD).
NONE, LOAD, PRELOAD = "", "load", "preload"


def rows() -> list[tuple[str, dict, str]]:
    """(setting, its variables, how the shim is loaded)."""
    portable = PORTABLE
    plain = [
        ("default, run twice", {}, NONE),
        ("`ATEN_CPU_CAPABILITY=avx2`", ATEN, NONE),
        ("`MKL_CBWR=AVX2`", MKL, NONE),
        ("`ONEDNN_MAX_CPU_ISA=AVX2`", ONEDNN, NONE),
        ("ATen and oneMKL pinned (AVX2)", {**ATEN, **MKL}, NONE),
        ("ATen, oneMKL and oneDNN pinned to AVX2", PINNED, NONE),
        ("the same, with oneMKL capped as on an AVX2-only host (`MKL_ENABLE_INSTRUCTIONS=AVX2`)",
         {**PINNED, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, NONE),
        ("ATen's generic path (`ATEN_CPU_CAPABILITY=default`), oneMKL `COMPATIBLE`",
         {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}, NONE),
        ("ATen, oneDNN AVX2, oneMKL `COMPATIBLE` (portable before, no shim)", {**PINNED, "MKL_CBWR": "COMPATIBLE"}, NONE),
        ("default, with the shim", {}, LOAD),
        ("ATen, oneMKL and oneDNN pinned to AVX2, with the shim", PINNED, LOAD),
        ("the same, `MKL_CBWR=AVX2,STRICT`", {**PINNED, "MKL_CBWR": "AVX2,STRICT"}, LOAD),
    ]
    seqmix = [
        ("seqmix `numerics: portable` (ATen, oneDNN and oneMKL capped at AVX2, `MKL_CBWR=AVX2,STRICT`, 1 thread, "
         "the shim loaded in the process)", portable, LOAD),
        ("portable, the shim by `LD_PRELOAD` instead", portable, PRELOAD),
        ("portable without the shim", portable, NONE),
        ("portable, on a host made to look AVX2-only", {**portable, **AVX2_ONLY}, LOAD),
        ("portable's variables but `MKL_ENABLE_INSTRUCTIONS=AVX512`", {**portable, "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
         LOAD),
    ]
    return plain + seqmix


def _child(steps: int, shim: bool) -> int:
    """Train the model, print its digest and what ran (JSON)."""
    if shim:  # as seqmix.cli.environment.pin_numerics does, before torch is imported
        mkl_shim.load()
    import torch

    from seqmix import fingerprint
    from seqmix.train import provenance

    torch.set_num_threads(1)
    spec = next(s for s in fingerprint.specs("native") if s.arch == "softmax")
    run = fingerprint.trainer(spec)
    t0 = time.perf_counter()
    for _ in range(steps):
        run.step()
    print(json.dumps({"digest": fingerprint.weights_digest(run.model), "seconds": time.perf_counter() - t0,
                      "aten": torch.backends.cpu.get_cpu_capability(), "mkl": provenance.mkl_branch(),
                      "shim": mkl_shim.loaded()}))
    return 0


NORMALS = (0x00800000, 0x7F800000)  # the bit patterns of the positive normal floats


def _sqrt_child(shim: bool) -> int:
    """Count the positive normal floats whose torch.sqrt differs from the correctly rounded one."""
    if shim:
        mkl_shim.load()
    import numpy as np
    import torch

    from seqmix.train import provenance

    torch.set_num_threads(1)
    wrong, largest, step = 0, 0.0, 1 << 24
    for start in range(NORMALS[0], NORMALS[1], step):
        x = np.arange(start, min(start + step, NORMALS[1]), dtype=np.uint32).view(np.float32)
        exact = np.sqrt(x.astype(np.float64)).astype(np.float32)  # a float's square root, rounded once
        off = torch.sqrt(torch.from_numpy(x)).numpy().view(np.uint32) != exact.view(np.uint32)
        wrong, largest = wrong + int(off.sum()), max([largest, *x[off][-1:].tolist()])
    print(json.dumps({"floats": NORMALS[1] - NORMALS[0], "not_correctly_rounded": wrong, "largest": largest,
                      "mkl": provenance.mkl_branch()}))
    return 0


def sqrt_rounding() -> dict:
    """torch.sqrt under portable's variables without the shim, with its vendor answer alone and
    with it whole; and tools/vml_sqrt.c ("recomputed": None where this CPU lacks AVX-512F)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        vendor = mkl_shim.build(Path(tmp), vendor_check_only=True)  # oneMKL's own square root
        for name, shim in (("none", NONE), ("vendor", PRELOAD), ("shim", LOAD)):
            env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"}
            env.update(PORTABLE, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
            if shim == PRELOAD:
                env["LD_PRELOAD"] = str(vendor)
            command = [sys.executable, "-m", "tools.numerics_probe", "--sqrt-child"] + (["--shim"] if shim == LOAD else [])
            out[name] = json.loads(subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                                                  check=True).stdout.strip().splitlines()[-1])
        out["recomputed"] = None
        if "avx512f" in numerics.cpu_flags():
            binary = Path(tmp) / "vml_sqrt"
            subprocess.run([mkl_shim.compiler(), "-O2", "-mavx2", "-mfma", "-mavx512f", "-o", str(binary),
                            str(REPO / "tools" / "vml_sqrt.c"), "-lm"], check=True)
            out["recomputed"] = json.loads(subprocess.run([str(binary)], capture_output=True, text=True,
                                                          check=True).stdout)
    return out


def sqrt_markdown(found: dict) -> list[str]:
    def largest(r):
        return f"{r['largest']:.3g} (2^{math.log2(r['largest']):.1f})" if r["largest"] else "none"

    rows = [("without the shim", found["none"]), ("the shim's vendor answer alone: oneMKL's own, AVX2 branch",
                                                  found["vendor"]), ("with the shim: IEEE's", found["shim"])]
    lines = ["", "## oneMKL's single square root", "",
             f"Over all {found['none']['floats']:,} positive normal floats, the square roots torch.sqrt (oneMKL's "
             "`vmsSqrt`) rounds otherwise than IEEE's, under portable's variables, and the largest such input:", "",
             "| torch.sqrt | oneMKL branch | not correctly rounded | largest such input |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['mkl']} | {r['not_correctly_rounded']:,} | {largest(r)} |" for name, r in rows]
    if found["vendor"]["largest"]:
        lines += ["", "On the AVX2 branch oneMKL's square root is correctly rounded above that input; below it its "
                  "refinement's products underflow. AdamW's second moment falls there where a parameter's gradients "
                  f"stay below about {math.sqrt(found['vendor']['largest']):.0e}."]
    if again := found["recomputed"]:
        wrong, other = again["not_correctly_rounded"], again["differ_from_vrsqrtps"]
        lines += ["", "tools/vml_sqrt.c recomputes oneMKL's AVX2 kernel (`vrsqrtps`, then one Newton step and a "
                  "fused correction) from three first approximations of 1/sqrt(x):", "",
                  "| first approximation | not correctly rounded | differ from the `vrsqrtps` one |", "|---|---|---|",
                  f"| this CPU's `vrsqrtps` | {wrong['vrsqrtps']:,} | 0 |",
                  f"| `vrsqrt14ps` (AVX-512's, another within the same bound) | {wrong['vrsqrt14ps']:,} | "
                  f"{other['vrsqrt14ps']:,} |",
                  f"| 1/sqrt(x) rounded to float | {wrong['exact']:,} | {other['exact']:,} |", "",
                  "Which square roots the kernel rounds otherwise depends on the approximation it starts from, and "
                  "`vrsqrtps` approximates differently on each vendor's CPUs: without the shim's square root, a host "
                  "of another vendor would round other small square roots otherwise."]
    return lines


# Mamba's fused CPU scan built as kernels/selective_scan_cpu.py builds it, and with other flags.
SCAN_BUILDS = {"as built (-O3 -ffast-math)": ["-O3", "-ffast-math", "-fopenmp-simd", "-mavx2", "-mfma"],
               "-O2 -ffast-math": ["-O2", "-ffast-math", "-fopenmp-simd", "-mavx2", "-mfma"],
               "-O3, no -ffast-math": ["-O3", "-fopenmp-simd", "-mavx2", "-mfma"]}


def scan_builds() -> dict[str, dict]:
    """For each build of the scan's source: the digests of its forward and backward on one fixed
    input of the quick profile's MQAR shape (d 128), and the backward's time."""
    import hashlib

    import torch
    from torch.utils.cpp_extension import load

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    Bt, L, D, N = 128, 48, 128, 16
    x, delta = torch.randn(Bt, L, D, generator=g), torch.rand(Bt, L, D, generator=g) * 0.5
    At, B, C = -2 * torch.rand(N, D, generator=g), torch.randn(Bt, L, N, generator=g), torch.randn(Bt, L, N, generator=g)
    gy = torch.randn(Bt, L, D, generator=g)

    def digest(*ts):
        return hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in ts)).hexdigest()[:8]

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, flags) in enumerate(SCAN_BUILDS.items()):
            (Path(tmp) / str(i)).mkdir()
            ext = load(name=f"probe_scan_{i}", sources=[str(REPO / "kernels" / "selective_scan_cpu.cpp")],
                       extra_cflags=flags, build_directory=str(Path(tmp) / str(i)))
            y, checkpoints = ext.forward(x, delta, At, B, C, 16)
            t0 = time.perf_counter()
            grads = ext.backward(gy, x, delta, At, B, C, checkpoints, 16)
            out[name] = {"forward": digest(y), "backward": digest(*grads), "ms": 1e3 * (time.perf_counter() - t0)}
    return out


def scan_markdown(builds: dict[str, dict]) -> list[str]:
    import subprocess as sp

    cxx = sp.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[:1] or ["c++ unknown"]
    lines = ["", "## Mamba's fused CPU scan, built with other flags", "",
             f"kernels/selective_scan_cpu.cpp compiled here ({cxx[0]}, {platform.libc_ver()[0]} "
             f"{platform.libc_ver()[1]}) as training builds it and with other flags, then run once forward and "
             f"backward on one fixed input (batch 128, length 48, width 128, state 16): the first 8 hex digits of "
             "the SHA-256 of its outputs, and the backward's time.", "",
             "| build | forward | backward | backward ms |", "|---|---|---|---|"]
    lines += [f"| {name} | `{b['forward']}` | `{b['backward']}` | {b['ms']:.0f} |" for name, b in builds.items()]
    return lines


def probe(variables: dict, shim: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"}
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH")]))
    if shim == PRELOAD:
        env["LD_PRELOAD"] = str(mkl_shim.build())
    command = [sys.executable, "-m", "tools.numerics_probe", "--child", "--steps", str(steps)]
    out = subprocess.run(command + (["--shim"] if shim == LOAD else []), cwd=REPO, env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" + edits" if git("status", "--porcelain", "--", "src", "tools") else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sqrt-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scan", action="store_true", help="also build Mamba's fused CPU scan with other flags (minutes)")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--markdown", type=Path, default=None, help="write the page here (docs/investigations/numerics-probe.md)")
    a = p.parse_args(argv)
    if a.child:
        return _child(a.steps, a.shim)
    if a.sqrt_child:
        return _sqrt_child(a.shim)
    load0 = os.getloadavg()[0]
    table = []
    for label, variables, shim in rows():
        runs = [probe(variables, shim, a.steps) for _ in range(2 if "twice" in label else 1)]
        table.append((label, runs))
        print(f"{label}: {', '.join(r['digest'][:8] for r in runs)} (oneMKL {runs[0]['mkl']}, "
              f"ATen {runs[0]['aten']}, {runs[0]['seconds']:.1f} s)", file=sys.stderr)
    found = sqrt_rounding()
    builds = scan_builds() if a.scan else {}
    flags = numerics.cpu_flags()
    isa = " ".join(f for f in flags if f.startswith(("avx", "fma", "amx")))
    import torch

    shim_text = ("The rows 'with the shim' run oneMKL with its shim loaded (seqmix/mkl_shim.c: what it answers and "
                 "why; what portable loads on every host): its dispatch as on an Intel CPU, "
                 "the instructions on this one.")
    lines = [
        "# Which library changes the bits: issue 42's probe on this host", "",
        f"<!-- generated by `{COMMAND} --steps {a.steps}{' --scan' if a.scan else ''} --markdown docs/investigations/numerics-probe.md`; "
        "do not edit by hand -->",
        f"Measured at commit {commit()} on {numerics.cpu_model()} ({numerics.cpu_vendor()}, {platform.node()}), "
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}; widest vector instruction set "
        f"{numerics.vector_isa(flags)} (flags: {isa}). Load average {load0:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs (times are noisy where it is above 1).", "",
        f"The fingerprint's softmax language model (seqmix/fingerprint.py: 2 layers, width 64, GELU feed-forward, "
        f"dropout 0.1, MQAR's cell) trained {a.steps} AdamW steps on one thread on one fixed batch, a fresh process "
        "per setting; the first 8 hex digits of the SHA-256 of its weights. oneMKL's branch and ATen's capability "
        "are what the process reported running (mkl_cbwr_get, torch.backends.cpu.get_cpu_capability). "
        + shim_text, "",
        "| setting | weights' hash | oneMKL branch | ATen | seconds |", "|---|---|---|---|---|"]
    for label, runs in table:
        lines.append(f"| {label} | {', '.join('`' + r['digest'][:8] + '`' for r in runs)} | {runs[0]['mkl']} | "
                     f"{runs[0]['aten']} | {runs[0]['seconds']:.1f} |")
    text = "\n".join(lines + sqrt_markdown(found) + (scan_markdown(builds) if builds else [])) + "\n"
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
