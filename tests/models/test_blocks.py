"""Each architecture in its published block (models/blocks.py): every native block equals a
block written here from its reference code's structure, on the same weights in fp64; the
blocks' own initialisation; CRATE's sparse code kept by its block; the block chosen per
architecture, forced for all, or per architecture, and recorded in each run's spec."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seqmix import catalogue
from seqmix.expansion.table import expand
from seqmix.expansion.validate import ConfigError, validate_study
from seqmix.models.blocks import Block, build_blocks, norm_class
from seqmix.models.lm import CausalLM, LMConfig
from tests.conftest import tiny_config

F64 = torch.float64


def _randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter drawn afresh (norm gains and biases too), so that no term of a block
    hides behind an initial 1 or 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) + (1.0 if p.dim() == 1 else 0.0))
    return module


def _copy_norm(ref: nn.LayerNorm, ours: nn.Module) -> None:
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        if getattr(ref, "bias", None) is not None:
            ref.bias.copy_(ours.bias)


# --- post-LN: the Grassmann paper's Transformer layer = torch's post-norm encoder layer ---


def test_post_block_equals_torchs_post_norm_transformer_layer():
    """Zhang 2025 §3.2: h = LN(h + MHA(h)); h = LN(h + FFN(h)), GELU, d_ff = 4d: what
    nn.TransformerEncoderLayer(norm_first=False) computes, causal mask included."""
    d, H, L = 16, 4, 9
    ours = _randomise(Block("softmax", d, {"n_heads": H}, d_ff=4 * d, dropout=0.0, block="post")).to(F64).eval()
    ref = nn.TransformerEncoderLayer(d, H, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=False, dtype=F64).eval()
    m = ours.mixer
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]))
        ref.self_attn.out_proj.weight.copy_(m.out_proj.weight)
        ref.self_attn.out_proj.bias.copy_(m.out_proj.bias)
        for a, b in ((ref.linear1, ours.ffn.fc1), (ref.linear2, ours.ffn.fc2)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)
    _copy_norm(ref.norm1, ours.norm1)
    _copy_norm(ref.norm2, ours.norm2)
    x = torch.randn(2, L, d, dtype=F64)
    mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64)
    torch.testing.assert_close(ours(x), ref(x, src_mask=mask, is_causal=True), atol=1e-12, rtol=0)


def test_post_block_around_grassmann_has_no_outer_residual():
    """§3.2 step 5: the gate blends h into the mixer's output, then LayerNorm; no h + ..."""
    torch.manual_seed(0)
    ours = _randomise(Block("grassmann", 8, {"rank": 4, "offsets": [1, 2]}, d_ff=32, dropout=0.0,
                            block="post")).to(F64).eval()
    x = torch.randn(2, 6, 8, dtype=F64)
    mid = ours.norm1(ours.mixer(x))
    torch.testing.assert_close(ours(x), ours.norm2(mid + ours.ffn(mid)), atol=1e-12, rtol=0)


# --- CRATE: Ma-Lab-Berkeley/CRATE model/crate.py (Attention, FeedForward, Transformer) ---


class CrateReferenceLayer(nn.Module):
    """One layer of CRATE's Transformer, structured as model/crate.py: PreNorm(Attention)
    with tied qkv (no bias), softmax(w wᵀ · dim_head^-½) w, to_out; grad_x = attn(LN(x)) + x;
    x = FeedForward(LN(grad_x)) = ReLU(x̂ + η(Dᵀx̂ − DᵀDx̂) − ηλ), with no outer residual."""

    def __init__(self, dim: int, heads: int, dim_head: int, step_size: float = 0.1, lambd: float = 0.1):
        super().__init__()
        self.heads, self.scale = heads, dim_head**-0.5
        self.norm_attn, self.norm_ff = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim)
        self.weight = nn.Parameter(torch.empty(dim, dim))
        self.step_size, self.lambd = step_size, lambd

    def attn(self, x):
        B, N, _ = x.shape
        w = self.qkv(x).view(B, N, self.heads, -1).transpose(1, 2)  # 'b n (h d) -> b h n d'
        attn = torch.softmax(w @ w.transpose(-1, -2) * self.scale, dim=-1)
        return self.to_out((attn @ w).transpose(1, 2).reshape(B, N, -1))

    def ff(self, x):
        x1 = F.linear(x, self.weight)  # D x
        grad_1 = F.linear(x1, self.weight.t())  # Dᵀ D x
        grad_2 = F.linear(x, self.weight.t())  # Dᵀ x
        return F.relu(x + self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd)

    def forward(self, x):
        grad_x = self.attn(self.norm_attn(x)) + x
        return self.ff(self.norm_ff(grad_x))


