"""What one training step of a paper-profile model costs, for this checkout and an earlier
revision side by side in one run: aten ops that write, bytes written and CPU time.

``python -m tools.bench steps --baseline main --arch mamba --arch h3 --arch performer
--point wikitext2 --point mqar/L64-kv4/d512-lr0.000464159 --point mqar/L512-kv64/d256-lr0.000464159``

Models are built as ``plan`` builds them (budget solved, native block, options) at points of
the paper profile (``config/paper.yaml``). A GPU step of these small models
is bound by kernel launches, so the counts are of what a GPU would run: the fast paths a
CUDA tensor takes (Mamba's Triton scan where a version has it; its launch skipped, see
``_as_on_a_gpu``), counted by this checkout's ``seqmix.measure`` for both versions.
``writes`` are the aten ops that write a tensor in one forward and backward (each at least
one kernel launch; views launch none; a Triton op counts as one); bytes written are counted
at batches 2 and 3 and extended to the point's batch. ``ms`` is a whole training step
(AdamW included) on CPU tensors at a small batch, one thread, as a CPU dispatches (Mamba's
fused C++ scan in both versions): the median over rounds in which the two versions take
turns on each case, so that other load on the machine falls on both alike. Each version
runs in its own process; the baseline's source comes from ``git archive``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[2]
THIS_MEASURE = REPO / "src" / "seqmix" / "measure.py"


# ------------------------------------------------------------------------------------------
# Worker: one version of seqmix (the source tree given on its command line), commands on stdin.
# ------------------------------------------------------------------------------------------


def _this_checkouts_counter():
    """This checkout's ``seqmix.measure``, loaded from its file, so that both versions are
    counted by the same code whatever the baseline's counter was."""
    spec = importlib.util.spec_from_file_location("seqmix_bench_measure", THIS_MEASURE)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _build(point: str, arch: str):
    import seqmix
    from seqmix.preflight import solved_size
    from seqmix.tasks import task_class

    try:  # the baseline may be a version before seqmix.expansion (then seqmix.study held both)
        from seqmix.expansion import table
        from seqmix.expansion.validate import load_study
    except ImportError:
        from seqmix.study.load import load_study

        from seqmix.study import table

    study = load_study(Path(seqmix.REPO_ROOT) / "config" / "paper.yaml")
    # this version's run spec: a version before the study's expansion (table.expand) has run_spec
    spec = (table.expand(study).run_spec(point, arch, 0) if hasattr(table, "expand")
            else table.run_spec(study, point, arch, 0))
    task = task_class(spec.kind).without_data(spec)
    size = solved_size(spec)
    torch.manual_seed(0)
    return spec, task, task.build_model(size.d_model, size.n_layers, size.d_ff_mult).train()


def _kernel_list() -> dict:
    """This version's fast paths by name: those its mixer modules declare
    (seqmix.mixers.declared_kernels), or, in versions before, the dict KERNELS of
    the module seqmix.kernels.registry (gone since 764041d) or of seqmix.kernels itself."""
    from seqmix import mixers

    if hasattr(mixers, "declared_kernels"):
        return mixers.declared_kernels()
    try:
        return importlib.import_module("seqmix.kernels.registry").KERNELS
    except ModuleNotFoundError:
        return importlib.import_module("seqmix.kernels").KERNELS


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _as_on_a_gpu():
    """Dispatch as for CUDA tensors (Triton paths apply, fused CPU ops do not) on CPU
    tensors, with every Triton kernel's launch skipped: its op still allocates and returns
    its outputs (values unset), which is all that is counted, so no interpreter runs. The
    backward check a GPU runs once per signature is skipped too."""
    import triton

    from seqmix.mixers import dispatch

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(dispatch, "_applies", lambda path, x, setting: path.kind == "triton"))
        stack.enter_context(mock.patch.object(dispatch, "_check_backward", lambda *args: None))
        for entry in _kernel_list().values():
            # each version's own list: a "module:function" string before Kernel entries
            module = importlib.import_module((entry if isinstance(entry, str) else entry.fast).split(":")[0])
            for name, value in vars(module).items():
                if isinstance(value, triton.runtime.JITFunction):
                    stack.enter_context(mock.patch.object(module, name, _NoLaunch()))
            if hasattr(module, "check_same_device"):
                stack.enter_context(mock.patch.object(module, "check_same_device", lambda kernel, *t: t[0].device))
        yield


def _count(point: str, arch: str) -> dict:
    """Writes and bytes written of one forward and backward at the point's batch, as a
    GPU dispatches them (``_as_on_a_gpu``)."""
    from seqmix.mixers import dispatch

    measure = _this_checkouts_counter()
    spec, task, model = _build(point, arch)
    params = [p for p in model.parameters() if p.requires_grad]
    counts = {}
    with _as_on_a_gpu(), dispatch.using("auto") as run:
        for b in (1, *measure.MEMORY_BATCHES):  # batch 1 uncounted: caches a mixer fills on its first call
            batch = task.example_batch(b, "cpu")
            with measure.Count() as c:
                torch.autograd.grad(task.loss(model, batch), params, allow_unused=True)
            counts[b] = c
    two, three = (counts[b] for b in measure.MEMORY_BATCHES)
    if two.writes != three.writes:
        raise RuntimeError(f"{arch} at {point}: {two.writes} writes at batch 2, {three.writes} at batch 3")
    B = spec.train.batch_size
    return {"writes": two.writes, "paper_batch": B, "paths": run.taken(),
            "gb": measure.extend((two.bytes_written, three.bytes_written), B) / 1e9}


