"""Properties every mixer must have (a new mixer inherits these tests by registering):
shape, causality, recurrent form = parallel form, gradcheck, and sane scores."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from seqmix import catalogue, mixers
from seqmix.expansion.validate import config_schema
from tests.conftest import tiny_mixer

D = 8


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
    m = tiny_mixer(name, causal=cls.supports_causal, dtype=torch.float32)
    x = torch.randn(2, 11, D)
    y = m(x)
    assert y.shape == x.shape
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", with_flag("supports_causal"))
def test_causal_output_ignores_the_future(name):
    m = tiny_mixer(name)
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
    m = tiny_mixer(name)
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
    m = tiny_mixer(name, causal=cls.supports_causal, max_len=5)
    x = torch.randn(1, 5, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", with_flag("has_scores"))
def test_scores_are_nonnegative_and_causal(name):
    cls = mixers.mixer_class(name)
    m = tiny_mixer(name, causal=cls.supports_causal)
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
        if not cls.supports_causal:
            with pytest.raises(ValueError, match="no causal form"):
                mixers.build(name, D, causal=True, max_len=16)


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(mixers.MixerOptionsError, match="allowed: .*rank"):
        mixers.build("grassmann", D, rnk=3)


def test_schema_lists_every_mixer_and_its_options():
    schema = config_schema()
    assert schema["properties"]["architectures"]["items"] == {"$ref": "#/$defs/ArchName"}
    assert schema["$defs"]["ArchName"]["examples"] == mixers.names()
    options = schema["properties"]["mixers"]["properties"]
    assert list(options) == mixers.names()
    for name in mixers.names():
        fields = {f.name for f in dataclasses.fields(mixers.mixer_class(name).Options)}
        assert set(options[name].get("properties", {})) == fields, f"schema options of {name}"
        assert options[name].get("additionalProperties") is False, f"{name}: unknown options must fail"


SCHEMA_WORD = {"ge": "minimum", "gt": "exclusiveMinimum"}


@pytest.mark.parametrize("name", mixers.names())
def test_option_bounds_are_in_the_schema_and_refused_with_their_key(name):
    """Every lower bound a mixer states in a field's metadata shows in the JSON schema and
    fails config validation naming ``mixers.<name>.<option>`` (before any job)."""
    from seqmix.expansion.validate import ConfigError, validate_study
    from tests.conftest import tiny_config

    schema = config_schema()["properties"]["mixers"]["properties"][name]["properties"]
    for f in dataclasses.fields(mixers.mixer_class(name).Options):
        for key, bound in f.metadata.items():
            if key not in SCHEMA_WORD:
                continue
            forms = [schema[f.name], *schema[f.name].get("anyOf", [])]  # int | None: the int form
            assert bound in [form.get(SCHEMA_WORD[key]) for form in forms], f"{name}.{f.name} {key} {bound}"
            raw = tiny_config(Path("/nonexistent"), None, archs=("softmax",))
            raw["mixers"] = {name: {f.name: bound - 1 if key == "ge" else bound}}
            with pytest.raises(ConfigError, match=rf"mixers\.{name}\.{f.name}'"):
                validate_study(raw)


def test_catalogue_entries_name_their_fields_and_colours_are_unique():
    colours = [m.colour for m in catalogue.MIXERS]
    assert len(set(colours)) == len(colours), f"two mixers share a colour: {colours}"
    with pytest.raises(TypeError):
        catalogue.MixerEntry("x", "m:X", "X", "#000000")  # keywords only: no field read by position
