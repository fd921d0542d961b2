"""Shared fixtures: the local data mirror and tiny configs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .helpers import REPO, session_dir, shared_once

# Without CUDA the Triton kernels run only under the interpreter, which triton reads when
# its language module is imported: set it before any test imports triton (the cost counts
# import torch.utils.flop_counter, which imports triton), not only in test_kernels.py.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# What CI must test, by the variable .ci/run sets to 1 for it: where one of these is missing,
# a test that needs it skips on a developer's machine and fails in CI (skip_or_fail), so that
# CI is never green without having tested it. tests/project/test_repository.py holds .ci/run to this
# list and every skip in tests/ to skip_or_fail with one of these.
REQUIREMENTS = {
    "SEQMIX_REQUIRE_MIRROR": "the data layer",
    "SEQMIX_REQUIRE_SLURM": "the cluster path",
    "SEQMIX_REQUIRE_CPU_EXTENSION": "Mamba's fused CPU scan",
    "SEQMIX_REQUIRE_NAMESPACE": "a real full disk",
    "SEQMIX_REQUIRE_TRITON": "the Triton kernels",
    "SEQMIX_REQUIRE_MALLOPT": "glibc's malloc settings",
    "SEQMIX_REQUIRE_COMPILER": "portable numerics' oneMKL shim, built with a C compiler",
}
REQUIRE_MIRROR_ENV = "SEQMIX_REQUIRE_MIRROR"
REQUIRE_TRITON_ENV = "SEQMIX_REQUIRE_TRITON"


def skip_or_fail(msg: str, require_env: str, what: str | None = None) -> NoReturn:
    """Skip with ``msg`` on a developer's machine; fail where ``$require_env`` is 1 (CI sets
    it), where skipping would leave CI green without having tested ``what`` (by default what
    REQUIREMENTS says the variable stands for)."""
    what = what or REQUIREMENTS[require_env]
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{msg} ({require_env}=1: this run must test {what})", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def require_triton():
    """The triton module, for a test module's top level: skipped without it on a developer's
    machine, failed in CI ($SEQMIX_REQUIRE_TRITON=1)."""
    try:
        import triton
    except ImportError as e:
        skip_or_fail(f"triton cannot be imported here ({e}): the kernel tests need it (requirements.txt pins it)",
                     REQUIRE_TRITON_ENV)
    return triton


def mirror_path() -> Path | None:
    """$SEQMIX_DATA_MIRROR when set (and only it: an explicit choice is never overridden),
    else ../shared/data beside the repository, as the Makefile does; None without one."""
    env = os.environ.get("SEQMIX_DATA_MIRROR")
    candidate = Path(env) if env else REPO.parent / "shared" / "data"
    return candidate.resolve() if (candidate / "wikitext-2-raw").is_dir() else None


def require_mirror() -> Path:
    """The data mirror; without one, skip_or_fail (SEQMIX_REQUIRE_MIRROR)."""
    path = mirror_path()
    if path is None:
        where = os.environ.get("SEQMIX_DATA_MIRROR") or REPO.parent / "shared" / "data"
        skip_or_fail(f"no data mirror at {where}: set SEQMIX_DATA_MIRROR to a directory with the mirror layout "
                     "(README: The data mirror)", REQUIRE_MIRROR_ENV)
    return path


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The data mirror. Tests that need it skip without one on a developer's machine, and
    fail in CI ($SEQMIX_REQUIRE_MIRROR=1), where skipping them would leave CI green
    without having tested the data layer."""
    return require_mirror()


