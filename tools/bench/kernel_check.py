"""Every Triton kernel against its reference, through the mixers that call it (``gpu-check``'s
kernel-correctness part; ``results/bench/<gpu>/kernel_check.csv``).

Every catalogued mixer, in each form it has (causal, non-causal), is built at the study's
width with the study's options and run forward and backward twice with the same weights,
input and output gradient: under the dispatch setting ``reference`` (plain PyTorch) and under
its fast paths (``auto`` on a GPU; ``triton`` in the CPU smoke, where the kernels run under
TRITON_INTERPRET=1), in fp32 and in bf16 autocast, at awkward lengths (1, and lengths that
are not a multiple of any block). Compared: the output and the gradient of the input and of
every parameter, each as max |fast - reference| / max(max |reference|, 1 % of the largest
reference magnitude of the case: a gradient that is zero in exact arithmetic, as GLA's gate at
L = 1, is roundoff on both sides); the row keeps the output's and the worst gradient's
(named). Tolerances: fp32 1e-4 (the same sums in another order:
a few ulps of the largest term; a wrong index or mask is off by O(1)), bf16 3e-2 (eight
bf16 unit roundoffs, 2^-8 each: both paths round their matmul operands to bf16, in
different places).

Which kernels a case reached is counted, not assumed: every Triton kernel the mixer modules
declare (``seqmix.mixers.triton_kernels()``) is wrapped with a call counter in the worker, so
a kernel that a branch declares (and a mixer calls) joins the check without an edit here, and a
declared kernel that no mixer reaches is reported as unchecked. A mixer whose fast run reaches no
kernel is one row, ``no kernel``, and its other cases are skipped.
"""

from __future__ import annotations

import functools
import importlib
import time
import warnings

import torch

from seqmix import catalogue, mixers
from seqmix.expansion.validate import load_study
from seqmix.mixers import dispatch
from tools.bench.kernels import versions

FIELDS = ["arch", "form", "dtype", "L", "d_model", "batch", "setting", "kernels", "paths", "out_err", "grad_err",
          "worst_grad", "tolerance", "finite", "fast_s", "status", "device", "torch", "triton"]
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}
LENGTHS = (1, 63, 1000)  # 1, and lengths no block divides
SMOKE_LENGTHS = (1, 19)

_CALLS: dict[str, int] = {}
_NO_KERNEL: set[tuple[str, str]] = set()


def count_kernel_calls() -> dict[str, int]:
    """Wrap every declared Triton kernel (``seqmix.mixers.triton_kernels()``) with a call counter
    (once per process; a declaration looks its kernel up at every call); the counts, by name."""
    from seqmix.mixers import triton_kernels

    for name, kernel in triton_kernels().items():
        if name in _CALLS:
            continue
        module, _, attr = kernel.fast.partition(":")
        mod = importlib.import_module(module)
        original = getattr(mod, attr)

        @functools.wraps(original)
        def counted(*args, _original=original, _name=name, **kwargs):
            _CALLS[_name] += 1
            return _original(*args, **kwargs)

        setattr(mod, attr, counted)
        _CALLS[name] = 0
    return _CALLS


def cases(archs: list[str] | None = None) -> list[tuple[str, str]]:
    """(arch, form) of every catalogued mixer (or of ``archs``), every form it has."""
    out = []
    for entry in catalogue.MIXERS:
        if archs is not None and entry.name not in archs:
            continue
        cls = mixers.mixer_class(entry.name)
        out += [(entry.name, form) for form, has in (("causal", cls.supports_causal),
                                                     ("noncausal", cls.supports_noncausal)) if has]
    return out


def _relative(a: torch.Tensor, b: torch.Tensor, floor: float) -> float:
    scale = max(b.float().abs().max().item(), floor, 1e-30)
    return (a.float() - b.float()).abs().max().item() / scale


