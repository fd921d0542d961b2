"""Triton kernels against their PyTorch references, forward and backward, on the CPU.

The kernels run under the Triton interpreter (numpy, exact fp32). ``TRITON_INTERPRET=1``
must be set before any ``triton.jit`` function is defined, so it is set at the top of this
module and the kernel modules are imported inside the tests through ``_kernel_module``
(which re-imports a module that something else loaded in compiled mode). Setting it for the
whole pytest process is harmless: nothing else runs Triton on the CPU.

Tolerances (fp32): kernel and reference compute the same sums in different orders (tiles,
closed-form backward, chunked scans), so they agree to a few ulps of the largest term:
rtol 1e-4, atol 1e-5 × the reference's largest magnitude. A wrong index, mask or
missing term is off by O(1) relative, orders of magnitude above that.
Sizes are awkward on purpose (L = 1, L not a multiple of the 16-token interpreter tile,
r, d_k, p not powers of two, offsets ≥ L and duplicated, B and H > 1) and tiny: the
interpreter is slow.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any triton.jit function is defined

import importlib  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.conftest import require_triton  # noqa: E402
from tests.helpers import assert_close, assert_same_fwd_bwd, grads, scan_inputs  # noqa: E402

require_triton()

from seqmix.mixers.gla import gla_recurrent_reference  # noqa: E402
from seqmix.mixers.grassmann import grassmann_mix_reference, plucker  # noqa: E402
from seqmix.mixers.mamba import selective_scan_reference  # noqa: E402
from seqmix.mixers.tssa import tssa_reference  # noqa: E402


def _kernel_module(name: str):
    """seqmix.kernels.<name>, with its kernels defined under the interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    mod = importlib.import_module(f"seqmix.kernels.{name}")
    probe = {"grassmann": "_fwd_kernel", "gla": "_fwd_o_kernel", "tssa": "_causal_fwd_kernel",
             "selective_scan": "_fwd_kernel"}[name]
    if not isinstance(getattr(mod, probe), InterpretedFunction):
        importlib.reload(sys.modules["seqmix.kernels._common"])
        mod = importlib.reload(mod)
    return mod


def assert_matches(got, want, what: str, rtol: float = 1e-4, atol_rel: float = 1e-5):
    """At this module's fp32 tolerances (its docstring): atol a fraction of the largest value."""
    assert_close(got, want, what, atol=atol_rel, rtol=rtol, scaled=True)


def check(kernel_fn, ref_fn, inputs: list[torch.Tensor], names: list[str]):
    """Forward and the gradient of every input, kernel vs reference, for one random dy."""
    assert_same_fwd_bwd(kernel_fn, ref_fn, inputs, names=names, atol=1e-5, rtol=1e-4, scaled=True)


# --------------------------------------------------------------------------------------
# Causal Grassmann (Zhang 2025, arXiv:2512.19428, §3.2; causal pairing t - Δ)
# --------------------------------------------------------------------------------------

GRASSMANN_CASES = [
    # B, L, r, d, offsets, normalize, bias
    (2, 37, 5, 20, (1, 2, 4, 40, 2), True, True),  # ragged L, dup offset, offset ≥ L
    (1, 1, 7, 16, (1,), True, True),  # L = 1: no valid offset anywhere, g = 0
    (3, 19, 7, 33, (1, 3, 3, 8), False, False),  # unnormalised, no bias, d ragged
    (2, 18, 6, 17, (20, 30), True, True),  # every offset ≥ L
]


