"""What several test modules use, written once (fixtures stay in conftest.py): the workflow in
a scratch copy and Snakemake on it, run specs of the tiny config and the comparison of two
runs, fast paths against their references forward and backward, and small harnesses."""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
F64 = torch.float64

# ------------------------------------------------------------------------------------------
# The workflow in a scratch copy, and Snakemake on it.
# ------------------------------------------------------------------------------------------

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def copy_workflow(dst: Path) -> Path:
    """The workflow sources (not results) in a scratch copy, so tests can touch them."""
    dst.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("Snakefile", "workflow", "notebooks", "src", "kernels", "config", "envs", "requirements.txt"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=ignore, symlinks=True)  # src/seqmix/kernels: a link
        else:
            shutil.copy2(src, dst / name)
    (dst / "paper").mkdir()
    shutil.copy2(REPO / "paper" / "report.tex", dst / "paper" / "report.tex")
    shutil.copytree(REPO / "paper" / "sections", dst / "paper" / "sections")
    for extra in (REPO / "paper").glob("*.yaml"):
        shutil.copy2(extra, dst / "paper" / extra.name)
    return dst


def tool_env(env: dict | None = None) -> dict[str, str]:
    """This environment with ``env`` on top (a None value unsets the variable), and this
    interpreter's folder on PATH unless PATH has it already (the rules run `python`)."""
    merged = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    here = str(Path(sys.executable).parent)
    if here not in merged["PATH"].split(os.pathsep):
        merged["PATH"] = here + os.pathsep + merged["PATH"]
    return merged


def extensions_dir(src: Path) -> dict[str, str]:
    """A scratch copy's own folder for Mamba's fused CPU scan (TORCH_EXTENSIONS_DIR): torch
    builds it with ninja, whose command names the source's path, so one folder shared by two
    checkouts is rebuilt (about 70 CPU s) each time the other one loads it. Nothing for this
    checkout, whose build is the user's."""
    return {} if src.resolve() == REPO else {"TORCH_EXTENSIONS_DIR": str(src.parent / f"{src.name}.torch_extensions")}


def snakemake(src: Path, work: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Snakemake on the Snakefile of ``src`` in the working directory ``work``, two cores; a
    scratch copy builds its extensions in a folder of its own (extensions_dir)."""
    cmd = [*SNAKEMAKE, "--snakefile", str(src / "Snakefile"), "--directory", str(work),
           "--cores", "2", "--rerun-incomplete", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tool_env({**extensions_dir(src), **(env or {})}),
                          cwd=work)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess | str) -> dict[str, int]:
    """The job-count table of a dry run (its process, or its output): {rule: count}."""
    out = proc if isinstance(proc, str) else proc.stdout + proc.stderr
    table = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def planned_wildcards(out: str, rule: str) -> list[dict[str, str]]:
    """The wildcards of each job of ``rule`` a run's or dry run's output lists (a real run
    logs them on stderr: pass stdout and stderr together)."""
    blocks = re.findall(rf"^(?:local)?rule {rule}:\n(.*?)(?:\n\n|\Z)", out, re.M | re.S)
    return [dict(re.findall(r"(\w+)=([^,\n]+)", m.group(1))) for b in blocks
            if (m := re.search(r"wildcards: (.*)", b))]


def read_macros(path: Path) -> dict[str, str]:
    """{command name: body} of a generated macros file."""
    return dict(re.findall(r"^\\newcommand\{\\(\w+)\}\{(.*)\}$", path.read_text(), re.M))


def pdf_text(pdf: Path) -> str:
    """The text of a PDF, its whitespace runs made single spaces."""
    out = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    return " ".join(out.split())


# ------------------------------------------------------------------------------------------
# Runs: the spec of one run of a config, and two runs compared.
# ------------------------------------------------------------------------------------------

# metrics.json fields that hold wall-clock facts: the only ones in which a resumed run and an
# uninterrupted one may differ.
TIME_FIELDS = frozenset({"wall_time_s", "resumed_from_steps"})


def without_time(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIME_FIELDS}


def run_spec_in(cfg: dict, results: Path | str, task: str = "mqar", arch: str = "softmax", seed: int = 0, **train):
    """The run spec of (task, arch, seed) of the config ``cfg`` (a raw mapping, left as it is),
    its results under ``results``, with ``train`` overriding the task's training settings."""
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import validate_study

    cfg = copy.deepcopy(cfg)
    cfg["results_dir"] = str(results)
    cfg["tasks"][task]["train"] = {**cfg["tasks"][task]["train"], **train}
    return expand(validate_study(cfg)).run_spec(task, arch, seed)


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def log_rows(run_dir: Path) -> list[dict]:
    """log.csv without its wall-clock column."""
    import csv

    with open(Path(run_dir) / "log.csv") as f:
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in csv.DictReader(f)]