def _forward_backward(mixer, x, dy, setting: str, dtype: str):
    """(output, {name: gradient}, dispatch record) of one forward and backward under ``setting``."""
    leaves = {"input": x, **dict(mixer.named_parameters())}
    ctx = torch.autocast(x.device.type, torch.bfloat16) if dtype == "bf16" else torch.autocast(x.device.type, enabled=False)
    with dispatch.using(setting) as record, ctx:
        out = mixer(x)
        grads = torch.autograd.grad(out, list(leaves.values()), dy.to(out.dtype), allow_unused=True,
                                    materialize_grads=True)
    return out.detach(), dict(zip(leaves, grads)), record


@functools.cache
def _options(config: str) -> dict:
    return load_study(config).mixers


def check_case(config: str, arch: str, form: str, dtype: str, L: int, d_model: int, batch: int,
               setting: str) -> list[dict]:
    """One (mixer, form, dtype, L): the fast paths against the reference (module docstring)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = {"arch": arch, "form": form, "dtype": dtype, "L": L, "d_model": d_model, "batch": batch, "setting": setting,
            "tolerance": TOLERANCE[dtype], "device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else "cpu (Triton interpreter)", **{k: v for k, v in versions().items() if k != "fla"}}
    if (arch, form) in _NO_KERNEL:
        return []
    calls = count_kernel_calls()
    torch.manual_seed(0)
    mixer = mixers.build(arch, d_model, form == "causal", max_len=max(L, 2), **_options(config).get(arch, {}))
    mixer = mixer.to(device).train()
    g = torch.Generator(device).manual_seed(L)
    x = torch.randn(batch, L, d_model, device=device, generator=g).requires_grad_()
    dy = torch.randn(batch, L, d_model, device=device, generator=g)
    ref_out, ref_grads, _ = _forward_backward(mixer, x, dy, "reference", dtype)
    before = dict(calls)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dispatch.KernelFallbackWarning)
        out, grads, record = _forward_backward(mixer, x, dy, setting, dtype)
    fast_s = time.perf_counter() - t0
    reached = sorted(n for n in calls if calls[n] > before[n])
    paths = "; ".join(f"{k}: {v}" for k, v in record.taken().items())
    fell_back = [str(w.message) for w in caught if issubclass(w.category, dispatch.KernelFallbackWarning)]
    fell_back += [paths] if "fallback" in paths and not fell_back else []  # an earlier case's, remembered
    if not reached and not fell_back:
        _NO_KERNEL.add((arch, form))
        return [{**base, "kernels": "", "paths": paths or "none", "status": "no kernel"}]
    floor = 0.01 * max(t.float().abs().max().item() for t in [ref_out, *ref_grads.values()])
    errors = {name: _relative(grads[name], ref_grads[name], floor) for name in grads}
    worst = max(errors, key=errors.get)
    out_err = _relative(out, ref_out, floor)
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(t).all()) for t in grads.values())
    good = finite and max(out_err, errors[worst]) <= TOLERANCE[dtype]
    status = f"FALLBACK: {fell_back[0][:300]}" if fell_back else ("ok" if good else "MISMATCH")
    return [{**base, "kernels": " ".join(reached), "paths": paths, "out_err": f"{out_err:.2e}",
             "grad_err": f"{errors[worst]:.2e}", "worst_grad": worst, "finite": finite, "fast_s": round(fast_s, 3),
             "status": status}]


def coverage(rows: list[dict]) -> list[str]:
    """One line per declared Triton kernel: the mixers that reached it and its largest errors,
    or that none did (no check)."""
    from seqmix.mixers import triton_kernels

    lines = []
    for name in triton_kernels():
        hit = [r for r in rows if name in str(r.get("kernels", "")).split()]
        if not hit:
            lines.append(f"{name}: reached by no mixer: NOT CHECKED")
            continue
        by = ", ".join(sorted({f"{r['arch']} ({r['form']})" for r in hit}))
        errs = ", ".join(f"{d} <= {max(max(float(r['out_err']), float(r['grad_err'])) for r in hit if r['dtype'] == d):.1e}"
                         for d in sorted({r["dtype"] for r in hit}))
        bad = [r for r in hit if r["status"] != "ok"]
        lines.append(f"{name}: via {by}; L {', '.join(str(L) for L in sorted({r['L'] for r in hit}))}; {errs}; "
                     + ("ok" if not bad else f"{len(bad)} case(s) not ok: {bad[0]['status'][:200]}"))
    return lines
