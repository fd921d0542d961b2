"""`python -m seqmix fingerprint`: the bits this host's training gives under a study's numerics.

A few training steps of every catalogued mixer (config/fingerprint.yaml: the quick profile's
MQAR cell at width 64 with a feed-forward, so that a step makes every library call a study's
training makes: oneMKL's matrix products and FFTs, oneDNN's conv1d and GELU, ATen's kernels,
dropout; a mixer without a causal form on a small SNLI classifier), on one thread, one fixed
batch, then the SHA-256 of each model's weights and one of them all. Two hosts whose
fingerprints agree train every mixer to the same bits; docs/reference/hosts.md keeps the hosts
measured, tests/core/test_numerics.py checks this host against them. Seconds, not minutes: no
data is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import torch

from seqmix import REPO_ROOT, catalogue, numerics
from seqmix.study.jobs import TrainJob

# The prose of docs/reference/hosts.md around its generated tables: what a fingerprint shows and what not.
HOSTS_NOTES = """\
`numerics: portable` (the default) pins ATen to its AVX2 kernels, oneDNN to AVX2 and oneMKL to
its AVX2 conditional-numerical-reproducibility branch in STRICT mode, capped at AVX2, on one
thread, and loads into every job oneMKL's shim, built with the machine's C compiler once (what
it answers and why: seqmix/mkl_shim.c). A host needs x86-64 with AVX2 and FMA and a C compiler.
Every such host should give the portable fingerprint below with the same torch version: one that
differs is a defect of the pinning to find on that host (`python -m tools.numerics_probe` tells
which library moves the bits), not a value to record, and `--record` refuses it, naming the
mixers; tests/core/test_numerics.py checks this host against the entries and every pair of entries of
one torch version against each other. `native` fingerprints are listed for comparison: they
differ between hosts of other instruction sets or vendors.

What is known per library (the evidence: docs/investigations/numerics-probe.md, tests/core/test_numerics.py):

- oneMKL (why it needs the shim: its vendor check, explained once in seqmix/mkl_shim.c's
  header): natively on an AMD EPYC (Zen 5) `perf report` names `mkl_blas_def_sgemm_kernel_0_zen`,
  a Zen kernel of its generic branch, where an Intel CPU runs `mkl_blas_avx512_*`; asked for its
  AVX2 branch without the shim it reports AUTO and runs the Zen kernels. With the shim it reports
  `AVX2,STRICT` on AMD and runs `mkl_blas_avx2_sgemm_kernel_0_cnr`, `mkl_dft_avx2_*` and
  `mkl_vml_kernel_s*_L9HAynn`, Intel's AVX2 kernels; the weights are the same whether the shim is
  loaded in the process (as seqmix does) or by `LD_PRELOAD`, and differ without it.
- In the wheel's oneMKL (`objdump -d` of libtorch_cpu.so) no matrix-product or FFT kernel uses an
  approximate instruction (`rcpps`, `rsqrtps`), nor the vector exp, log and tanh ATen calls; the
  single square root does (`vmsSqrt`, AVX2: one Newton step from `vrsqrtps`), which the shim
  replaces. Not yet seen on an Intel host.
- A cap of oneMKL's instructions set from outside overrides its reproducibility branch: with
  `MKL_ENABLE_INSTRUCTIONS=AVX512` oneMKL still reports AVX2 but gives the bits of its AVX-512
  branch, so portable sets `MKL_ENABLE_INSTRUCTIONS=AVX2` itself (which changes nothing under the
  AVX2 branch). Whether an Intel CPU whose best is plain AVX-512 does the same unasked is not
  known.
- STRICT changes every mixer's bits against the same branch without it, and keeps a matrix
  product's bits when the thread count changes, which the branch alone does not (a 64 x 6,144 x
  64 product differs between 1 and 2 threads without STRICT); it costs little
  (docs/costs/numerics-cost.md).
