"""Triton kernels vs their PyTorch references, SDPA attention and fla, over sequence length.

``python -m tools.bench kernels [--lengths 256 1024 ...] [--out results/bench/<gpu>/kernels.csv]``

What is timed (the mixing cores only, no projections, batch ``--batch``, ``--dtype``; each
op's case builder is its entry of ``tools.bench.launches.LAUNCHES``; the kernel and the
reference it equals are those its mixer module declares):

- ``grassmann``: z (B, L, r=32) -> g (B, L, d=256), offsets (1, 2, 4, 8, 12, 16), normalised
  (the paper's sizes, Zhang 2025, arXiv:2512.19428, §3.2 and §4.1); impls ``triton`` (kernels.grassmann) and
  ``reference`` (mixers.grassmann.grassmann_mix_reference).
- ``gla``: the GLA mixer's defaults at d=256 (4 heads, d_k = 32 and d_v = 64 per head, chunk
  64); impls ``triton`` (kernels.gla.chunk_gla), ``reference``
  (kernels.gla_chunked.gla_chunk_reference: the recurrent form is a Python loop over L) and ``fla``
  (flash-linear-attention's chunk_gla, when ``import fla`` works).
- ``tssa``: causal ToST at d=256, 4 heads (p = 64), denom_bias over L; ``triton`` and
  ``reference`` (mixers.tssa.tssa_reference).
- ``attention``: ``sdpa`` = F.scaled_dot_product_attention, causal, 4 heads of 64 (d=256),
  the softmax core the others replace.

Each op is timed forward (``fwd``) and forward+backward (``fwdbwd``) with
triton.testing.do_bench (CUDA events, median), peak memory is
torch.cuda.max_memory_allocated above what was live before the call.

Byte model (``bytes_moved``, the least traffic the op needs: every input read once and
every output written once, at the dtype's size): grassmann fwd z + W + b + g, bwd adds
dg, z, W read and dz, dW, db written; gla fwd q, k, log α, v + o, bwd adds q, k, v, log α,
do read and their four gradients written; tssa fwd w + y, bwd adds w, dy + dw; sdpa
fwd q, k, v + o, bwd adds q, k, v, o, do + dq, dk, dv (sdpa is compute-bound; its
bandwidth column is only for completeness). ``bandwidth_GBps`` = bytes_moved / time and
``roofline_frac`` = that over the GPU's HBM bandwidth (table below; empty if unknown).

Every case (op, impl, L) runs in a worker process under a time limit (``--case-timeout``,
``tools.bench.watchdog``): a case that fails (a kernel that does not compile or launch) is a
row with status ``failed: <error>``, its traceback printed verbatim; one that hangs or kills
its process is a row ``timeout: …`` or ``crashed: …``; and the sweep goes on. fla's import is
timed and, where it fails, its error printed verbatim and written in the fla rows' status.
The CSV is written after every length, so a sweep cut short keeps what it measured.

Without a GPU the command takes no timings: it runs each kernel once under the Triton
interpreter at a tiny size against its reference, says so, and exits 0 (1 if a kernel
disagrees). The CLI sets TRITON_INTERPRET=1 for it before any kernel module is imported.
``--interpret`` runs the sweep itself there instead, at the sizes given, with wall-clock
times of the interpreter (no benchmark: how ``gpu-check --cpu-smoke`` proves the sweep).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from collections.abc import Callable
from pathlib import Path

import torch

from seqmix.device import device_slug
from seqmix.io import write_csv
from tools.bench.launches import CASES, PAPER_SIZES, SMOKE_SIZES, FlaUnavailable, Sizes
from tools.bench.watchdog import Case, run_cases

FIELDS = ["op", "impl", "pass", "L", "batch", "d_model", "dtype", "time_ms", "peak_mem_bytes",
          "bytes_moved", "bandwidth_GBps", "roofline_frac", "status", "device", "torch",
          "triton", "fla"]
DEFAULT_LENGTHS = [256 * 2**i for i in range(9)]  # 256 … 65536

# HBM bandwidth in bytes/s by a substring of torch.cuda.get_device_name (first match wins).
HBM_BYTES_PER_S = [
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM5
    ("GH200", 4.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # 40 GB
    ("L40S", 0.864e12),
    ("L4", 0.3e12),
    ("A10", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12),
    ("V100", 0.9e12),
]

def hbm_bandwidth(name: str) -> float | None:
    for key, bw in HBM_BYTES_PER_S:
        if key.lower() in name.lower():
            return bw
    return None


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    for pkg, key in (("triton", "triton"), ("flash-linear-attention", "fla")):
        try:
            out[key] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[key] = ""
    return out




# -------------------------------------------------------------------------------------
# Measurement
# -------------------------------------------------------------------------------------


def _peak_bytes(fn: Callable[[], None], device) -> int | str:
    if device.type != "cuda":
        fn()
        return ""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def _milliseconds(fn: Callable[[], None], grads: list[torch.Tensor], device, warmup_ms: int, rep_ms: int) -> float:
    """do_bench's median on a GPU; one wall-clock call under the interpreter (no benchmark)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median")


