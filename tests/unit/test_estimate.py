"""Estimators against known generating processes, an independent dense hazard fit, garbage and real traces.

Tolerances come from the sandwich standard error of the weighted least squares (computed from the
sample's own at-risk counts and the true hazard), so a seeded test fails only on a real bias.
"""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ebctl.estimate import Ema, HazardFit, LengthWindow, fit_hazard

# the copies shipped in the package (ebctl/data/traces, with their attribution in ebctl/data/traces/README.md)
TRACES = Path(__file__).resolve().parents[2] / "ebctl" / "data" / "traces"


def _dense(o, t95):
    """The paper's definition, literally: ĥ(t) on every integer t ∈ [1, t95] via bincount."""
    o = np.asarray(o, dtype=np.int64)
    cnt = np.bincount(np.minimum(o, t95 + 1), minlength=t95 + 2)
    at_risk = cnt[::-1].cumsum()[::-1]  # at_risk[t] = #{O ≥ t}
    t = np.arange(1, t95 + 1, dtype=np.float64)
    w = at_risk[1 : t95 + 1].astype(np.float64)
    return t, w, cnt[1 : t95 + 1] / w


def _dense_fit(o, t95):
    t, w, h = _dense(o, t95)
    sw = np.sqrt(w)
    (p0, eta), *_ = np.linalg.lstsq(np.column_stack([sw, sw * t]), sw * h, rcond=None)
    res = h - p0 - eta * t
    r2 = 1 - (w @ res**2) / (w @ (h - (w @ h) / w.sum()) ** 2)
    return p0, eta, r2


def _se(o, t95, hazard):
    """Sandwich SE of (p0, eta): Var ĥ(t) = h(1-h)/#{O ≥ t} under the true hazard."""
    t, w, _ = _dense(o, t95)
    h = hazard(t)
    x = np.column_stack([np.ones_like(t), t])
    a = np.linalg.inv(x.T @ (w[:, None] * x))
    b = x.T @ ((w * h * (1 - h))[:, None] * x)
    return np.sqrt(np.diag(a @ b @ a))


def _linear_hazard_sample(p0, eta, size, rng):
    """O with h(t) = min(p0 + eta·t, 1) exactly, by inversion of S(t) = Π_{s≤t} (1 - h(s))."""
    t = np.arange(1, 200_000)
    cdf = 1 - np.cumprod(1 - np.minimum(p0 + eta * t, 1.0))
    return np.searchsorted(cdf, rng.random(size)) + 1


# ---- fit_hazard on known hazards