# Every mixer's small options for tests: fp64 property checks and full Jacobians stay fast
# (test_mixers.py, test_mixer_contracts.py, test_analysis_measured.py); every other option
# is the default. A new mixer whose defaults are slow in fp64 adds a line here.
TINY_OPTIONS: dict[str, dict] = {
    "softmax": {"n_heads": 2},
    "grassmann": {"rank": 5, "offsets": (1, 2, 3)},
    # Chunks, windows and blocks smaller than the test lengths, so that the fast paths
    # cross chunk boundaries and end on a partial chunk.
    "linear": {"n_heads": 2, "chunk_size": 4},
    "performer": {"n_heads": 2, "chunk_size": 4, "feature_seed": 0},
    "sliding_window": {"n_heads": 2, "window": 3, "n_global": 1},
    "bigbird": {"n_heads": 2, "block_size": 2, "n_random": 1, "seed": 0},
    "linformer": {"n_heads": 2, "k": 4},
    "crate": {"n_heads": 2},
    # Chunks smaller than the test lengths (and GLA's sub-chunks smaller than its chunk),
    # so that the chunked forms cross chunk boundaries and end on a partial chunk.
    "gla": {"n_heads": 2, "chunk_size": 4, "gate_low_rank_dim": 4},
    "h3": {"d_state": 4, "head_dim": 2},
    "mamba": {"d_state": 4, "chunk_size": 4},
    "tssa": {"n_heads": 2},
}


def tiny_mixer(name: str, causal: bool | None = None, max_len: int = 16, dtype: torch.dtype = torch.float64,
               d_model: int = 8, **overrides):
    """Mixer ``name`` with its TINY_OPTIONS (and ``overrides``), seeded, in ``dtype``, in eval
    mode; causal where it has a causal form unless ``causal`` says otherwise."""
    from seqmix import mixers

    if causal is None:
        causal = mixers.mixer_class(name).supports_causal
    torch.manual_seed(0)
    m = mixers.build(name, d_model, causal=causal, max_len=max_len, **{**TINY_OPTIONS.get(name, {}), **overrides})
    return m.to(dtype).eval()


def tiny_config(root: Path, mirror: Path | None, archs=("softmax", "grassmann"), seeds=(0,)) -> dict:
    """A complete config sized for tests: seconds per run on one CPU core."""
    model = {"d_model": 16, "n_layers": 1, "dropout": 0.0, "budget": {"params": None}}
    train = {"steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 3,
             "eval_batches": 2, "log_every": 2, "checkpoint_every": 3, "threads": 1}
    cfg = {
        "profile": "test",
        "results_dir": str(root / "results"),
        "data": {"dir": str(root / "data"), "mirror": str(mirror) if mirror else None,
                 "source": "mirror" if mirror else "auto"},
        # Trained on the (1 MB) validation split to keep the test fast; recorded as such.
        "tokenizer": {"kind": "trained", "vocab_size": 256, "train_split": "validation"},
        "architectures": list(archs),
        "seeds": list(seeds),
        "tasks": {
            "mqar": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "num_train": 64,
                     "num_test": 16, "model": model, "train": train},
        },
        "mixers": {"grassmann": {"rank": 4, "offsets": [1, 2]}},
        "analysis": {
            "complexity": {"lengths": [8, 16, 32], "d_model": 16, "repeats": 2, "warmup": 0},
            "throughput": {"lengths": [8, 16], "d_model": 16, "vocab_size": 64, "tokens_per_batch": 32,
                           "warmup": 0, "steps": 1, "repeats": 2},
            "sparsity": {"tasks": ["wikitext2" if mirror else "mqar"], "num_sequences": 2},
            "copy_probe": {"d_model": 16, "seq_len": 8, "vocab_size": 16, "steps": 4, "batch_size": 4,
                           "warmup_steps": 1, "eval_sequences": 8},
        },
    }
    if mirror:
        cfg["tasks"]["wikitext2"] = {"block_size": 16, "eval_max_tokens": 256, "model": model, "train": train}
        cfg["tasks"]["snli"] = {"train_file": "train_head_1024", "max_sentence_tokens": 8,
                                "eval_max_examples": 32, "model": model, "train": train}
    return cfg


def prepare_all(study) -> None:
    """Prepare the tokenizer (when a task needs it) and every task's data of ``study``."""
    from seqmix.data.tokenizer import prepare_tokenizer
    from seqmix.expansion.table import expand
    from seqmix.tasks import task_class

    expansion = expand(study)
    if any(expansion.needs_tokenizer(g) for g in expansion.groups):
        prepare_tokenizer(expansion.tokenizer_job())
    for g in expansion.groups:
        job = expansion.data_job(g)
        task_class(job.kind).prepare(job)