def measure(op: str, impl: str, case: Callable, B: int, L: int, dtype, device, hbm: float | None,
            warmup_ms: int = 25, rep_ms: int = 100, sizes: Sizes = PAPER_SIZES) -> list[dict]:
    base = {"op": op, "impl": impl, "L": L, "batch": B, "d_model": sizes.d_model,
            "dtype": str(dtype).replace("torch.", "")}
    try:
        inputs, fn, (fwd_bytes, bwd_bytes) = case(impl, B, L, dtype, device, sizes)
        with torch.no_grad():
            dy = torch.randn_like(fn(*inputs))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return [{**base, "pass": p, "status": "oom"} for p in ("fwd", "fwdbwd")]
    except FlaUnavailable as err:
        return [{**base, "pass": p, "status": f"unavailable: fla {err}"} for p in ("fwd", "fwdbwd")]
    except Exception as err:  # noqa: BLE001 - a kernel that fails to compile or launch is a result
        return [{**base, "pass": p, "status": failed(err)} for p in ("fwd", "fwdbwd")]

    def forward():
        with torch.no_grad():
            fn(*inputs)

    def forward_backward():
        fn(*inputs).backward(dy)

    rows = []
    for name, run, nbytes in (("fwd", forward, fwd_bytes), ("fwdbwd", forward_backward,
                                                             fwd_bytes + bwd_bytes)):
        row = {**base, "pass": name, "bytes_moved": nbytes}
        try:
            row["peak_mem_bytes"] = _peak_bytes(run, device)
            ms = _milliseconds(run, inputs, device, warmup_ms, rep_ms)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rows.append({**row, "status": "oom"})
            continue
        except Exception as err:  # noqa: BLE001 - as above (the backward kernels compile here)
            rows.append({**row, "status": failed(err)})
            continue
        gbps = nbytes / (ms * 1e-3) / 1e9
        row.update(time_ms=round(ms, 5), bandwidth_GBps=round(gbps, 2), status="ok",
                   roofline_frac=round(gbps * 1e9 / hbm, 4) if hbm else "")
        rows.append(row)
    return rows  # the tensors die with this frame; the next case starts from a clean cache


def failed(err: Exception) -> str:
    """A failed case's status: the error printed verbatim to stderr, its first 200 characters in the row."""
    import traceback

    traceback.print_exception(err)
    return f"failed: {type(err).__name__}: {' '.join(str(err).split())[:200]}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"


