"""tools/mamba_mqar.py's independent Mamba (written from Gu & Dao 2023 alone) is a real
Mamba: given seqmix's weights it computes seqmix's Mamba language model, forward and
backward; its exact zero-order hold differs from the ΔB simplification only by O(Δ²)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from seqmix.models.lm import CausalLM, LMConfig
from tests.conftest import REPO


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("mamba_mqar", REPO / "tools" / "mamba_mqar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seqmix_mamba_lm(vocab=32, L=12, d=16, d_state=4):
    torch.manual_seed(0)
    return CausalLM(LMConfig(arch="mamba", vocab_size=vocab, max_len=L, d_model=d, n_layers=2, d_ff_mult=0.0,
                             dropout=0.0, block="pre_rms", positions="none", mixer_options={"d_state": d_state}))


def test_with_seqmix_weights_it_computes_seqmix_mamba_forward_and_backward(tool):
    ours = seqmix_mamba_lm().double()
    theirs = tool.MambaLMIndependent(32, 16, d_state=4).double()
    theirs.load_seqmix(ours.state_dict())
    x = torch.randint(0, 32, (3, 12))
    a, b = ours(x), theirs(x)
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(theirs.layers[0].A_log.grad, ours.blocks[0].mixer.A_log.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(theirs.emb.weight.grad, ours.tok_emb.weight.grad, rtol=1e-8, atol=1e-10)


def test_a_changed_weight_shows_in_its_output(tool):
    # The comparison above can fail: one of seqmix's Δ biases moved changes the output.
    ours = seqmix_mamba_lm().double()
    theirs = tool.MambaLMIndependent(32, 16, d_state=4).double()
    state = ours.state_dict()
    state["blocks.1.mixer.dt_proj.bias"] = state["blocks.1.mixer.dt_proj.bias"] + 0.5
    theirs.load_seqmix(state)
    x = torch.randint(0, 32, (3, 12))
    assert (theirs(x) - ours(x)).abs().max() > 1e-4


def test_the_zero_order_hold_agrees_with_the_simplification_to_first_order_in_delta(tool):
    torch.manual_seed(1)
    b, L, E, N = 2, 6, 3, 4
    x, B, C = torch.randn(b, L, E, dtype=torch.float64), torch.randn(b, L, N, dtype=torch.float64), torch.randn(b, L, N, dtype=torch.float64)
    A, D = -torch.rand(E, N, dtype=torch.float64) - 0.5, torch.zeros(E, dtype=torch.float64)
    for scale, bound in ((1e-2, 1e-3), (1e-3, 1e-5)):
        delta = scale * torch.rand(b, L, E, dtype=torch.float64)
        gap = (tool.selective_scan(x, delta, A, B, C, D, zoh=True) - tool.selective_scan(x, delta, A, B, C, D)).abs().max()
        assert 0 < gap < bound


def test_in_fp32_it_agrees_with_the_path_seqmix_trains_with(tool):
    # Training runs in fp32 through the fused CPU scan where it builds (else the chunked one):
    # the same model to float rounding, gradients included.
    ours = seqmix_mamba_lm(vocab=64, L=48, d=32, d_state=8)
    theirs = tool.MambaLMIndependent(64, 32, d_state=8)
    theirs.load_seqmix(ours.state_dict())
    x = torch.randint(0, 64, (4, 48))
    a, b = ours(x), theirs(x)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    for mine, reference in ((theirs.layers[1].x_proj.weight, ours.blocks[1].mixer.x_proj.weight),
                            (theirs.layers[0].dt_proj.bias, ours.blocks[0].mixer.dt_proj.bias)):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-3, atol=1e-5)


def test_its_weights_put_into_seqmix_give_its_own_outputs(tool):
    # --through-seqmix trains the independent initialisation in seqmix's model: the same
    # function, so the same outputs from the first step.
    theirs = tool.MambaLMIndependent(32, 16, d_state=4).double()
    ours = seqmix_mamba_lm().double()
    ours.load_state_dict(theirs.seqmix_state())
    x = torch.randint(0, 32, (3, 12))
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-10, atol=1e-10)


def test_zoology_init_is_the_one_zoology_trains_from(tool):
    # Every linear map N(0, 0.02) with zero biases, so Δ's bias is 0 (softplus 0.69, not
    # mamba_ssm's [0.001, 0.1]); out_proj N(0, 0.02 / √4); A and D as mamba_ssm's.
    torch.manual_seed(0)
    model = seqmix_mamba_lm(vocab=64, L=48, d=64, d_state=16)
    before = model.blocks[0].mixer.A_log.clone()
    tool.zoology_init(model)
    mixer = model.blocks[0].mixer
    assert torch.equal(mixer.dt_proj.bias, torch.zeros_like(mixer.dt_proj.bias))
    assert mixer.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert mixer.out_proj.weight.std().item() == pytest.approx(0.01, rel=0.1)
    assert torch.equal(mixer.A_log, before) and torch.equal(mixer.D, torch.ones_like(mixer.D))
