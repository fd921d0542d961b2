"""seqmix.allocator: with freed memory kept, a training-sized tensor allocated again and
again stops page-faulting; with glibc's defaults (the control, SEQMIX_SYSTEM_MALLOC=1 read
by the CLI) every allocation faults.
glibc settles after a few allocations (8-9 here), so only the last four are judged."""

import os
import subprocess
import sys
import textwrap

from tests.conftest import skip_or_fail

PROBE = textwrap.dedent("""
    import resource, sys, torch
    from seqmix.cli.environment import keep_freed_memory_unless_asked  # what every command does first
    took = keep_freed_memory_unless_asked()
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    counts = []
    for _ in range(16):  # 64 MiB, above glibc's largest mmap threshold (32 MiB)
        before = faults()
        x = torch.empty(16 * 2**20)
        x.fill_(1.0)
        del x
        counts.append(faults() - before)
    print(int(took), max(counts[-4:]))
""")
PAGES = 64 * 2**20 // 4096


def probe(env_extra: dict) -> tuple[bool, int]:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return bool(int(out[0])), int(out[1])


def test_kept_memory_stops_the_page_faults_the_defaults_pay_every_time():
    took, kept = probe({"SEQMIX_SYSTEM_MALLOC": "0"})
    if not took:
        skip_or_fail("this C library has no mallopt (glibc's malloc only)", "SEQMIX_REQUIRE_MALLOPT")
    declined, default = probe({"SEQMIX_SYSTEM_MALLOC": "1"})
    assert not declined
    assert default > PAGES // 2, f"the control did not fault ({default} faults): the probe measures nothing"
    assert kept < PAGES // 20, f"{kept} page faults per 64 MiB allocation with memory kept"