def measure_case(op: str, impl: str, L: int, batch: int, dtype: str, smoke: bool = False) -> list[dict]:
    """One case's rows, in a worker process (``run_sweep``): on the GPU, else under the
    interpreter; ``smoke``: at ``SMOKE_SIZES``."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = device_name(device)
    case = next(c for o, i, c in CASES if (o, i) == (op, impl))
    torch.manual_seed(0)
    rows = measure(op, impl, case, batch, L, DTYPES[dtype], device, hbm_bandwidth(name) if device.type == "cuda" else None,
                   sizes=SMOKE_SIZES if smoke else PAPER_SIZES)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [{**r, "device": name, **versions()} for r in rows]


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _time(rows, op, impl, pass_, L):
    for r in rows:
        if (r["op"], r["impl"], r["pass"], r["L"], r["status"]) == (op, impl, pass_, L, "ok"):
            return r["time_ms"]
    return None


def summarize(rows: list[dict]) -> list[str]:
    """The ratios the targets name (benchmark figures, not tests)."""
    lines = []
    lengths = sorted({r["L"] for r in rows})
    t_k = _time(rows, "grassmann", "triton", "fwdbwd", 4096)
    t_r = _time(rows, "grassmann", "reference", "fwdbwd", 4096)
    if t_k and t_r:
        lines.append(f"grassmann fwd+bwd at L=4096: reference / triton = {t_r / t_k:.2f}x "
                     "(target >= 5x)")
    for L in lengths:
        t_k = _time(rows, "grassmann", "triton", "fwdbwd", L)
        t_a = _time(rows, "attention", "sdpa", "fwdbwd", L)
        roof = [r.get("roofline_frac") for r in rows if (r["op"], r["impl"], r["pass"], r["L"])
                == ("grassmann", "triton", "fwd", L) and r["status"] == "ok"]
        if t_k and t_a:
            lines.append(f"L={L:>6}: grassmann triton fwd+bwd {t_k:.3f} ms vs sdpa {t_a:.3f} ms "
                         f"-> sdpa / grassmann = {t_a / t_k:.2f}x (target > 1 at L >= 2048)"
                         + (f"; grassmann fwd roofline {roof[0]} (target >= 0.5)" if roof and roof[0] != "" else ""))
        t_g = _time(rows, "gla", "triton", "fwdbwd", L)
        t_f = _time(rows, "gla", "fla", "fwdbwd", L)
        if t_g and t_f:
            lines.append(f"L={L:>6}: gla triton / fla fwd+bwd = {t_g / t_f:.2f}x (target <= 1.25x)")
    fla = [r for r in rows if r["impl"] == "fla"]
    if fla and not any(r["status"] == "ok" for r in fla):  # only where the GLA sweep asked for it
        lines.append(f"no GLA comparison with fla (flash-linear-attention): {fla[0]['status']}")
    return lines


def _print_row(r: dict) -> None:
    print(f"  {r['op']:>9} {r['impl']:>9} {r['pass']:>6} L={r['L']:>6}: "
          + (f"{r['time_ms']:.4f} ms, "
             + (f"{r['peak_mem_bytes'] / 2**20:.1f} MiB, " if r["peak_mem_bytes"] != "" else "")
             + f"{r['bandwidth_GBps']} GB/s" if r["status"] == "ok" else r["status"]), flush=True)


def _case_rows(case: Case, outcome, device: str) -> list[dict]:
    """A case's rows; a case that timed out, crashed or was skipped has two saying so."""
    if outcome.rows is not None:
        return outcome.rows
    a = case.args
    d_model = (SMOKE_SIZES if a.get("smoke") else PAPER_SIZES).d_model
    return [{"op": a["op"], "impl": a["impl"], "pass": p, "L": a["L"], "batch": a["batch"], "d_model": d_model,
             "dtype": str(DTYPES[a["dtype"]]).replace("torch.", ""), "status": outcome.status, "device": device,
             **versions()} for p in ("fwd", "fwdbwd")]


