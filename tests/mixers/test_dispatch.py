"""seqmix.mixers.dispatch: one implementation setting, a record of the path each call took
(in provenance.json and benchmark rows), the fallback to the reference when a fast path
fails; and no module but the CLI reads the environment. The Triton kernels' own fallback
tests are in test_kernels.py (they need the interpreter)."""

from __future__ import annotations

import ast
import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

from seqmix.mixers import dispatch
from tests.conftest import REPO


def twice(x):
    return 2 * x


def fused_cpu(calls: list, error: Exception | None = None, available: bool = True) -> dispatch.FastPath:
    """A fused-CPU fast path of ``twice`` that counts its calls and raises ``error``."""

    def fn(x):
        calls.append(x)
        if error is not None:
            raise error
        return x + x

    return dispatch.fused_cpu_path(fn, lambda: available)


def fallbacks(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, dispatch.KernelFallbackWarning)]


def test_the_setting_picks_the_path_and_the_record_says_which():
    calls, x = [], torch.ones(3)
    with dispatch.isolated() as process:
        assert dispatch.current() == "auto"
        assert torch.equal(dispatch.call("op", (x,), twice, fused_cpu(calls)), 2 * x)
        with dispatch.using("reference") as block:
            assert dispatch.current() == "reference"
            dispatch.call("op", (x,), twice, fused_cpu(calls))
        assert dispatch.current() == "auto"
        # a Triton path applies to CUDA tensors, and to every tensor under "triton"
        dispatch.call("kernel", (x,), twice, dispatch.triton_path(lambda t: calls.append(t) or t + t))
        with dispatch.using("triton") as forced:
            dispatch.call("kernel", (x,), twice, dispatch.triton_path(lambda t: calls.append(t) or t + t))
    assert len(calls) == 2  # the fused op under auto, the kernel under "triton"
    assert process.taken() == {"op": "fused_cpu", "kernel": "reference"}
    assert block.taken() == {"op": "reference"} and forced.taken() == {"kernel": "triton"}
    with pytest.raises(ValueError, match="'kernels' is not one of auto, reference, triton"):
        dispatch.configure("kernels")


