"""Closed forms against independent computations (numeric optima, direct throughput comparison)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from ebctl import model

H200 = dict(alpha_p=0.0012785933, beta_p=2.48525518e-05, alpha_d=0.0089211816, beta_d=4.5864675e-05)


def _numeric_cfr_optimum(p0, alpha_p, alpha_d):
    """argmax θ/𝒯(θ) with 𝒯 = α_d ζ(θ)/p0 + α_p (the N-linear terms of appendix B.5 do not move the
    optimum), by bounded minimisation over log θ: an independent route from Eq. 3's root."""

    def neg(u):
        th = math.exp(u)
        return -th / (alpha_d * -math.log1p(-th) / p0 + alpha_p)

    res = minimize_scalar(neg, bounds=(math.log(1e-9), math.log(1 - 1e-12)), method="bounded",
                          options={"xatol": 1e-12})
    return math.exp(res.x)


@pytest.mark.parametrize("gamma", np.geomspace(1e-6, 10, 36))
def test_theta0_is_the_numeric_optimum_of_cfr_throughput(gamma):
    alpha_p, alpha_d = 0.002, 0.01
    p0 = gamma * alpha_d / alpha_p
    t = model.theta0(gamma)
    assert 0 < t < 1
    assert t == pytest.approx(_numeric_cfr_optimum(p0, alpha_p, alpha_d), rel=1e-6)


def test_theta0_small_gamma_asymptote_and_errors():
    assert model.theta0(1e-10) == pytest.approx(math.sqrt(2e-10), rel=1e-4)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="gamma"):
            model.theta0(bad)


@given(st.floats(1e-9, 1e3), st.floats(1.0001, 10))
def test_theta0_increasing_in_gamma(g, factor):
    assert model.theta0(g * factor) > model.theta0(g)


@pytest.mark.parametrize("p0,costs,mu_l,n", [
    (0.003, H200, 512, 256),
    (0.01, dict(alpha_p=0.0047, beta_p=5e-5, alpha_d=0.0104, beta_d=1.04e-4), 128, 64),
    (0.02, dict(alpha_p=0.01, beta_p=0.0, alpha_d=0.01, beta_d=0.0), 100, 100),
])
def test_delta_theta_is_the_slope_of_the_exact_fluid_optimum(p0, costs, mu_l, n):
    """Eq. 5 is dθ*/dη at η = 0: compare with a central finite difference of the numeric optimum."""
    t0 = model.theta0(p0 * costs["alpha_p"] / costs["alpha_d"])
    eta = 3e-4 * p0 * p0
    args = dict(beta_p=costs["beta_p"], alpha_p=costs["alpha_p"], alpha_d=costs["alpha_d"],
                beta_d=costs["beta_d"], mu_l=mu_l, n=n)
    fd = (model.theta_exact_fluid(p0, eta, **args) - model.theta_exact_fluid(p0, -eta, **args)) / (2 * eta)
    dt = model.delta_theta(t0, p0, eta, costs["alpha_d"], costs["beta_d"], n)
    assert dt > 0
    assert dt / eta == pytest.approx(fd, rel=2e-3)


@given(st.floats(1e-4, 0.2), st.floats(1e-9, 1e-2), st.floats(0.01, 0.95), st.floats(0, 4096))
def test_delta_theta_positive_for_ifr(p0, eta, t0, n):
    assert model.delta_theta(t0, p0, eta, 0.01, 5e-5, n) > 0


def test_exact_fluid_equals_theta0_without_eta():
    for p0 in (1e-3, 3e-3, 0.03, 0.2):
        got = model.theta_exact_fluid(p0, 0.0, mu_l=700, n=512, **H200)
        assert got == pytest.approx(model.theta0(p0 * H200["alpha_p"] / H200["alpha_d"]), rel=1e-6)