def run_sweep(lengths: list[int], out: Path | None, batch: int, dtype: str, ops: list[str] | None = None,
              case_timeout_s: float = 60.0, budget_s: float = 3600.0, smoke: bool = False) -> tuple[Path, list[dict]]:
    """Every (op, impl) at every length, each case in a worker under its time limit (module
    docstring); the CSV is written after every length. ``smoke``: ``SMOKE_SIZES``."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = device_name(device)
    hbm = hbm_bandwidth(name) if device.type == "cuda" else None
    ver = versions()
    out = out or Path("results/bench") / device_slug(name) / "kernels.csv"
    print(f"device: {name} (HBM {hbm / 1e12 if hbm else '?'} TB/s), torch {ver['torch']}, "
          f"triton {ver['triton']}, fla {ver['fla'] or 'not installed'}; batch {batch}, {dtype}; "
          f"at most {case_timeout_s:.0f} s a case", flush=True)
    deadline = time.monotonic() + budget_s
    rows: list[dict] = []
    for L in lengths:
        cases = [Case(f"{op}/{impl}/L{L}", "tools.bench.kernels:measure_case",
                      {"op": op, "impl": impl, "L": L, "batch": batch, "dtype": dtype, "smoke": smoke}, case_timeout_s)
                 for op, impl, _ in CASES if not ops or op in ops]
        outcomes = run_cases(cases, max(0.0, deadline - time.monotonic()))
        for c in cases:
            for r in _case_rows(c, outcomes[c.id], name):
                _print_row(r)
                rows.append(r)
        write_csv(out, rows, FIELDS)  # after every length: a long sweep keeps what it measured
    print("\n".join(summarize(rows)), flush=True)
    print(f"wrote {len(rows)} rows to {out}", flush=True)
    return out, rows


# -------------------------------------------------------------------------------------
# No GPU: an interpreter correctness smoke, no timings
# -------------------------------------------------------------------------------------


def _interpreted(name: str):
    """seqmix.kernels.<name>, whose kernels must have been defined under the interpreter."""
    from seqmix.kernels._common import interpreted

    mod = importlib.import_module(f"seqmix.kernels.{name}")
    probe = {"grassmann": "_fwd_kernel", "gla": "_fwd_o_kernel", "tssa": "_causal_fwd_kernel"}[name]
    if not interpreted(getattr(mod, probe)):
        raise RuntimeError(f"seqmix.kernels.{name} was imported without TRITON_INTERPRET=1, so its kernels "
                           "need a GPU: run `python -m tools.bench kernels`, which sets it before importing them")
    return mod


def smoke_cpu() -> dict[str, float]:
    """Each kernel once at a tiny size vs its reference, forward and backward: max rel. error.
    The kernels and references are those the mixer modules declare."""
    from tools.bench.launches import declared

    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen).requires_grad_()  # noqa: E731
    for name in ("grassmann", "gla", "tssa"):
        _interpreted(name)
    gm, gl, ts = declared("grassmann"), declared("gla"), declared("tssa")
    offs = (1, 2, 5)
    la = (torch.nn.functional.logsigmoid(torch.randn(1, 2, 19, 6, generator=gen))).requires_grad_()
    cases = {
        "grassmann": ([rnd(2, 19, 5), rnd(12, 10), rnd(12)],
                      lambda z, W, b: gm(z, W, b, offs), lambda z, W, b: gm.reference(z, W, b, offs)),
        "gla": ([rnd(1, 2, 19, 6), rnd(1, 2, 19, 6), rnd(1, 2, 19, 5), la],
                lambda *x: gl(*x, chunk_size=16), gl.reference),
        "tssa": ([rnd(2, 3, 19, 5), rnd(3), rnd(3, 19, 1)],
                 lambda w, t, b: ts(w, t, b, True), lambda w, t, b: ts.reference(w, t, b, True)),
    }
    errors = {}
    for name, (inputs, kern, ref) in cases.items():
        out_k, out_r = kern(*inputs), ref(*inputs)
        dy = torch.randn(out_r.shape, generator=gen)
        got = [out_k, *torch.autograd.grad(out_k, inputs, dy)]
        want = [out_r, *torch.autograd.grad(out_r, inputs, dy)]
        errors[name] = max(((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()
                           for a, b in zip(got, want))
    return errors


def run(lengths: list[int] | None = None, out: Path | None = None, batch: int = 4,
        dtype: str = "bf16", ops: list[str] | None = None, case_timeout_s: float = 60.0,
        budget_s: float = 3600.0, interpret: bool = False) -> int:
    """Entry point of ``python -m tools.bench kernels``; returns the exit status."""
    if not torch.cuda.is_available() and not interpret:
        print("no GPU: CUDA is not available, so no timings were taken and no CSV is written.")
        print("Running each kernel once under the Triton interpreter against its reference "
              "(forward and backward, fp32, tiny sizes):")
        errors = smoke_cpu()
        ok = True
        for name, err in errors.items():
            good = err < 1e-4
            ok &= good
            print(f"  {name}: {'ok' if good else 'MISMATCH'} (max relative error {err:.1e})")
        return 0 if ok else 1
    run_sweep(lengths or DEFAULT_LENGTHS, out, batch, dtype, ops, case_timeout_s, budget_s)
    return 0