@pytest.mark.parametrize("p", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("w", [2_000, 20_000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_geometric_recovers_constant_hazard(p, w, seed):
    o = np.random.default_rng(seed).geometric(p, w)
    f = fit_hazard(o)
    se0, se1 = _se(o, f.t95, lambda t: np.full_like(t, p))
    assert f.ok and f.reason == "ok" and f.n == w
    assert se0 / p < 0.04  # the tolerance below is not vacuous
    assert abs(f.p0 - p) <= 4 * se0
    assert abs(f.eta) <= 4 * se1
    if w == 20_000:
        assert abs(f.p0 - p) / p < 0.05
        assert abs(f.eta) * f.t95 < 0.15 * p  # no spurious IFR/DFR over the fitted range


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_hazard_recovers_p0_and_eta(seed):
    p0, eta = 0.005, 2e-5
    o = _linear_hazard_sample(p0, eta, 20_000, np.random.default_rng(seed))
    f = fit_hazard(o)
    se0, se1 = _se(o, f.t95, lambda t: p0 + eta * t)
    assert f.ok and f.eta > 0
    assert se0 / p0 < 0.1 and se1 / eta < 0.1
    assert abs(f.p0 - p0) <= 4 * se0
    assert abs(f.eta - eta) <= 4 * se1
    assert f.r2 > 0.5


@pytest.mark.parametrize(
    "make",
    [
        lambda r: np.where(r.random(20_000) < 0.5, r.geometric(0.2, 20_000), r.geometric(0.01, 20_000)),
        lambda r: np.floor(r.random(20_000) ** (-1 / 1.5)).astype(int),  # discrete Pareto: h ≈ 1.5/t
    ],
    ids=["geometric-mixture", "pareto"],
)
def test_falling_hazard_gives_negative_eta(make):
    f = fit_hazard(make(np.random.default_rng(7)))
    assert f.ok and f.eta < 0 and f.p0 > 0


@pytest.mark.parametrize("seed", range(6))
def test_sparse_sums_equal_the_dense_definition(seed):
    rng = np.random.default_rng(seed)
    o = [rng.geometric(0.03, 3000), _linear_hazard_sample(0.01, 1e-4, 3000, rng),
         rng.integers(1, 40, 500), rng.geometric(0.5, 50)][seed % 4]
    f = fit_hazard(o)
    assert f.t95 == int(np.quantile(o, 0.95, method="inverted_cdf"))
    p0, eta, r2 = _dense_fit(o, f.t95)
    assert f.ok and f.reason == "ok"
    assert f.p0 == pytest.approx(p0, rel=1e-9, abs=1e-12)
    assert f.eta == pytest.approx(eta, rel=1e-9, abs=1e-12)
    assert f.r2 == pytest.approx(r2, rel=1e-7, abs=1e-9)
    assert f.mu_o == pytest.approx(o.mean()) and f.sigma_o == pytest.approx(o.std())


def test_discrete_correction_reports_the_continuous_rate():
    o = np.random.default_rng(3).geometric(0.2, 20_000)
    plain, corr = fit_hazard(o), fit_hazard(o, discrete_correction=True)
    assert corr.p0 == pytest.approx(-math.log1p(-plain.p0)) and corr.p0 > plain.p0
    assert corr.eta == plain.eta
    assert corr.p0 == pytest.approx(-math.log(0.8), rel=0.05)


def test_line_crossing_zero_is_clipped_to_a_positive_p0():
    o = np.random.default_rng(0).integers(200, 301, 5000)  # ĥ = 0 until 200: strong IFR
    t95 = int(np.quantile(o, 0.95, method="inverted_cdf"))
    assert _dense_fit(o, t95)[0] < 0  # the raw line does cross zero
    f = fit_hazard(o)
    assert f.ok and f.reason == "p0<=0 clipped"
    assert f.p0 == pytest.approx(1 / o.mean()) and f.eta > 0  # first tenth has no completions


# ---- fit_hazard on garbage


def test_garbage_is_dropped_before_fitting():
    clean = np.random.default_rng(1).geometric(0.05, 2000)
    dirty = np.concatenate([clean, [np.nan, np.inf, -np.inf, -3, 0, 2.5, 1e300]]).astype(object)
    dirty = np.concatenate([dirty, [None, "7", 10**40, True]])
    assert fit_hazard(dirty) == fit_hazard(clean)
    assert fit_hazard(np.concatenate([clean, [np.nan, -1.0, 0.0]])) == fit_hazard(clean)


def test_empty_and_degenerate_samples_fall_back():
    for empty in ([], np.array([]), [0, -1, np.nan], ["a"], [[1, 2], [3]]):
        f = fit_hazard(empty)
        assert isinstance(f, HazardFit) and math.isnan(f.r2)
        assert (f.ok, f.p0, f.eta, f.n, f.t95, f.mu_o, f.sigma_o, f.reason) == (
            False, 0.0, 0.0, 0, 0, 0.0, 0.0, "empty")
    one = fit_hazard([7])
    assert not one.ok and one.p0 == pytest.approx(1 / 7) and one.eta == 0.0 and one.n == 1
    const = fit_hazard([50] * 100)
    assert not const.ok and const.p0 == pytest.approx(0.02) and const.eta == 0.0
    assert "distinct" in const.reason
    two = fit_hazard([1, 1, 1, 1, 5] * 10, quantile=1.0)
    assert not two.ok and two.p0 == pytest.approx(1 / 1.8)
    assert fit_hazard([1, 1, 1, 1, 5] * 10, quantile=1.0, min_points=2).ok
    ones = fit_hazard([1] * 10, discrete_correction=True)  # 1/mean = 1: the log must stay finite
    assert not ones.ok and math.isfinite(ones.p0) and ones.p0 > 20


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.integers(), st.integers(-5, 60), st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from([10**400, -(10**30), 2**63, 2**64, 2**40, 2**40 + 1, 1])),
             max_size=200),
    st.booleans(),
    st.floats(0.0, 1.0),
)
def test_fit_hazard_never_raises_and_stays_finite(values, correct, q):
    f = fit_hazard(np.array(values, dtype=object), discrete_correction=correct, quantile=q)
    g = fit_hazard(values, discrete_correction=correct, quantile=q)
    for r in (f, g):
        assert math.isfinite(r.p0) and r.p0 >= 0 and math.isfinite(r.eta)
        assert math.isfinite(r.mu_o) and math.isfinite(r.sigma_o)
        assert not r.ok or (r.p0 > 0 and 0 <= r.r2 <= 1)
        assert r.ok or r.eta == 0.0