- ATen at a fixed capability and oneDNN capped at AVX2 choose their kernels from the CPU's flags,
  not its vendor (oneDNN's AMD-only paths need AVX-512); the JIT kernels oneDNN generated for the
  fingerprint use no approximate instruction (`ONEDNN_JIT_DUMP`). Capping ATen, oneDNN, oneMKL
  and glibc's own dispatch as on an AVX2-only host leaves the portable fingerprint unchanged.
- Mamba's fused CPU scan is compiled on each host (g++ -O3 -ffast-math -fopenmp-simd -mavx2
  -mfma; kernels/selective_scan_cpu.py) and calls glibc's vector exp (libmvec) in its loops: its
  bits are the compiler's and glibc's, the same on hosts with the same ones, whatever their
  vendor. -ffast-math is the risk there: it leaves the order of the scan's sums and its
  contractions to the compiler, and built at -O2 instead of -O3 its backward already gives other
  bits (docs/investigations/numerics-probe.md); without it the loops do not vectorise (no vector exp) and run
  several times slower. A host with another compiler version or glibc can differ in Mamba alone.
  The extension is linked without -ffast-math, so it does not turn on flush-to-zero for the
  process.
- An Intel Xeon with AVX-512 and AMX, and an AMD EPYC that exposes AVX2 but not AVX-512, give the
  portable fingerprint of the AMD EPYC with AVX-512 in every mixer; natively each gives other bits
  (the entries below). Not yet recorded: a host with another compiler or glibc, or another torch
  version. Add one: `python -m seqmix fingerprint --numerics portable --out FILE` on it, then
  `python -m seqmix fingerprint --record docs/reference/hosts.md --from FILE` here.
"""
CONFIG = REPO_ROOT / "config" / "fingerprint.yaml"  # the models, their shapes and steps
ALL = "all"  # the line that hashes every mixer's


def specs(mode: str) -> list[TrainJob]:
    """One run spec per catalogued mixer, in the catalogue's order: its run on the first task of
    config/fingerprint.yaml that trains it."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study

    expansion = expand(load_study(CONFIG, {"numerics": mode, "architectures": catalogue.mixer_names()}))
    first = {}
    for r in expansion.runs:
        first.setdefault(r.arch, r)
    return [expansion.run_spec(first[name].task, name, first[name].seed) for name in catalogue.mixer_names()]


@dataclasses.dataclass
class Trainer:
    """A run's model, optimiser and training step on one fixed batch of its shapes (what
    ``seqmix.train.loop`` does per step, without data files, checkpoints or evaluation)."""

    spec: TrainJob
    model: torch.nn.Module
    step: Any  # () -> loss


def trainer(spec: TrainJob, batch_size: int | None = None) -> Trainer:
    """The run of ``spec`` built as training builds it (seeded, budget solved), stepping on
    ``task.example_batch`` at ``batch_size`` (default: the run's)."""
    from seqmix.tasks import task_class
    from seqmix.train.loop import build_for_spec, lr_lambda, make_optimizer
    from seqmix.train.step import optimizer_step, step_loss

    device = torch.device("cpu")
    task = task_class(spec.kind).without_data(spec)
    model, _ = build_for_spec(spec, task)
    opt = make_optimizer(model, spec.train)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(spec.train))
    loss_of = step_loss(task, model, device, spec.train)
    batch = task.example_batch(batch_size or spec.train.batch_size, device)
    torch.manual_seed(spec.seed + 1)  # the dropout stream, as a fresh run seeds it

    def step() -> float:
        model.train()
        loss, _ = optimizer_step(loss_of, model, opt, spec.train.grad_clip, batch)
        sched.step()
        return loss

    return Trainer(spec, model, step)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer: names, shapes, dtypes and bytes."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(mode: str) -> dict[str, str]:
    """{mixer: digest of its weights after its training steps, ..., "all": digest of those}, trained
    in this process (whose libraries the CLI pinned for ``mode`` before torch was imported)."""
    torch.set_num_threads(1)
    digests = {}
    for spec in specs(mode):
        run = trainer(spec)
        for _ in range(spec.train.steps):
            run.step()
        digests[spec.arch] = weights_digest(run.model)
    digests[ALL] = hashlib.sha256("".join(digests.values()).encode()).hexdigest()
    return digests