def test_crate_native_block_equals_crates_own_layer():
    d, H = 16, 4
    assert catalogue.mixer_entry("crate").block == "pre"
    ours = _randomise(Block("crate", d, {"n_heads": H}, d_ff=4 * d, dropout=0.0, block="pre",
                            causal=False)).to(F64).eval()
    ref = CrateReferenceLayer(d, H, d // H).to(F64).eval()
    with torch.no_grad():
        ref.qkv.weight.copy_(ours.mixer.qkv.weight)
        ref.to_out.weight.copy_(ours.mixer.to_out.weight)
        ref.to_out.bias.copy_(ours.mixer.to_out.bias)
        ref.weight.copy_(ours.ffn.weight)
    _copy_norm(ref.norm_attn, ours.norm1)
    _copy_norm(ref.norm_ff, ours.norm2)
    x = torch.randn(3, 11, d, dtype=F64)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-12, rtol=0)


def _ista_outputs(model: CausalLM, idx: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    hooks = [b.ffn.register_forward_hook(lambda mod, inp, out: outs.append(out.detach())) for b in model.blocks]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return outs


def _train_crate(block: str, steps: int = 40) -> CausalLM:
    """A small CRATE LM trained on a copy task (the second half repeats the first)."""
    torch.manual_seed(0)
    model = CausalLM(LMConfig(arch="crate", vocab_size=32, max_len=32, d_model=32, n_layers=2, dropout=0.0,
                              block=block, mixer_options={"n_heads": 4}))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        half = torch.randint(0, 32, (16, 16), generator=g)
        seq = torch.cat([half, half], dim=1)
        loss = model.loss(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_trained_crate_keeps_istas_exact_zeros_in_the_stream():
    """CRATE's ISTA step is a sparse code (ReLU(... − ηλ)): in its own pre-LN block the
    code *is* the layer's output, exact zeros included. The post-LN block normalises it
    afterwards, which erases every zero (issue 14: 50.5 % → 0 %)."""
    idx = torch.randint(0, 32, (4, 31), generator=torch.Generator().manual_seed(2))
    native = _train_crate("pre")
    codes = _ista_outputs(native, idx)
    states = native.hidden_states(idx)[1:]
    for code, state in zip(codes, states):
        zeros = (code == 0).double().mean().item()
        assert zeros > 0.2, f"ISTA's code has {zeros:.1%} exact zeros"
        torch.testing.assert_close(state, code, atol=0, rtol=0)  # the stream is the code
    post = _train_crate("post")
    for state in post.hidden_states(idx)[1:]:
        assert (state == 0).double().mean().item() == 0.0


# --- ToST: RobinWu218/ToST tost_lang/model_TSSA.py (nanoGPT Block with LayerScale) ---


class ToSTReferenceBlock(nn.Module):
    """ToST's language Block as its code is structured: nanoGPT's ln_1/attn/ln_2/mlp with
    LayerScale, x = x + γ1 ⊙ attn(ln_1(x)); x = x + γ2 ⊙ mlp(ln_2(x)); the attention is
    CausalSelfAttention_TSSA, written out here after the reference code (§2.3 of the
    ToST paper's causal form), mlp = c_proj(GELU(c_fc(x)))."""

    def __init__(self, d: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_c_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.temp = nn.Parameter(torch.ones(heads, 1))
        self.denom_bias = nn.Parameter(torch.zeros(heads, max_len, 1))
        self.c_fc, self.mlp_c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma_1, self.gamma_2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))

    def attn(self, x):
        B, T, C = x.shape
        w = self.c_attn(x).view(B, T, self.heads, C // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        w_sq = w**2
        denom = torch.cumsum(w_sq, dim=-2).clamp_min(1e-12)
        w_normed = w_sq / denom + self.denom_bias[:, :T, :]
        Pi = torch.softmax((w_normed * self.temp[..., None]).sum(-1), dim=1)  # over heads: (B, nh, T)
        dots = torch.cumsum(w_sq * Pi[..., None], dim=-2) / (Pi.cumsum(dim=-1) + 1e-8)[..., None]
        y = -(w * Pi[..., None]) * (1 / (1 + dots))
        return self.attn_c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.ln_1(x))
        return x + self.gamma_2 * self.mlp_c_proj(F.gelu(self.c_fc(self.ln_2(x))))


def test_tost_native_block_equals_tosts_own_block():
    d, H, L = 16, 4, 10
    assert catalogue.mixer_entry("tssa").block == "pre_layerscale"
    ours = _randomise(Block("tssa", d, {"n_heads": H}, d_ff=4 * d, dropout=0.0, block="pre_layerscale",
                            max_len=L)).to(F64).eval()
    ref = ToSTReferenceBlock(d, H, L).to(F64).eval()
    m = ours.mixer
    with torch.no_grad():
        for a, b in ((ref.c_attn, m.c_attn), (ref.attn_c_proj, m.c_proj), (ref.c_fc, ours.ffn.fc1),
                     (ref.mlp_c_proj, ours.ffn.fc2)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)
        ref.temp.copy_(m.temp[:, None])
        ref.denom_bias.copy_(m.denom_bias)
        ref.gamma_1.copy_(ours.gamma1)
        ref.gamma_2.copy_(ours.gamma2)
    _copy_norm(ref.ln_1, ours.norm1)
    _copy_norm(ref.ln_2, ours.norm2)
    x = torch.randn(2, L, d, dtype=F64)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-12, rtol=0)


