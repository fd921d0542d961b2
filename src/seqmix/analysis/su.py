"""Su's sparsity of attention rows in closed form (Su Jianlin 2023, "Can attention
mechanisms really concentrate attention?", kexue.fm/archives/9889), with the two checks each
closed form must pass: numeric integration (``s_quad``) and Monte Carlo.

For weights a_j ∝ f(q·k_j), keys k = μ + σε, ε ~ N(0, I) and n → ∞, S(a) = E|a|/sqrt(E a²)
reduces to S = E|f(β + γε)| / sqrt(E f²(β + γε)) over ε ~ N(0, 1), with β = q·μ, γ = σ‖q‖:
one function per score function f (a row's ``kernel``) below. The derivations, and the
correction to the article's bound on ‖q̃‖₂/‖q̃‖₁, are in the report's "Attention sparsity"
section.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypedDict

import numpy as np
from scipy import integrate, special

from seqmix.io import columns
from seqmix.study.settings import SparsityAnalyticSettings

# One row of sparsity_analytic.csv: one point of a curve. Functional syntax: ``lambda`` is a
# Python keyword.
SparsityAnalyticRow = TypedDict("SparsityAnalyticRow", {
    "kernel": str,  # exp | relu2 | identity | elu1 | decay
    "method": str,  # closed_form (n → ∞, except decay) | monte_carlo (finite n, mean over rows)
    "beta": float,  # β = q·μ, the key-bias term; NaN for decay
    "gamma": float,  # γ = σ‖q‖, query norm × key spread; NaN for decay
    "n": float,  # keys in the row; inf for the n → ∞ forms
    "lambda": float,  # decay factor λ ∈ (0, 1]; NaN except for decay
    "d": float,  # feature dimension of elu1 (its S depends on d); NaN otherwise
    "S": float,  # Su's sparsity: 1 for a uniform row, 1/√n for a one-hot one
    "S_se": float,  # standard error of a monte_carlo S (over ``rows`` rows); 0 for closed forms
    "rows": int,  # sampled rows behind a monte_carlo point; 0 for closed forms
})
FIELDS = columns(SparsityAnalyticRow)

SQRT2 = math.sqrt(2.0)
SQRT_2PI = math.sqrt(2.0 * math.pi)


# ---------------------------------------------------------------------------------------
# Closed forms (Su 2023; derivations in the report's "Attention sparsity" section)
# ---------------------------------------------------------------------------------------


def s_exp(gamma: float | np.ndarray) -> float | np.ndarray:
    """Softmax attention: S = exp(-γ²/2) (β cancels between numerator and denominator)."""
    return np.exp(-0.5 * np.asarray(gamma, float) ** 2)


def s_relu2(beta: float | np.ndarray, gamma: float | np.ndarray) -> float | np.ndarray:
    """relu² attention (Su's Mathematica formula), written as M₂(a)/sqrt(M₄(a)), a = β/γ.

    Evaluated stably: for a ≥ 0 every term is positive; for a < 0 the common factor
    e^{-a²/2} is taken out through erfcx (Φ(a) = ½ erfcx(-a/√2) e^{-a²/2}), so that
    S = e^{-a²/4} m₂/sqrt(m₄) does not underflow to 0/0 for very negative a. What remains
    is a cancellation of relative size ~a⁴·1e-16, negligible for |a| ≲ 100.
    """
    a = np.asarray(beta, float) / np.asarray(gamma, float)
    a, scalar = np.atleast_1d(a), np.ndim(a) == 0
    out = np.empty_like(a)
    pos = a >= 0
    ap = a[pos]
    Phi, phi = special.ndtr(ap), np.exp(-0.5 * ap**2) / SQRT_2PI
    m2 = (ap**2 + 1) * Phi + ap * phi
    m4 = (ap**4 + 6 * ap**2 + 3) * Phi + (ap**3 + 5 * ap) * phi
    out[pos] = m2 / np.sqrt(m4)
    an = a[~pos]
    Phi_s, phi_s = 0.5 * special.erfcx(-an / SQRT2), 1.0 / SQRT_2PI  # both times e^{-a²/2}
    m2 = (an**2 + 1) * Phi_s + an * phi_s
    m4 = (an**4 + 6 * an**2 + 3) * Phi_s + (an**3 + 5 * an) * phi_s
    out[~pos] = np.exp(-0.25 * an**2) * m2 / np.sqrt(m4)
    return out[0] if scalar else out


def s_identity(beta: float | np.ndarray, gamma: float | np.ndarray) -> float | np.ndarray:
    """Plain linear attention (f = identity, |f| in the numerator): minimum √(2/π) at β = 0."""
    beta, gamma = np.asarray(beta, float), np.asarray(gamma, float)
    mean_abs = math.sqrt(2 / math.pi) * gamma * np.exp(-(beta**2) / (2 * gamma**2)) + beta * special.erf(
        beta / (SQRT2 * gamma)
    )
    return mean_abs / np.sqrt(beta**2 + gamma**2)


def s_nonneg_linear(q: np.ndarray, mu: np.ndarray, cov: np.ndarray) -> float:
    """Non-negative linear attention, a_j = q̃·k̃_j: S = 1/sqrt(1 + q̃ᵀΣ̃q̃/(q̃ᵀμ̃)²).

    q: (d,) non-negative query features; mu: (d,) and cov: (d, d) the mean and covariance
    of the key features. Exact for n → ∞ whatever the key distribution (only E a and E a²
    enter, and both are moments of a linear function of k̃).
    """
    q, mu, cov = np.asarray(q, float), np.asarray(mu, float), np.asarray(cov, float)
    return float(1.0 / np.sqrt(1.0 + (q @ cov @ q) / (q @ mu) ** 2))


def s_nonneg_linear_iid(q: np.ndarray, mu: float, sigma: float) -> float:
    """The iid special case (μ̃ = μ̃·1, Σ̃ = σ̃²I): 1/sqrt(1 + ((σ̃/μ̃)·‖q̃‖₂/‖q̃‖₁)²)."""
    q = np.asarray(q, float)
    ratio = np.linalg.norm(q) / np.abs(q).sum()
    return float(1.0 / np.sqrt(1.0 + (sigma / mu * ratio) ** 2))


def ratio_bounds(d: int) -> tuple[float, float]:
    """(min, max) of ‖q̃‖₂/‖q̃‖₁ over non-zero q̃ ∈ R^d: (1/√d at uniform q̃, 1 at one-hot q̃).

    Su's article gives √d as the maximum; that is the maximum of ‖q̃‖₁/‖q̃‖₂ instead.
    """
    return 1.0 / math.sqrt(d), 1.0


def s_decay(lam: float | np.ndarray, n: int | np.ndarray) -> float | np.ndarray:
    """Linear attention with decay, a = (λ^{n-1}, …, λ, 1): S(λ, n); S = 1 at λ = 1."""
    lam, n = np.asarray(lam, float), np.asarray(n, float)
    ln = lam**n
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sqrt((1 - ln) / (n * (1 - lam)) * (1 + lam) / (1 + ln))
    return np.where(lam == 1.0, 1.0, s)


def s_decay_bound(lam: float | np.ndarray, n: int | np.ndarray) -> float | np.ndarray:
    """Su's upper bound sqrt((1/n)(1+λ)/((1-λ)(1+λⁿ))) > S(λ, n), for λ < 1."""
    lam, n = np.asarray(lam, float), np.asarray(n, float)
    return np.sqrt((1 / n) * (1 + lam) / ((1 - lam) * (1 + lam**n)))


def elu1_moments(m: float, s: float) -> tuple[float, float]:
    """Mean and variance of φ(x) = elu(x) + 1 for x ~ N(m, s²), in closed form.

    With c = m/s and b = m + 1:
        E φ  = bΦ(c) + sφ(c) + e^{m+s²/2} Φ(-c-s)
        E φ² = b²Φ(c) + 2bsφ(c) + s²(Φ(c) - cφ(c)) + e^{2m+2s²} Φ(-c-2s)
    (the x > 0 branch is a truncated-normal moment, the x ≤ 0 branch a lognormal one).
    """
    c = m / s
    Phi, phi = special.ndtr(c), math.exp(-0.5 * c * c) / SQRT_2PI
    b = m + 1.0
    mean = b * Phi + s * phi + math.exp(m + 0.5 * s * s) * special.ndtr(-c - s)
    second = b * b * Phi + 2 * b * s * phi + s * s * (Phi - c * phi) + math.exp(2 * m + 2 * s * s) * special.ndtr(-c - 2 * s)
    return float(mean), float(second - mean * mean)


def elu1(x: np.ndarray) -> np.ndarray:
    """The linear-attention feature map φ(x) = elu(x) + 1 (Katharopoulos 2020), > 0."""
    x = np.asarray(x, float)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def s_elu1(q_norm: float, mu0: float, d: int) -> float:
    """S of elu+1 attention for keys k ~ N(μ₀·1, I) in R^d (iid features) and q = ‖q‖e₁, the
    direction that makes ‖q̃‖₂/‖q̃‖₁ largest: the most concentrated row elu+1 attention can
    produce at that ‖q‖ (then γ = ‖q‖ and β = ‖q‖μ₀)."""
    q_tilde = np.ones(d)
    q_tilde[0] = float(elu1(q_norm))
    mean, var = elu1_moments(mu0, 1.0)
    return s_nonneg_linear_iid(q_tilde, mean, math.sqrt(var))


# ---------------------------------------------------------------------------------------
# Checks: numeric integration and Monte Carlo
# ---------------------------------------------------------------------------------------

# The score functions f of a_j ∝ f(q·k_j) with a 1-D closed form, by the name a row's ``kernel``
# gives them (Su's word, the CSV's column and a claim's key; a kernel of kernels/ is a fast path).
SCORE_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "relu2": lambda x: np.maximum(x, 0.0) ** 2,
    "identity": lambda x: x,
}