def lines(digests: dict[str, str], width: int = 16) -> list[str]:
    """What the command prints: one line per mixer in the catalogue's order and one for all,
    digests cut to ``width``."""
    order = [*catalogue.mixer_names(), ALL]
    names = sorted(digests, key=lambda n: (order.index(n) if n in order else len(order), n))
    return [f"{name:<15} {digests[name][:width]}" for name in names]


def host_record(mode: str) -> dict[str, str]:
    """The host a fingerprint was made on, as docs/reference/hosts.md lists it."""
    flags = numerics.cpu_flags()
    return {"cpu": numerics.cpu_model(), "vendor": numerics.cpu_vendor(), "vector_isa": numerics.vector_isa(flags),
            "flags": " ".join(f for f in flags if f.startswith(("avx", "fma", "sse", "amx"))), "mode": mode}


def toolchain(cxx: str = "c++") -> dict[str, str | None]:
    """The C++ compiler ``cxx`` that builds Mamba's fused CPU scan on this host (torch's
    extension builder's: $CXX, else c++, as seqmix.cli.environment.compiler reads it) and the
    glibc whose vector exp it calls: that mixer's bits are theirs (docs/reference/hosts.md). None where
    there is none."""
    import subprocess

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = ""
    return {"compiler": version.splitlines()[0] if version else None,
            "glibc": os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else None}


def measure(mode: str, cxx: str = "c++") -> dict[str, Any]:
    """This host's fingerprint under ``mode`` as `--out` writes it: the host, its toolchain, the
    digests in full, the code they depend on and the numerics that ran (trained in this process,
    whose libraries the CLI pinned before torch was imported)."""
    import datetime

    from seqmix.train import provenance

    digests = fingerprint(mode)
    state = provenance.numerics_record()
    found = sources()
    return {**host_record(mode), "pinned": state["pinned"], "date": datetime.date.today().isoformat(),
            "commit": commit_of(found), "torch": torch.__version__, **toolchain(cxx), "digests": digests,
            "sources": found, "numerics": state}


def sources() -> dict[str, str]:
    """{file: digest} of the code a fingerprint depends on: this module and what every mixer's
    training imports (seqmix.sources). A recorded fingerprint made by other code is stale, not
    a defect of the pinning."""
    from seqmix.sources import closure, digests, run_modules

    modules = {__name__, *(m for s in specs(numerics.DEFAULT) for m in run_modules(s.arch, s.kind))}
    return digests([*closure(sorted(modules)), CONFIG])


def commit_of(sources: dict[str, str]) -> str:
    """The checkout's commit, with " + edits" where one of ``sources`` differs from it."""
    import subprocess

    def git(*args) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)

    head = git("rev-parse", "HEAD").stdout.strip()
    if not head:
        return "unknown"
    inside = [f for f in sources if not f.startswith("/")]
    return head + (" + edits" if git("diff", "--quiet", "HEAD", "--", *inside).returncode else "")


# ------------------------------------------------------------------------------------------
# docs/reference/hosts.md: every host a fingerprint was recorded on, generated from the JSON it keeps.
# ------------------------------------------------------------------------------------------

HOSTS_BEGIN, HOSTS_END = "<!-- hosts:", "-->"
# What an entry keeps of a fingerprint (`--out`'s JSON): the host, its toolchain, the digests cut
# to 16 hex digits and the code they depend on. torch, compiler and glibc: None in a fingerprint
# made before they were recorded.
HOST_KEYS = ("cpu", "vendor", "vector_isa", "flags", "mode", "pinned", "date", "commit")
TOOLCHAIN_KEYS = ("torch", "compiler", "glibc")
PROBE = "python -m tools.numerics_probe"  # what tells which library moves the bits on a host