@pytest.mark.parametrize("B,L,r,d,offsets,normalize,bias", GRASSMANN_CASES)
def test_grassmann_matches_reference(B, L, r, d, offsets, normalize, bias):
    gm = _kernel_module("grassmann")
    g = torch.Generator().manual_seed(L * 31 + r)
    z = torch.randn(B, L, r, generator=g).requires_grad_()
    W = (torch.randn(d, r * (r - 1) // 2, generator=g) / r).requires_grad_()
    b = torch.randn(d, generator=g).requires_grad_() if bias else None
    inputs, names = [z, W] + ([b] if bias else []), ["z", "W"] + (["b"] if bias else [])

    def kern(z, W, b=None):
        return gm.grassmann_mix(z, W, b, offsets, normalize, 1e-6)

    def ref(z, W, b=None):
        return grassmann_mix_reference(z, W, b, offsets, normalize, 1e-6)

    check(kern, ref, inputs, names)
    if min(offsets) >= L:
        assert gm.grassmann_mix(z, W, b, offsets, normalize).abs().max() == 0


def test_grassmann_norm_clamp_and_degenerate_pairs():
    """‖p‖ < ε (clamped: no gradient through the norm) mixed with unclamped pairs, and
    exactly parallel pairs (p = 0)."""
    gm = _kernel_module("grassmann")
    g = torch.Generator().manual_seed(7)
    z = torch.randn(2, 21, 4, generator=g) * 0.7
    z[:, 9] = 2.0 * z[:, 8]  # p(z_9, z_8) = 0 exactly
    z = z.requires_grad_()
    W = torch.randn(16, 6, generator=g).requires_grad_()
    b = torch.randn(16, generator=g).requires_grad_()
    offsets, eps = (1, 2), 0.3
    with torch.no_grad():
        nrm = torch.linalg.vector_norm(plucker(z[:, 1:], z[:, :-1]), dim=-1)
    assert (nrm < eps).any() and (nrm > eps).any()  # both branches are exercised
    check(lambda z, W, b: gm.grassmann_mix(z, W, b, offsets, True, eps),
          lambda z, W, b: grassmann_mix_reference(z, W, b, offsets, True, eps),
          [z, W, b], ["z", "W", "b"])


def test_grassmann_rejects_noncausal_offsets():
    gm = _kernel_module("grassmann")
    z, W = torch.randn(1, 4, 3), torch.randn(5, 3)
    with pytest.raises(ValueError, match="causal case only"):
        gm.grassmann_mix(z, W, None, (1, -1))


@pytest.mark.slow
def test_grassmann_paper_rank():
    """r = 32 (C = 496 over several C tiles), the paper's offsets; ~30 s in the interpreter."""
    gm = _kernel_module("grassmann")
    g = torch.Generator().manual_seed(3)
    z = torch.randn(2, 50, 32, generator=g).requires_grad_()
    W = (torch.randn(64, 496, generator=g) / 32).requires_grad_()
    b = torch.randn(64, generator=g).requires_grad_()
    offs = (1, 2, 4, 8, 12, 16)
    check(lambda z, W, b: gm.grassmann_mix(z, W, b, offs),
          lambda z, W, b: grassmann_mix_reference(z, W, b, offs), [z, W, b], ["z", "W", "b"])


@pytest.mark.parametrize("B,L,r,d,offsets,bias", [(1, 19, 4, 16, (1, 2, 2, 30), True), (1, 1, 4, 16, (1,), False)])
def test_the_grassmann_ops_pass_torch_library_opcheck(B, L, r, d, offsets, bias):
    """The forward and backward custom ops: schema, fake (shape) impls, autograd registration
    and AOT dispatch, as torch.compile uses them (torch.library.opcheck), at a ragged L with a
    duplicated offset and one ≥ L, and at L = 1 without bias."""
    gm = _kernel_module("grassmann")
    g = torch.Generator().manual_seed(B * L)
    z = torch.randn(B, L, r, generator=g).requires_grad_()
    W = (torch.randn(d, r * (r - 1) // 2, generator=g) / r).requires_grad_()
    b = torch.randn(d, generator=g).requires_grad_() if bias else None
    torch.library.opcheck(gm._forward, (z, W, b, list(offsets), True, 1e-6))
    _, c, s_, rn = gm._forward(z, W, b, list(offsets), True, 1e-6)
    dg = torch.randn(B, L, d, generator=g)
    for need_dz, need_dw in ((True, True), (False, True)):
        torch.library.opcheck(gm._backward, (dg, z.detach(), W.detach(), c.detach(), s_.detach(), rn.detach(),
                                             list(offsets), bias, need_dz, need_dw))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_compiled_step_traces_the_grassmann_kernel_without_a_graph_break(backend):
    """A Grassmann LM's loss under torch.compile(fullgraph=True): the kernel's forward custom
    op is a node of the one graph (fullgraph raises at any break; an opaque call would be
    one), and the compiled loss and every gradient equal the eager kernel's, which equal the
    reference's (the tests above). aot_eager traces the backward through the op's autograd
    and fake registrations as ``train.compile`` does, without inductor's C++ compile (about
    a minute on a cold CI machine); the slow variant runs inductor itself. On a GPU the graph
    is also captured as a CUDA graph (mode reduce-overhead): only a GPU can show that."""
    from torch._dynamo.utils import counters

    from seqmix.mixers import dispatch
    from seqmix.models.lm import CausalLM, LMConfig

    _kernel_module("grassmann")
    torch.manual_seed(0)
    cfg = LMConfig(arch="grassmann", vocab_size=37, max_len=24, d_model=16, n_layers=2, dropout=0.0,
                   block="post", mixer_options={"rank": 5, "offsets": (1, 2, 2, 30)})
    model = CausalLM(cfg)
    idx, targets = torch.randint(0, 37, (2, 19)), torch.randint(0, 37, (2, 19))
    params = list(model.parameters())
    traced: list[str] = []

    def inspecting(gm, example_inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    def loss_fn(idx, targets):
        return model.loss(idx, targets, every_position=True)

    with dispatch.isolated("triton") as record:
        torch._dynamo.reset()
        counters.clear()
        want = loss_fn(idx, targets)  # eager: resolves the kernel path (seqmix.train.step)
        want_grads = torch.autograd.grad(want, params)
        got = torch.compile(loss_fn, fullgraph=True, backend=inspecting)(idx, targets)
        got_grads = torch.autograd.grad(got, params)
    torch._dynamo.reset()
    assert record.taken() == {"grassmann": "triton"}
    assert traced.count("seqmix.grassmann_fwd.default") == cfg.n_layers, sorted(set(traced))
    assert not counters["graph_break"]
    assert_matches(got, want, "compiled loss")
    for i, (gc, ge) in enumerate(zip(got_grads, want_grads)):
        assert_matches(gc, ge, f"compiled grad {i}")


# --------------------------------------------------------------------------------------
# Chunked GLA (Yang et al. 2024, arXiv:2312.06635)
# --------------------------------------------------------------------------------------

GLA_CASES = [
    # B, H, L, Dk, Dv, chunk, gate scale (0: plain linear attention)
    (2, 2, 21, 9, 6, 16, 1.0),  # two chunks, ragged tail, Dk and Dv not powers of two
    (1, 1, 1, 5, 3, 16, 1.0),  # L = 1
    (1, 1, 45, 20, 18, 32, 1.0),  # 2 sub-chunks per chunk, Dk and Dv over two tiles
    (1, 2, 33, 7, 5, 16, 0.0),  # gate-free: causal linear attention
    (1, 1, 40, 6, 4, 32, 8.0),  # strong decay (log α down to ~ -16 per step)
]


@pytest.mark.parametrize("B,H,L,Dk,Dv,chunk,gate", GLA_CASES)
def test_chunk_gla_matches_recurrence(B, H, L, Dk, Dv, chunk, gate):
    gla = _kernel_module("gla")
    g = torch.Generator().manual_seed(L * 7 + Dk)
    q = (torch.randn(B, H, L, Dk, generator=g) * Dk**-0.5).requires_grad_()
    k = torch.randn(B, H, L, Dk, generator=g).requires_grad_()
    v = torch.randn(B, H, L, Dv, generator=g).requires_grad_()
    la = (F.logsigmoid(2 * torch.randn(B, H, L, Dk, generator=g)) * gate).requires_grad_()
    check(lambda q, k, v, la: gla.chunk_gla(q, k, v, la, chunk_size=chunk),
          gla_recurrent_reference, [q, k, v, la], ["q", "k", "v", "log_alpha"])


def test_chunk_gla_rejects_bad_chunk():
    gla = _kernel_module("gla")
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="power of two"):
        gla.chunk_gla(x, x, x, x, chunk_size=24)


# --------------------------------------------------------------------------------------
# TSSA (Wu et al. 2025, arXiv:2412.17810; official code's non-causal and causal forms)
# --------------------------------------------------------------------------------------

TSSA_CASES = [
    # B, H, L, p, causal
    (2, 3, 37, 5, True),  # ragged L, 3 heads (padded to 4), p = 5
    (1, 2, 1, 7, True),  # L = 1
    (2, 3, 37, 5, False),
    (1, 1, 1, 4, False),  # one head (Π = 1), one token
]


@pytest.mark.parametrize("B,H,L,p,causal", TSSA_CASES)
def test_tssa_matches_reference(B, H, L, p, causal):
    tm = _kernel_module("tssa")
    g = torch.Generator().manual_seed(L * 5 + p)
    w = torch.randn(B, H, L, p, generator=g).requires_grad_()
    temp = (torch.rand(H, generator=g) + 0.5).requires_grad_()
    if causal:
        db = (0.3 * torch.randn(H, L + 3, 1, generator=g)).requires_grad_()  # L_max > L
        check(lambda w, t, d: tm.tssa(w, t, d, True), lambda w, t, d: tssa_reference(w, t, d, True),
              [w, temp, db], ["w", "temp", "denom_bias"])
    else:
        check(lambda w, t: tm.tssa(w, t, None, False), lambda w, t: tssa_reference(w, t, None, False),
              [w, temp], ["w", "temp"])


def test_tssa_without_bias_and_zero_column():
    """Causal with denom_bias None = a zero table; non-causal with an all-zero feature
    column (F.normalize's clamp: no gradient through that column's norm)."""
    tm = _kernel_module("tssa")
    g = torch.Generator().manual_seed(11)
    w = torch.randn(2, 2, 19, 3, generator=g)
    temp = torch.tensor([0.7, 1.3])
    assert_matches(tm.tssa(w, temp, None, True), tssa_reference(w, temp, torch.zeros(2, 19, 1), True),
                   "causal, no bias")
    w[:, 1, :, 2] = 0.0
    w = w.requires_grad_()
    temp = temp.clone().requires_grad_()
    check(lambda w, t: tm.tssa(w, t, None, False), lambda w, t: tssa_reference(w, t, None, False),
          [w, temp], ["w", "temp"])


# --------------------------------------------------------------------------------------
# Mamba's selective scan (Gu & Dao 2023, arXiv:2312.00752, §3.3; mamba_ssm selective_scan_ref)
# --------------------------------------------------------------------------------------


SCAN_CASES = [
    # Bt, D, N, L, strong decay, with D and z; interpreter tiles: 8 tokens × 4 channels
    (2, 5, 3, 1, False, True),  # L = 1; D and N not multiples of the tiles
    (2, 5, 3, 1, True, False),
    (2, 6, 4, 13, False, True),  # two chunks, the second ragged
    (2, 6, 4, 13, True, True),
    (3, 4, 2, 17, True, False),  # D one tile exactly; the last chunk one token long
    (1, 9, 16, 40, False, False),  # five full chunks, three channel blocks, N 16 (Mamba's)
    (1, 9, 16, 40, True, True),
]


@pytest.mark.parametrize("Bt,D,N,L,strong,skip_and_gate", SCAN_CASES)
def test_selective_scan_matches_reference(Bt, D, N, L, strong, skip_and_gate):
    ss = _kernel_module("selective_scan")
    inputs, names = scan_inputs(Bt, D, N, L, strong=strong, skip=skip_and_gate, gate=skip_and_gate,
                                 dtype=torch.float32, seed=L + N)
    check(ss.selective_scan, selective_scan_reference, inputs, names)


def test_selective_scan_reads_strided_views_and_rejects_bad_shapes():
    """The layer's own layouts: time-major tensors seen as (Bt, ·, L) views, B and C slices
    of one projection (row stride R + 2N), z half of another; read in place."""
    ss = _kernel_module("selective_scan")
    g = torch.Generator().manual_seed(3)
    Bt, L, D, N, R = 2, 11, 6, 4, 3
    xz = torch.randn(Bt, L, 2 * D, generator=g)
    proj = torch.randn(Bt, L, R + 2 * N, generator=g)
    delta = torch.rand(Bt, L, D, generator=g)
    A = -torch.rand(D, N, generator=g) * 4
    Dskip = torch.randn(D, generator=g)
    u, z = (t.transpose(1, 2) for t in xz.split(D, dim=-1))
    _, B, C = (t.transpose(1, 2) for t in proj.split([R, N, N], dim=-1))
    args = (u, delta.transpose(1, 2), A, B, C, Dskip, z)
    assert_matches(ss.selective_scan(*args), selective_scan_reference(*args), "strided views")
    with pytest.raises(ValueError, match=r"B must be \(2, 4, 11\)"):
        ss.selective_scan(u, delta.transpose(1, 2), A, B[:, :3], C, Dskip, z)


# --------------------------------------------------------------------------------------
# 16-bit inputs (the AMP path): fp16, since the interpreter's numpy has no bf16
# --------------------------------------------------------------------------------------


def test_half_precision_inputs_against_fp32_reference():
    """Kernels take fp16 inputs, return fp16 outputs and gradients, and stay within fp16
    rounding of the fp32 reference evaluated on the same (fp16-representable) values: unit
    roundoff 4.9e-4, forward tolerance 4e-3 of the largest value; gradients 1e-2, because
    the backward's matmul operands (dg, dA, decayed q/k) are rounded to fp16 once more."""
    gm, gl, ts = _kernel_module("grassmann"), _kernel_module("gla"), _kernel_module("tssa")
    g = torch.Generator().manual_seed(5)
    rnd = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).half().float()  # noqa: E731
    cases = [
        ([rnd(2, 21, 5), rnd(12, 10, scale=0.2), rnd(12)], lambda z, W, b: gm.grassmann_mix(z, W, b, (1, 2)),
         lambda z, W, b: grassmann_mix_reference(z, W, b, (1, 2))),
        ([rnd(1, 2, 21, 6, scale=0.4), rnd(1, 2, 21, 6), rnd(1, 2, 21, 5),
          F.logsigmoid(rnd(1, 2, 21, 6)).half().float()],
         lambda *x: gl.chunk_gla(*x, chunk_size=16), gla_recurrent_reference),
        ([rnd(2, 3, 21, 5), rnd(3).abs() + 0.5, rnd(3, 21, 1, scale=0.3)],
         lambda w, t, b: ts.tssa(w, t, b, True), lambda w, t, b: tssa_reference(w, t, b, True)),
    ]
    for inputs, kern, ref in cases:
        half = [t.half().requires_grad_() for t in inputs]
        full = [t.clone().requires_grad_() for t in inputs]
        out_h, out_f = kern(*half), ref(*full)
        assert out_h.dtype == torch.float16
        assert_matches(out_h.float(), out_f, "fp16 forward", rtol=4e-3, atol_rel=4e-3)
        dy = torch.randn(out_f.shape, generator=g).half()
        for gh, gf in zip(grads(out_h, half, dy), grads(out_f, full, dy.float())):
            assert gh.dtype == torch.float16
            assert_matches(gh.float(), gf, "fp16 gradient", rtol=1e-2, atol_rel=1e-2)


def test_selective_scan_half_inputs_as_under_autocast():
    """Under bf16 autocast the layer hands the scan 16-bit u, B, C, z (linear and conv
    outputs) and fp32 Δ (softplus autocasts to fp32), A and D. The kernel's arithmetic is fp32
    (as the reference's): only the output and the 16-bit inputs' gradients are rounded, once
    (fp16 here, the interpreter has no bf16: unit roundoff 4.9e-4, tolerance 2e-3)."""
    ss = _kernel_module("selective_scan")
    inputs, names = scan_inputs(2, 6, 4, 21, gate=True, dtype=torch.float32, seed=9)
    half_at = {0, 3, 4, 6}  # u, B, C, z
    with torch.no_grad():
        full = [(t.half().float() if i in half_at else t).requires_grad_() for i, t in enumerate(inputs)]
    mixed = [(t.detach().half() if i in half_at else t.detach()).requires_grad_() for i, t in enumerate(full)]
    out_h, out_f = ss.selective_scan(*mixed), selective_scan_reference(*full)
    assert out_h.dtype == torch.float16
    assert_matches(out_h.float(), out_f, "fp16 forward", rtol=2e-3, atol_rel=2e-3)
    dy = torch.randn(out_f.shape, generator=torch.Generator().manual_seed(1)).half()
    for i, (name, gh, gf) in enumerate(zip(names, grads(out_h, mixed, dy), grads(out_f, full, dy.float()))):
        assert gh.dtype == mixed[i].dtype, name
        assert_matches(gh.float(), gf, f"d{name} (fp16 inputs)", rtol=2e-3, atol_rel=2e-3)


# --------------------------------------------------------------------------------------
# The mixers' dispatch (the kernels forced on the CPU) gives the reference's output and grads;
# a kernel that fails falls back to the reference, once, and says so
# --------------------------------------------------------------------------------------

DISPATCH_OPTIONS = {"grassmann": {"rank": 5, "offsets": (1, 3, 3)}, "gla": {"n_heads": 2, "chunk_size": 16},
                    "tssa": {"n_heads": 3}, "mamba": {"d_state": 3, "expand": 1}}
KERNEL_MODULE = {"mamba": "selective_scan"}  # the kernels module of each mixer, where not its name


def _mixer_case(arch: str, causal: bool = True):
    """A small mixer of ``arch`` (d 24, L 19: not a multiple of the 16-token tiles), its input,
    parameters and an output gradient."""
    from seqmix.mixers import build

    torch.manual_seed(0)
    mixer = build(arch, 24, causal=causal, max_len=32, **DISPATCH_OPTIONS[arch])
    x = torch.randn(2, 19, 24, requires_grad=True)
    return mixer, x, [x, *mixer.parameters()], torch.randn(2, 19, 24)


@pytest.mark.parametrize("arch,causal", [("grassmann", True), ("gla", True), ("tssa", True), ("tssa", False),
                                         ("mamba", True)])
def test_mixer_dispatch_matches_reference(arch, causal):
    from seqmix.mixers import dispatch

    _kernel_module(KERNEL_MODULE.get(arch, arch))  # the mixer's kernels, under the interpreter
    mixer, x, params, dy = _mixer_case(arch, causal)
    with dispatch.using("reference") as reference_run:
        want = mixer(x)
    want_grads = grads(want, params, dy)
    with dispatch.using("triton") as kernel_run:
        got = mixer(x)
    assert reference_run.taken() == {arch: "reference"} and kernel_run.taken() == {arch: "triton"}
    assert_matches(got, want, f"{arch} output")
    for i, (g, w) in enumerate(zip(grads(got, params, dy), want_grads)):
        assert_matches(g, w, f"{arch} grad {i}")


def compile_failure(error: str) -> Exception:
    """What Triton raises when a kernel does not compile: a front-end CompilationError, or
    MLIR's pass manager failing inside triton.compile (the ToST kernels on an H100 with
    Triton 3.6.0, issue 24)."""
    from triton.compiler.errors import CompilationError

    if error == "CompilationError":
        return CompilationError("def _causal_fwd_kernel(...): ...", None, "Assertion failed in ScanOpToLLVM.cpp")
    return RuntimeError("PassManager::run failed")


@pytest.mark.parametrize("arch,kernel,error,shape", [
    ("tssa", "_causal_fwd_kernel", "CompilationError", (2, 3, 19, 8)),  # the forward fails to compile
    ("tssa", "_causal_bwd_kernel", "RuntimeError", (2, 3, 19, 8)),  # only the backward: caught at first use
    ("grassmann", "_fwd_kernel", "RuntimeError", (2, 19, 5)),
    ("gla", "_bwd_dqk_kernel", "CompilationError", (2, 2, 19, 6)),
    ("mamba", "_bwd_kernel", "RuntimeError", (2, 24, 19)),  # a custom op's backward: caught at first use
])
def test_a_kernel_that_fails_falls_back_to_its_reference_with_one_warning(arch, kernel, error, shape, monkeypatch):
    import triton

    from seqmix.mixers import dispatch

    module = _kernel_module(KERNEL_MODULE.get(arch, arch))
    mixer, x, params, dy = _mixer_case(arch)
    with dispatch.isolated("reference"):
        want = mixer(x)
    want_grads = grads(want, params, dy)

    def launch(*args, **kwargs):
        raise compile_failure(error)

    # the launch itself fails (where Triton compiles); the kernel object keeps its type
    monkeypatch.setattr(getattr(module, kernel), "run", launch)
    outside = dispatch.provenance()  # the process's own record (earlier tests may have filled it)
    with dispatch.isolated("triton"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [mixer(x) for _ in range(3)]  # after the first, straight to the reference
        record = dispatch.provenance()
    for got in outputs:
        assert_matches(got, want, f"{arch} output after the fallback")
        for i, (g, w) in enumerate(zip(grads(got, params, dy), want_grads)):
            assert_matches(g, w, f"{arch} grad {i} after the fallback")
    warned = [str(w.message) for w in caught if issubclass(w.category, dispatch.KernelFallbackWarning)]
    assert len(warned) == 1, warned
    for part in (f"triton kernel '{arch}' failed", f"{shape} float32", f"Triton {triton.__version__}", error):
        assert part in warned[0], (part, warned[0])
    assert record["setting"] == "triton"
    assert record["paths"][arch].startswith(f"reference (fallback: triton failed: {error}: "), record
    assert dispatch.provenance() == outside, "isolated() gave the process state back"


# --------------------------------------------------------------------------------------
# The benchmark command without a GPU
# --------------------------------------------------------------------------------------


def test_bench_kernels_cpu_smoke(tmp_path, capsys, monkeypatch):
    from tools.bench.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the no-GPU path, on any machine
    out = tmp_path / "kernels.csv"
    assert main(["kernels", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no GPU" in text and "no timings" in text
    for name in ("grassmann", "gla", "tssa"):
        assert f"{name}: ok" in text
    assert not out.exists()  # no timings, no CSV


def test_bench_cases_and_summary_without_gpu():
    """The benchmark's op builders run (reference impls, on the CPU) and its byte model and
    target ratios are computed from rows as documented."""
    from seqmix.device import device_slug
    from tools.bench import kernels as bench
    from tools.bench import launches

    for _op, impl, case in launches.CASES:
        if impl in ("triton", "fla"):
            continue  # the kernels are covered above; fla is optional
        inputs, fn, (fwd_bytes, bwd_bytes) = case(impl, 1, 20, torch.float32, torch.device("cpu"))
        fn(*inputs).sum().backward()
        assert inputs[0].grad is not None and 0 < fwd_bytes < bwd_bytes  # bwd moves more
    # grassmann fwd: z + W + b read, g written, fp32
    _, _, (fwd_bytes, _) = launches.grassmann_case("reference", 2, 8, torch.float32, "cpu")
    assert fwd_bytes == 4 * (2 * 8 * 32 + 256 * 496 + 256 + 2 * 8 * 256)
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.hbm_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bench.hbm_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    row = lambda op, impl, p, L, t: {"op": op, "impl": impl, "pass": p, "L": L, "time_ms": t,  # noqa: E731
                                     "status": "ok", "roofline_frac": 0.6}
    rows = [row("grassmann", "triton", "fwdbwd", 4096, 1.0), row("grassmann", "reference", "fwdbwd", 4096, 6.0),
            row("attention", "sdpa", "fwdbwd", 4096, 2.0), row("grassmann", "triton", "fwd", 4096, 0.4),
            row("gla", "triton", "fwdbwd", 4096, 1.1), row("gla", "fla", "fwdbwd", 4096, 1.0)]
    text = "\n".join(bench.summarize(rows))
    assert "reference / triton = 6.00x" in text
    assert "sdpa / grassmann = 2.00x" in text and "roofline 0.6" in text
    assert "gla triton / fla fwd+bwd = 1.10x" in text