# ---- real traces (docs/controller.md's table: whole trace as the window)


def _trace(name, column):
    with open(TRACES / name, newline="") as fh:
        return np.array([int(row[column]) for row in csv.DictReader(fh)])


@pytest.mark.parametrize(
    ("name", "column"),
    [("azure2023_conv.csv", "GeneratedTokens"), ("azure2023_code.csv", "GeneratedTokens"),
     ("mooncake_conversation.csv", "output_tokens")],
)
def test_real_traces_fit_as_the_dense_weighted_least_squares(name, column):
    """On the shipped traces, the closed-form sums equal the dense fit the docstring defines, computed here
    with numpy: ĥ(t) = #{O = t}/#{O ≥ t} at every integer t in [1, t95] (t95: numpy's inverted-CDF 95th
    percentile), a line by weighted least squares, weights #{O ≥ t} (np.polyfit weighs residuals by √w)."""
    o = _trace(name, column)
    o = o[o >= 1]
    t95 = int(np.quantile(o, 0.95, method="inverted_cdf"))
    t = np.arange(1, t95 + 1)
    counts = np.bincount(o, minlength=t95 + 1)[1:t95 + 1].astype(float)
    at_risk = np.array([np.count_nonzero(o >= x) for x in t], dtype=float)
    eta, p0 = np.polyfit(t, counts / at_risk, 1, w=np.sqrt(at_risk))
    f = fit_hazard(o)
    assert f.ok and f.t95 == t95
    assert f.p0 == pytest.approx(p0, rel=1e-6) and f.eta == pytest.approx(eta, rel=1e-6)


# ---- LengthWindow


def test_window_keeps_the_newest_in_order():
    w = LengthWindow(3)
    assert len(w) == 0 and w.outputs().size == 0
    for k in range(1, 6):
        assert w.append(10 * k, k)
    assert len(w) == 3 and w.total_appended == 5
    assert w.outputs().tolist() == [3, 4, 5] and w.inputs().tolist() == [30, 40, 50]
    assert w.outputs().dtype == np.int64
    w.outputs()[:] = 0  # a copy: the ring is untouched
    assert w.outputs().tolist() == [3, 4, 5]


def test_window_rejects_garbage():
    w = LengthWindow(10)
    assert w.append(0, 1) and w.append(np.int32(5), 2.0)  # zero input and integral floats are fine
    for i, o in [(1, 0), (1, -2), (-1, 3), (1, math.nan), (math.inf, 3), (1, 2.5), (None, 3), ("4", 3),
                 (1, True), (10**30, 3), (1, 2**41)]:
        assert not w.append(i, o), (i, o)
    assert w.outputs().tolist() == [1, 2] and w.total_appended == 2


