"""Several jobs on one GPU: ``python -m seqmix.slots CMD ...`` runs CMD in a slot of one of the
machine's GPUs, pinned there by ``CUDA_VISIBLE_DEVICES``.

A 13M-parameter model leaves an H100 mostly idle (its step waits on kernel launches), so
the workflow runs several training jobs on one GPU at once. Snakemake counts how many:
every training and evaluation job declares ``gpu_slots=1`` and `make` passes
``--resources gpu_slots=<GPUs × SLOTS_PER_GPU>``. Which GPU a job gets is decided here, by
one lock file per (GPU, slot index) in ``slot_dir()``: a job takes the lowest free slot index
over the GPUs in turn (GPU 0 slot 0, GPU 1 slot 0, ..., GPU 0 slot 1, ...), so jobs spread
evenly, and the lock (``flock``) is held by the job's own process (CMD replaces this one) until
it ends, however it ends: a killed job frees its slot.

The GPUs: ``$SEQMIX_GPUS`` (a comma list; any names, so that tests run fake ones on a CPU),
else the entries of ``$CUDA_VISIBLE_DEVICES`` (a SLURM allocation's), else nvidia-smi's.
None: CMD runs as it is, nothing pinned. The job finds its slot in ``$SEQMIX_GPU_SLOT``
(``<gpu>/<slot index>``; training writes it to provenance.json).

Standard library only: the Makefile asks ``python -m seqmix.slots --count`` before any
package is installed.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GPUS_ENV = "SEQMIX_GPUS"
SLOT_DIR_ENV = "SEQMIX_SLOT_DIR"
SLOT_ENV = "SEQMIX_GPU_SLOT"


def gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs jobs are spread over (module docstring), in order; [] on a machine without one."""
    env = os.environ if environ is None else environ
    for key in (GPUS_ENV, "CUDA_VISIBLE_DEVICES"):
        if key in env:
            return [g.strip() for g in env[key].split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def slot_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the slots' lock files live: ``$SEQMIX_SLOT_DIR``, else one folder per user in the
    machine's temporary directory (the GPUs are the machine's, whichever checkout runs)."""
    env = os.environ if environ is None else environ
    return Path(env.get(SLOT_DIR_ENV) or Path(tempfile.gettempdir()) / f"seqmix-gpu-slots-{os.getuid()}")


def acquire(devices: list[str], directory: Path) -> tuple[str, int, int]:
    """Lock the lowest free slot index over ``devices`` in turn: (gpu, slot index, the open
    lock file's descriptor, which holds the lock until it is closed or its process ends)."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in itertools.count():
        for gpu in devices:
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in gpu)
            fd = os.open(directory / f"gpu-{name}.slot-{index}", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return gpu, index, fd
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--count"]:
        print(len(gpus()))
        return 0
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0].startswith("-"):
        print("usage: python -m seqmix.slots [--] COMMAND [ARG ...]  |  python -m seqmix.slots --count",
              file=sys.stderr)
        return 2
    devices = gpus()
    env = dict(os.environ)
    if devices:
        gpu, index, fd = acquire(devices, slot_dir())
        os.set_inheritable(fd, True)  # the command holds the lock: it replaces this process
        env.update({"CUDA_VISIBLE_DEVICES": gpu, SLOT_ENV: f"{gpu}/{index}"})
    os.execvpe(args[0], args, env)


if __name__ == "__main__":
    sys.exit(main())
