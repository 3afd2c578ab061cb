"""Closed forms of "Threshold-Based Exclusive Batching for LLM Inference" (ICML 2026).

Plain keyword-argument functions of numbers: no state, no I/O, no clock. Equation
numbers are the paper's; docs/design.md §7 lists where the code departs from it. Units: seconds, tokens,
requests.

Vocabulary: theta = k/N (share of slots idle at refill), zeta = -ln(1-theta), p0 + eta·t the output-length
hazard, mu_l / mu_o mean input / output length, alpha/beta fixed / marginal iteration costs
(p: prefill per token, d: decode per request, MB: mixed per token, beta_MB^e(r) = c0 + c1 r + c2 r²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize_scalar

_THETA_SERIES = 1e-4  # below this Ψ(θ) is summed as a series: θ/(1−θ) + ln(1−θ) cancels to θ²/2


@dataclass(frozen=True, slots=True)
class Costs:
    """Iteration-cost coefficients. ``alpha_mb`` is 0 for a profile whose beta_MB^e(r) was fitted from
    saturated end-to-end throughput: that beta already holds the per-iteration fixed costs, and adding
    alpha_MB on top would count them twice."""

    alpha_p: float
    beta_p: float
    alpha_d: float
    beta_d: float
    alpha_mb: float = 0.0
    c0: float = math.nan  # beta_MB^e(r) = c0 + c1 r + c2 r²; nan: mixed cost unknown
    c1: float = 0.0
    c2: float = 0.0

    @property
    def has_mixed(self) -> bool:
        return math.isfinite(self.c0)


def _check(name: str, x: float, *, lo: float = 0.0, lo_open: bool = False, hi: float = math.inf) -> None:
    ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if math.isfinite(hi) else "")
        raise ValueError(f"{name}={x!r}: must be finite and {bound}")


def _psi(theta: float) -> float:
    """Left side of Eq. 3: Ψ(θ) = θ/(1−θ) + ln(1−θ) = Σ_{n≥2} (n−1)/n · θⁿ, increasing from 0 to ∞."""
    if theta < _THETA_SERIES:
        t2 = theta * theta
        return t2 / 2 + 2 * t2 * theta / 3 + 3 * t2 * t2 / 4
    return theta / (1.0 - theta) + math.log1p(-theta)


def theta0(gamma: float) -> float:
    """Eq. 3: the CFR base threshold, the root in (0, 1) of θ/(1−θ) + ln(1−θ) = γ, γ = p0·α_p/α_d."""
    _check("gamma", gamma, lo_open=True)
    if gamma <= 1.0:
        return brentq(lambda t: _psi(t) - gamma, 0.0, 0.9,  # Ψ(0.9) ≈ 6.7 > 1 ≥ γ
                      xtol=1e-16, rtol=4 * np.finfo(float).eps, maxiter=200)
    # Near θ → 1 solve for x = 1 − θ instead, where it keeps its digits: (1−x)/x + ln x = γ.
    x_lo = 1.0 / (2.0 * (gamma + 2.0))  # (1−x)/x + ln x > γ here for every γ > 0
    x = brentq(lambda x: (1.0 - x) / x + math.log(x) - gamma, x_lo, 0.5,
               xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=200)
    return 1.0 - x


def zeta(theta: float) -> float:
    """ζ(θ) = −ln(1−θ): the decode-phase length in units of 1/p0 (appendix B.2)."""
    return -math.log1p(-theta)


def delta_theta(theta0: float, p0: float, eta: float, alpha_d: float, beta_d: float, n: float) -> float:
    """Eq. 5: first-order IFR correction Δθ for a linear hazard h(t) = p0 + η·t, at batch size N = n.

    Δθ = η(1−θ0)²/(p0²θ0) · [ ζ(θ0/(1−θ0) − ζ/2) + (β_d N/α_d)(ζ − θ0) ],  ζ = −ln(1−θ0).
    """
    _check("theta0", theta0, lo_open=True, hi=1.0 - 1e-15)
    _check("p0", p0, lo_open=True)
    _check("alpha_d", alpha_d, lo_open=True)
    _check("beta_d", beta_d)
    _check("n", n)
    if not math.isfinite(eta):
        raise ValueError(f"eta={eta!r}: must be finite")
    z = zeta(theta0)
    duration = z * (theta0 / (1.0 - theta0) - z / 2.0)
    per_token = beta_d * n / alpha_d * (z - theta0)
    return eta * (1.0 - theta0) ** 2 / (p0 * p0 * theta0) * (duration + per_token)


def vbar(p0: float, mu_l: float) -> float:
    """Appendix D.4: v̄ = 1/(p0²·μ_L), the expected supremum of the decode-phase memory walk."""
    return 1.0 / (p0 * p0 * mu_l)


def vbar_moments(mu_l: float, var_l: float, mu_o: float, var_o: float) -> float:
    """Appendix D.3-D.4's v̄ = v_N/(2|d_N|) for any output distribution with mean μ_O and variance σ_O².

    D.3 prices one decode step of n requests with completions Bernoulli(p0) (geometric outputs). Without that
    assumption a slot's completions form a renewal process of rate q = 1/μ_O whose count per step has variance
    σ_O²/μ_O³ (the renewal CLT), and a completion releases S = L + O with Var(S) = σ_L² + σ_O². So
    d_n = −n·q·μ_L (as in D.3), v_n = n·q·(σ_L² + σ_O²) + n·(σ_O²/μ_O³)·(μ_L + μ_O)², and

        v̄ = (σ_L² + σ_O² + σ_O²·(1 + μ_L/μ_O)²) / (2 μ_L).

    Geometric outputs (σ_O² ≈ μ_O² = 1/p0²) with μ_L ≪ μ_O give D.4's 1/(p0²μ_L) back; outputs piled at a cap
    (σ_O ≪ μ_O) give far less: the completions of a batch whose outputs are nearly fixed are nearly fixed too.
    Like D.3 this takes a completion's size as independent of how many complete; on a simulated walk they are
    not (a slot's released output tokens over a span are the span less the ages at its ends), and the walk's
    own variance rate comes out lower still (tests/unit/test_model.py): the margin stays conservative."""
    if not (mu_l > 0 and mu_o > 0):
        return math.inf
    return (var_l + var_o + var_o * (1.0 + mu_l / mu_o) ** 2) / (2.0 * mu_l)


def n_star(capacity_tokens: float, eps: float, theta: float, p0: float, mu_l: float,
           bound: str = "probabilistic", vbar_: float | None = None) -> int:
    """Eq. 6 and appendix D.5: the largest memory-safe batch size N*.

    N* = ⌊ (C − x) / (μ_L + (1−θ)/(θ p0) · ln(1/(1−θ))) ⌋ with x = v̄·ln(1/ε) ("probabilistic", Eq. 6:
    P(OOM) ≤ ε), x = v̄ ("expected": expected peak) or x = 0 ("static"); v̄ = 1/(p0² μ_L), or ``vbar_`` when
    given (:func:`vbar_moments`, from the measured variances). Never < 0.
    D.5's ordering N* ≤ N*_expected ≤ N*_static holds for ε ≤ 1/e.
    """
    _check("capacity_tokens", capacity_tokens)
    _check("eps", eps, lo_open=True, hi=1.0)
    _check("theta", theta, lo_open=True, hi=1.0 - 1e-15)
    _check("p0", p0, lo_open=True, hi=1.0)
    _check("mu_l", mu_l)
    v = vbar_ if vbar_ is not None else vbar(p0, mu_l) if mu_l > 0 else math.inf
    if bound == "probabilistic":
        margin = v * math.log(1.0 / eps)
    elif bound == "expected":
        margin = v
    elif bound == "static":
        margin = 0.0
    else:
        raise ValueError(f"bound={bound!r}: must be 'probabilistic', 'expected' or 'static'")
    per_request = mu_l + (1.0 - theta) / (theta * p0) * zeta(theta)
    n = (capacity_tokens - margin) / per_request
    return max(0, math.floor(n)) if math.isfinite(n) else 0


# --- the exact fluid optimum (no first-order expansion in eta) ---------------------------------------

_GL_X, _GL_W = np.polynomial.legendre.leggauss(48)  # smooth integrand on [0, T]: 48 nodes are ample


def fluid_decode_time(theta: float, p0: float, eta: float) -> float:
    """Iterations until a fraction θ of a batch has finished, fluid limit of h(t) = p0 + η t:
    p0·T + η T²/2 = ζ(θ), so T = 2ζ/(p0 + √(p0² + 2ηζ)) (the cancellation-free form of
    (−p0 + √(p0² + 2ηζ))/η). inf when a falling hazard (η < 0) never accumulates ζ."""
    z = zeta(theta)
    disc = p0 * p0 + 2.0 * eta * z
    if disc < 0:
        return math.inf
    return 2.0 * z / (p0 + math.sqrt(disc))


def fluid_batch_integral(t_end: float, p0: float, eta: float) -> float:
    """I/N = ∫₀ᵀ exp(−p0 s − η s²/2) ds: request-iterations per slot over a decode phase (Gauss–Legendre)."""
    s = 0.5 * t_end * (_GL_X + 1.0)
    return 0.5 * t_end * float(np.dot(_GL_W, np.exp(-p0 * s - 0.5 * eta * s * s)))


def fluid_cycle_time(theta: float, *, p0: float, eta: float, alpha_p: float, beta_p: float,
                     alpha_d: float, beta_d: float, mu_l: float, n: float) -> float:
    """𝒯(θ) = α_d T(θ) + β_d I(θ) + α_p + β_p N μ_L θ (appendix B.5 with the exact IFR T and I)."""
    t_end = fluid_decode_time(theta, p0, eta)
    if not math.isfinite(t_end):
        return math.inf
    return alpha_d * t_end + beta_d * n * fluid_batch_integral(t_end, p0, eta) + alpha_p + beta_p * n * mu_l * theta


def theta_exact_fluid(p0: float, eta: float, alpha_p: float, beta_p: float, alpha_d: float, beta_d: float,
                      mu_l: float, n: float) -> float:
    """argmax_θ θ/𝒯(θ) under the linear-hazard fluid model, without Eq. 5's first-order expansion.

    A coarse grid finds the basin, a bounded Brent search polishes it. With η = 0 it equals
    ``theta0(p0*alpha_p/alpha_d)`` (the N-proportional terms of 𝒯 drop out of the optimality condition).
    """
    for name, x in (("p0", p0), ("alpha_d", alpha_d)):
        _check(name, x, lo_open=True)
    for name, x in (("alpha_p", alpha_p), ("beta_p", beta_p), ("beta_d", beta_d), ("mu_l", mu_l), ("n", n)):
        _check(name, x)
    if not math.isfinite(eta):
        raise ValueError(f"eta={eta!r}: must be finite")
    hi = 1.0 - 1e-9
    if eta < 0:  # cumulative hazard tops out at p0²/(2|η|): θ beyond 1 − exp(−that) is never reached
        hi = min(hi, -math.expm1(-p0 * p0 / (2.0 * -eta)) * (1.0 - 1e-9))

    def neg_rate(theta: float) -> float:
        return -theta / fluid_cycle_time(theta, p0=p0, eta=eta, alpha_p=alpha_p, beta_p=beta_p,
                                         alpha_d=alpha_d, beta_d=beta_d, mu_l=mu_l, n=n)

    grid = np.concatenate([np.geomspace(1e-7 * hi, 0.05 * hi, 24), np.linspace(0.05 * hi, hi, 40)[1:]])
    vals = [neg_rate(float(t)) for t in grid]
    i = int(np.argmin(vals))
    lo_b, hi_b = float(grid[max(i - 1, 0)]) * (0.5 if i == 0 else 1.0), float(grid[min(i + 1, len(grid) - 1)])
    res = minimize_scalar(neg_rate, bounds=(lo_b, hi_b), method="bounded",
                          options={"xatol": 1e-12 * max(1.0, lo_b / 1e-6)})
    return float(res.x) if res.fun <= vals[i] else float(grid[i])


# --- throughput and the EB / MB crossover ------------------------------------------------------------

def beta_eb_w(*, beta_p: float, beta_d: float, mu_l: float, mu_o: float) -> float:
    """β_EB^w = (β_p μ_L + β_d μ_O)/(μ_L + μ_O): workload-weighted marginal cost of EB (after Eq. 3)."""
    return (beta_p * mu_l + beta_d * mu_o) / (mu_l + mu_o)


def beta_mb_e(r: float, c0: float, c1: float, c2: float) -> float:
    """β_MB^e(r) = c0 + c1 r + c2 r², r = decode share of a mixed batch's tokens (appendix A.4)."""
    return c0 + c1 * r + c2 * r * r


def tp_eb(*, theta: float, n: float, alpha_p: float, beta_p: float, alpha_d: float, beta_d: float,
          mu_l: float, mu_o: float) -> float:
    """Eq. 4 (at any θ, k = θN): requests/s of saturated EB,
    [ (α_p + α_d ζ μ_O)/k + β_EB^w (μ_L + μ_O) ]⁻¹."""
    k = theta * n
    inv = (alpha_p + alpha_d * zeta(theta) * mu_o) / k + \
        beta_eb_w(beta_p=beta_p, beta_d=beta_d, mu_l=mu_l, mu_o=mu_o) * (mu_l + mu_o)
    return 1.0 / inv


def tp_mb(*, n: float, alpha_mb: float, beta_mb: float, mu_l: float, mu_o: float) -> float:
    """Saturated MB throughput (requests/s): [ α_MB (1 + μ_O)/N + β_MB^e (μ_L + μ_O) ]⁻¹ (before Eq. 7)."""
    return 1.0 / (alpha_mb * (1.0 + mu_o) / n + beta_mb * (mu_l + mu_o))


def eb_criterion(*, theta: float, n: float, alpha_p: float, beta_p: float, alpha_d: float, beta_d: float,
                 alpha_mb: float, beta_mb: float, mu_l: float, mu_o: float) -> tuple[float, float]:
    """Both sides of Eq. 7 / Eq. 8 (δ excluded): (β_MB^e − β_EB^w, [(α_p + α_d ζ μ_O)/θ − α_MB(1+μ_O)]
    / (N(μ_L+μ_O))). EB has the higher throughput exactly when lhs > rhs. Online (Eq. 8) N is N_obs."""
    lhs = beta_mb - beta_eb_w(beta_p=beta_p, beta_d=beta_d, mu_l=mu_l, mu_o=mu_o)
    rhs = ((alpha_p + alpha_d * zeta(theta) * mu_o) / theta - alpha_mb * (1.0 + mu_o)) / (n * (mu_l + mu_o))
    return lhs, rhs


def prefers_eb(*, theta: float, n: float, alpha_p: float, beta_p: float, alpha_d: float, beta_d: float,
               alpha_mb: float, beta_mb: float, mu_l: float, mu_o: float, delta: float = 0.0) -> bool:
    """Eq. 8: run EB iff β̂_MB^e(r̂) − β_EB^w > [(α_p + α_d ζ μ_O)/θ − α_MB(1+μ_O)]/(N(μ_L+μ_O)) + δ.
    δ > 0 favours MB (latency), δ < 0 favours EB (throughput); with δ = 0 it is Eq. 7."""
    lhs, rhs = eb_criterion(theta=theta, n=n, alpha_p=alpha_p, beta_p=beta_p, alpha_d=alpha_d,
                            beta_d=beta_d, alpha_mb=alpha_mb, beta_mb=beta_mb, mu_l=mu_l, mu_o=mu_o)
    return lhs > rhs + delta


def kv_reserve_fraction(*, n: float, mu_o: float, block_size: int, total_blocks: int, s_kv: float = 0.5,
                        f0: float = 0.0, lo: float = 0.05, hi: float = 0.6) -> float:
    """Eq. 23: f_KV = min(hi, max(lo, N μ_O s_KV / (b · total_blocks) + f0)); refill only when
    free_blocks ≥ f_KV · total_blocks."""
    if total_blocks <= 0 or block_size <= 0:
        return hi
    f = n * mu_o * s_kv / (block_size * total_blocks) + f0
    return min(hi, max(lo, f)) if math.isfinite(f) else hi
