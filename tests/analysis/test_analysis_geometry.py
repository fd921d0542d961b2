"""Geometry of the Grassmann mixer: Plücker residuals and principal angles on cases whose
answer is known, and the rows geometry.csv gets from tiny models.

Tolerances: exact Plücker vectors in float64 satisfy the relations to ~1e-16 relative; 1e-12
leaves room for accumulation while any non-decomposable vector (random, or a sum of two
unrelated planes) sits orders of magnitude above it (checked at > 1e-3). Angles are compared
at 1e-6 degrees (float64 QR/SVD).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from seqmix import mixers
from seqmix.analysis import geometry as geo
from seqmix.mixers.grassmann import plucker
from seqmix.models.lm import CausalLM, LMConfig

R = 7


def test_quadruples_and_coordinate_index():
    q = geo.quadruples(R)
    assert q.shape == (math.comb(R, 4), 4)
    assert (q[:, :-1] < q[:, 1:]).all()
    sub = geo.quadruples(12, max_count=50, seed=1)
    assert sub.shape == (50, 4) and len({tuple(x) for x in sub.tolist()}) == 50
    eye = torch.eye(R, dtype=torch.float64)
    col = geo.coordinate_index(R)
    for i, j in [(0, 1), (2, 5), (5, 6)]:
        p = plucker(eye[i], eye[j])
        assert p[col[i, j]] == 1 and p.abs().sum() == 1


def test_plucker_residual_zero_for_planes_nonzero_otherwise():
    torch.manual_seed(0)
    a, b, c, e = (torch.randn(40, R, dtype=torch.float64) for _ in range(4))
    quads = geo.quadruples(R)
    assert geo.plucker_residual(plucker(a, b), quads).max() < 1e-12
    # Scale does not matter (the residual is relative to ‖p‖²).
    assert geo.plucker_residual(1e6 * plucker(a, b), quads).max() < 1e-12
    # Planes sharing a vector add up to a plane (a∧b + a∧c = a∧(b+c)): what the layer's
    # average over offsets does, since every pair at t contains z_t.
    assert geo.plucker_residual(plucker(a, b) + 0.3 * plucker(a, c), quads).max() < 1e-12
    # Two unrelated planes, or a random vector, are off the Grassmannian.
    off = geo.plucker_residual(plucker(a, b) + plucker(c, e), quads)
    assert off.amax(-1).min() > 1e-3
    rand = geo.plucker_residual(torch.randn(40, math.comb(R, 2), dtype=torch.float64), quads)
    assert rand.amax(-1).min() > 1e-3 and rand.mean() > 1e-2


def test_vector_angle():
    e1, e2 = torch.eye(3, dtype=torch.float64)[:2]
    got = geo.vector_angle(torch.stack([e1, e1, e1, e1]), torch.stack([e1, e2, -e1, e1 + e2]))
    torch.testing.assert_close(got, torch.tensor([0.0, 90.0, 180.0, 45.0], dtype=torch.float64))


def test_principal_angles_of_known_planes():
    e = torch.eye(5, dtype=torch.float64)
    P = torch.stack([e[0], e[1]], -1)
    for deg in (0.0, 17.0, 60.0, 90.0):
        a = math.radians(deg)
        Q = torch.stack([3 * e[0], math.cos(a) * e[1] + math.sin(a) * e[2]], -1)  # basis need not be orthonormal
        torch.testing.assert_close(geo.principal_angles(P, Q), torch.tensor([0.0, deg], dtype=torch.float64),
                                   atol=1e-6, rtol=0)
    torch.testing.assert_close(geo.principal_angles(P, torch.stack([e[2], e[3]], -1)),
                               torch.tensor([90.0, 90.0], dtype=torch.float64), atol=1e-6, rtol=0)
    # Same plane, other basis: both angles zero.
    Q = torch.stack([e[0] + e[1], e[0] - 2 * e[1]], -1)
    assert geo.principal_angles(P, Q).abs().max() < 1e-6


def test_principal_angles_match_scipy_and_plucker():
    torch.manual_seed(2)
    A, B = torch.randn(20, R, 2, dtype=torch.float64), torch.randn(20, R, 2, dtype=torch.float64)
    got = geo.principal_angles(A, B)
    for k in range(20):
        ref = np.sort(np.rad2deg(scipy.linalg.subspace_angles(A[k].numpy(), B[k].numpy())))
        np.testing.assert_allclose(got[k].numpy(), ref, atol=1e-6)
    # For 2-planes the unit Plücker vectors' inner product is ± cos θ₁ cos θ₂.
    pa = plucker(A[..., 0], A[..., 1])
    pb = plucker(B[..., 0], B[..., 1])
    inner = ((pa / pa.norm(dim=-1, keepdim=True)) * (pb / pb.norm(dim=-1, keepdim=True))).sum(-1).abs()
    torch.testing.assert_close(inner, torch.cos(torch.deg2rad(got)).prod(-1), atol=1e-10, rtol=0)


def grassmann(offsets=(1, 2, 3), schedule="all", rank=R, d=8) -> mixers.Mixer:
    torch.manual_seed(0)
    return mixers.build("grassmann", d, causal=True, rank=rank, offsets=offsets, schedule=schedule).double().eval()


def by(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def test_grassmann_layer_geometry():
    m = grassmann()
    h = torch.randn(3, 12, 8, dtype=torch.float64)
    rows = geo.grassmann_layer_geometry(m, h, max_quadruples=None)
    assert all(set(r) == set(geo.FIELDS) - {"task", "arch", "seed", "layer"} for r in rows)
    quantities = {r["quantity"] for r in rows}
    assert quantities == {"plucker_residual_pair", "plucker_residual_used", "pair_angle",
                          "plane_angle_1", "plane_angle_2"}
    assert {r["offset"] for r in by(rows, quantity="pair_angle")} == {0, 1, 2, 3}
    for r in by(rows, quantity="plucker_residual_used") + by(rows, quantity="plucker_residual_pair"):
        assert r["value"] < 1e-12  # float64 mixer: both the per-offset and the used features are planes
    # Δ = 1: P_t and P_{t+1} share z_t, so the smaller principal angle is 0.
    assert by(rows, quantity="plane_angle_1", offset=1, stat="q95")[0]["value"] < 1e-6
    assert by(rows, quantity="plane_angle_1", offset=2, stat="mean")[0]["value"] > 1.0
    pairs = by(rows, quantity="pair_angle", offset=2, stat="mean")[0]
    # The mean angle between z_t and z_{t-2} (z: the layer's reduced vectors), from their
    # cosines here (the analysis takes atan2 of sine and cosine).
    z = m.reduce(h).detach().numpy()
    cos = (z[:, 2:] * z[:, :-2]).sum(-1) / (np.linalg.norm(z[:, 2:], axis=-1) * np.linalg.norm(z[:, :-2], axis=-1))
    assert pairs["count"] == 3 * (12 - 2)
    assert pairs["value"] == pytest.approx(np.degrees(np.arccos(cos)).mean(), abs=1e-9)
    q = [by(rows, quantity="pair_angle", offset=0, stat=s)[0]["value"] for s in ("q05", "q25", "q50", "q75", "q95")]
    assert q == sorted(q)


def test_grassmann_per_layer_schedule_and_long_offsets():
    m = grassmann(offsets=(2, 20), rank=5)
    rows = geo.grassmann_layer_geometry(m, torch.randn(2, 10, 8, dtype=torch.float64))
    assert {r["offset"] for r in by(rows, quantity="pair_angle")} == {0, 2}  # Δ = 20 ≥ L skipped


def test_model_geometry_rows():
    torch.manual_seed(0)
    seqs = torch.randint(0, 40, (2, 12))
    lm = CausalLM(LMConfig(arch="grassmann", vocab_size=40, max_len=12, d_model=8, n_layers=2,
                           mixer_options={"rank": 4, "offsets": (1, 3)}))
    rows = geo.model_geometry(lm, seqs)
    assert {r["layer"] for r in rows} == {0, 1}
    assert max(r["value"] for r in by(rows, quantity="plucker_residual_pair", stat="max")) < 1e-5  # fp32
    soft = CausalLM(LMConfig(arch="softmax", vocab_size=40, max_len=12, d_model=8, n_layers=2,
                             mixer_options={"n_heads": 2}))
    assert geo.model_geometry(soft, seqs) == []
    assert geo.has_geometry(mixers.mixer_class("grassmann")) and not geo.has_geometry(mixers.mixer_class("softmax"))


def test_tssa_compression_term_rows():
    assert geo.has_geometry(mixers.mixer_class("tssa"))
    torch.manual_seed(0)
    m = mixers.build("tssa", 8, causal=True, max_len=12, n_heads=2).double().eval()
    h = torch.randn(3, 12, 8, dtype=torch.float64)
    rows = geo.tssa_layer_geometry(m, h, eps=0.5)
    per_seq = m.compression_term(h, 0.5).sum(-1)
    mean = by(rows, stat="mean")[0]
    assert mean["quantity"] == "compression_term" and mean["count"] == 3
    assert mean["value"] == pytest.approx(per_seq.mean().item(), rel=1e-12)
    assert by(rows, stat="std")[0]["value"] == pytest.approx(per_seq.std().item(), rel=1e-12)
    # Smaller ε (finer coding precision) costs more nats.
    assert by(geo.tssa_layer_geometry(m, h, eps=0.1), stat="mean")[0]["value"] > mean["value"]


def test_geometry_csv_has_exactly_its_row_types_columns(tmp_path, monkeypatch):
    # write_geometry over one run directory, its trained model replaced by a tiny one.
    import csv
    import json
    from types import SimpleNamespace

    from seqmix.io import columns
    from seqmix.study.settings import GeometrySettings
    from seqmix.train import evaluate

    torch.manual_seed(0)
    lm = CausalLM(LMConfig(arch="grassmann", vocab_size=40, max_len=12, d_model=8, n_layers=2,
                           mixer_options={"rank": 4, "offsets": (1, 3)}))
    task = SimpleNamespace(heldout_inputs=lambda split, n, crop_len: (torch.randint(0, 40, (n, 12)),))
    run = SimpleNamespace(task="wikitext2", arch="grassmann", seed=0)
    monkeypatch.setattr(evaluate, "load_run", lambda run_dir: (lm, task, run))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"arch": "grassmann"}))
    out = tmp_path / "geometry.csv"
    assert geo.write_geometry([tmp_path / "run"], GeometrySettings(num_sequences=2), out) > 0
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == columns(geo.GeometryRow)
        assert all(v != "" for r in reader for v in r.values())