def closed_form(kernel: str, beta: float, gamma: float) -> float:
    """The n → ∞ closed form of a 1-D kernel (exp, relu2, identity) at (β, γ)."""
    if kernel == "exp":
        return float(s_exp(gamma))
    if kernel == "relu2":
        return float(s_relu2(beta, gamma))
    if kernel == "identity":
        return float(s_identity(beta, gamma))
    raise KeyError(f"no 1-D closed form for kernel {kernel!r}; choose from {', '.join(SCORE_FUNCTIONS)}")


def s_quad(kernel: str, beta: float, gamma: float) -> float:
    """S from E_ε|f(β+γε)| and E_ε f²(β+γε) by adaptive quadrature (scipy quad).

    The integral is split at the kink/support edge ε₀ = -β/γ (where relu² and |x| stop
    being smooth), with relative tolerance 1e-12 so that a 1e-6 comparison is meaningful.
    It runs over |ε| ≤ 40 + 4γ rather than ±∞: the largest integrand, e^{2γε}φ(ε), is below
    e^{-800} beyond that, and finite limits keep exp(2γε) from overflowing.
    """
    f = SCORE_FUNCTIONS[kernel]
    edge = 40.0 + 4.0 * abs(gamma)
    e0 = min(max(-beta / gamma, -edge), edge)

    def expect(g: Callable[[float], float]) -> float:
        total = 0.0
        for lo, hi in ((-edge, e0), (e0, edge)):
            val, _ = integrate.quad(
                lambda e: g(beta + gamma * e) * math.exp(-0.5 * e * e) / SQRT_2PI,
                lo, hi, epsabs=1e-14, epsrel=1e-12, limit=500,
            )
            total += val
        return total

    mean_abs = expect(lambda x: abs(float(f(x))))
    mean_sq = expect(lambda x: float(f(x)) ** 2)
    return mean_abs / math.sqrt(mean_sq)


