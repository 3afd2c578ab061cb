"""The iteration-cost model, its fit and THE quality test (costmodel.judge), and the map to the paper's α/β.

Expected values come from the parameters the data were simulated with, from hand-worked arithmetic, or from
summing the model iteration by iteration (the cycle check of paper_costs); never from the fit itself.
"""

import math

import msgspec
import numpy as np
import pytest

from ebctl.costmodel import (
    FEATURES,
    IterationCosts,
    PhaseCost,
    Shape,
    _Relative,
    fit_phase,
    judge,
    paper_costs,
    report_features,
    shape,
)
from ebctl.protocol import BatchKind, IterationReport

P, D, M = BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED
COL = {f: i for i, f in enumerate(FEATURES)}


def rows(n, **cols):
    """An (n, 5) feature matrix with the given columns set (the others 0)."""
    x = np.zeros((n, len(FEATURES)))
    for name, v in cols.items():
        x[:, COL[name]] = v
    return x


def decode_data(rng, n=1500, noise=0.02):
    """Decode steps of a known PhaseCost: batch 1-256, context 100-2,000 per request, 10% after a switch."""
    truth = PhaseCost(intercept_s=8e-3, decode_req_s=4e-5, decode_ctx_token_s=2e-8, switched_s=3e-3)
    reqs = rng.integers(1, 257, n).astype(float)
    x = rows(n, decode_reqs=reqs, decode_ctx_tokens=reqs * rng.integers(100, 2001, n),
             switched=rng.random(n) < 0.1)
    y = truth.predict_rows(x) * rng.lognormal(0.0, noise, n)
    return truth, x, y


def r2(pred, y):
    return 1.0 - float(np.sum((y - pred) ** 2)) / float(np.sum((y - y.mean()) ** 2))


# ---- judge: hand-worked -------------------------------------------------------------------------------

def test_judge_hand_worked_pass():
    # relative errors 0.1, 0, 0, 0.2 → median 0.05; the mean 3 gives 2, 0.5, 0.25, 0.4 → median 0.45
    q = judge(np.array([1.1, 2.0, 4.0, 4.0]), np.array([1.0, 2.0, 4.0, 5.0]), 3.0)
    assert q.ok and q.median_rel_err == pytest.approx(0.05) and q.mean_rel_err == pytest.approx(0.45)
    assert q.n_test == 4 and "5.0%" in q.reason


def test_judge_fails_above_the_threshold_and_above_the_mean():
    q = judge(np.array([1.3, 2.6, 5.2]), np.array([1.0, 2.0, 4.0]), 100.0)  # 30% everywhere
    assert not q.ok and q.median_rel_err == pytest.approx(0.3) and "> 20%" in q.reason
    assert judge(np.array([1.3]), np.array([1.0]), 100.0, max_rel_err=0.35).ok  # the threshold is a parameter
    # 10% off a constant that the mean predicts exactly: under the threshold, but worse than the mean
    q = judge(np.full(5, 1.1), np.ones(5), 1.0)
    assert not q.ok and q.mean_rel_err == 0.0 and "above the mean" in q.reason
    # within 10% of the mean's error is a tie (a flat cost's constant fit IS a mean); 15% against 10% is not
    assert judge(np.full(3, 1.017), np.ones(3), 1.016).ok
    assert not judge(np.full(3, 1.15), np.ones(3), 1.10).ok


def test_judge_ignores_unusable_iterations_and_says_when_none_are_left():
    q = judge(np.array([1.0, 2.0, math.nan, 1.0, 1.0]), np.array([1.0, 2.0, 1.0, 0.0, -1.0]), 5.0)
    assert q.n_test == 2 and q.median_rel_err == 0.0
    q = judge(np.array([1.0]), np.array([math.nan]), 1.0)
    assert not q.ok and q.n_test == 0 and q.reason == "no held-out iterations"
    q = judge(np.array([1.0]), np.array([1.0]), math.nan)  # a perfect prediction, but no mean to beat
    assert not q.ok and q.median_rel_err == 0.0 and "no mean" in q.reason


# ---- fit_phase ----------------------------------------------------------------------------------------

