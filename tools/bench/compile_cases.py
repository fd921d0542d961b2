"""Where the compile check's launches come from: the calls the project makes to its Triton
kernels, as (origin, call) cases that ``tools.bench.compile_jit.record`` runs on fake tensors.

- ``profiles``: config/config.yaml and config/paper.yaml: each run's mixers as training builds
  them, a training step (forward and backward under the run's precision) at the train batch
  and evaluations (fp32, no grad) at batches 1, 2, 16 and the train batch (the batch enters
  the kernels' integers as a factor, so these four give every ``== 1`` / ``% 16`` outcome);
  shorter lengths where a task makes them (``SHORTER``); the complexity analysis and the
  throughput benchmark at their shapes.
- ``bench``: ``bench kernels``'s triton cases at batch 4, its lengths and the GPU
  correctness lengths, in bf16, fp16 and fp32, forward and backward. It has none for Mamba's
  selective scan (not timed there), so the scan's launches come from the other two sources.
- ``tests``: each kernel's test shapes (the ``*_CASES`` tables of tests/test_kernels.py).

Mamba reaches its scan as the other mixers reach their kernels (``dispatch``'s Triton path);
the scan's halves are ``torch.library`` custom ops, whose host code the recording runs in
place of their fake impls (``compile_jit``).

Not covered: the sparsity and geometry analyses and generation (no kernel there).
A new kernel is one ``KERNELS`` entry here (and its name in ``seqmix.kernels.KERNELS``).
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from seqmix import REPO_ROOT as REPO  # the checkout: its tests/ and config/ are read

PROFILES = ("config/config.yaml", "config/paper.yaml")
BENCH_BATCH = 4
BENCH_EXTRA_LENGTHS = (1, 63, 1000, 4096)  # the GPU correctness check's lengths (bench's case builders)
BENCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

Case = tuple[str, Callable[[], None]]  # (where the launch comes from, a call that launches it)


# ---------------------------------------------------------------------------------------
# The kernels, and each one's own test shapes
# ---------------------------------------------------------------------------------------


def _tables(path: Path, *names: str) -> dict[str, list]:
    """Module-level list literals of a test file, read without importing it (the kernel tests
    set TRITON_INTERPRET=1 at import)."""
    tree = ast.parse(path.read_text())
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and t.id in names}


def _kernel_test_table(name: str) -> list:
    path = REPO / "tests" / "test_kernels.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} is not here (an installed copy has no tests): run from a checkout, "
                                "or leave out --source tests")
    return _tables(path, name)[name]


def _test_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.float16)  # the tests' dtypes: fp32, and fp16 for the AMP path


def _grassmann_tests() -> Iterator[Case]:
    from seqmix.kernels.grassmann import grassmann_mix

    for B, L, r, d, offsets, normalize, bias in _kernel_test_table("GRASSMANN_CASES"):
        for dt in _test_dtypes():
            def call(B=B, L=L, r=r, d=d, offsets=offsets, normalize=normalize, bias=bias, dt=dt):
                z, W = _param(B, L, r, dtype=dt), _param(d, r * (r - 1) // 2, dtype=dt)
                _backward(grassmann_mix(z, W, _param(d, dtype=dt) if bias else None, offsets, normalize))
            yield f"tests grassmann B{B} L{L} r{r} d{d} {_dt(dt)}", call


def _gla_tests() -> Iterator[Case]:
    from seqmix.kernels.gla import chunk_gla

    for B, H, L, Dk, Dv, chunk, _gate in _kernel_test_table("GLA_CASES"):
        for dt in _test_dtypes():
            def call(B=B, H=H, L=L, Dk=Dk, Dv=Dv, chunk=chunk, dt=dt):
                q, k, la = (_param(B, H, L, Dk, dtype=dt) for _ in range(3))
                _backward(chunk_gla(q, k, _param(B, H, L, Dv, dtype=dt), la, chunk))
            yield f"tests gla B{B} H{H} L{L} Dk{Dk} Dv{Dv} chunk{chunk} {_dt(dt)}", call


def _tssa_tests() -> Iterator[Case]:
    from seqmix.kernels.tssa import tssa

    for B, H, L, p, causal in _kernel_test_table("TSSA_CASES"):
        for dt in _test_dtypes():
            def call(B=B, H=H, L=L, p=p, causal=causal, dt=dt):
                bias = _param(H, L + 3, 1, dtype=dt) if causal else None
                _backward(tssa(_param(B, H, L, p, dtype=dt), _param(H, dtype=dt), bias, causal))
            yield f"tests tssa B{B} H{H} L{L} p{p} {'causal' if causal else 'non-causal'} {_dt(dt)}", call


def _selective_scan_tests() -> Iterator[Case]:
    from seqmix.kernels.selective_scan import selective_scan

    for Bt, D, N, L, _strong, skip_and_gate in _kernel_test_table("SCAN_CASES"):
        for dt in _test_dtypes():
            def call(Bt=Bt, D=D, N=N, L=L, skip_and_gate=skip_and_gate, dt=dt):
                # 16-bit u, B, C, z beside fp32 Δ, A, D: what the layer passes under autocast
                # (tests/test_kernels.py's half-input test); all fp32 otherwise
                u, B, C = _param(Bt, D, L, dtype=dt), _param(Bt, N, L, dtype=dt), _param(Bt, N, L, dtype=dt)
                delta, A = _param(Bt, D, L), _param(D, N)
                skip, z = (_param(D), _param(Bt, D, L, dtype=dt)) if skip_and_gate else (None, None)
                _backward(selective_scan(u, delta, A, B, C, skip, z))
            yield (f"tests selective_scan Bt{Bt} D{D} N{N} L{L} {'with' if skip_and_gate else 'without'} D, z "
                   f"{_dt(dt)}"), call


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """A module of Triton kernels: every module-level ``@triton.jit`` kernel in it must compile
    at every launch; ``tests`` yields launches at its own tests' shapes (None: no such shapes)."""

    module: str
    tests: Callable[[], Iterator[Case]] | None = None