def assert_same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same results: weights byte for byte, the same log and
    metrics (wall-clock fields aside)."""
    a, b = Path(a), Path(b)
    assert digest(a / "model.pt") == digest(b / "model.pt")
    assert log_rows(a) == log_rows(b)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert without_time(ma) == without_time(mb)


# ------------------------------------------------------------------------------------------
# A fast path against its reference, forward and backward.
# ------------------------------------------------------------------------------------------


def grads(out: torch.Tensor, inputs: Sequence[torch.Tensor], cotangent: torch.Tensor | None = None,
          seed: int = 0) -> list[torch.Tensor]:
    """The gradients of <out, cotangent> with respect to ``inputs`` (a seeded random cotangent
    by default); an input ``out`` does not read gets zeros (at L = 1 some never are)."""
    if cotangent is None:
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return list(torch.autograd.grad(out, list(inputs), cotangent, allow_unused=True, materialize_grads=True))


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str, *, atol: float, rtol: float = 0.0,
                 scaled: bool = False) -> None:
    """``got`` equals ``want`` within ``atol`` + ``rtol`` |want|; with ``scaled``, ``atol`` is
    a fraction of the reference's largest magnitude (at least 1), for fp32 forms that add the
    same terms in another order and so agree to a few ulps of the largest one."""
    assert torch.isfinite(got).all(), f"{what}: not finite"
    if scaled:
        atol = atol * max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def assert_close_fwd_bwd(out: torch.Tensor, want: torch.Tensor, inputs: Sequence, *, atol: float, rtol: float = 0.0,
                         grad_atol: float | None = None, grad_rtol: float | None = None, scaled: bool = False,
                         names: Sequence[str] | None = None, seed: int = 0) -> None:
    """``out`` equals ``want`` (both computed from ``inputs``), and so does the gradient of
    every input that requires one, for one seeded random cotangent (inputs that are None or
    need no gradient are left out). Gradients take ``grad_atol``/``grad_rtol`` where given,
    else the forward's tolerances; ``scaled`` as in assert_close."""
    assert_close(out, want, "forward", atol=atol, rtol=rtol, scaled=scaled)
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    names = list(names) if names is not None else [f"(input {i})" for i in range(len(wrt))]
    assert len(names) == len(wrt), (names, len(wrt))
    cotangent = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=want.dtype)
    for name, g_out, g_want in zip(names, grads(out, wrt, cotangent), grads(want, wrt, cotangent)):
        assert_close(g_out, g_want, f"d{name}", atol=atol if grad_atol is None else grad_atol,
                     rtol=rtol if grad_rtol is None else grad_rtol, scaled=scaled)


def assert_same_fwd_bwd(fast: Callable, ref: Callable, inputs: Sequence, **tolerances) -> None:
    """``fast(*inputs)`` equals ``ref(*inputs)``, forward and backward (assert_close_fwd_bwd)."""
    assert_close_fwd_bwd(fast(*inputs), ref(*inputs), inputs, **tolerances)