def test_exact_fluid_integral_against_quadrature():
    from scipy.integrate import quad
    for p0, eta in ((0.003, 1e-5), (0.05, -3.5e-4), (0.01, 0.0)):
        t_end = model.fluid_decode_time(0.3, p0, eta)
        # the stopping time really is where the fluid survival reaches 1 − θ
        assert math.exp(-p0 * t_end - eta * t_end ** 2 / 2) == pytest.approx(0.7, rel=1e-12)
        ref, _ = quad(lambda s, p0=p0, eta=eta: math.exp(-p0 * s - eta * s * s / 2), 0, t_end,
                      epsabs=0, epsrel=1e-12)
        assert model.fluid_batch_integral(t_end, p0, eta) == pytest.approx(ref, rel=1e-10)


def test_exact_fluid_falling_hazard_stays_feasible():
    th = model.theta_exact_fluid(0.05, -3.5e-4, mu_l=2048, n=256, **H200)
    cap = -math.expm1(-0.05 ** 2 / (2 * 3.5e-4))
    assert 0 < th < cap


def test_n_star_hand_computed():
    # C = 1e5, ε = 0.01, θ = 0.1, p0 = 0.01, μ_L = 100: v̄ = 100, per request = 100 + 900·ln(1/0.9)
    # = 194.8244644; probabilistic (1e5 − 460.5170186)/194.82 = 510.9; expected 512.8; static 513.3.
    assert model.n_star(1e5, 0.01, 0.1, 0.01, 100) == 510
    assert model.n_star(1e5, 0.01, 0.1, 0.01, 100, bound="expected") == 512
    assert model.n_star(1e5, 0.01, 0.1, 0.01, 100, bound="static") == 513
    assert model.n_star(100.0, 0.01, 0.1, 0.01, 100) == 0  # the margin eats the cache: never negative
    with pytest.raises(ValueError, match="bound"):
        model.n_star(1e5, 0.01, 0.1, 0.01, 100, bound="nope")
    with pytest.raises(ValueError, match="eps"):
        model.n_star(1e5, 0.0, 0.1, 0.01, 100)


def test_vbar_from_moments_hand_computed_and_the_papers_for_geometric_outputs():
    # μ_L = 20, σ_L² = 36, μ_O = 50, σ_O² = 10: (36 + 10 + 10·1.4²)/40 = 65.6/40 = 1.64
    assert model.vbar_moments(20.0, 36.0, 50.0, 10.0) == pytest.approx(1.64)
    # geometric outputs (σ_O² = (1−p)/p²) and μ_L ≪ μ_O: D.4's 1/(p²μ_L)
    p = 1e-4
    assert model.vbar_moments(1.0, 0.0, 1 / p, (1 - p) / p**2) == pytest.approx(model.vbar(p, 1.0), rel=1e-3)
    assert model.vbar_moments(0.0, 0.0, 100.0, 1.0) == math.inf
    # Eq. 6 with it: C = 1e5, ε = 0.01, θ = 0.1, p0 = 0.01, μ_L = 100, v̄ = 10 instead of 100:
    # (1e5 − 46.05170186)/194.8244644 = 513.04
    assert model.n_star(1e5, 0.01, 0.1, 0.01, 100, vbar_=10.0) == 513