KERNELS: dict[str, KernelEntry] = {
    "grassmann": KernelEntry("seqmix.kernels.grassmann", _grassmann_tests),
    "gla": KernelEntry("seqmix.kernels.gla", _gla_tests),
    "tssa": KernelEntry("seqmix.kernels.tssa", _tssa_tests),
    "selective_scan": KernelEntry("seqmix.kernels.selective_scan", _selective_scan_tests),
}


# ---------------------------------------------------------------------------------------
# Fake inputs
# ---------------------------------------------------------------------------------------


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float", "fp")


def _param(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, requires_grad=True)


def _backward(out: torch.Tensor) -> None:
    out.backward(torch.empty_like(out))


def _mixer_call(mixer, batch: int, length: int, precision: str, train: bool) -> None:
    """The mixer on a (batch, length, d_model) fp32 input (the residual stream's dtype), as a
    training step (under the run's precision, then backward) or an evaluation (fp32, no grad)."""
    from seqmix.train.step import autocast

    x = torch.empty(batch, length, mixer.d_model, requires_grad=train)
    mixer.train(train)
    with autocast(torch.device("cpu"), precision if train else "fp32"), torch.set_grad_enabled(train):
        y = mixer(x)
    if train:
        _backward(y)


def has_triton_path(arch: str) -> bool:
    """Whether ``arch``'s mixer module has a Triton fast path (``dispatch.triton_path``): only
    these mixers launch kernels, so only they are run (the others may not even run on fake
    tensors, e.g. where a mask is built from data)."""
    from seqmix import mixers
    from seqmix.mixers.dispatch import FastPath

    module = sys.modules[mixers.mixer_class(arch).__module__]
    return any(isinstance(v, FastPath) and v.kind == "triton" for v in vars(module).values())


def _distinct_mixers(model: torch.nn.Module) -> list:
    """One of each distinct mixer of a model (the layers of a model mostly share theirs)."""
    from seqmix.mixers.base import Mixer

    seen = {}
    for m in model.modules():
        if isinstance(m, Mixer):
            seen.setdefault((type(m).__name__, repr(m.options), m.d_model, m.causal, m.max_len), m)
    return list(seen.values())


# ---------------------------------------------------------------------------------------
# Where launches come from
# ---------------------------------------------------------------------------------------


def _shapes(shorter_batches: dict[str, str], phase: str, B: int, L: int) -> list[tuple[int, int]]:
    """The (batch, length) pairs a task's mixers see in ``phase`` (``Task.shorter_batches``)."""
    batches = [B] if phase == "train" else sorted({b for b in (1, 2, 16, B) if b <= B})
    shorter = shorter_batches.get(phase)
    extra = [] if shorter is None else [(b, n) for n in range(1, L) for b in (batches if shorter == "all" else (1,))]
    return [(b, L) for b in batches] + extra