def test_a_failing_fast_path_falls_back_once_and_is_recorded():
    calls, x = [], torch.arange(4.0)
    path = fused_cpu(calls, RuntimeError("PassManager::run failed"))
    with dispatch.isolated(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [dispatch.call("op", (x,), twice, path) for _ in range(3)]
        record = dispatch.provenance()
    assert all(torch.equal(out, 2 * x) for out in outs)
    assert len(calls) == 1, "after a failure the fast path is not tried again in this process"
    (warned,) = fallbacks(caught)
    assert "fused_cpu kernel 'op' failed on inputs (4,) float32 (cpu; torch " in warned
    assert "RuntimeError: PassManager::run failed" in warned and "for the rest of this process" in warned
    assert record["paths"] == {"op": "reference (fallback: fused_cpu failed: RuntimeError: PassManager::run failed)"}


def test_out_of_memory_and_tracing_errors_are_not_fallbacks():
    """An OOM propagates (the reference would need more memory); so does a failure on fake
    tensors (cost counting: the counter's own failure, which it handles)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    calls = []
    with dispatch.isolated(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(torch.OutOfMemoryError):
            dispatch.call("op", (torch.ones(2),), twice, fused_cpu(calls, torch.OutOfMemoryError("out of memory")))
        with FakeTensorMode(), pytest.raises(NotImplementedError):
            dispatch.call("op", (torch.ones(2),), twice, fused_cpu(calls, NotImplementedError("no fake kernel")))
        assert torch.equal(dispatch.call("op", (torch.ones(2),), twice, fused_cpu(calls)), 2 * torch.ones(2))
    assert not fallbacks(caught) and len(calls) == 3


def test_an_unavailable_fast_path_is_recorded_without_a_warning():
    calls = []
    with dispatch.isolated() as process, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dispatch.call("op", (torch.ones(2),), twice, fused_cpu(calls, available=False))
    assert not calls and not fallbacks(caught)
    assert process.taken() == {"op": "reference (fused_cpu not available here)"}


def test_a_fallback_can_be_made_an_error():
    with dispatch.isolated(), warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.KernelFallbackWarning)
        with pytest.raises(dispatch.KernelFallbackWarning, match="RuntimeError: bad launch"):
            dispatch.call("op", (torch.ones(2),), twice, fused_cpu([], RuntimeError("bad launch")))


class _BackwardFails(torch.autograd.Function):
    """2x forward; a backward that fails as an uncompilable backward kernel would."""

    @staticmethod
    def forward(ctx, x):
        return x + x

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("PassManager::run failed")


def test_a_kernel_whose_backward_fails_falls_back_before_the_graph_is_built():
    x = torch.randn(5, requires_grad=True)
    kernel = dispatch.triton_path(_BackwardFails.apply)
    with dispatch.isolated("triton") as process, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():  # no gradient wanted: nothing to check, the kernel's output is used
            dispatch.call("op", (x,), twice, kernel)
        out = dispatch.call("op", (x,), twice, kernel)
        (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, torch.full_like(x, 2.0))
    assert len(fallbacks(caught)) == 1
    assert process.taken() == {"op": "triton; reference (fallback: triton failed: RuntimeError: PassManager::run failed)"}


# ------------------------------------------------------------------------------------------
# Provenance of a training run (the implementation setting and the paths taken)
# ------------------------------------------------------------------------------------------


def mamba_run(prepared_mqar: dict, root: Path, reference_mixers: bool):
    from seqmix.expansion.table import expand
    from seqmix.expansion.validate import validate_study

    cfg = copy.deepcopy(prepared_mqar)
    cfg["results_dir"], cfg["architectures"] = str(root), ["mamba"]
    cfg["tasks"]["mqar"]["train"].update(steps=2, eval_every=2, checkpoint_every=2, reference_mixers=reference_mixers)
    return expand(validate_study(cfg)).run_spec("mqar", "mamba", 0)


def test_a_compiled_call_takes_the_path_an_eager_call_resolved():
    """Under torch.compile (dynamo alone here: backend "eager") a call takes the fast path an
    eager call of the same name took, as an opaque call, and the reference where none did or
    where the fast path failed; the compiler never traces the fallback machinery."""
    calls, x = [], torch.arange(4.0)

    def step(t):
        return dispatch.call("op", (t,), twice, fused_cpu(calls)) + 1

    compiled = torch.compile(step, backend="eager", fullgraph=False)
    with dispatch.isolated():
        torch._dynamo.reset()
        assert torch.equal(compiled(x), 2 * x + 1) and calls == []  # nothing resolved yet: the reference
        assert torch.equal(step(x), 2 * x + 1) and len(calls) == 1  # eager: the fast path, resolved
        torch._dynamo.reset()
        assert torch.equal(compiled(x), 2 * x + 1) and len(calls) == 2  # compiled: the resolved fast path
    failing = fused_cpu(calls, RuntimeError("no"))
    with dispatch.isolated(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch._dynamo.reset()
        dispatch.call("op", (x,), twice, failing)  # fails and falls back: nothing resolved
        n = len(calls)
        assert torch.equal(torch.compile(lambda t: dispatch.call("op", (t,), twice, failing), backend="eager")(x),
                           2 * x) and len(calls) == n
    torch._dynamo.reset()


def test_provenance_records_the_setting_and_the_paths_a_run_took(prepared_mqar, tmp_path, monkeypatch):
    from seqmix.cli import main
    from seqmix.kernels import selective_scan_cpu

    fused = "fused_cpu" if selective_scan_cpu.available() else "reference (fused_cpu not available here)"
    expected = [("auto", False, {}, fused), ("reference", True, {}, "reference"),
                ("reference", False, {"SEQMIX_REFERENCE_MIXERS": "1"}, "reference")]
    for i, (setting, reference_mixers, env, path) in enumerate(expected):
        spec = mamba_run(prepared_mqar, tmp_path / str(i), reference_mixers)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with dispatch.isolated():  # main() sets the process's setting from the environment
            assert main(["train", "--spec", spec.model_dump_json(), "--quiet"]) == 0
        prov = json.loads((Path(spec.run_dir) / "provenance.json").read_text())["implementation"]
        assert prov["setting"] == setting and prov["paths"] == {"mamba": path}, (i, prov)
        assert "triton" in prov


# ------------------------------------------------------------------------------------------
# No module reads or writes the environment but the two entry points: the command line
# (seqmix.cli.environment, its one module that does) and the Snakefile's (seqmix.study.dag,
# which keys its cache on SEQMIX_* settings and hands the environment to the `jobs` command it runs).
# ------------------------------------------------------------------------------------------

CLI_BOUNDARY = {"src/seqmix/cli/environment.py", "src/seqmix/study/dag.py",
                # a command line of its own, run by the rules before `python -m seqmix`: the GPUs
                # it spreads jobs over are the environment's (CUDA_VISIBLE_DEVICES)
                "src/seqmix/slots.py"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(source: str) -> list[int]:
    """Lines that touch the process environment: os.environ, os.getenv, os.putenv, … or
    those names imported from os."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name)
                and node.value.id == "os"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & ENV_NAMES:
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_scan_finds_what_it_looks_for():
    source = ("import os\nflag = os.environ.get('A') == '1'\nfrom os import getenv\nos.environ['B'] = '1'\n"
              "path = os.path.join('a', 'b')\nenviron = {}\n")
    assert environment_uses(source) == [2, 3, 4]


def test_no_module_but_the_entry_points_reads_the_environment():
    files = sorted([*(REPO / "src" / "seqmix").rglob("*.py"), *(REPO / "kernels").glob("*.py")])
    assert len(files) > 40
    found = [f"{f.relative_to(REPO)}:{n}" for f in files if str(f.relative_to(REPO)) not in CLI_BOUNDARY
             for n in environment_uses(f.read_text())]
    assert not found, ("read the environment in seqmix.cli.environment and pass the value on: "
                       + ", ".join(found))
    assert environment_uses((REPO / "src" / "seqmix" / "cli" / "environment.py").read_text()), \
        "the CLI's environment module is where they are read"