def test_fit_recovers_known_decode_costs():
    truth, x, y = decode_data(np.random.default_rng(0))
    f = fit_phase(x, y, D)
    assert f.quality.ok and f.n == 1500 and f.quality.n_test == 300
    assert set(f.features) == {"decode_reqs", "decode_ctx_tokens", "switched"}
    for name in ("intercept_s", "decode_req_s", "decode_ctx_token_s", "switched_s"):
        assert getattr(f.cost, name) == pytest.approx(getattr(truth, name), rel=0.08), name
    assert f.quality.median_rel_err < 0.03  # the noise: lognormal σ = 2%, median |error| ≈ 0.674 σ
    assert f.cost.prefill_token_s == f.cost.prefill_req_s == 0.0  # a decode step holds no prompt


def test_fit_recovers_known_prefill_costs_with_per_request_overhead():
    rng = np.random.default_rng(1)
    n = 1000
    truth = PhaseCost(intercept_s=1.5e-3, prefill_token_s=2.5e-5, prefill_req_s=6e-4)
    reqs = rng.integers(1, 9, n).astype(float)
    x = rows(n, prefill_reqs=reqs, prefill_tokens=reqs * rng.integers(20, 600, n), switched=1.0)
    y = truth.predict_rows(x) * rng.lognormal(0.0, 0.02, n)
    f = fit_phase(x, y, P)
    assert f.quality.ok and set(f.features) == {"prefill_tokens", "prefill_reqs"}  # switched: no spread
    for name in ("intercept_s", "prefill_token_s", "prefill_req_s"):
        assert getattr(f.cost, name) == pytest.approx(getattr(truth, name), rel=0.08), name


def test_fit_recovers_the_attention_over_a_chunks_prefix():
    """Prompts of 10-240 tokens in one chunk, and prompts of 257-1,024 split into chunks of 256: a chunk of e
    tokens after p of prefix attends to e·p + e(e + 1)/2 keys (the last of three: 256·512 + 256·257/2 = 163,968).
    At 1e-8 s a key that is 1.6 ms on a 6.2-ms iteration; a fit without the term misses those chunks."""
    rng = np.random.default_rng(3)
    truth = PhaseCost(intercept_s=3.4e-3, prefill_token_s=6.4e-6, prefill_req_s=1.2e-3, prefill_ctx_token_s=1e-8)
    e, p = [], []
    for _ in range(300):
        e.append(int(rng.integers(10, 241)))
        p.append(0)
        long = int(rng.integers(257, 1025))
        for start in range(0, long, 256):
            e.append(min(256, long - start))
            p.append(start)
    e, p = np.array(e, dtype=float), np.array(p, dtype=float)
    keys = e * p + e * (e + 1) / 2
    last = (p == 512) & (e == 256)  # the last chunk of a prompt of 768 or more: 163,968 keys
    assert last.sum() > 10 and set(keys[last]) == {163968.0}
    x = rows(len(e), prefill_tokens=e, prefill_reqs=1.0, prefill_ctx_tokens=keys)
    y = truth.predict_rows(x) * rng.lognormal(0.0, 0.02, len(e))
    f = fit_phase(x, y, P)
    assert f.quality.ok and "prefill_ctx_tokens" in f.features, f
    assert f.cost.prefill_ctx_token_s == pytest.approx(1e-8, rel=0.1)
    assert np.median(np.abs(f.cost.predict_rows(x[last]) / y[last] - 1)) < 0.04
    x_blind = x.copy()
    x_blind[:, COL["prefill_ctx_tokens"]] = 0.0  # the reports of an engine that does not say
    blind = fit_phase(x_blind, y, P)
    assert np.median(np.abs(blind.cost.predict_rows(x_blind[last]) / y[last] - 1)) > 0.08


def test_flat_cost_passes_although_its_r2_is_near_zero():
    """The CPU case: iteration time hardly moves with the batch; R² ≈ 0, and the fit predicts it well."""
    rng = np.random.default_rng(2)
    n = 800
    reqs = rng.integers(1, 17, n).astype(float)
    x = rows(n, decode_reqs=reqs, decode_ctx_tokens=reqs * rng.integers(30, 300, n), switched=rng.random(n) < 0.2)
    y = 6e-3 * rng.lognormal(0.0, 0.08, n)  # independent of every feature
    f = fit_phase(x, y, D)
    assert f.quality.ok, f.quality
    assert abs(r2(f.cost.predict_rows(x), y)) < 0.05  # what the old R² test refused
    assert f.cost.intercept_s == pytest.approx(6e-3, rel=0.05)
    assert f.quality.median_rel_err < 0.08