def ratio_estimate(samples: np.ndarray) -> tuple[float, float]:
    """S = mean|a| / sqrt(mean a²) from iid draws of a, and its delta-method standard error.

    With m₁ = E|a|, m₂ = E a², S = m₁ m₂^{-1/2}, ∇S = (m₂^{-1/2}, -½ m₁ m₂^{-3/2}), and
    Var Ŝ ≈ ∇Sᵀ Cov(|a|, a²) ∇S / N. Valid when a has a finite fourth moment.
    """
    x = np.abs(np.asarray(samples, float))
    N = x.size
    m1, m2 = x.mean(), (x * x).mean()
    cov = np.cov(np.stack([x, x * x]), ddof=1)
    grad = np.array([m2**-0.5, -0.5 * m1 * m2**-1.5])
    return float(m1 / math.sqrt(m2)), float(math.sqrt(grad @ cov @ grad / N))


def s_monte_carlo(kernel: str, beta: float, gamma: float, samples: int, seed: int = 0) -> tuple[float, float]:
    """(S, standard error) of the n → ∞ form by sampling ε ~ N(0, 1)."""
    eps = np.random.default_rng(seed).standard_normal(samples)
    return ratio_estimate(SCORE_FUNCTIONS[kernel](beta + gamma * eps))


def s_monte_carlo_finite_n(
    kernel: str, beta: float, gamma: float, n: int, rows: int, seed: int = 0
) -> tuple[float, float]:
    """Mean S over ``rows`` sampled rows of n keys each, and its standard error.

    This is what a finite-length row measures; it converges to the closed form as n grows
    (slowly for exp at large γ, whose weights are heavy-tailed lognormals).
    """
    rng = np.random.default_rng(seed)
    out = np.empty(rows)
    for i in range(rows):
        a = np.abs(SCORE_FUNCTIONS[kernel](beta + gamma * rng.standard_normal(n)))
        out[i] = a.mean() / math.sqrt((a * a).mean()) if a.any() else np.nan
    out = out[np.isfinite(out)]
    return float(out.mean()), float(out.std(ddof=1) / math.sqrt(out.size)) if out.size > 1 else float("nan")