def read_hosts(path) -> list[dict]:
    """The entries a hosts file keeps (its JSON comment); [] where there is none."""
    from pathlib import Path

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    start = text.find(HOSTS_BEGIN)
    if start < 0:
        return []
    import json

    return json.loads(text[start + len(HOSTS_BEGIN):text.index(HOSTS_END, start)])


def entry_of(found: dict, where: str = "the fingerprint") -> dict:
    """The hosts file's entry for a fingerprint as `--out` writes it (``measure``), from this
    host or another; ConfigError naming ``where`` for a JSON that is not one."""
    from seqmix.errors import ConfigError

    missing = [k for k in (*HOST_KEYS, "digests", "sources") if k not in found]
    if missing or not isinstance(found["digests"], dict) or ALL not in found["digests"]:
        raise ConfigError(f"{where} is not a fingerprint (no {', '.join(missing) or ALL + ' digest'}): give the "
                          "JSON `python -m seqmix fingerprint --out FILE` wrote on that host")
    return {**{k: found[k] for k in HOST_KEYS}, **{k: found.get(k) for k in TOOLCHAIN_KEYS},
            "digests": {k: v[:16] for k, v in found["digests"].items()}, "sources": found["sources"]}


def comparable(a: dict, b: dict) -> bool:
    """Two entries that must hold the same digests: both portable and pinned, of one torch
    version (on every host; another torch version may compute otherwise)."""
    return all(e["mode"] == "portable" and e["pinned"] for e in (a, b)) and a.get("torch") == b.get("torch")


def differing(a: dict, b: dict) -> list[str]:
    """The mixers both entries hold whose digests differ (and "all" where they hold the same mixers)."""
    shared = [n for n in a["digests"] if n in b["digests"] and (n != ALL or a["digests"].keys() == b["digests"].keys())]
    return [n for n in shared if a["digests"][n][:16] != b["digests"][n][:16]]


def same_host(a: dict, b: dict) -> bool:
    """One entry per host: CPU model, vendor, instruction sets, numerics, whether pinned and
    toolchain (compiler and glibc where both entries know them)."""
    known = [k for k in ("compiler", "glibc") if a.get(k) and b.get(k)]
    return all(a.get(k) == b.get(k) for k in ("cpu", "vendor", "flags", "mode", "pinned", "torch", *known))


def host_name(e: dict) -> str:
    return f"{e['cpu']} ({e['vendor']}, {e['vector_isa']}; torch {e.get('torch') or 'unknown'})"


def refusal(path, entries: list[dict], entry: dict) -> str | None:
    """Why ``entry`` may not join ``entries``: a portable fingerprint that differs from a recorded
    one of the same torch version (which mixers, and how to find the cause); None where it may."""
    from seqmix.sources import changed

    against = [(i, e, d) for i, e in enumerate(entries, 1) if comparable(e, entry) and (d := differing(e, entry))]
    if not against:
        return None
    i, e, names = against[0]
    mixers = [n for n in names if n != ALL]
    shown = ", ".join(f"{n} (recorded {e['digests'][n][:16]}, this one {entry['digests'][n][:16]})" for n in names)
    text = (f"{path} records portable fingerprints of torch {entry.get('torch')} that this one, of "
            f"{host_name(entry)}, does not match: it differs from #{i} {host_name(e)} in {len(mixers)} "
            f"mixer{'s' if len(mixers) != 1 else ''}: {shown}"
            + (f", and from {len(against) - 1} more entr{'ies' if len(against) > 2 else 'y'}" if len(against) > 1 else "")
            + ". Nothing recorded: under portable numerics every host trains every mixer to the same bits, so one that "
            f"differs is a defect of the pinning on one of them; run `{PROBE}` on the host that made this one to "
            "find which library moves the bits, and fix the pinning (seqmix/numerics.py)")
    if other := [f"{k} {e[k]!r} there, {entry[k]!r} here" for k in ("compiler", "glibc")
                 if e.get(k) and entry.get(k) and e[k] != entry[k]]:
        text += f"; the hosts' toolchains differ ({'; '.join(other)}), with which Mamba's fused CPU scan is built"
    if stale := changed(e["sources"]):
        text += (f". The code that fingerprint depends on changed since #{i} was recorded at {e['commit'][:10]} "
                 f"({', '.join(stale[:4])}{', ...' if len(stale) > 4 else ''}): a fingerprint made at that commit on "
                 "this host tells a change of the code from a defect of the pinning")
    return text