def test_unpredictable_cost_fails():
    rng = np.random.default_rng(3)
    n = 500
    reqs = rng.integers(1, 200, n).astype(float)
    x = rows(n, decode_reqs=reqs, decode_ctx_tokens=reqs * 100)
    y = 1e-2 * rng.lognormal(0.0, 1.0, n)  # the same batch takes from a third to three times as long
    f = fit_phase(x, y, D)
    assert not f.quality.ok and f.quality.median_rel_err > 0.2 and "> 20%" in f.quality.reason
    assert f.cost is not None  # fitted and judged: the caller decides not to use it


def test_features_without_spread_or_effect_are_dropped():
    rng = np.random.default_rng(4)
    n = 600
    reqs = rng.integers(1, 300, n).astype(float)
    # context exactly 100 per request: collinear with decode_reqs; switched never 1: no spread
    x = rows(n, decode_reqs=reqs, decode_ctx_tokens=100 * reqs)
    y = (9e-3 + 5e-5 * reqs) * rng.lognormal(0.0, 0.01, n)
    f = fit_phase(x, y, D)
    assert f.quality.ok and len(f.features) == 1 and "switched" not in f.features
    per_request = f.cost.decode_req_s + 100 * f.cost.decode_ctx_token_s  # either column carries it
    assert per_request == pytest.approx(5e-5, rel=0.03) and f.cost.intercept_s == pytest.approx(9e-3, rel=0.03)
    # a feature with spread and no effect: the fit without it is as good, so it goes
    x2 = rows(n, decode_reqs=reqs, switched=rng.random(n) < 0.5)
    f2 = fit_phase(x2, y, D)
    assert f2.features == ("decode_reqs",) and f2.cost.switched_s == 0.0


def test_every_feature_flat_leaves_the_intercept():
    """The demo engine at its cap: every decode step the same size (the old fit refused: "no spread")."""
    x = rows(100, decode_reqs=256.0, decode_ctx_tokens=256.0 * 500)
    y = np.full(100, 0.031) * np.random.default_rng(5).lognormal(0.0, 0.01, 100)
    f = fit_phase(x, y, D)
    assert f.quality.ok and f.features == () and f.cost.intercept_s == pytest.approx(0.031, rel=0.01)


def test_a_noisy_flat_cost_is_fitted_flat_and_passes():
    """Mixed iterations of a tiny model on a busy CPU (the CI failure of 2026-11-26: "median error 12.3% above the
    mean's 10.4%"): cost flat in every feature, lognormal noise σ = 0.15 and a 5% tail of slow iterations, the
    features as varied as real mixed batches. The flat cost's own median error is about 10%, under the 20%
    threshold, so every draw must pass; before the flat fallback 5 of these 50 draws failed (the L1 constant sits
    below the mean on right-skewed times, and a median over 60 held-out iterations moves with the split)."""
    for seed in range(50):
        rng = np.random.default_rng(seed)
        n = 300
        decode = rng.integers(1, 16, n).astype(float)
        x = rows(n, prefill_tokens=rng.integers(1, 256, n), prefill_reqs=rng.integers(1, 4, n), decode_reqs=decode,
                 decode_ctx_tokens=decode * rng.integers(20, 120, n), switched=rng.random(n) < 0.2)
        y = 0.02 * rng.lognormal(0.0, 0.15, n) * (1 + (rng.random(n) < 0.05) * rng.exponential(1.0, n))
        f = fit_phase(x, y, M)
        assert f.quality.ok, (seed, f.quality.reason)
        assert f.quality.median_rel_err <= 1.1 * f.quality.mean_rel_err <= 0.2 * 1.1, (seed, f.quality)
        # whatever was kept, it predicts a typical iteration near the 0.02-s flat cost (mean of the draw 0.0212)
        assert f.cost.predict(prefill_tokens=128, prefill_reqs=2, decode_reqs=8, decode_ctx_tokens=560) \
            == pytest.approx(0.0205, rel=0.12), (seed, f.cost)


def test_garbage_rows_are_ignored():
    _, x, y = decode_data(np.random.default_rng(6), n=400)
    bad_x = np.vstack([x[:3], rows(1, decode_reqs=math.inf), rows(1, decode_reqs=-1.0), rows(1, decode_reqs=4.0)])
    bad_y = np.concatenate([[math.nan, -1.0, 0.0], [1e-2, 1e-2, math.inf]])
    f = fit_phase(np.vstack([x, bad_x]), np.concatenate([y, bad_y]), D)
    clean = fit_phase(x, y, D)
    assert f.n == clean.n == 400 and f.cost == clean.cost and f.quality == clean.quality