def _walk_vbar(draw_o, n=64, blocks=400, block=10_000, seed=0):
    """v/(2|d|) of D.4 measured on the memory walk itself: n slots each serving requests back to back (inputs
    uniform 10..30, outputs ``draw_o``); per step every slot adds a token and a completion releases L + O; the
    drift d and the long-run variance rate v are taken over blocks of ``block`` steps."""
    rng = np.random.default_rng(seed)
    steps = blocks * block
    sums = np.full(blocks, float(n * block))
    for _ in range(n):
        o = draw_o(rng, steps // 20 + 100)
        lengths = rng.integers(10, 31, len(o)).astype(float)
        done = np.cumsum(o) - rng.uniform(0, o[0])  # a stationary start: the clock starts within a request
        keep = (done > 0) & (done <= steps)
        sums -= np.bincount((done[keep] // block).astype(int), weights=(lengths + o)[keep], minlength=blocks)[:blocks]
    return sums.var() / block / (2 * abs(sums.mean() / block))


@pytest.mark.parametrize("name, draw_o", [
    ("geometric", lambda r, m: r.geometric(0.02, m).astype(float)),
    ("near-fixed", lambda r, m: r.integers(45, 56, m).astype(float)),
    ("heavy-tailed", lambda r, m: np.maximum(np.round(r.gamma(0.5, 100.0, m)), 1.0)),
])
def test_vbar_from_moments_is_conservative_against_a_simulated_memory_walk(name, draw_o):
    """D.3 treats a completion's size as independent of how many complete; on a real walk they are not (a
    slot's released output tokens over a span are the span less the ages at its ends), so the walk's own
    variance rate is lower. The margin from the measured moments must stay at or above it (D.4 means it to be
    conservative), and for near-fixed outputs it must be far below the geometric formula's."""
    x = draw_o(np.random.default_rng(9), 10**6)
    formula = model.vbar_moments(20.0, (21**2 - 1) / 12, float(x.mean()), float(x.var()))
    assert _walk_vbar(draw_o) <= formula
    if name == "near-fixed":
        assert formula < 0.05 * model.vbar(1 / float(x.mean()), 20.0)


@given(c=st.floats(1e4, 1e7), eps=st.floats(1e-6, 0.5), f=st.floats(0.01, 0.99), theta=st.floats(0.01, 0.9),
       p0=st.floats(1e-3, 0.2), mu_l=st.floats(16, 8192))
def test_n_star_monotone(c, eps, f, theta, p0, mu_l):
    ns = model.n_star
    assert ns(c, eps * f, theta, p0, mu_l) <= ns(c, eps, theta, p0, mu_l)  # stricter ε, smaller N
    assert ns(c * 1.5, eps, theta, p0, mu_l) >= ns(c, eps, theta, p0, mu_l)
    assert ns(c, eps, theta, p0, mu_l, "expected") <= ns(c, eps, theta, p0, mu_l, "static")
    if eps <= math.exp(-1):  # D.5's ordering N* ≤ N*_expected needs ln(1/ε) ≥ 1
        assert ns(c, eps, theta, p0, mu_l) <= ns(c, eps, theta, p0, mu_l, "expected")
    assert ns(c, eps, theta, p0, mu_l * 1.5, "static") <= ns(c, eps, theta, p0, mu_l, "static")
    # With the margin small against C (the regime Eq. 6 is meant for), longer inputs mean fewer slots.
    margin = model.vbar(p0, mu_l) * math.log(1 / eps)
    assume(margin < 0.01 * c)
    assert ns(c, eps, theta, p0, mu_l * 1.5) <= ns(c, eps, theta, p0, mu_l)


params = st.fixed_dictionaries(dict(
    theta=st.floats(0.005, 0.9), n=st.floats(8, 4096), alpha_p=st.floats(1e-4, 0.05),
    beta_p=st.floats(1e-6, 2e-4), alpha_d=st.floats(1e-3, 0.05), beta_d=st.floats(1e-6, 3e-4),
    alpha_mb=st.floats(0, 0.05), beta_mb=st.floats(1e-6, 3e-4), mu_l=st.floats(1, 16000),
    mu_o=st.floats(1, 4000)))


@settings(max_examples=300)
@given(params)
def test_eq7_agrees_with_direct_throughput_comparison(p):
    eb = model.tp_eb(theta=p["theta"], n=p["n"], alpha_p=p["alpha_p"], beta_p=p["beta_p"],
                     alpha_d=p["alpha_d"], beta_d=p["beta_d"], mu_l=p["mu_l"], mu_o=p["mu_o"])
    mb = model.tp_mb(n=p["n"], alpha_mb=p["alpha_mb"], beta_mb=p["beta_mb"], mu_l=p["mu_l"], mu_o=p["mu_o"])
    assume(abs(eb - mb) > 1e-9 * max(eb, mb))  # not a tie
    assert model.prefers_eb(**p) == (eb > mb)


def test_tp_eb_is_the_cycle_throughput():
    """Eq. 4 against the cycle it summarises: k requests per (prefill + fluid decode phase)."""
    p0, theta, n, mu_l = 0.004, 0.2, 400, 300
    k = theta * n
    cycle = H200["alpha_p"] + H200["beta_p"] * k * mu_l + (H200["alpha_d"] * model.zeta(theta)
                                                          + H200["beta_d"] * n * theta) / p0
    assert model.tp_eb(theta=theta, n=n, mu_l=mu_l, mu_o=1 / p0, **H200) == pytest.approx(k / cycle, rel=1e-12)


def test_prefers_eb_delta_direction():
    """Eq. 8 worked by hand at θ = 0.05, N = 512, μ_L = μ_O = 512, α_MB = 0:
    lhs = β_MB − β_EB^w = 5.5e-5 − (2.5e-5·512 + 4.6e-5·512)/1024 = 5.5e-5 − 3.55e-5 = 1.95e-5;
    rhs = (α_p + α_d·ζ·μ_O)/θ / (N(μ_L + μ_O)), ζ = −ln 0.95 = 0.0512933: α_d·ζ·μ_O = 9e-3·0.0512933·512 = 0.2363595,
    + α_p = 0.2373595, / θ = 4.747190, / (512·1024 = 524,288) = 9.0545e-6. lhs − rhs = 1.0445e-5: EB for any δ below
    that, MB above it. With β_MB = 4.0e-5, lhs = 4.5e-6 < rhs: MB at δ = 0, and δ = −5e-6 (favouring EB) flips it."""
    p = dict(theta=0.05, n=512, alpha_p=1e-3, beta_p=2.5e-5, alpha_d=9e-3, beta_d=4.6e-5, alpha_mb=0.0,
             mu_l=512, mu_o=512)
    assert model.eb_criterion(beta_mb=5.5e-5, **p) == pytest.approx((1.95e-5, 9.0545e-6), rel=1e-4)
    assert model.prefers_eb(beta_mb=5.5e-5, **p)  # δ = 0: Eq. 7
    assert model.prefers_eb(beta_mb=5.5e-5, delta=1.0e-5, **p)
    assert not model.prefers_eb(beta_mb=5.5e-5, delta=1.1e-5, **p)
    assert not model.prefers_eb(beta_mb=4.0e-5, **p)
    assert model.prefers_eb(beta_mb=4.0e-5, delta=-5e-6, **p)


def test_kv_reserve_fraction_eq23():
    """Eq. 23 by hand: 256 requests that each still write on average s_KV·μ_O = 0.5·200 tokens need 25,600 tokens,
    1,600 blocks of 16, which is 0.16 of 10,000 blocks; f0 adds to that; whole outputs (s_KV = 1) need twice as
    much; the same tokens in blocks of 32 are 800 blocks, 0.08. Then the clip [0.05, 0.6] and its directions."""
    f = model.kv_reserve_fraction
    assert f(n=256, mu_o=200, block_size=16, total_blocks=10000) == pytest.approx(0.16)
    assert f(n=256, mu_o=200, block_size=16, total_blocks=10000, f0=0.1) == pytest.approx(0.26)
    assert f(n=256, mu_o=200, block_size=16, total_blocks=10000, s_kv=1.0) == pytest.approx(0.32)
    assert f(n=256, mu_o=200, block_size=32, total_blocks=10000) == pytest.approx(0.08)
    assert f(n=1, mu_o=1, block_size=16, total_blocks=10000) == 0.05
    assert f(n=1e6, mu_o=1e3, block_size=16, total_blocks=10) == 0.6
    assert f(n=10, mu_o=10, block_size=16, total_blocks=0) == 0.6
    # more requests or longer outputs never reserve less; a larger cache never reserves a larger share
    grid = [(n, mu_o, blocks) for n in (1, 64, 256, 4096) for mu_o in (1.0, 50.0, 200.0, 2000.0)
            for blocks in (100, 10000, 10**6)]
    for n, mu_o, blocks in grid:
        here = f(n=n, mu_o=mu_o, block_size=16, total_blocks=blocks)
        assert 0.05 <= here <= 0.6
        assert f(n=2 * n, mu_o=mu_o, block_size=16, total_blocks=blocks) >= here
        assert f(n=n, mu_o=2 * mu_o, block_size=16, total_blocks=blocks) >= here
        assert f(n=n, mu_o=mu_o, block_size=16, total_blocks=2 * blocks) <= here
