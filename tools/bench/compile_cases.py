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
- ``tests``: each kernel's test shapes (the ``*_CASES`` tables of tests/kernels/test_kernels.py), as its
  entry of ``tools.bench.launches.LAUNCHES`` launches them.

Mamba reaches its scan as the other mixers reach their kernels (``dispatch``'s Triton path);
the scan's halves are ``torch.library`` custom ops, whose host code the recording runs in
place of their fake impls (``compile_jit``).

Not covered: the sparsity and geometry analyses and generation (no kernel there).
A new kernel is its declaration in its mixer's module (``seqmix.mixers.base.kernel``) and its
launches in ``tools.bench.launches.LAUNCHES``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from seqmix import REPO_ROOT as REPO  # the checkout: its config/ is read
from tools.bench.launches import Case, backward, dtype_name, kernel_launches

PROFILES = ("config/config.yaml", "config/paper.yaml")
BENCH_BATCH = 4
BENCH_EXTRA_LENGTHS = (1, 63, 1000, 4096)  # the GPU correctness check's lengths (bench's case builders)
BENCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32)



# ---------------------------------------------------------------------------------------
# Fake inputs
# ---------------------------------------------------------------------------------------


def _mixer_call(mixer, batch: int, length: int, precision: str, train: bool) -> None:
    """The mixer on a (batch, length, d_model) fp32 input (the residual stream's dtype), as a
    training step (under the run's precision, then backward) or an evaluation (fp32, no grad)."""
    from seqmix.train.step import autocast

    x = torch.empty(batch, length, mixer.d_model, requires_grad=train)
    mixer.train(train)
    with autocast(torch.device("cpu"), precision if train else "fp32"), torch.set_grad_enabled(train):
        y = mixer(x)
    if train:
        backward(y)


def has_triton_path(arch: str) -> bool:
    """Whether ``arch``'s mixer module declares a Triton kernel (``seqmix.mixers.triton_kernels()``):
    only these mixers launch kernels, so only they are run (the others may not even run on fake
    tensors, e.g. where a mask is built from data)."""
    from seqmix import mixers

    module = mixers.mixer_class(arch).__module__
    return any(k.declared_by == module for k in mixers.triton_kernels().values())


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

    where = f"{profile} {spec.task} {spec.arch} d{size.d_model}"
    for phase in ("train", "eval"):
        shapes = _shapes(task.shorter_batches, phase, spec.train.batch_size, task.sequence_length)

        def call(phase=phase, shapes=shapes):
            for m in mixers():
                for b, length in shapes:
                    _mixer_call(m, b, length, spec.train.precision, phase == "train")

        bs, ls = sorted({b for b, _ in shapes}), sorted({n for _, n in shapes})
        yield f"{where} {phase} b{'/'.join(map(str, bs))} L{_span(ls)}", call


def _span(lengths) -> str:
    return f"{lengths[0]}-{lengths[-1]}" if len(lengths) > 1 else str(lengths[0])


def _analysis_cases(expansion, profile: str) -> Iterator[Case]:
    """The complexity analysis's mixers and the throughput benchmark's, fp32."""
    from seqmix import mixers

    job = expansion.complexity_job()
    cfg = job.complexity
    for arch in filter(has_triton_path, job.architectures):
        def call(arch=arch):  # as analysis.complexity.build_mixer builds them (no .to(device) on fakes)
            causal = mixers.mixer_class(arch).supports_causal
            for L in cfg.lengths:
                m = mixers.build(arch, cfg.d_model, causal=causal, max_len=L, **job.mixers.get(arch, {}))
                _mixer_call(m, cfg.batch_size, L, "fp32", False)
                _mixer_call(m, cfg.batch_size, L, "fp32", True)
        yield f"{profile} complexity {arch} d{cfg.d_model} b{cfg.batch_size} L{_span(cfg.lengths)}", call
    tj = expansion.throughput_job()
    tp = tj.throughput
    for arch in filter(has_triton_path, tj.architectures):
        if not mixers.mixer_class(arch).supports_causal:
            continue
        def call(arch=arch):  # noqa: E306 - as analysis.throughput.training_step builds them
            for L in tp.lengths:
                m = mixers.build(arch, tp.d_model, causal=True, max_len=L, **tj.mixers.get(arch, {}))
                _mixer_call(m, max(1, tp.tokens_per_batch // L), L, "fp32", True)
        yield f"{profile} throughput {arch} d{tp.d_model} L{_span(tp.lengths)}", call


def profile_cases(root: Path = REPO) -> Iterator[Case]:
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import load_study
    from seqmix.preflight import Specs, cost_specs

    for path in PROFILES:
        expansion = expand(load_study(root / path))
        name = Path(path).stem
        for spec in cost_specs(Specs.of_expansion(expansion)):
            yield from _run_cases(spec, name)
        yield from _analysis_cases(expansion, name)


def bench_cases() -> Iterator[Case]:
    from tools.bench.kernels import DEFAULT_LENGTHS

    lengths = sorted({*DEFAULT_LENGTHS, *BENCH_EXTRA_LENGTHS})
    for op, (_, launch) in kernel_launches().items():
        if launch.bench is None:
            continue
        for dtype in BENCH_DTYPES:
            def call(case=launch.bench, dtype=dtype):
                for L in lengths:
                    inputs, fn, _ = case("triton", BENCH_BATCH, L, dtype, torch.device("cpu"))
                    backward(fn(*inputs))
            yield f"bench {op} b{BENCH_BATCH} L{_span(lengths)} {dtype_name(dtype)}", call


def test_cases() -> Iterator[Case]:
    for _, launch in kernel_launches().values():
        yield from launch.tests()


SOURCES: dict[str, Callable[[], Iterator[Case]]] = {"profiles": profile_cases, "bench": bench_cases,
                                                    "tests": test_cases}