_TIMED: dict = {}


def _time(point: str, arch: str, batch: int, steps: int) -> list[float]:
    torch.set_num_threads(1)
    key = (point, arch, batch)
    if key not in _TIMED:
        _TIMED.clear()  # one model alive at a time
        _, task, model = _build(point, arch)
        _TIMED[key] = (task, model, torch.optim.AdamW(model.parameters(), lr=1e-4), task.example_batch(batch, "cpu"))
    task, model, opt, batch_ = _TIMED[key]

    def step():
        opt.zero_grad(set_to_none=True)
        task.loss(model, batch_).backward()
        opt.step()

    step()  # untimed
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def worker(src: str) -> None:
    sys.path[:] = [src, *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent)]
    import seqmix

    # That version's kernels/ as seqmix.kernels, loaded here for revisions whose seqmix does
    # not yet find its checkout's kernels itself (an editable install would hand out its own).
    kernels = Path(src).parent / "kernels"
    spec = importlib.util.spec_from_file_location("seqmix.kernels", kernels / "__init__.py",
                                                  submodule_search_locations=[str(kernels)])
    sys.modules["seqmix.kernels"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["seqmix.kernels"])
    import seqmix.kernels

    print(json.dumps({"seqmix": seqmix.__file__, "kernels": seqmix.kernels.__file__}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "count":
                out = _count(cmd["point"], cmd["arch"])
            else:
                out = {"times": _time(cmd["point"], cmd["arch"], cmd["batch"], cmd["steps"])}
        except Exception as err:  # noqa: BLE001 - reported to the driver as a row
            out = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------


class Worker:
    """One version's worker process; ``ask`` sends a command and returns its answer."""

    def __init__(self, name: str, src: Path):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(src)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=src.parent)
        self.imported = json.loads(self.proc.stdout.readline())
        if not self.imported["seqmix"].startswith(str(src)):
            raise RuntimeError(f"{name}: imported seqmix from {self.imported['seqmix']}, not {src}")

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def extract(rev: str, into: Path) -> Path:
    """The source of ``rev`` under ``into`` (its seqmix imports its own kernels/: seqmix's
    checkout finder); returns its src/."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src", "kernels", "config"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def run(baseline: str, archs: list[str], points: list[str], time_batch: int, rounds: int, steps: int,
        progress: bool = True) -> str:
    """Counts at every (point, arch) and CPU times at the first point, both versions; the table."""
    time_point = points[0]
    with tempfile.TemporaryDirectory() as tmp:
        workers = [Worker(baseline, extract(baseline, Path(tmp))), Worker("this checkout", REPO / "src")]
        cases = [(p, a) for p in points for a in archs]
        counts = {(w.name, c): w.ask(cmd="count", point=c[0], arch=c[1]) for c in cases for w in workers}
        times: dict = collections.defaultdict(list)
        for r in range(rounds):
            for arch in archs:
                for w in workers:
                    out = w.ask(cmd="time", point=time_point, arch=arch, batch=time_batch, steps=steps)
                    times[(w.name, arch)] += out.get("times", [])
            if progress:
                print(f"round {r + 1}/{rounds} timed", file=sys.stderr, flush=True)
        for w in workers:
            w.close()
    return table(workers, cases, counts, times, time_point, time_batch)


def table(workers, cases, counts, times, time_point: str, time_batch: int) -> str:
    head = ["point", "arch", "version", "writes", "GB written", f"CPU ms/step ({time_point}, batch {time_batch})",
            "paths (GPU dispatch)"]
    rows = []
    for point, arch in cases:
        got = [counts[(w.name, (point, arch))] for w in workers]
        for w, n in zip(workers, got):
            t = times.get((w.name, arch)) if point == time_point else None
            ms = f"{statistics.median(t) * 1e3:.0f}" if t else "-"
            if "error" in n:
                rows.append([point, arch, w.name, n["error"], "", ms, ""])
            else:
                paths = "; ".join(f"{k}: {v}" for k, v in n["paths"].items()) or "none"
                rows.append([point, arch, w.name, str(n["writes"]), f"{n['gb']:.2f}", ms, paths])
        if any("error" in n for n in got):
            continue
        old, new = got
        t_old, t_new = (times.get((w.name, arch)) if point == time_point else None for w in workers)
        ratio = f"{statistics.median(a / b for a, b in zip(t_new, t_old)):.2f}x" if t_old and t_new else "-"
        rows.append([point, arch, "new / old", f"{new['writes'] / old['writes']:.2f}x", f"{new['gb'] / old['gb']:.2f}x",
                     ratio, ""])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, help="the source tree (src/) whose seqmix this worker runs")
    worker(ap.parse_args().worker)
