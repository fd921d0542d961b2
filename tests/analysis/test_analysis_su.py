"""Su's sparsity (Su 2023, kexue.fm/archives/9889): every closed form against numeric integration (1e-6)
and Monte Carlo (within 4 standard errors), and su_sparsity on rows whose S is known.

Tolerances: quad runs at relative tolerance 1e-12, so the 1e-6 bound (the issue's) leaves
six orders of magnitude of margin for quadrature error while still catching any real
mistake in a formula. Monte Carlo uses a fixed seed and a delta-method standard error; a
4-SE band fails a correct formula with probability ~6e-5 per check, and each Monte Carlo
test also shows that a deliberately wrong formula lands far outside the same band, so the
band is tight enough to mean something.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special

from seqmix.analysis import su
from seqmix.analysis.sparsity import su_sparsity
from seqmix.study.settings import SparsityAnalyticSettings

GRID = [(b, g) for b in (-2.0, -1.0, -0.3, 0.0, 0.5, 1.5, 3.0) for g in (0.2, 0.7, 1.0, 2.0)]


def su_relu2_verbatim(beta: float, gamma: float) -> float:
    """Su's Mathematica formula for relu² (closed form 2 of the article) transcribed symbol for
    symbol (unstable for β/γ ≪ 0)."""
    e = math.exp(-(beta**2) / (2 * gamma**2))
    erf1 = math.erf(beta / (math.sqrt(2) * gamma)) + 1
    num = e * (math.sqrt(2) * beta * gamma + math.sqrt(math.pi) / e * (beta**2 + gamma**2) * erf1)
    den = math.pi**0.25 * math.sqrt(
        2 * math.sqrt(2) * beta * gamma * e * (beta**2 + 5 * gamma**2)
        + 2 * math.sqrt(math.pi) * (beta**4 + 6 * beta**2 * gamma**2 + 3 * gamma**4) * erf1
    )
    return num / den


# --- closed form vs numeric integration ---------------------------------------------------


@pytest.mark.parametrize("kernel", ["exp", "relu2", "identity"])
def test_closed_form_equals_quadrature(kernel):
    worst = max(abs(su.closed_form(kernel, b, g) - su.s_quad(kernel, b, g)) for b, g in GRID)
    assert worst < 1e-6, f"{kernel}: closed form and quad differ by {worst:.2e}"


def test_relu2_is_su_formula_and_known_values():
    for b, g in [(b, g) for b, g in GRID if abs(b / g) <= 3]:  # verbatim cancels beyond (6e-7 at -5)
        assert su.s_relu2(b, g) == pytest.approx(su_relu2_verbatim(b, g), rel=1e-10, abs=1e-14)
    assert su.s_relu2(0.0, 1.3) == pytest.approx(1 / math.sqrt(6), abs=1e-15)  # M₂(0)/sqrt(M₄(0)) = (1/2)/sqrt(3/2)
    assert su.s_relu2(-1.0, 0.7) == pytest.approx(0.1374, abs=5e-5)  # a 2M-sample Monte Carlo gives 0.1378
    # Stable far into the tail, where the verbatim form is 0/0; S → 0 only for β < 0.
    tail = su.s_relu2(np.array([-40.0, -20.0, -10.0]), 1.0)
    assert np.all(np.isfinite(tail)) and np.all(tail > 0) and np.all(np.diff(tail) > 0)
    assert su.s_relu2(-10.0, 1.0) == pytest.approx(su.s_quad("relu2", -10.0, 1.0), rel=1e-6)


def test_identity_properties():
    assert su.s_identity(0.0, 1.0) == pytest.approx(math.sqrt(2 / math.pi), abs=1e-15)
    b = np.linspace(-3, 3, 61)
    s = su.s_identity(b, 1.0)
    assert s.min() == pytest.approx(math.sqrt(2 / math.pi)) and np.allclose(s, s[::-1])
    assert su.s_identity(1.0, 2.0) == pytest.approx(su.s_identity(0.5, 1.0), abs=1e-15)  # only β/γ


def test_exp_is_independent_of_beta():
    for b in (-2.0, 0.0, 3.0):
        assert su.s_quad("exp", b, 0.9) == pytest.approx(math.exp(-0.5 * 0.81), abs=1e-9)


def _normal_expect(g, m: float, s: float) -> float:
    """E g(x) for x ~ N(m, s²) by quad, split at 0 (elu's kink), over m ± 40s."""
    pdf = lambda x: math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))  # noqa: E731
    return sum(integrate.quad(lambda x: g(x) * pdf(x), a, b, epsabs=1e-14, epsrel=1e-12, limit=500)[0]
               for a, b in ((m - 40 * s, 0.0), (0.0, m + 40 * s)))


