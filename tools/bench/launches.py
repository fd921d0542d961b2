"""How the maintainer's checks launch the project's Triton kernels. Which kernels exist, their
functions and the references they equal are what the mixer modules declare
(``seqmix.mixers.triton_kernels()``), and the cases here take them from there; per kernel,
``LAUNCHES`` says how the compile check (``python -m tools.bench.compile_check``) launches it
at its own tests' shapes (the ``*_CASES`` tables of tests/kernels/test_kernels.py) and how the kernel
bench (``python -m tools.bench kernels``, ``make gpu-check``) times it, at what sizes and
against what. A new Triton kernel is its declaration in its mixer's module and its launches
here; ``kernel_launches()`` names a declared kernel that has none, and the compile check
refuses to run without them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from seqmix import REPO_ROOT as REPO  # the checkout: its tests/ are read
from seqmix.mixers import Kernel, triton_kernels

Case = tuple[str, Callable[[], None]]  # (where the launch comes from, a call that launches it)


# ---------------------------------------------------------------------------------------
# Each kernel at the bench's sizes
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The ops' sizes besides batch and L: the paper's (tools.bench.kernels says which), or the
    CPU smoke's (tiny: the interpreter runs the kernels through numpy)."""

    d_model: int = 256
    n_heads: int = 4
    rank: int = 32  # Grassmann
    offsets: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    gla_dk: int = 32  # per head: GLA defaults at d=256 (expand_k 0.5)
    gla_dv: int = 64
    gla_chunk: int = 64


PAPER_SIZES = Sizes()
SMOKE_SIZES = Sizes(d_model=16, n_heads=2, rank=4, offsets=(1, 2), gla_dk=4, gla_dv=8, gla_chunk=16)


# The ops: each returns (inputs that take gradients, fn(*inputs) -> output, bytes model)


@functools.cache
def declared(name: str) -> Kernel:
    """The Triton kernel ``name`` as its mixer module declares it: callable as the kernel, its
    ``reference`` the plain function it equals."""
    return triton_kernels()[name]


def _nbytes(*shapes_and_dtype) -> int:
    *shapes, dtype = shapes_and_dtype
    size = torch.empty((), dtype=dtype).element_size()
    return sum(size * int(torch.Size(s).numel()) for s in shapes)


def grassmann_case(impl: str, B: int, L: int, dtype, device, sizes: Sizes = PAPER_SIZES):
    kernel = declared("grassmann")
    r, d, offsets = sizes.rank, sizes.d_model, sizes.offsets
    C = r * (r - 1) // 2
    z = torch.randn(B, L, r, device=device, dtype=dtype, requires_grad=True)
    W = (torch.randn(d, C, device=device, dtype=dtype) / r).requires_grad_()
    b = torch.zeros(d, device=device, dtype=dtype, requires_grad=True)
    fn = kernel if impl == "triton" else kernel.reference
    fwd = _nbytes((B, L, r), (d, C), (d,), (B, L, d), dtype)
    bwd = _nbytes((B, L, d), (B, L, r), (d, C), (B, L, r), (d, C), (d,), dtype)
    return [z, W, b], lambda z, W, b: fn(z, W, b, offsets, True, 1e-6), (fwd, bwd)


class FlaUnavailable(RuntimeError):
    """flash-linear-attention is not installed, or its import failed (the message says how)."""