# ---------------------------------------------------------------------------------------
# Curves for the report
# ---------------------------------------------------------------------------------------


def _row(kernel, method, *, beta=float("nan"), gamma=float("nan"), n=float("inf"),
         lam=float("nan"), d=float("nan"), S, S_se=0.0, rows=0) -> SparsityAnalyticRow:
    return {"kernel": kernel, "method": method, "beta": beta, "gamma": gamma, "n": n,
            "lambda": lam, "d": d, "S": S, "S_se": S_se, "rows": rows}


def analytic_curves(cfg: SparsityAnalyticSettings) -> list[SparsityAnalyticRow]:
    """Every row of sparsity_analytic.csv from the ``analysis.sparsity_analytic`` config:
    the closed forms over the β × γ grid, decay over λ × n, and finite-n Monte Carlo rows
    converging to the n → ∞ closed forms at the ``mc_points``."""
    betas = np.linspace(*cfg.beta_range, cfg.beta_points)
    gammas = np.linspace(*cfg.gamma_range, cfg.gamma_points)
    d = cfg.feature_dim
    rows = []
    for beta in betas:
        for gamma in gammas:
            b, g = float(beta), float(gamma)
            for kernel in SCORE_FUNCTIONS:
                rows.append(_row(kernel, "closed_form", beta=b, gamma=g, S=closed_form(kernel, b, g)))
            rows.append(_row("elu1", "closed_form", beta=b, gamma=g, d=d, S=s_elu1(g, b / g, d)))
    for lam in cfg.lambdas:
        for n in cfg.lengths:
            rows.append(_row("decay", "closed_form", n=int(n), lam=float(lam), S=float(s_decay(lam, n))))
    for k, (beta, gamma) in enumerate(cfg.mc_points):
        for kernel in SCORE_FUNCTIONS:
            for n in cfg.mc_lengths:
                s, se = s_monte_carlo_finite_n(kernel, beta, gamma, int(n), cfg.mc_rows, seed=cfg.seed + k)
                rows.append(_row(kernel, "monte_carlo", beta=beta, gamma=gamma, n=int(n), S=s, S_se=se,
                                 rows=cfg.mc_rows))
    return rows