def _run_cases(spec, profile: str) -> Iterator[Case]:
    """Training and evaluation calls of one run spec's mixers."""
    from seqmix.preflight import solved_size
    from seqmix.tasks import task_class

    if not has_triton_path(spec.arch):
        return
    task = task_class(spec.kind).without_data(spec)
    size = solved_size(spec)
    built: list = []

    def mixers():
        if not built:  # built inside the recording (fake parameters)
            built.extend(_distinct_mixers(task.build_model(size.d_model, size.n_layers, size.d_ff_mult)))
        return built

    label = f"{profile} {spec.task} {spec.arch} d{size.d_model}"
    for phase in ("train", "eval"):
        shapes = _shapes(task.shorter_batches, phase, spec.train.batch_size, task.sequence_length)

        def call(phase=phase, shapes=shapes):
            for m in mixers():
                for b, length in shapes:
                    _mixer_call(m, b, length, spec.train.precision, phase == "train")

        bs, ls = sorted({b for b, _ in shapes}), sorted({n for _, n in shapes})
        yield f"{label} {phase} b{'/'.join(map(str, bs))} L{_span(ls)}", call


def _span(lengths) -> str:
    return f"{lengths[0]}-{lengths[-1]}" if len(lengths) > 1 else str(lengths[0])


def _analysis_cases(study, profile: str) -> Iterator[Case]:
    """The complexity analysis's mixers and the throughput benchmark's, fp32."""
    from seqmix import mixers as registry
    from seqmix.study.table import complexity_job, throughput_job

    job = complexity_job(study)
    cfg = job.complexity
    for arch in filter(has_triton_path, job.architectures):
        def call(arch=arch):  # as analysis.complexity.build_mixer builds them (no .to(device) on fakes)
            causal = registry.mixer_class(arch).supports_causal
            for L in cfg.lengths:
                m = registry.build(arch, cfg.d_model, causal=causal, max_len=L, **job.mixers.get(arch, {}))
                _mixer_call(m, cfg.batch_size, L, "fp32", False)
                _mixer_call(m, cfg.batch_size, L, "fp32", True)
        yield f"{profile} complexity {arch} d{cfg.d_model} b{cfg.batch_size} L{_span(cfg.lengths)}", call
    tj = throughput_job(study)
    tp = tj.throughput
    for arch in filter(has_triton_path, tj.architectures):
        if not registry.mixer_class(arch).supports_causal:
            continue
        def call(arch=arch):  # noqa: E306 - as analysis.throughput.training_step builds them
            for L in tp.lengths:
                m = registry.build(arch, tp.d_model, causal=True, max_len=L, **tj.mixers.get(arch, {}))
                _mixer_call(m, max(1, tp.tokens_per_batch // L), L, "fp32", True)
        yield f"{profile} throughput {arch} d{tp.d_model} L{_span(tp.lengths)}", call


def profile_cases(root: Path = REPO) -> Iterator[Case]:
    from seqmix.preflight import cost_specs
    from seqmix.study.load import load_study

    for path in PROFILES:
        study = load_study(root / path)
        name = Path(path).stem
        for spec in cost_specs(study):
            yield from _run_cases(spec, name)
        yield from _analysis_cases(study, name)


def bench_cases() -> Iterator[Case]:
    from tools.bench.kernels import CASES, DEFAULT_LENGTHS

    lengths = sorted({*DEFAULT_LENGTHS, *BENCH_EXTRA_LENGTHS})
    for op, impl, case in CASES:
        if impl != "triton":
            continue
        for dtype in BENCH_DTYPES:
            def call(case=case, dtype=dtype):
                for L in lengths:
                    inputs, fn, _ = case("triton", BENCH_BATCH, L, dtype, torch.device("cpu"))
                    _backward(fn(*inputs))
            yield f"bench {op} b{BENCH_BATCH} L{_span(lengths)} {_dt(dtype)}", call


def test_cases() -> Iterator[Case]:
    for entry in KERNELS.values():
        if entry.tests is not None:
            yield from entry.tests()


SOURCES: dict[str, Callable[[], Iterator[Case]]] = {"profiles": profile_cases, "bench": bench_cases,
                                                    "tests": test_cases}