def test_elu1_moments_equal_quadrature():
    for m, s in ((-1.5, 0.5), (0.0, 1.0), (0.3, 1.0), (2.0, 1.7)):
        mean = _normal_expect(lambda x: float(su.elu1(x)), m, s)
        var = _normal_expect(lambda x: float(su.elu1(x)) ** 2, m, s) - mean**2
        got = su.elu1_moments(m, s)
        assert abs(got[0] - mean) < 1e-6 and abs(got[1] - var) < 1e-6


# --- closed form vs Monte Carlo -----------------------------------------------------------

# Points with γ ≤ 1: for exp the delta method needs E a⁴ = e^{4β+8γ²} to be moderate; at
# γ ≳ 2 the lognormal tail makes the standard error itself unreliable at 4e5 samples.
def _s_relu(a: float) -> float:
    """S of plain relu weights (M₁/sqrt(M₂) of the truncated normal), a = β/γ."""
    Phi, phi = special.ndtr(a), math.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
    return (a * Phi + phi) / math.sqrt((a * a + 1) * Phi + a * phi)


MC_POINTS = [(0.0, 0.5), (-1.0, 0.7), (0.5, 1.0)]
WRONG = {
    "exp": lambda b, g: math.exp(-(g**2)),  # e^{-γ²}: a factor 2 off in the exponent
    "relu2": lambda b, g: _s_relu(b / g),  # relu instead of relu²: the power dropped
    "identity": lambda b, g: su.s_identity(b, g) * 1.02,  # 2% off
}


@pytest.mark.parametrize("kernel", ["exp", "relu2", "identity"])
def test_closed_form_within_monte_carlo_error(kernel):
    for k, (b, g) in enumerate(MC_POINTS):
        s_mc, se = su.s_monte_carlo(kernel, b, g, 400_000, seed=k)
        exact = su.closed_form(kernel, b, g)
        assert abs(s_mc - exact) < 4 * se, f"{kernel} at β={b}, γ={g}: MC {s_mc:.5f} ± {se:.1e}, closed {exact:.5f}"
        wrong = WRONG[kernel](b, g)
        assert abs(s_mc - wrong) > 4 * se, f"{kernel}: the check cannot tell a wrong formula apart"


def test_elu1_closed_form_within_monte_carlo_error():
    rng = np.random.default_rng(3)
    d, N = 16, 100_000
    for q_norm, mu0 in ((2.0, 0.0), (3.0, -0.5), (4.0, -1.0)):
        q = np.zeros(d)
        q[0] = q_norm
        keys = rng.standard_normal((N, d)) + mu0
        s_mc, se = su.ratio_estimate(su.elu1(keys) @ su.elu1(q))
        exact = su.s_elu1(q_norm, mu0, d)
        assert abs(s_mc - exact) < 4 * se
        # Wrong: the uniform-query ratio 1/√d instead of the actual ‖q̃‖₂/‖q̃‖₁.
        mean, var = su.elu1_moments(mu0, 1.0)
        wrong = 1 / math.sqrt(1 + var / mean**2 / d)
        assert abs(s_mc - wrong) > 4 * se


def test_general_nonneg_linear_within_monte_carlo_error():
    # Correlated lognormal key features: k̃ = exp(m + Lz) has a closed-form mean and
    # covariance, μ̃_i = e^{m_i + C_ii/2}, Σ̃_ij = μ̃_i μ̃_j (e^{C_ij} - 1), with C = L Lᵀ.
    rng = np.random.default_rng(4)
    d, N = 16, 400_000
    m = rng.normal(0, 0.3, d)
    Lc = 0.25 * rng.standard_normal((d, d))
    C = Lc @ Lc.T
    mu = np.exp(m + 0.5 * np.diag(C))
    cov = np.outer(mu, mu) * np.expm1(C)
    q = np.abs(rng.standard_normal(d))
    keys = np.exp(m + rng.standard_normal((N, d)) @ Lc.T)
    s_mc, se = su.ratio_estimate(keys @ q)
    exact = su.s_nonneg_linear(q, mu, cov)
    assert abs(s_mc - exact) < 4 * se
    wrong = su.s_nonneg_linear(q, mu, np.diag(np.diag(cov)))  # correlations dropped
    assert abs(s_mc - wrong) > 4 * se