def test_too_few_iterations_are_not_fitted():
    _, x, y = decode_data(np.random.default_rng(7), n=19)
    f = fit_phase(x, y, D)
    assert f.cost is None and not f.quality.ok and f.quality.reason == "19 iterations < 20"
    assert fit_phase(x, y, D, min_samples=10).cost is not None


# ---- the model, its rows and shapes -------------------------------------------------------------------

def test_predictions_and_report_features_by_hand():
    c = PhaseCost(intercept_s=1.0, prefill_token_s=0.1, prefill_req_s=0.5, decode_req_s=0.01,
                  decode_ctx_token_s=0.001, switched_s=2.0, prefill_ctx_token_s=1e-4)
    # two prompt chunks: 10 tokens after 100 of prefix (10·100 + 10·11/2 = 1,055 keys), 20 new (20·21/2 = 210)
    r = IterationReport(engine_id="e", seq=0, wall_time=0.0, forward_s=1.0, kind=M, prefill_reqs=2,
                        prefill_tokens=30, decode_reqs=4, decode_ctx_tokens=1000, prefill_ctx_tokens=1265)
    x = report_features(r, True)
    assert x == (30.0, 2.0, 4.0, 1000.0, 1.0, 1265.0)
    want = 1.0 + 0.1 * 30 + 0.5 * 2 + 0.01 * 4 + 0.001 * 1000 + 2.0 + 1e-4 * 1265  # = 8.1665
    assert c.predict(**dict(zip(FEATURES, x, strict=True))) == pytest.approx(8.1665) == want
    assert c.predict_rows(np.array([x, x]))[1] == pytest.approx(8.1665)
    ic = IterationCosts(mixed=c)
    assert ic.predict(M, prefill_tokens=30) == pytest.approx(4.0) and math.isnan(ic.predict(D))
    assert np.isnan(ic.predict_rows(D, np.array([x]))).all()


def test_shape_by_hand():
    x = np.array([[100, 2, 0, 0, 1, 5000], [300, 2, 0, 0, 0, 35000], [0, 0, 4, 800, 0, 0], [0, 0, 6, 1200, 1, 0]],
                 dtype=float)
    s = shape(x)
    assert s == Shape(tokens_per_prefill_req=100.0, ctx_per_decode_req=200.0, switched_frac=0.5,
                      ctx_per_prefill_token=100.0)  # 40,000 keys over 400 prompt tokens
    assert math.isnan(shape(np.zeros((0, 6))).switched_frac) and math.isnan(shape(rows(2)).ctx_per_decode_req)


# ---- paper_costs ---------------------------------------------------------------------------------------

PRE = PhaseCost(intercept_s=1e-3, prefill_token_s=2e-5, prefill_req_s=4e-4, switched_s=5e-4)
DEC = PhaseCost(intercept_s=8e-3, decode_req_s=3e-5, decode_ctx_token_s=1e-8, switched_s=2e-3)
MIX = PhaseCost(intercept_s=9e-3, prefill_token_s=2.5e-5, decode_req_s=5e-5, switched_s=1e-3)


def test_paper_costs_hand_worked():
    c = paper_costs(IterationCosts(prefill=PRE, decode=DEC, mixed=MIX), prefill=Shape(200.0, math.nan, 1.0),
                    decode=Shape(math.nan, 1000.0, 0.1), mixed=Shape(150.0, 700.0, 0.25))
    assert c.alpha_p == pytest.approx(1e-3 + 5e-4 + 2e-3)  # intercept + both switches: 3.5e-3
    assert c.beta_p == pytest.approx(2e-5 + 4e-4 / 200)  # 2.2e-5
    assert c.alpha_d == pytest.approx(8e-3)
    assert c.beta_d == pytest.approx(3e-5 + 1e-8 * 1000)  # 4e-5
    assert c.alpha_mb == pytest.approx(9e-3 + 1e-3 * 0.25)
    assert (c.c0, c.c1, c.c2) == pytest.approx((2.5e-5, 5e-5 - 2.5e-5, 0.0))
    # the attention over a chunk's prefix enters β_p at the keys per prompt token seen (here 300), and m_p too
    pre = msgspec.structs.replace(PRE, prefill_ctx_token_s=1e-8)
    mix = msgspec.structs.replace(MIX, prefill_ctx_token_s=2e-8)
    c = paper_costs(IterationCosts(prefill=pre, decode=DEC, mixed=mix), prefill=Shape(200.0, math.nan, 1.0, 300.0),
                    decode=Shape(math.nan, 1000.0, 0.1), mixed=Shape(150.0, 700.0, 0.25, 50.0))
    assert c.beta_p == pytest.approx(2e-5 + 4e-4 / 200 + 1e-8 * 300)  # 2.23e-5
    assert c.c0 == pytest.approx(2.5e-5 + 2e-8 * 50)  # 2.6e-5
    # without a mixed fit the mixed cost is unknown (eb+ then stays in eb and says so)
    c = paper_costs(IterationCosts(prefill=PRE, decode=DEC), prefill=Shape(200.0), decode=Shape(ctx_per_decode_req=1e3))
    assert not c.has_mixed and c.alpha_d == 8e-3
    c = paper_costs(IterationCosts(decode=DEC), prefill=Shape(), decode=Shape(ctx_per_decode_req=1e3))
    assert math.isnan(c.alpha_p) and math.isnan(c.beta_p)


