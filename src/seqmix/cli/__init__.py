"""`python -m seqmix <command>`: the one command line every Snakemake rule calls.

Each command reads its job spec (``--spec``: the JSON the Snakefile passes, what that job
reads and nothing else) or builds it from a study config (``--config``: a YAML file, or a
JSON object), calls one library function with it, and writes files; nothing here holds
results in memory between commands. Run ``python -m seqmix <command> --help`` for each
command's options.

The command line by concern: ``parser`` (the commands' options), ``commands`` (one function
each), ``inputs`` (what a command reads, each once: its spec, its run or its study, and the
numerics it runs under), ``environment`` (the environment read, the study's numerics pinned
before torch is imported, and the process's global settings made from both). Nothing at the
top of these modules imports torch (a test keeps that so).
"""

from __future__ import annotations

import sys

from seqmix.cli import environment
from seqmix.cli.parser import build_parser
from seqmix.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    """Run one command; a known failure (bad config or spec, bad data, a file that cannot be
    read or written, a run directory in use) prints one line naming the cause and the fix."""
    return run_command(build_parser().parse_args(argv))


def run_command(args) -> int:
    """Run a parsed command (this parser's, or ``python -m tools.bench``'s) after
    ``environment.configure``; a known failure is one line and its exit status."""
    try:
        environment.configure(args)  # its numerics pinned before anything imports torch
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from seqmix.data.manifest import DataError
    from seqmix.io import FileError, write_failure

    try:
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except FileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 4
    except Exception as e:
        # A write outside seqmix.io's writers (mkdir, a library's own file), its errno also
        # where torch or pandas wrapped it in another exception.
        clear = write_failure(e)
        if clear is None:
            raise
        print(f"error: {clear}", file=sys.stderr)
        return 4