def test_iid_special_case_and_the_corrected_sqrt_d_remark():
    d = 32
    lo, hi = su.ratio_bounds(d)
    assert (lo, hi) == (1 / math.sqrt(d), 1.0)
    rng = np.random.default_rng(5)
    q = np.abs(rng.standard_normal((1000, d))) * (rng.random((1000, d)) < 0.3)
    q = q[q.sum(1) > 0]
    ratio = np.linalg.norm(q, axis=1) / q.sum(1)
    assert ratio.min() >= lo - 1e-12 and ratio.max() <= hi + 1e-12  # never √d
    uniform, onehot = np.ones(d), np.eye(d)[0]
    assert np.linalg.norm(uniform) / uniform.sum() == pytest.approx(lo)
    assert np.linalg.norm(onehot) / onehot.sum() == pytest.approx(hi)
    # Hence the iid S has a query- and d-independent floor 1/sqrt(1 + (σ̃/μ̃)²).
    mu, sigma = 1.4, 0.85
    floor = 1 / math.sqrt(1 + (sigma / mu) ** 2)
    s_all = [su.s_nonneg_linear_iid(qi, mu, sigma) for qi in q]
    assert min(s_all) >= floor - 1e-12
    assert su.s_nonneg_linear_iid(onehot, mu, sigma) == pytest.approx(floor)
    # The iid form is the general form with μ̃ = μ̃·1, Σ̃ = σ̃² I.
    assert su.s_nonneg_linear_iid(q[0], mu, sigma) == pytest.approx(
        su.s_nonneg_linear(q[0], mu * np.ones(d), sigma**2 * np.eye(d)), abs=1e-14
    )


def test_decay_equals_the_explicit_row():
    # Deterministic: the row a = (λ^{n-1}, …, 1) is known exactly, so the check against
    # integration/Monte Carlo becomes a check against evaluating S on that row.
    for lam in (0.3, 0.9, 0.99, 1.0):
        for n in (1, 2, 7, 100, 5000):
            row = torch.tensor(lam, dtype=torch.float64) ** torch.arange(n - 1, -1, -1, dtype=torch.float64)
            assert float(su.s_decay(lam, n)) == pytest.approx(su_sparsity(row).item(), abs=1e-12)
            if lam < 1:  # S = bound·sqrt(1-λⁿ): equal once λⁿ underflows
                assert su.s_decay(lam, n) <= su.s_decay_bound(lam, n)
                assert su.s_decay(lam, n) < su.s_decay_bound(lam, n) or lam**n < 1e-16
    assert float(su.s_decay(0.9, 100)) == pytest.approx(0.43588, abs=5e-6)  # Su's decay form at λ = 0.9, n = 100
    assert su.s_decay(0.9, 10**6) < 0.01  # λ < 1: S → 0 as n → ∞


def test_finite_n_monte_carlo_converges_to_closed_form():
    for kernel, b, g in (("identity", 0.0, 1.0), ("relu2", -0.5, 1.0), ("exp", 0.0, 0.5)):
        s, se = su.s_monte_carlo_finite_n(kernel, b, g, n=4096, rows=100, seed=1)
        assert abs(s - su.closed_form(kernel, b, g)) < 4 * se + 1e-3  # + O(1/n) ratio bias
        s_short, _ = su.s_monte_carlo_finite_n(kernel, b, g, n=4, rows=100, seed=1)
        assert abs(s_short - su.closed_form(kernel, b, g)) > abs(s - su.closed_form(kernel, b, g))