@pytest.fixture(scope="session")
def shared_study(tmp_path_factory, mirror):
    """The tiny study the DAG tests share (tests/shared_study.py), built once for the session and
    put through what they ask of it: one build for every pytest worker, started as the
    session starts (pytest_collection_modifyitems below)."""
    from tests.shared_study import shared_study

    return shared_study(session_dir(tmp_path_factory) / "shared-study", mirror)


_BUILDING = []  # the process building the shared study, where this worker started it


# The files that take minutes (`make test --durations=30`), longest first. `make test` runs
# files on two workers in the order collected (--dist loadfile --no-loadscope-reorder): these
# start first and the many quick files fill in around them, so that both workers end
# together. (By default pytest-xdist would order files by their number of tests, which put
# most of these last, one worker running them alone at the end.) A guess of order, not a
# bound: a file missing here only runs later.
LONGEST = (
    "tests/tools/test_gpu_headline_script.py",
    "tests/workflow/test_reruns.py",
    "tests/core/test_numerics.py",
    "tests/workflow/test_checkouts.py",
    "tests/tools/test_gpucheck.py",
    "tests/core/test_slots.py",
    "tests/workflow/test_slurm.py",
    "tests/faults/test_disk.py",
    "tests/mixers/test_mixers_scan.py",
    "tests/core/test_plan.py",
    "tests/mixers/test_mixers_attention.py",
    "tests/kernels/test_kernels.py",
)


def file_of(item) -> str:
    return item.nodeid.split("::")[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # The shared study takes minutes: where a test of this session needs it, its build starts
    # now, in a process of its own, and the other tests run first, beside it (a stable sort:
    # the files that need it go last, and in them the tests that need it). Before them, the
    # longest files first (LONGEST).
    def needs(item) -> bool:
        return "shared_study" in getattr(item, "fixturenames", ())

    needing = {file_of(i) for i in items if needs(i)}
    rank = {name: n for n, name in enumerate(LONGEST)}
    items.sort(key=lambda i: (file_of(i) in needing, rank.get(file_of(i), len(LONGEST)), needs(i)))
    factory, mirror = getattr(config, "_tmp_path_factory", None), mirror_path()
    if not needing or factory is None or mirror is None or config.option.collectonly:
        return
    from tests.shared_study import start_building

    if (proc := start_building(session_dir(factory) / "shared-study", mirror)) is not None:
        _BUILDING.append(proc)


def pytest_sessionfinish(session, exitstatus):
    for proc in _BUILDING:
        if proc.poll() is None:  # a session cut short: its build goes with it
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def prepared_config(root: Path, mirror: Path | None) -> dict:
    """The tiny config in ``root`` with every task's data prepared."""
    from seqmix.expansion.validate import validate_study

    raw = tiny_config(root, mirror)
    prepare_all(validate_study(raw))
    return raw


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, mirror) -> dict:
    """Tiny config (a raw mapping) with every task's data prepared once for the session, for
    every worker (a tokenizer trained and WikiText-2 and SNLI prepared: half a minute)."""
    return shared_once(tmp_path_factory, "prepared", lambda root: prepared_config(root, mirror))


@pytest.fixture(scope="session")
def prepared_mqar(tmp_path_factory) -> dict:
    """The tiny config's MQAR task alone, prepared: synthetic, so it needs no mirror (tests
    of training mechanics use it and run everywhere)."""
    return shared_once(tmp_path_factory, "prepared-mqar", lambda root: prepared_config(root, None))


class OutputSizes(TorchDispatchMode):
    """Records the tensors every op produces while active: ``total`` elements written (a
    deterministic measure of work that exposes a gradient zero-filled at full size on every
    loop step) and the ``largest`` single tensor (to check 'no L x L tensor')."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.total += t.numel()
                self.largest = max(self.largest, t.numel())
        return out
