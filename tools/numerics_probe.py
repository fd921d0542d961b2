"""Which library changes the bits, on this host: issue 42's table, measured here.

    python -m tools.numerics_probe [--steps 80] [--markdown docs/numerics-probe.md]

A small 2-layer attention language model (the fingerprint's softmax run: MQAR's cell, width
64, GELU feed-forward, dropout; seqmix/fingerprint.py) trained ``--steps`` AdamW steps on one
thread on one fixed batch, in a fresh process per setting, and the SHA-256 of its weights:
each library's pin on and off (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA), the host
made to look like one without AVX-512 (MKL_ENABLE_INSTRUCTIONS=AVX2 on top), seqmix's two
numerics, and the same with oneMKL dispatching as on the other vendor's CPUs (tools/mkl_vendor.py:
its vendor check answered the other way). Each row names the oneMKL branch and ATen capability
the process reported running, and its time (noisy where the machine is shared).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seqmix import numerics

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python -m tools.numerics_probe"

ATEN, MKL, ONEDNN = {"ATEN_CPU_CAPABILITY": "avx2"}, {"MKL_CBWR": "AVX2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PORTABLE = numerics.environment("portable")


def rows(other_vendor: str) -> list[tuple[str, dict, bool]]:
    """(setting, its variables, whether oneMKL dispatches as on ``other_vendor``'s CPUs)."""
    return [
        ("default, run twice", {}, False),
        ("`ATEN_CPU_CAPABILITY=avx2`", ATEN, False),
        ("`MKL_CBWR=AVX2`", MKL, False),
        ("`ONEDNN_MAX_CPU_ISA=AVX2`", ONEDNN, False),
        ("ATen and oneMKL pinned (AVX2)", {**ATEN, **MKL}, False),
        ("ATen, oneMKL and oneDNN pinned to AVX2", {**ATEN, **MKL, **ONEDNN}, False),
        ("the same, with oneMKL capped as on an AVX2-only host (`MKL_ENABLE_INSTRUCTIONS=AVX2`)",
         {**ATEN, **MKL, **ONEDNN, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, False),
        ("ATen's generic path (`ATEN_CPU_CAPABILITY=default`), oneMKL `COMPATIBLE`",
         {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}, False),
        ("seqmix `numerics: portable` (ATen, oneDNN AVX2, oneMKL `COMPATIBLE`, 1 thread)", PORTABLE, False),
        ("portable, on a host made to look AVX2-only", {**PORTABLE, **AVX2_ONLY}, False),
        (f"default, oneMKL dispatching as on {other_vendor}", {}, True),
        (f"ATen, oneMKL and oneDNN pinned to AVX2, oneMKL as on {other_vendor}", {**ATEN, **MKL, **ONEDNN}, True),
        (f"portable, oneMKL as on {other_vendor}", PORTABLE, True),
        (f"portable, oneMKL as on {other_vendor}, host made to look AVX2-only", {**PORTABLE, **AVX2_ONLY}, True),
    ]


def _child(steps: int) -> int:
    """Train the model, print its digest and what ran (JSON)."""
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
                      "aten": torch.backends.cpu.get_cpu_capability(), "mkl": provenance.mkl_branch()}))
    return 0


def probe(variables: dict, preload: Path | None, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES and k != "LD_PRELOAD"}
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH")]))
    if preload:
        env["LD_PRELOAD"] = str(preload)
    out = subprocess.run([sys.executable, "-m", "tools.numerics_probe", "--child", "--steps", str(steps)], cwd=REPO,
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" + edits" if git("status", "--porcelain", "--", "src", "tools") else "")


def main(argv: list[str] | None = None) -> int:
    from tools import mkl_vendor

    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--markdown", type=Path, default=None, help="write the page here (docs/numerics-probe.md)")
    a = p.parse_args(argv)
    if a.child:
        return _child(a.steps)
    intel_here = numerics.cpu_vendor() == "GenuineIntel"
    other = "AMD (Zen)" if intel_here else "Intel"
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        shim = mkl_vendor.build(tmp, intel=not intel_here)
        table = []
        for label, variables, flipped in rows(other):
            runs = [probe(variables, shim if flipped else None, a.steps) for _ in range(2 if "twice" in label else 1)]
            table.append((label, runs))
            print(f"{label}: {', '.join(r['digest'][:8] for r in runs)} (oneMKL {runs[0]['mkl']}, "
                  f"ATen {runs[0]['aten']}, {runs[0]['seconds']:.1f} s)", file=sys.stderr)
    flags = numerics.cpu_flags()
    isa = " ".join(f for f in flags if f.startswith(("avx", "fma", "amx")))
    import torch

    lines = [
        "# Which library changes the bits: issue 42's probe on this host", "",
        f"<!-- generated by `{COMMAND} --steps {a.steps} --markdown docs/numerics-probe.md`; do not edit by hand -->",
        f"Measured at commit {commit()} on {numerics.cpu_model()} ({numerics.cpu_vendor()}, {platform.node()}), "
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}; widest vector instruction set "
        f"{numerics.vector_isa(flags)} (flags: {isa}). Load average {load0:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs (times are noisy where it is above 1).", "",
        f"The fingerprint's softmax language model (seqmix/fingerprint.py: 2 layers, width 64, GELU feed-forward, "
        f"dropout 0.1, MQAR's cell) trained {a.steps} AdamW steps on one thread on one fixed batch, a fresh process "
        "per setting; the first 8 hex digits of the SHA-256 of its weights. oneMKL's branch and ATen's capability "
        "are what the process reported running (mkl_cbwr_get, torch.backends.cpu.get_cpu_capability). The rows "
        f"'as on {other}' run oneMKL with its vendor check answered the other way (tools/mkl_vendor.py): its "
        "dispatch as on such a CPU, the instructions on this one.", "",
        "| setting | weights' hash | oneMKL branch | ATen | seconds |", "|---|---|---|---|---|"]
    for label, runs in table:
        lines.append(f"| {label} | {', '.join('`' + r['digest'][:8] + '`' for r in runs)} | {runs[0]['mkl']} | "
                     f"{runs[0]['aten']} | {runs[0]['seconds']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