def test_analytic_curves_table():
    cfg = SparsityAnalyticSettings(beta_range=(-1.0, 1.0), beta_points=3, gamma_range=(0.5, 1.5), gamma_points=2,
                               lengths=[4, 64], lambdas=[0.9, 1.0], feature_dim=8, mc_points=[(0.0, 1.0)],
                               mc_lengths=[16], mc_rows=10, seed=0)
    rows = su.analytic_curves(cfg)
    assert all(set(r) == set(su.FIELDS) for r in rows)
    assert len(rows) == 3 * 2 * 4 + 2 * 2 + 1 * 3 * 1
    closed = [r for r in rows if r["method"] == "closed_form" and r["kernel"] != "decay"]
    assert {(r["beta"], r["gamma"]) for r in closed} == {(b, g) for b in (-1.0, 0.0, 1.0) for g in (0.5, 1.5)}
    # Each row holds the S of its kernel at its (β, γ), computed here without the closed
    # forms: 1-D kernels by quadrature, elu+1 from quadrature moments of its features.
    for r in closed:
        b, g = r["beta"], r["gamma"]
        if r["kernel"] == "elu1":
            mean = _normal_expect(lambda x: float(su.elu1(x)), b / g, 1.0)
            var = _normal_expect(lambda x: float(su.elu1(x)) ** 2, b / g, 1.0) - mean**2
            q = np.ones(8)
            q[0] = g + 1.0  # elu(‖q‖) + 1 along the query's axis, 1 on the others
            ratio = np.linalg.norm(q) / q.sum()
            expected = 1 / math.sqrt(1 + var / mean**2 * ratio**2)
        else:
            expected = su.s_quad(r["kernel"], b, g)
        assert r["S"] == pytest.approx(expected, abs=1e-6), r
        assert (r["n"], r["S_se"], r["rows"]) == (float("inf"), 0.0, 0)
    # Decay rows: S of the explicit row (λ^{n-1}, ..., λ, 1).
    decay = [r for r in rows if r["kernel"] == "decay"]
    assert {(r["lambda"], r["n"]) for r in decay} == {(lam, n) for lam in (0.9, 1.0) for n in (4, 64)}
    for r in decay:
        a = r["lambda"] ** np.arange(r["n"] - 1, -1, -1, dtype=float)
        assert r["S"] == pytest.approx(a.mean() / math.sqrt((a * a).mean()), abs=1e-12), r
    mc = [r for r in rows if r["method"] == "monte_carlo"]
    assert sorted(r["kernel"] for r in mc) == sorted(su.SCORE_FUNCTIONS)
    assert all((r["beta"], r["gamma"], r["n"], r["rows"]) == (0.0, 1.0, 16, 10) for r in mc)
    # Each the finite-n estimate at the config's n, rows and seed (tested against the closed
    # forms above), not another draw.
    for r in mc:
        assert (r["S"], r["S_se"]) == su.s_monte_carlo_finite_n(r["kernel"], 0.0, 1.0, 16, 10, seed=0), r


# --- su_sparsity ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 10, 257])
def test_su_sparsity_onehot_and_constant(n):
    onehot = torch.zeros(3, n, dtype=torch.float64)
    onehot[:, n // 2] = 2.5
    torch.testing.assert_close(su_sparsity(onehot), torch.full((3,), 1 / math.sqrt(n), dtype=torch.float64))
    torch.testing.assert_close(su_sparsity(torch.full((3, n), 0.7, dtype=torch.float64)),
                               torch.ones(3, dtype=torch.float64))


def test_su_sparsity_mask_dim_and_scale():
    L = 6
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    row = torch.rand(L, L, dtype=torch.float64) * causal  # zeros above the diagonal
    row[:, 0] = 1.0
    s = su_sparsity(row, mask=causal)
    for t in range(L):  # row t over its visible prefix 0..t
        torch.testing.assert_close(s[t], su_sparsity(row[t, : t + 1]))
    eye = torch.eye(L, dtype=torch.float64)
    torch.testing.assert_close(su_sparsity(eye, mask=causal), 1 / torch.arange(1, L + 1).double().sqrt())
    x = torch.rand(4, 5, dtype=torch.float64)
    torch.testing.assert_close(su_sparsity(x, dim=0), su_sparsity(x.T))
    torch.testing.assert_close(su_sparsity(3.0 * x), su_sparsity(x))
    assert torch.isnan(su_sparsity(torch.zeros(1, 4))).all()


def test_su_sparsity_matches_numpy_ratio():
    a = np.random.default_rng(0).exponential(size=1000)
    assert su_sparsity(torch.from_numpy(a)).item() == pytest.approx(su.ratio_estimate(a)[0], rel=1e-12)


def test_cli_writes_the_curves_csv(tmp_path):
    import csv

    import yaml

    from seqmix import REPO_ROOT, cli
    from seqmix.study.profile import deep_merge

    raw = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    small = {"beta_points": 2, "gamma_points": 2, "lengths": [8], "lambdas": [0.9], "mc_points": [[0.0, 1.0]],
             "mc_lengths": [8], "mc_rows": 4}
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(deep_merge(raw, {"analysis": {"sparsity_analytic": small}})))
    out = tmp_path / "sparsity_analytic.csv"
    assert cli.main(["sparsity-analytic", "--config", str(cfg), "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == su.FIELDS and len(rows) == 2 * 2 * 4 + 1 + 3