def test_tost_block_initialisation_is_tosts():
    """γ = 1e-5 on both branches; c_proj and the MLP's output projection N(0, 0.02/√(2n))."""
    n, d = 6, 128
    torch.manual_seed(0)
    lm = CausalLM(LMConfig(arch="tssa", vocab_size=64, max_len=16, d_model=d, n_layers=n, block="pre_layerscale"))
    want = 0.02 / math.sqrt(2 * n)
    for block in lm.blocks:
        assert torch.all(block.gamma1 == 1e-5) and torch.all(block.gamma2 == 1e-5)
        for w in (block.mixer.c_proj.weight, block.ffn.fc2.weight):
            assert abs(w.std().item() / want - 1) < 0.05, (w.std().item(), want)
        assert abs(block.ffn.fc1.weight.std().item() / 0.02 - 1) < 0.05  # the rest keeps GPT-2's 0.02


# --- Mamba: state-spaces/mamba mamba_simple.py Block + mixer_seq_simple.py MixerModel ---


def _mamba_rms_norm(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_mamba_native_stack_equals_mixer_models_residual_stream():
    """MixerModel keeps (hidden, residual) apart: residual = hidden + residual; hidden =
    mixer(RMSNorm(residual)); at the end norm_f(hidden + residual). No MLP in the block."""
    d, L = 16, 12
    assert catalogue.mixer_entry("mamba").block == "pre_rms"
    blocks = build_blocks("mamba", d, 2, {"d_state": 4}, d_ff_mult=4.0, dropout=0.0, block="pre_rms",
                          causal=True, max_len=L).to(F64).eval()
    _randomise(blocks)
    assert all(b.ffn is None for b in blocks) and norm_class("pre_rms") is nn.RMSNorm
    norm_f_weight = 1 + 0.3 * torch.randn(d, dtype=F64)
    x = torch.randn(2, L, d, dtype=F64)
    ours = x
    for b in blocks:
        ours = b(ours)
    ours = _mamba_rms_norm(ours, norm_f_weight)
    hidden, residual = x, None
    for b in blocks:
        residual = hidden + residual if residual is not None else hidden
        hidden = b.mixer(_mamba_rms_norm(residual, b.norm1.weight))
    ref = _mamba_rms_norm(hidden + residual, norm_f_weight)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


def test_mamba_lm_has_mixer_models_norms_and_rescaled_out_proj():
    n, d = 4, 64
    lm = CausalLM(LMConfig(arch="mamba", vocab_size=64, max_len=16, d_model=d, n_layers=n, block="pre_rms"))
    assert isinstance(lm.norm_f, nn.RMSNorm) and lm.norm_f.eps == 1e-5
    for block in lm.blocks:
        w = block.mixer.out_proj.weight  # kaiming_uniform(a=√5) = U(±1/√fan_in), then / √n_layer
        bound = 1 / math.sqrt(w.shape[1]) / math.sqrt(n)
        assert w.abs().max().item() <= bound and w.abs().max().item() > 0.9 * bound


# --- choosing the block ---------------------------------------------------------------


def _study(tmp_path, block=None, archs=("softmax", "crate", "tssa", "mamba")):
    raw = tiny_config(tmp_path, None, archs=archs)
    if block is not None:
        raw["tasks"]["mqar"]["model"]["block"] = block
    return validate_study(raw)


def test_every_run_records_the_block_it_trains_in(tmp_path):
    study = _study(tmp_path)
    for arch in ("softmax", "crate", "tssa", "mamba"):
        spec = expand(study).run_spec("mqar", arch, 0)
        assert spec.model.block == catalogue.mixer_entry(arch).block
        assert f'"block":"{spec.model.block}"' in spec.model_dump_json()


def test_a_config_can_force_one_block_or_choose_per_architecture(tmp_path):
    forced = _study(tmp_path, "post")
    assert {expand(forced).run_spec("mqar", a, 0).model.block for a in ("softmax", "crate", "tssa", "mamba")} == {"post"}
    mixed = _study(tmp_path, {"default": "pre", "mamba": "native", "crate": "post"})
    got = {a: expand(mixed).run_spec("mqar", a, 0).model.block for a in ("softmax", "crate", "tssa", "mamba")}
    assert got == {"softmax": "pre", "crate": "post", "tssa": "pre", "mamba": "pre_rms"}


@pytest.mark.parametrize("block, message", [
    ("middle", "unknown block(s) 'middle'; choose from: native, post, pre, pre_layerscale, pre_rms"),
    ({"transformer": "pre"}, "unknown architecture(s) transformer"),
])
def test_a_bad_block_is_named(tmp_path, block, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _study(tmp_path, block)


def test_the_old_norm_key_says_what_replaced_it(tmp_path):
    raw = tiny_config(tmp_path, None)
    raw["tasks"]["mqar"]["model"]["norm"] = "pre"
    with pytest.raises(ConfigError, match="model.norm is now model.block: write block: pre"):
        validate_study(raw)


def test_blocks_in_the_catalogue_are_the_blocks_built():
    for name in catalogue.BLOCKS:
        Block("softmax", 8, {"n_heads": 2}, d_ff=16, dropout=0.0, block=name)
    assert {m.block for m in catalogue.MIXERS} <= set(catalogue.BLOCKS)
    assert set(Block.FORWARD) == set(catalogue.BLOCKS)
    with pytest.raises(ValueError, match="resolve model.block 'native'"):
        build_blocks("softmax", 8, 1, {}, d_ff_mult=1, dropout=0, block="native", causal=True, max_len=4)


@pytest.mark.parametrize("block", ["post", "pre", "pre_layerscale"])
def test_dropout_acts_only_in_training(block):
    """The block's dropout (on each branch's output): in eval the block is its weights without
    dropout, bit for bit; in training it draws masks, fresh on every call, and nothing else in
    the block differs from eval (with its p set to 0, training is eval)."""
    arch = "tssa" if block == "pre_layerscale" else "softmax"
    noisy = _randomise(Block(arch, 8, {"n_heads": 2}, d_ff=16, dropout=0.5, block=block, max_len=6))
    clean = Block(arch, 8, {"n_heads": 2}, d_ff=16, dropout=0.0, block=block, max_len=6)
    clean.load_state_dict(noisy.state_dict())  # _randomise: LayerScale's γ is O(1), not 1e-5
    x = torch.randn(2, 6, 8)
    assert torch.equal(noisy.eval()(x), clean.eval()(x))
    noisy.train()
    torch.manual_seed(0)
    first, second = noisy(x), noisy(x)
    assert not torch.allclose(first, clean(x)), "training drew no dropout mask"
    assert not torch.allclose(first, second), "the same mask twice"
    noisy.drop.p = 0.0
    assert torch.equal(noisy(x), clean.train()(x))


def test_the_docs_table_of_blocks_is_the_catalogues():
    """docs/reference/blocks.md's table (written by `make docs-blocks`) says of each mixer it lists what
    the catalogue says: a changed block or reason shows here. A mixer catalogued since the
    table was written is only not listed yet, as in the plan table, not a failure."""
    from seqmix.report.mixer_table import blocks_markdown
    from tests.conftest import REPO
    from tools.docs import generated

    table = generated((REPO / "docs" / "reference" / "blocks.md").read_text()).strip().splitlines()
    rows = blocks_markdown().strip().splitlines()
    assert table[:2] == rows[:2], "the table's header"
    assert table[2:], "docs/reference/blocks.md lists no mixer"
    assert [row for row in rows if row in table[2:]] == table[2:], (
        "docs/reference/blocks.md's rows differ from the catalogue's: make docs-blocks")


def test_positions_none_leaves_the_embedding_out_and_unknown_schemes_are_refused():
    """Zoology's recurrences train on MQAR without position embeddings: model.positions
    resolves per architecture, a model with none has no pos_emb, and a misspelt scheme is a
    config error naming the key."""
    import pydantic
    import pytest
    import torch

    from seqmix.models.lm import CausalLM, LMConfig
    from seqmix.study.settings import ModelSettings

    spec = ModelSettings(positions={"default": "learned", "mamba": "none"})
    assert (spec.positions_for("mamba"), spec.positions_for("softmax")) == ("none", "learned")
    with pytest.raises(pydantic.ValidationError, match="unknown position scheme.*'rope'"):
        ModelSettings(positions={"gla": "rope"})
    with pytest.raises(pydantic.ValidationError, match="unknown architecture.*'mambo'"):
        ModelSettings(positions={"mambo": "none"})
    cfg = dict(arch="softmax", vocab_size=32, max_len=8, d_model=16, n_layers=1, d_ff_mult=0, dropout=0.0, block="pre")
    with_pos, without = CausalLM(LMConfig(**cfg)), CausalLM(LMConfig(**cfg, positions="none"))
    assert without.pos_emb is None
    def n(m):
        return sum(p.numel() for p in m.parameters())
    assert n(with_pos) - n(without) == 8 * 16
    # Without positions a softmax layer is permutation-equivariant over the prefix: the last
    # position's output does not depend on the order of the tokens before it.
    x = torch.tensor([[1, 2, 3, 4, 5]])
    y = torch.tensor([[3, 1, 2, 4, 5]])
    torch.testing.assert_close(without(x)[0, -1], without(y)[0, -1])
    assert not torch.allclose(with_pos(x)[0, -1], with_pos(y)[0, -1])