def test_paper_costs_preserve_an_eb_cycle_summed_iteration_by_iteration():
    """One EB cycle: a refill of k requests in one prefill iteration (after decode: switched), then T decode
    steps with n rows (the first after the prefill: switched). The paper's α_p + β_p·tokens + α_d·T +
    β_d·(n·T) must equal the iteration-cost model summed step by step, at the cycle's own shape."""
    k, prompt, n, ctx, steps = 4, 200, 12, 900, 30
    pre = PRE.predict(prefill_tokens=k * prompt, prefill_reqs=k, switched=1)
    dec = sum(DEC.predict(decode_reqs=n, decode_ctx_tokens=n * ctx, switched=int(i == 0)) for i in range(steps))
    c = paper_costs(IterationCosts(prefill=PRE, decode=DEC), prefill=Shape(tokens_per_prefill_req=prompt),
                    decode=Shape(ctx_per_decode_req=ctx))
    paper = c.alpha_p + c.beta_p * k * prompt + c.alpha_d * steps + c.beta_d * n * steps
    assert paper == pytest.approx(pre + dec, rel=1e-12)


def test_paper_costs_preserve_a_mixed_iteration():
    """β_MB^e(r)·n_tok + α_MB equals the mixed model at its shape, n_tok = prefill tokens + decode rows."""
    p_tok, p_req, d_rows, ctx = 600, 3, 20, 700
    c = paper_costs(IterationCosts(prefill=PRE, decode=DEC, mixed=MIX), prefill=Shape(200.0),
                    decode=Shape(ctx_per_decode_req=1e3), mixed=Shape(p_tok / p_req, ctx, 0.0))
    n_tok = p_tok + d_rows
    r = d_rows / n_tok
    beta = c.c0 + c.c1 * r + c.c2 * r * r
    want = MIX.predict(prefill_tokens=p_tok, prefill_reqs=p_req, decode_reqs=d_rows, decode_ctx_tokens=d_rows * ctx)
    assert c.alpha_mb + beta * n_tok == pytest.approx(want, rel=1e-12)