def scan_inputs(Bt: int, D: int, N: int, L: int, *, strong: bool = False, skip: bool = True, gate: bool = False,
                dtype: torch.dtype = F64, seed: int = 0) -> tuple[list[torch.Tensor], list[str]]:
    """Mamba's selective scan inputs as the layer passes them, requiring grad, and their
    names: u, Δ, A, B, C (B, C: (Bt, N, L)), then D where ``skip``, then z where ``gate``.
    Δ ∈ (0, 0.2) (weak decay: the init's Δ ≤ 0.1) or (0, 3) (``strong``: exp(Δ A) down to
    e^-72 at N 16); A_n = -n · U[0.5, 1.5]."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(Bt, D, L, generator=g, dtype=dtype)
    delta = (3.0 if strong else 0.2) * torch.rand(Bt, D, L, generator=g, dtype=dtype)
    A = -torch.arange(1, N + 1, dtype=dtype).repeat(D, 1) * (0.5 + torch.rand(D, 1, generator=g, dtype=dtype))
    B, C = (torch.randn(Bt, N, L, generator=g, dtype=dtype) for _ in range(2))
    Dskip, z = torch.randn(D, generator=g, dtype=dtype), torch.randn(Bt, D, L, generator=g, dtype=dtype)
    named = [("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)]
    named += [("D", Dskip)] if skip else []
    named += [("z", z)] if gate else []
    return [t.requires_grad_() for _, t in named], [n for n, _ in named]


# ------------------------------------------------------------------------------------------
# What the pytest workers of one session share.
# ------------------------------------------------------------------------------------------


def session_dir(tmp_path_factory) -> Path:
    """The folder every worker of this test session sees (beside their own temporary folders;
    this session's own without workers)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_once(tmp_path_factory, name: str, make: Callable[[Path], object]):
    """``make(folder)`` (a JSON value) made once for the whole session, by the first worker that
    asks, in ``folder``; the others wait for it on a lock and read what it returned."""
    root = session_dir(tmp_path_factory) / name
    record = root.with_suffix(".json")
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            root.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(make(root)))
    return json.loads(record.read_text())


# ------------------------------------------------------------------------------------------
# Small harnesses.
# ------------------------------------------------------------------------------------------


HARNESS = REPO / "tests" / "harness"


def harness_env(**extra: str) -> dict[str, str]:
    """What makes the workflow's training jobs (`python -m seqmix train`, the rules call
    `python` from PATH) run through tests/harness/train.py, which holds them at the events
    ``extra`` names (its docstring); anything else runs in this interpreter as it is."""
    path = os.pathsep.join([str(HARNESS), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {"PATH": path, "SEQMIX_TEST_PYTHON": sys.executable, **extra}


def wait_until_held(proc: subprocess.Popen, marker: Path, who: str) -> None:
    """Wait until a process held by the harness has written ``marker``; fail the test if
    ``proc`` (``who``: what it is, for the message) ends first, with its stderr if piped."""
    while not marker.exists():
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        stderr = f": {proc.stderr.read()[-3000:]}" if proc.stderr else ""
        raise AssertionError(f"{who} ended (status {proc.returncode}) before it held{stderr}")


def slot_env(tmp_path: Path, **extra) -> dict:
    """For tool_env: no GPU setting of this environment's (None unsets it), GPU slots kept
    under ``tmp_path``, and ``extra``."""
    return {"SEQMIX_GPUS": None, "CUDA_VISIBLE_DEVICES": None, "SEQMIX_GPU_SLOT": None,
            "SEQMIX_SLOT_DIR": str(tmp_path / "slots"), **extra}


def flatten(tree, prefix: str = "") -> dict[str, object]:
    """Dotted keys of a nested mapping; lists and scalars are leaves (JSON-normalised)."""
    if isinstance(tree, dict) and tree:
        out = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.loads(json.dumps(tree))}
