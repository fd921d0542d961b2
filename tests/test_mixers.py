"""Properties every mixer must have (a new mixer inherits these tests by registering):
shape, causality, recurrent form = parallel form, gradcheck, and sane scores."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqmix import catalogue, mixers
from seqmix.config import config_schema

# Small options so that fp64 property checks stay fast; every other option is the default.
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
D = 8


def build(name: str, causal: bool = True, max_len: int = 16, dtype=torch.float64):
    torch.manual_seed(0)
    m = mixers.build(name, D, causal=causal, max_len=max_len, **TINY_OPTIONS.get(name, {}))
    return m.to(dtype).eval()


def with_flag(flag: str) -> list[str]:
    """Registered mixers whose class sets ``flag``. A mixer whose module fails to import is
    kept, so that its tests fail loudly instead of disappearing from the run."""
    out = []
    for n in mixers.names():
        try:
            keep = getattr(mixers.mixer_class(n), flag)
        except ImportError:
            keep = True
        if keep:
            out.append(n)
    return out


@pytest.mark.parametrize("name", mixers.names())
def test_shape_and_finite(name):
    cls = mixers.mixer_class(name)
    m = build(name, causal=cls.supports_causal, dtype=torch.float32)
    x = torch.randn(2, 11, D)
    y = m(x)
    assert y.shape == x.shape
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", with_flag("supports_causal"))
def test_causal_output_ignores_the_future(name):
    m = build(name)
    L = 12
    x = torch.randn(2, L, D, dtype=torch.float64)
    y = m(x)
    for t in (0, 3, L - 2):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        y2 = m(x2)
        assert torch.allclose(y[:, : t + 1], y2[:, : t + 1], atol=1e-12, rtol=0), (
            f"{name}: output at positions <= {t} changed when later tokens changed"
        )
        assert not torch.allclose(y[:, t + 1 :], y2[:, t + 1 :]), f"{name}: the future has no effect at all"


@pytest.mark.parametrize("name", with_flag("has_step"))
def test_recurrent_step_equals_parallel_forward(name):
    m = build(name)
    B, L = 2, 13
    x = torch.randn(B, L, D, dtype=torch.float64)
    y = m(x)
    state = m.init_state(B, x.device, x.dtype)
    outs = []
    for t in range(L):
        y_t, state = m.step(x[:, t], state)
        outs.append(y_t)
    torch.testing.assert_close(torch.stack(outs, dim=1), y, atol=1e-8, rtol=0)


@pytest.mark.parametrize("name", mixers.names())
def test_gradcheck(name):
    cls = mixers.mixer_class(name)
    m = build(name, causal=cls.supports_causal, max_len=5)
    x = torch.randn(1, 5, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", with_flag("has_scores"))
def test_scores_are_nonnegative_and_causal(name):
    cls = mixers.mixer_class(name)
    m = build(name, causal=cls.supports_causal)
    L = 10
    s = m.scores(torch.randn(2, L, D, dtype=torch.float64))
    assert s.dim() == 4 and s.shape[0] == 2 and s.shape[-2:] == (L, L)
    assert (s >= 0).all()
    assert (s.sum(-1) > 0).all(), "every row needs some mass"
    if m.causal:
        assert (s.triu(1) == 0).all(), "causal scores must vanish above the diagonal"


def test_noncausal_only_mixers_refuse_causal():
    for name in mixers.names():
        cls = mixers.mixer_class(name)
        entry = catalogue.mixer_entry(name)
        assert (entry.causal, entry.noncausal) == (cls.supports_causal, cls.supports_noncausal), name
        if not cls.supports_causal:
            with pytest.raises(ValueError, match="no causal form"):
                mixers.build(name, D, causal=True, max_len=16)


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(mixers.MixerOptionsError, match="allowed: .*rank"):
        mixers.build("grassmann", D, rnk=3)


def test_schema_lists_every_mixer_and_its_options():
    schema = config_schema()
    assert schema["properties"]["architectures"]["items"]["enum"] == mixers.names()
    options = schema["properties"]["mixers"]["properties"]
    assert list(options) == mixers.names()
    for name in mixers.names():
        fields = {f.name for f in dataclasses.fields(mixers.mixer_class(name).Options)}
        assert set(options[name].get("properties", {})) == fields, f"schema options of {name}"
        assert options[name].get("additionalProperties") is False, f"{name}: unknown options must fail"