# ---- the fit's solver: the same minimiser as scipy's nnls on every row ----------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_reduced_solvers_match_nnls_on_the_rows(seed):
    """The fit solves on aᵀa (or on a's QR triangle) instead of the m rows; scipy.optimize.nnls on the rows
    is the independent reference. Cases: a feasible unconstrained minimum, one that needs the bound (a
    column whose best coefficient is negative), and two identical columns (aᵀa singular: the QR path)."""
    from scipy.optimize import nnls

    from ebctl.costmodel import _nnls_gram, _nnls_reduced

    rng = np.random.default_rng(seed)
    a = rng.random((400, 4)) + 0.1
    b = a @ np.array([0.5, 1.0, 0.0, 2.0]) + rng.normal(0, 0.05, 400)
    b_neg = b - 0.8 * a[:, 2]  # the third coefficient would be negative: the bound binds
    for target in (b, b_neg):
        ref, _ = nnls(a, target)
        assert np.allclose(_nnls_gram(a.T @ a, a.T @ target), ref, atol=1e-8)
        assert np.allclose(_nnls_reduced(a, target), ref, atol=1e-8)
    assert (nnls(a, b_neg)[0][2] == 0) and (np.linalg.lstsq(a, b_neg, rcond=None)[0][2] < 0)
    twin = np.column_stack([a, a[:, 0]])
    assert _nnls_gram(twin.T @ twin, twin.T @ b) is None  # refused: the caller goes to the rows
    ref_obj = np.linalg.norm(twin @ nnls(twin, b)[0] - b)
    assert np.linalg.norm(twin @ _nnls_reduced(twin, b) - b) == pytest.approx(ref_obj, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_batched_candidate_fits_match_nnls_on_each_candidates_rows(seed):
    """The feature selection fits every candidate column set of a round in one batch (``_Relative.l2_many``);
    each row must be scipy's nnls on the relative-error rows of that candidate's columns: a feasible set, one
    whose bound binds (the batched unconstrained solve is infeasible there), and a singular one (a column
    repeated: the batched Cholesky fails, every set is then solved alone)."""
    from scipy.optimize import nnls

    from ebctl.costmodel import _design

    rng = np.random.default_rng(seed)
    x = rng.random((300, 5)) * [100, 3, 50, 5000, 1]
    y = 0.01 + x @ [1e-4, 0.0, 2e-4, 1e-6, 0.0] + rng.normal(0, 1e-4, 300)
    y -= 3e-4 * x[:, 1]  # prefill_reqs lowers the cost: its coefficient is 0 at the bound
    y = np.abs(y) + 1e-4
    x[:, 4] = x[:, 0]  # a twin of prefill_tokens: a set holding both has a singular aᵀa
    rel = _Relative(x, y)
    rows = _design(x) / y[:, None]
    for sets in ([[0, 1, 3], [0, 3, 4], [0, 2, 3]], [[0, 1, 5], [0, 1, 2]], [[0, 1], [0, 2]]):
        got = rel.l2_many(np.array(sets))
        for s, coef in zip(sets, got, strict=True):
            ref, _ = nnls(rows[:, s], np.ones(len(y)))
            assert np.linalg.norm(rows[:, s] @ coef - 1) == pytest.approx(np.linalg.norm(rows[:, s] @ ref - 1),
                                                                         rel=1e-7, abs=1e-12)


def test_the_fits_median_is_numpys():
    """The fit's own median (a bare partition) against ``np.median``: odd and even counts, rows and 1-d."""
    from ebctl.costmodel import _median_rows

    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 4, 399, 400):
        v = rng.random((3, n))
        assert np.array_equal(_median_rows(v), np.median(v, axis=-1))
        assert _median_rows(v[0]) == np.median(v[0])
    assert _median_rows(np.array([1.0, 9.0, 3.0, 4.0])) == 3.5  # by hand: (3 + 4) / 2


def test_an_exactly_singular_gram_that_cholesky_accepts_is_solved_on_the_rows():
    """Two equal columns (the intercept's and a feature's) over 7 rows: aᵀa = [[7, 7], [7, 7]], whose Cholesky
    pivot rounds to +4e-16 (accepted) while LU finds it singular. In the daemon, decode rows whose context is
    exactly 100× their requests made ``ebctl tune calibrate`` fail this way, by turns. Any c ≥ 0 with
    c0 + c1 = 1 fits y = 1 exactly."""
    gram = np.full((2, 2), 7.0)
    np.linalg.cholesky(gram)  # the premise: accepted
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(gram, np.ones(2))
    x = np.zeros((7, len(FEATURES)))
    x[:, FEATURES.index("decode_reqs")] = 1.0
    rel = _Relative(x, np.ones(7))
    sel = [0, 1 + FEATURES.index("decode_reqs")]
    for coef in (rel.l2_many(np.array([sel]))[0], rel.l2(sel)):
        assert (coef >= 0).all() and coef.sum() == pytest.approx(1.0)


def test_a_flat_decode_cost_worse_fitted_than_its_mean_still_fails():
    """The flat fallback is for mixed iterations only: a decode fit's slope is Eq. 3-6's β_d, and a flat fit would
    set it to 0. A draw of the same flat, noisy cost on decode's features (seed 20: its constant fit misses the
    mean's error, 11.3% against 9.3%): as a decode fit it fails, as a mixed fit it is the flat cost."""
    rng = np.random.default_rng(20)
    n = 300
    decode = rng.integers(1, 16, n).astype(float)
    x = rows(n, decode_reqs=decode, decode_ctx_tokens=decode * rng.integers(20, 120, n), switched=rng.random(n) < 0.2)
    y = 0.02 * rng.lognormal(0.0, 0.15, n) * (1 + (rng.random(n) < 0.05) * rng.exponential(1.0, n))
    f = fit_phase(x, y, D)
    fm = fit_phase(x, y, M)
    assert fm.quality.ok and fm.features == ()  # mixed: the flat cost
    assert not f.quality.ok and "above the mean" in f.quality.reason, f.quality