def test_window_extend_resize_clear():
    w = LengthWindow(4)
    assert w.extend([1, 2, -1, 3], [5, 6, 7, 0]) == 2
    assert w.extend(range(10, 17), range(20, 27)) == 7
    assert w.inputs().tolist() == [13, 14, 15, 16] and w.outputs().tolist() == [23, 24, 25, 26]
    w.append(99, 98)
    assert w.outputs().tolist() == [24, 25, 26, 98]
    w.resize(2)
    assert w.capacity == 2 and w.outputs().tolist() == [26, 98]
    w.resize(5)
    w.append(1, 1)
    assert w.outputs().tolist() == [26, 98, 1] and w.inputs().tolist() == [16, 99, 1]
    assert w.total_appended == 11
    w.clear()
    assert len(w) == 0 and w.total_appended == 11
    with pytest.raises(ValueError):
        w.extend([1, 2], [3])
    with pytest.raises(ValueError):
        LengthWindow(0)


def test_window_agrees_with_a_deque():
    from collections import deque

    rng = np.random.default_rng(5)
    w, ref = LengthWindow(37), deque(maxlen=37)
    for _ in range(500):
        i, o = int(rng.integers(0, 100)), int(rng.integers(1, 100))
        if rng.random() < 0.1:
            w.extend([i, i], [o, o])
            ref.extend([(i, o), (i, o)])
        else:
            w.append(i, o)
            ref.append((i, o))
    assert w.inputs().tolist() == [a for a, _ in ref] and w.outputs().tolist() == [b for _, b in ref]


# ---- Ema


def test_ema_converges_and_ignores_garbage():
    e = Ema(0.1)
    assert math.isnan(e.value)
    assert e.update(math.nan) != e.update(math.nan)  # still NaN: nothing valid yet
    assert e.update(10.0) == 10.0  # the first valid sample initialises
    for _ in range(200):
        e.update(50.0)
        e.update(math.nan)
        e.update(-1.0)
        e.update(math.inf)
        e.update(None)
    assert e.value == pytest.approx(50.0, rel=1e-6)
    assert Ema(0.5).update(4.0) == 4.0
    e2 = Ema(0.5)
    e2.update(0.0)
    assert e2.update(4.0) == 2.0
    e.reset()
    assert math.isnan(e.value)
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            Ema(bad)


def test_eta_standard_error_is_calibrated():
    """Under a geometric null (η = 0) η̂/se is about N(0, 1); under a real IFR it is large."""
    rng = np.random.default_rng(11)
    z = np.array([(lambda f: f.eta / f.eta_se)(fit_hazard(rng.geometric(0.02, 500))) for _ in range(300)])
    assert 0.85 < z.std() < 1.15
    assert 0.02 < np.mean(np.abs(z) > 2) < 0.09
    t = np.arange(1, 5000)
    surv = np.concatenate([[1.0], np.cumprod(1 - np.minimum(0.004 + 4e-6 * t, 1.0))])
    f = fit_hazard(np.searchsorted(-surv, -rng.random(4000)))
    assert f.eta / f.eta_se > 4


def test_recent_rate_is_the_tokens_finished_over_the_last_horizon():
    from ebctl.estimate import RecentRate

    r = RecentRate(10.0)
    assert math.isnan(r.value)
    for t in range(30):  # 5 tokens a second for 30 s, then 20 a second for 5 s
        r.add(float(t), 5)
    # the span held: 19 .. 29 s; the 10 reports after its first carry 50 tokens
    assert r.value == pytest.approx(50 / 10)
    for t in range(30, 35):
        r.add(float(t), 20)
    # 24 .. 34 s: reports 25-29 carry 25 tokens, 30-34 carry 100
    assert r.value == pytest.approx(125 / 10)
    r.add(33.0, 1000)  # a clock that went back is skipped
    assert r.value == pytest.approx(125 / 10)
