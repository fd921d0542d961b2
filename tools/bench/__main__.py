"""``python -m tools.bench <command>``: the kernel bench, the GPU check and the step counter.

Each command runs as ``python -m seqmix``'s do (``seqmix.cli.run_command``: the environment
read first, a known failure one line), so that their outputs are what they were when they
were ``python -m seqmix bench <command>``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from seqmix.cli import run_command
from seqmix.errors import ConfigError

INTERPRET_ENV = "TRITON_INTERPRET"  # set to 1 for `kernels` and `gpu-check` on a machine without a GPU


def cmd_gpu_check(args) -> int:
    from tools.bench import gpucheck

    return gpucheck.run(smoke=args.cpu_smoke, out=Path(args.out) if args.out else None)


def cmd_steps(args) -> int:
    from tools.bench import steps

    if not args.arch or not args.point:
        raise ConfigError("bench steps needs --arch and --point (each repeatable), e.g. --arch h3 --point wikitext2")
    print(steps.run(args.baseline, args.arch, args.point, args.batch, args.rounds, args.steps,
                    progress=not args.quiet))
    return 0


def cmd_kernels(args) -> int:
    from tools.bench import kernels
    from tools.bench.launches import OPS

    unknown = sorted(set(args.op or ()) - set(OPS))
    if unknown:
        raise ConfigError(f"unknown --op {', '.join(unknown)}; choose from {', '.join(OPS)}")
    # without a GPU: interpreter smoke, exit 0
    return kernels.run(args.lengths, Path(args.out) if args.out else None, args.batch, args.dtype, args.op,
                       args.case_timeout, args.budget, args.interpret)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("kernels", help="Triton kernels vs references, SDPA and fla (GPU; CPU: smoke only)")
    sp.set_defaults(func=cmd_kernels, cpu_smoke=False)
    sp.add_argument("--lengths", type=int, nargs="+", default=None, help="L values (default 256..65536)")
    sp.add_argument("--out", default=None, help="the CSV (default results/bench/<gpu>/kernels.csv)")
    sp.add_argument("--batch", type=int, default=4)
    sp.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    sp.add_argument("--op", action="append", help="benchmark only this op (repeatable)")
    sp.add_argument("--case-timeout", type=float, default=60.0,
                    help="seconds one case (op, impl, L) may take; past it the case is a timeout row")
    sp.add_argument("--budget", type=float, default=3600.0, help="seconds the whole sweep may take")
    sp.add_argument("--interpret", action="store_true",
                    help="without a GPU: run the sweep under the Triton interpreter (times mean nothing)")

    sp = sub.add_parser("gpu-check", help="everything a GPU can tell in 8 minutes, into results/bench/<gpu>/ "
                        "(make gpu-check)")
    # native: a GPU machine's numerics (portable pins CPU libraries through a oneMKL shim that
    # needs a C compiler, which a GPU image may lack; the GPU's arithmetic is not pinned by it)
    sp.set_defaults(func=cmd_gpu_check, asked_numerics="native")
    sp.add_argument("--out", default=None, help="its directory (default results/bench/<gpu>)")
    sp.add_argument("--cpu-smoke", action="store_true",
                    help="every part at tiny sizes on the CPU (config/gpu-check-smoke.yaml), to "
                         "results/gpu-check-smoke/bench unless --out")

    sp = sub.add_parser("steps", help="a paper-shape training step's writes, bytes and CPU time, this checkout "
                        "beside --baseline")
    sp.set_defaults(func=cmd_steps)
    sp.add_argument("--baseline", default="main", help="the git revision to compare with")
    sp.add_argument("--arch", action="append", help="this architecture (repeatable)")
    sp.add_argument("--point", action="append", help="a task of config/paper.yaml (repeatable; "
                    "the CPU is timed at the first)")
    sp.add_argument("--batch", type=int, default=4, help="the CPU-timed batch")
    sp.add_argument("--rounds", type=int, default=3, help="timing rounds (the versions alternate)")
    sp.add_argument("--steps", type=int, default=1, help="timed training steps per case and round")
    sp.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("kernels", "gpu-check"):
        import torch

        # Triton chooses interpreter or compiler when it decorates a kernel, i.e. when a kernel
        # module is imported: decided here, before any is (the workers these commands start
        # inherit it).
        if not torch.cuda.is_available() or args.cpu_smoke:
            os.environ[INTERPRET_ENV] = "1"
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