def hosts_markdown(entries: list[dict], notes: str) -> str:
    """docs/reference/hosts.md: the hosts and their fingerprints as tables, the entries as JSON."""
    import json

    out = ["# Hosts and their fingerprints", "",
           "Generated by `python -m seqmix fingerprint --record docs/reference/hosts.md` (this host) and "
           "`python -m seqmix fingerprint --record docs/reference/hosts.md --from FILE` (the `--out FILE` of another host): "
           "a portable fingerprint is added only where it agrees with every recorded one of the same torch "
           "version, and a host recorded again replaces its own entry. Do not edit by hand.", "",
           notes.strip(), "", "## Hosts", "",
           "| # | CPU | vendor | vector ISA | numerics | pinned | torch | date | commit | all |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for i, e in enumerate(entries, 1):
        out.append(f"| {i} | {e['cpu']} | {e['vendor']} | {e['vector_isa']} | {e['mode']} | "
                   f"{'yes' if e['pinned'] else 'no'} | {e.get('torch') or 'not recorded'} | {e['date']} | "
                   f"`{e['commit'][:10]}`{' + edits' if e['commit'].endswith('+ edits') else ''} | "
                   f"`{e['digests'][ALL][:16]}` |")
    out += ["", "The C++ compiler and glibc of each host (Mamba's fused CPU scan is built and runs with them), and "
            "its instruction-set flags (those starting avx, fma, sse, amx):", ""]
    out += [f"{i}. {e.get('compiler') or 'compiler not recorded'}; {e.get('glibc') or 'glibc not recorded'}; "
            f"{e['flags']}" for i, e in enumerate(entries, 1)]
    names = [*catalogue.mixer_names(), ALL]
    names += sorted({n for e in entries for n in e["digests"]} - set(names))  # a mixer since removed
    out += ["", "## Fingerprints", "",
            "The first 16 hex digits of the SHA-256 of each mixer's weights after its training steps "
            "(seqmix/fingerprint.py, config/fingerprint.yaml), one column per host above.", "",
            "| mixer | " + " | ".join(f"#{i} {e['mode']}" for i, e in enumerate(entries, 1)) + " |",
            "|---|" + "---|" * len(entries)]
    for name in names:
        out.append(f"| {name} | " + " | ".join(f"`{e['digests'].get(name, '')[:16]}`" for e in entries) + " |")
    out += ["", HOSTS_BEGIN, json.dumps(entries, indent=1), HOSTS_END, ""]
    return "\n".join(out)


def record(path, entry: dict, notes: str) -> list[dict]:
    """Add ``entry`` to the hosts file at ``path`` and rewrite it: in place of its host's own
    earlier entry, never of another's; ConfigError (``refusal``) for a portable fingerprint
    that differs from a recorded one of the same torch version, leaving the file as it was."""
    from seqmix.errors import ConfigError
    from seqmix.io import write_text

    entries = read_hosts(path)
    if problem := refusal(path, entries, entry):
        raise ConfigError(problem)
    entries = [e for e in entries if not same_host(e, entry)] + [entry]
    entries.sort(key=lambda e: (e["mode"] != "portable", e["vendor"], e["cpu"], e["flags"], e["date"]))
    write_text(path, hosts_markdown(entries, notes))
    return entries
