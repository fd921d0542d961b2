"""Compile every Triton kernel for sm_80 and sm_90 at every launch the project makes, on a CPU.

``python -m tools.bench.compile_check [--arch 80 90] [--source ...] [--kernel ...]
[--json FILE] [--jobs N]`` prints kernel × specialisation × arch -> ok or the compiler's first
error lines, and exits 1 if a launch fails to compile or a kernel has no case (issue 24).
The launches come from ``compile_cases``; ``compile_jit`` records, specialises and compiles
them. tests/kernels/test_kernel_compile.py runs it with the pinned Triton, ``make
kernels-compile-check`` with the oldest supported one (3.6.0). Triton's on-disk cache
(``TRITON_CACHE_DIR``) makes a second run fast.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

from seqmix.mixers import triton_kernels
from tools.bench.compile_cases import SOURCES
from tools.bench.compile_jit import (  # noqa: F401 - re-exported for tests
    TARGETS,
    Launch,
    _Pointer,
    compile_all,
    compile_one,
    jit_kernels,
    record,
    specialise,
)
from tools.bench.launches import kernel_launches

# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def describe(data: str) -> tuple[str, str]:
    """(kernel, specialisation) of a serialised launch, target left out: integers and
    pointers with their type and ``%16`` where Triton assumes a multiple of 16,
    constexprs as ``name=value``, then num_warps / num_stages."""
    d = json.loads(data)
    names = list(d["signature"])
    consts = {names[k[0]]: v for k, v in zip(d["constant_keys"], d["constant_vals"]) if len(k) == 1}
    div = {names[k[0]] for k, v in zip(d["attrs_keys"], d["attrs_vals"]) if ["tt.divisibility", 16] in v}
    parts = []
    for name, ty in d["signature"].items():
        if ty == "constexpr":
            val = consts.get(name)
            parts.append(f"{name}={val['constexpr'] if isinstance(val, dict) and 'constexpr' in val else val}")
        else:
            parts.append(f"{name}:{ty}{'%16' if name in div else ''}")
    opts = d["options"]
    parts.append(f"warps={opts.get('num_warps')} stages={opts.get('num_stages')}")
    return d["name"].removeprefix("seqmix.kernels."), " ".join(parts)


def rows_of(results: dict[int, list[tuple[str, list[str], str, float]]]) -> list[dict]:
    """One row per (kernel, specialisation) with the status on every target; ``results``:
    {arch: [(specialisation data, origins, status, seconds)]}."""
    rows: dict[tuple[str, str], dict] = {}
    for arch, got in results.items():
        for data, origins, status, seconds in got:
            kernel, spec = describe(data)
            row = rows.setdefault((kernel, spec), {"kernel": kernel, "specialisation": spec, "origins": []})
            row[f"sm_{arch}"] = status
            row[f"sm_{arch}_s"] = round(seconds, 2)
            row["origins"] += [o for o in origins if o not in row["origins"]]
    return sorted(rows.values(), key=lambda r: (r["kernel"], r["specialisation"]))


def format_table(rows: list[dict], archs: list[int], width: int = 60) -> str:
    head = ["kernel", "specialisation", "first case (of n)", *[f"sm_{a}" for a in archs]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        first = f"{r['origins'][0]} (of {len(r['origins'])})"
        cells = [r["kernel"], r["specialisation"], first,
                 *[(r.get(f"sm_{a}", "-") if r.get(f"sm_{a}", "-") == "ok" else r.get(f"sm_{a}", "-")[:400])
                   for a in archs]]
        lines.append("| " + " | ".join(c.replace("|", "/") if i == len(cells) - 1 else c
                                        for i, c in enumerate(cells)) + " |")
    return "\n".join(lines)


def uncovered(modules: list, rows: list[dict]) -> list[str]:
    """Module-level kernels no case launched and no kernel calls."""
    launched = {r["kernel"] for r in rows}
    missing = []
    for module in modules:
        kernels = jit_kernels(module)
        sources = " ".join(k.src for k in kernels.values())
        for name in kernels:
            full = f"{module.__name__.removeprefix('seqmix.kernels.')}.{name}"
            if full not in launched and not re.search(rf"\b{name}\(", sources):
                missing.append(full)
    return missing


def check(archs: list[int], sources: list[str], out: Path | None = None, jobs: int = 1,
          kernels: list[str] | None = None, progress=print) -> int:
    import importlib

    import triton

    try:
        declared = {name: k for name, (k, _) in kernel_launches().items()}
    except LookupError as e:  # a declared Triton kernel the tools cannot launch yet
        progress(str(e))
        return 1
    modules = [importlib.import_module(k.module) for k in declared.values()]
    chosen = [declared[k].module for k in (kernels or declared)]
    started = time.time()
    cases = [c for s in sources for c in SOURCES[s]()]
    launches, errors = record(cases, modules, set(chosen))
    problems = [f"case failed to run: {e}" for e in errors]
    progress(f"{len(cases)} cases ({', '.join(sources)}): {len(launches)} distinct launches recorded in "
             f"{time.time() - started:.0f} s")
    specs = {arch: specialise(arch, launches) for arch in archs}
    tasks = [(arch, f"{k.fn.__module__}:{k.fn.__name__}", data) for arch in archs for data, (k, _) in specs[arch].items()]
    t0 = time.time()
    done = iter(compile_all(tasks, jobs))
    results = {arch: [(data, origins, *next(done)) for data, (_, origins) in specs[arch].items()] for arch in archs}
    progress(f"{len(tasks)} compiles ({', '.join(f'sm_{a}: {len(specs[a])}' for a in archs)}) in "
             f"{time.time() - t0:.0f} s with {jobs} process(es)")
    rows = rows_of(results)
    problems += [f"{m}: no case launches it (add its launches to tools.bench.launches.LAUNCHES)"
                 for m in uncovered([m for m in modules if m.__name__ in chosen], rows)]
    failed = [r for r in rows if any(r.get(f"sm_{a}") != "ok" for a in archs)]
    progress(f"Triton {triton.__version__}, torch {torch.__version__}: {len(rows)} kernel specialisations, "
             f"targets {', '.join(f'sm_{a}' for a in archs)}: {len(rows) - len(failed)} compile everywhere, "
             f"{len(failed)} fail; {time.time() - started:.0f} s in all")
    progress(format_table(rows, archs))
    for p in problems:
        progress(p)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"triton": triton.__version__, "torch": torch.__version__, "archs": archs,
                                   "sources": sources, "cases": len(cases), "launches": len(launches),
                                   "compiles": len(tasks), "seconds": round(time.time() - started, 1),
                                   "problems": problems, "rows": rows}, indent=1))
    return 1 if failed or problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.compile_check", description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, nargs="+", choices=sorted(TARGETS), default=sorted(TARGETS),
                   help="compute capabilities to compile for")
    p.add_argument("--source", nargs="+", choices=list(SOURCES), default=list(SOURCES), help="where the launches come from")
    p.add_argument("--json", type=Path, default=None, help="write the table and the problems here")
    p.add_argument("--jobs", type=int, default=1, help="compile in this many worker processes")
    p.add_argument("--kernel", nargs="+", choices=list(triton_kernels()), default=None, help="only these kernel modules")
    args = p.parse_args(argv)
    return check(args.arch, args.source, args.json, args.jobs, args.kernel)


if __name__ == "__main__":
    sys.exit(main())