def _fla_chunk_gla():
    """fla's chunk_gla as f(q, k, v, log_alpha) on (B, H, L, ·) tensors; FlaUnavailable with
    the import's own error (printed verbatim) where it cannot be imported."""
    import traceback

    t0 = time.perf_counter()
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
    except ModuleNotFoundError as err:
        raise FlaUnavailable(f"not installed ({err})") from None
    except Exception as err:  # noqa: BLE001 - any import failure: said verbatim
        traceback.print_exception(err)
        raise FlaUnavailable(f"import fla.ops.gla failed: {type(err).__name__}: {err}") from None
    print(f"  from fla.ops.gla import chunk_gla: {time.perf_counter() - t0:.1f} s", flush=True)
    params = inspect.signature(fla_chunk_gla).parameters

    def run(q, k, v, g):
        if "head_first" in params:  # older fla: (B, H, T, K) when head_first=True
            out = fla_chunk_gla(q, k, v, g, scale=1.0, head_first=True)
        else:  # current fla: (B, T, H, K)
            t = lambda x: x.transpose(1, 2)  # noqa: E731
            out = fla_chunk_gla(t(q), t(k), t(v), t(g), scale=1.0)
            out = (t(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else t(out)
        return out[0] if isinstance(out, tuple) else out

    return run


def gla_case(impl: str, B: int, L: int, dtype, device, sizes: Sizes = PAPER_SIZES):
    # timed against its chunkwise PyTorch form: the reference it equals is a Python loop over L
    from seqmix.kernels.gla_chunked import gla_chunk_reference

    H, K, V, chunk = sizes.n_heads, sizes.gla_dk, sizes.gla_dv, sizes.gla_chunk
    q = (torch.randn(B, H, L, K, device=device, dtype=dtype) * K**-0.5).requires_grad_()
    k = torch.randn(B, H, L, K, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, L, V, device=device, dtype=dtype, requires_grad=True)
    la = (torch.nn.functional.logsigmoid(torch.randn(B, H, L, K, device=device)) / 16)
    la = la.to(dtype).requires_grad_()
    if impl == "triton":
        fn = lambda q, k, v, la: declared("gla")(q, k, v, la, chunk)  # noqa: E731
    elif impl == "fla":
        fn = _fla_chunk_gla()
    else:
        fn = lambda q, k, v, la: gla_chunk_reference(q, k, v, la, chunk)  # noqa: E731
    fwd = _nbytes((B, H, L, K), (B, H, L, K), (B, H, L, K), (B, H, L, V), (B, H, L, V), dtype)
    bwd = 2 * _nbytes((B, H, L, K), (B, H, L, K), (B, H, L, K), (B, H, L, V), dtype) + _nbytes(
        (B, H, L, V), dtype)
    return [q, k, v, la], fn, (fwd, bwd)


def tssa_case(impl: str, B: int, L: int, dtype, device, sizes: Sizes = PAPER_SIZES):
    kernel = declared("tssa")
    H, P = sizes.n_heads, sizes.d_model // sizes.n_heads
    w = torch.randn(B, H, L, P, device=device, dtype=dtype, requires_grad=True)
    temp = torch.ones(H, device=device, dtype=dtype, requires_grad=True)
    bias = torch.zeros(H, L, 1, device=device, dtype=dtype, requires_grad=True)
    fn = kernel if impl == "triton" else kernel.reference
    fwd = _nbytes((B, H, L, P), (B, H, L, P), dtype)
    bwd = _nbytes((B, H, L, P), (B, H, L, P), (B, H, L, P), dtype)
    return [w, temp, bias], lambda w, t, b: fn(w, t, b, True), (fwd, bwd)


def sdpa_case(impl: str, B: int, L: int, dtype, device, sizes: Sizes = PAPER_SIZES):
    H, Dh = sizes.n_heads, sizes.d_model // sizes.n_heads
    q, k, v = (torch.randn(B, H, L, Dh, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    fwd = _nbytes(*[(B, H, L, Dh)] * 4, dtype)
    bwd = _nbytes(*[(B, H, L, Dh)] * 8, dtype)
    return [q, k, v], fn, (fwd, bwd)


# ---------------------------------------------------------------------------------------
# Each kernel at its own tests' shapes, on fake tensors (the compile check's launches)
# ---------------------------------------------------------------------------------------


def _tables(path: Path, *names: str) -> dict[str, list]:
    """Module-level list literals of a test file, read without importing it (the kernel tests
    set TRITON_INTERPRET=1 at import)."""
    tree = ast.parse(path.read_text())
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and t.id in names}


def _kernel_test_table(name: str) -> list:
    path = REPO / "tests" / "kernels" / "test_kernels.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} is not here (an installed copy has no tests): run from a checkout, "
                                "or leave out --source tests")
    return _tables(path, name)[name]


def _test_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.float16)  # the tests' dtypes: fp32, and fp16 for the AMP path


def _grassmann_tests() -> Iterator[Case]:
    grassmann_mix = declared("grassmann")
    for B, L, r, d, offsets, normalize, bias in _kernel_test_table("GRASSMANN_CASES"):
        for dt in _test_dtypes():
            def call(B=B, L=L, r=r, d=d, offsets=offsets, normalize=normalize, bias=bias, dt=dt):
                z, W = _param(B, L, r, dtype=dt), _param(d, r * (r - 1) // 2, dtype=dt)
                backward(grassmann_mix(z, W, _param(d, dtype=dt) if bias else None, offsets, normalize))
            yield f"tests grassmann B{B} L{L} r{r} d{d} {dtype_name(dt)}", call


def _gla_tests() -> Iterator[Case]:
    chunk_gla = declared("gla")
    for B, H, L, Dk, Dv, chunk, _gate in _kernel_test_table("GLA_CASES"):
        for dt in _test_dtypes():
            def call(B=B, H=H, L=L, Dk=Dk, Dv=Dv, chunk=chunk, dt=dt):
                q, k, la = (_param(B, H, L, Dk, dtype=dt) for _ in range(3))
                backward(chunk_gla(q, k, _param(B, H, L, Dv, dtype=dt), la, chunk))
            yield f"tests gla B{B} H{H} L{L} Dk{Dk} Dv{Dv} chunk{chunk} {dtype_name(dt)}", call


def _tssa_tests() -> Iterator[Case]:
    tssa = declared("tssa")
    for B, H, L, p, causal in _kernel_test_table("TSSA_CASES"):
        for dt in _test_dtypes():
            def call(B=B, H=H, L=L, p=p, causal=causal, dt=dt):
                bias = _param(H, L + 3, 1, dtype=dt) if causal else None
                backward(tssa(_param(B, H, L, p, dtype=dt), _param(H, dtype=dt), bias, causal))
            yield f"tests tssa B{B} H{H} L{L} p{p} {'causal' if causal else 'non-causal'} {dtype_name(dt)}", call


def _selective_scan_tests() -> Iterator[Case]:
    selective_scan = declared("selective_scan")
    for Bt, D, N, L, _strong, skip_and_gate in _kernel_test_table("SCAN_CASES"):
        for dt in _test_dtypes():
            def call(Bt=Bt, D=D, N=N, L=L, skip_and_gate=skip_and_gate, dt=dt):
                # 16-bit u, B, C, z beside fp32 Δ, A, D: what the layer passes under autocast
                # (tests/kernels/test_kernels.py's half-input test); all fp32 otherwise
                u, B, C = _param(Bt, D, L, dtype=dt), _param(Bt, N, L, dtype=dt), _param(Bt, N, L, dtype=dt)
                delta, A = _param(Bt, D, L), _param(D, N)
                skip, z = (_param(D), _param(Bt, D, L, dtype=dt)) if skip_and_gate else (None, None)
                backward(selective_scan(u, delta, A, B, C, skip, z))
            yield (f"tests selective_scan Bt{Bt} D{D} N{N} L{L} {'with' if skip_and_gate else 'without'} D, z "
                   f"{dtype_name(dt)}"), call


# Fake inputs: the compile check records launches on them; nothing runs.


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float", "fp")


def _param(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, requires_grad=True)


def backward(out: torch.Tensor) -> None:
    out.backward(torch.empty_like(out))


# ---------------------------------------------------------------------------------------
# The launches of each declared Triton kernel
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Launches:
    """How the tools launch one declared Triton kernel (``seqmix.mixers.triton_kernels()``): ``tests``
    yields launches at its own tests' shapes (every module-level ``@triton.jit`` kernel of its module
    must compile at each); ``bench`` builds the bench's case at a (batch, length, dtype), for
    each of ``impls`` (the kernel's ``triton`` and what it is timed against); None where the
    bench does not time it."""

    tests: Callable[[], Iterator[Case]]
    bench: Callable | None = None
    impls: tuple[str, ...] = ()


LAUNCHES: dict[str, Launches] = {
    "grassmann": Launches(_grassmann_tests, grassmann_case, ("triton", "reference")),
    "gla": Launches(_gla_tests, gla_case, ("triton", "fla", "reference")),
    "tssa": Launches(_tssa_tests, tssa_case, ("triton", "reference")),
    # not timed by the bench: the compile check's other sources launch it
    "selective_scan": Launches(_selective_scan_tests),
}


def kernel_launches() -> dict[str, tuple[Kernel, Launches]]:
    """Every declared Triton kernel with its launches here, by name; a LookupError naming
    those that have none (or a name here that no mixer module declares)."""
    kernels = triton_kernels()
    problems = []
    if missing := sorted(set(kernels) - set(LAUNCHES)):
        problems.append(f"add {', '.join(missing)}")
    if unknown := sorted(set(LAUNCHES) - set(kernels)):
        problems.append(f"{', '.join(unknown)} is declared by no mixer module")
    if problems:
        raise LookupError("tools.bench.launches.LAUNCHES must launch every Triton kernel of "
                          "seqmix.mixers.triton_kernels(): " + "; ".join(problems))
    return {name: (k, LAUNCHES[name]) for name, k in kernels.items()}


# The bench's cases (op, impl, builder): each kernel's, then the softmax core they replace
# (SDPA: PyTorch's own, nothing to compile).
CASES: list[tuple[str, str, Callable]] = [
    *((name, impl, k.bench) for name, k in LAUNCHES.items() if k.bench is not None for impl in k.impls),
    ("attention", "sdpa", sdpa_case),
]
OPS = list(dict.fromkeys(op for op, _, _ in CASES))  # the kernels' op names (kernels/<op>.py) and SDPA
