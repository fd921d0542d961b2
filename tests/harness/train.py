"""`python -m seqmix train ...` that stops at an event a test waits for, so that the test acts
on what the process did, never on when (tests run it directly; `python` beside this file
runs it for the workflow's training jobs):

- SEQMIX_TEST_HOLD=<file>: once it has saved its SEQMIX_TEST_HOLD_AFTER-th checkpoint (1 if
  unset), the process writes <file> (the step it saved) and waits there to be killed. Only
  the process that claims <file> first holds; a rerun or a resubmitted job runs through.
- SEQMIX_TEST_BARRIER=<dir>, SEQMIX_TEST_BARRIER_COUNT=<n>: the first n processes each take
  a ticket in <dir> (holding their GPU slot, whose name the ticket holds) and wait until
  all n have one: n jobs run at once, however loaded the machine.

Either wait ends after SEQMIX_TEST_WAIT_S seconds (600 if unset) with exit status 3, so
that a test that fails before it acts leaves no process behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

WAIT_S = float(os.environ.get("SEQMIX_TEST_WAIT_S", "600"))


def claim(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` if no process has (readers never see it half written)."""
    try:
        os.close(os.open(path.with_name(path.name + ".claimed"), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)
    return True


def wait_until(done) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            print(f"tests/harness/train.py: nobody acted within {WAIT_S:.0f} s", file=sys.stderr)
            os._exit(3)
        time.sleep(0.05)


def hold_after_checkpoint(marker: Path, after: int) -> None:
    from seqmix.train import loop

    save, saved = loop.save_checkpoint, []

    def save_then_hold(run) -> None:
        save(run)
        saved.append(run.state.step)
        if len(saved) == after and claim(marker, f"{run.state.step}\n"):
            wait_until(lambda: False)  # killed here

    loop.save_checkpoint = save_then_hold


def barrier(directory: Path, count: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ticket = next((k for k in range(count) if claim(directory / str(k), os.environ.get("SEQMIX_GPU_SLOT", ""))), None)
    if ticket is not None:
        wait_until(lambda: all((directory / str(k)).exists() for k in range(count)))


if __name__ == "__main__":
    from seqmix import cli
    from seqmix.cli.environment import pin_numerics

    # The study's numerics first, as `python -m seqmix` pins them: before the hold below
    # imports the training loop, hence torch (a process that imported it runs unpinned).
    args = cli.build_parser().parse_args(sys.argv[1:])
    pin_numerics(args)
    if os.environ.get("SEQMIX_TEST_HOLD"):
        hold_after_checkpoint(Path(os.environ["SEQMIX_TEST_HOLD"]), int(os.environ.get("SEQMIX_TEST_HOLD_AFTER", "1")))
    if os.environ.get("SEQMIX_TEST_BARRIER"):
        barrier(Path(os.environ["SEQMIX_TEST_BARRIER"]), int(os.environ["SEQMIX_TEST_BARRIER_COUNT"]))
    sys.exit(cli.run_command(args))
