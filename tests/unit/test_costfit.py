"""The online cost fits: the windows, ``switched`` from the report stream, one source for α/β, status.

Reports are simulated from known per-kind costs; expected α/β come from paper_costs on those known costs
(its own hand-worked tests are in test_costmodel.py) or from the base costs given, never from the fits.
"""

import math

import numpy as np
import pytest

from ebctl import model
from ebctl.costfit import FEATURES, IterationWindow, OnlineCosts
from ebctl.costmodel import IterationCosts, PhaseCost, PhaseFit, Quality, Shape, paper_costs
from ebctl.protocol import BatchKind, IterationReport

P, D, M, IDLE = BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED, BatchKind.IDLE
BASE = model.Costs(alpha_p=1.0, beta_p=2.0, alpha_d=3.0, beta_d=4.0, alpha_mb=5.0, c0=6.0, c1=7.0, c2=8.0)
PRE = PhaseCost(intercept_s=2e-3, prefill_token_s=3e-5, switched_s=1e-3)
DEC = PhaseCost(intercept_s=9e-3, decode_req_s=5e-5, decode_ctx_token_s=1e-8, switched_s=4e-3)
MIX = PhaseCost(intercept_s=1e-2, prefill_token_s=3.5e-5, decode_req_s=6e-5)


def rep(kind, *, seconds=1e-2, p_tok=0, p_req=0, d_req=0, ctx=0, seq=0):
    return IterationReport(engine_id="e", seq=seq, wall_time=0.0, forward_s=seconds, kind=kind,
                           prefill_tokens=p_tok, prefill_reqs=p_req, decode_reqs=d_req, decode_ctx_tokens=ctx)


def eb_stream(rng, cycles, *, prefill_noise=0.01, mixed_every=0):
    """EB cycles (one prefill iteration, then 3-12 decode steps) priced by PRE/DEC, 1% lognormal noise;
    with ``mixed_every``, every that many cycles a mixed iteration priced by MIX instead of the prefill."""
    out, last = [], None
    for c in range(cycles):
        tok, req = int(rng.integers(50, 3000)), int(rng.integers(1, 5))
        kind = M if mixed_every and c % mixed_every == 0 else P
        n = int(rng.integers(1, 200))
        if kind is P:
            t = PRE.predict(prefill_tokens=tok, prefill_reqs=req, switched=last is not P)
            t *= rng.lognormal(0, prefill_noise)
            out.append(rep(P, seconds=t, p_tok=tok, p_req=req))
        else:
            t = MIX.predict(prefill_tokens=tok, prefill_reqs=req, decode_reqs=n) * rng.lognormal(0, 0.01)
            out.append(rep(M, seconds=t, p_tok=tok, p_req=req, d_req=n, ctx=n * 300))
        last = kind
        for i in range(int(rng.integers(3, 13))):
            ctx = n * int(rng.integers(100, 1500))
            t = DEC.predict(decode_reqs=n, decode_ctx_tokens=ctx, switched=i == 0) * rng.lognormal(0, 0.01)
            out.append(rep(D, seconds=t, d_req=n, ctx=ctx))
            last = D
    return out


def fed(reports, **kw):
    oc = OnlineCosts(**kw)
    for r in reports:
        oc.observe(r)
    oc.refit(force=True)
    return oc


# ---- IterationWindow -----------------------------------------------------------------------------------

def test_window_rejects_garbage_and_keeps_the_newest_in_order():
    w = IterationWindow(3)
    for row, s in [((1, 0, 0, 0, 0, 0), math.nan), ((1, 0, 0, 0, 0, 0), 0.0), ((1, 0, 0, 0, 0, 0), -1.0),
                   ((math.inf, 0, 0, 0, 0, 0), 1.0), ((-1, 0, 0, 0, 0, 0), 1.0), ((1, 0, 0, 0, 0, 0), math.inf)]:
        assert not w.add(row, s)
    assert len(w) == 0 and w.total == 0
    for i in range(5):
        assert w.add((i, 0, 0, 0, 0, 0), float(i + 1))
    x, y = w.rows()
    assert list(x[:, 0]) == [2, 3, 4] and list(y) == [3.0, 4.0, 5.0] and w.total == 5
    w.resize(2)
    assert list(w.rows()[1]) == [4.0, 5.0] and w.total == 5
    w.resize(4)
    w.add((9, 0, 0, 0, 0, 0), 10.0)
    assert list(w.rows()[1]) == [4.0, 5.0, 10.0]
    with pytest.raises(ValueError):
        IterationWindow(0)


# ---- switched, from the stream ---------------------------------------------------------------------------

def test_switched_is_a_change_from_the_previous_non_idle_kind():
    oc = OnlineCosts()
    for r in (rep(P, p_tok=10, p_req=1), rep(D, d_req=2), rep(D, d_req=2), rep(IDLE), rep(D, d_req=2),
              rep(P, p_tok=10, p_req=1), rep(P, p_tok=10, p_req=1), rep(M, p_tok=5, p_req=1, d_req=1),
              rep(P, p_tok=10, p_req=1, d_req=3)):  # a prefill carrying decode rows: no kind's sample
        oc.observe(r)
    switched = {k: list(oc.windows[k].rows()[0][:, 4]) for k in (P, D, M)}
    assert switched == {P: [0.0, 1.0, 0.0], D: [1.0, 0.0, 0.0], M: [1.0]}  # the first report: no previous


# ---- one source for α/β ------------------------------------------------------------------------------

def test_profile_until_both_fits_pass_then_online_for_both():
    rng = np.random.default_rng(0)
    reports = eb_stream(rng, 300)
    early = fed(reports[:12])
    c = early.choose(BASE, "profile:x", needs_mixed=False)
    assert c.costs == BASE and c.source == "profile:x" and "iterations < 20" in c.reason
    oc = fed(reports)
    c = oc.choose(BASE, "profile:x", needs_mixed=False)
    assert c.source == "online" and "prefill" in c.reason and "decode" in c.reason
    want = paper_costs(IterationCosts(prefill=PRE, decode=DEC), prefill=oc.shapes[P], decode=oc.shapes[D])
    for k in ("alpha_p", "beta_p", "alpha_d", "beta_d"):
        assert getattr(c.costs, k) == pytest.approx(getattr(want, k), rel=0.1), k
    assert not c.costs.has_mixed  # no mixed iterations: never the profile's β_MB beside online β_EB
    assert oc.shapes[P].tokens_per_prefill_req > 1 and oc.shapes[D].ctx_per_decode_req > 100


def test_one_failed_fit_keeps_every_coefficient_on_the_profile():
    rng = np.random.default_rng(1)
    oc = fed(eb_stream(rng, 300, prefill_noise=1.5))  # prefill times unpredictable; decode fine
    assert oc.passed(D) and not oc.passed(P)
    c = oc.choose(BASE, "profile:x", needs_mixed=False)
    assert c.costs == BASE and c.source == "profile:x"  # not alpha_d online beside alpha_p from the profile
    assert "prefill: median error" in c.reason and "decode" not in c.reason
    st = oc.status(c)
    assert st["prefill"]["state"] == "failed" and not st["prefill"]["in_use"] and st["prefill"]["rel_err"] > 0.2
    assert st["decode"]["state"] == "passed, not in use" and st["mixed"]["state"] == "waiting"
    assert st["mixed"]["reason"] == "0 iterations < 20"


def test_eb_plus_needs_the_mixed_fit_too():
    rng = np.random.default_rng(2)
    without = fed(eb_stream(rng, 200))
    c = without.choose(BASE, "default", needs_mixed=True)
    assert c.costs == BASE and "mixed: 0 iterations" in c.reason
    with_mixed = fed(eb_stream(rng, 400, mixed_every=2))
    c = with_mixed.choose(BASE, "default", needs_mixed=True)
    assert c.source == "online" and c.costs.has_mixed
    want = paper_costs(IterationCosts(prefill=PRE, decode=DEC, mixed=MIX), prefill=with_mixed.shapes[P],
                       decode=with_mixed.shapes[D], mixed=with_mixed.shapes[M])
    for k in ("alpha_mb", "c0", "c1"):
        assert getattr(c.costs, k) == pytest.approx(getattr(want, k), rel=0.1), k
    st = with_mixed.status(c)
    assert all(st[k]["in_use"] and st[k]["state"] == "in use" for k in ("prefill", "decode", "mixed"))
    assert set(st["decode"]["features"]) <= {"decode_reqs", "decode_ctx_tokens", "switched"}
    assert st["decode"]["coef"]["intercept_s"] == pytest.approx(DEC.intercept_s, rel=0.1)


def test_online_fits_that_give_no_decode_intercept_are_not_used():
    """Eq. 3 divides by α_d: an intercept of 0, or one under 1% of the mean decode step (not identified by
    the batch sizes seen), sends the choice back to the profile's costs; 2% of it is used."""
    oc = fed(eb_stream(np.random.default_rng(3), 100))
    q = Quality(True, 0.01, 0.5, 50, "ok")
    step = 0.02  # the mean decode step of the fit's iterations
    for alpha_d, used in ((0.0, False), (0.005 * step, False), (0.02 * step, True)):
        oc.fits[D] = PhaseFit(PhaseCost(intercept_s=alpha_d, decode_req_s=1e-4), q, ("decode_reqs",), 250, step)
        c = oc.choose(BASE, "default", needs_mixed=False)
        assert (c.source == "online") is used, (alpha_d, c.reason)
        if not used:
            assert c.costs == BASE and "not identified" in c.reason and "Eq. 3 needs it" in c.reason
        else:
            assert c.costs.alpha_d == alpha_d
    assert oc.choose(BASE, "default", needs_mixed=False, enabled=False).reason.endswith("cost_online = false)")


def test_flat_decode_at_a_fixed_batch_passes():
    """The demo engine at its cap: every decode step has 256 rows (no spread), time nearly constant."""
    rng = np.random.default_rng(4)
    reports = [rep(D, seconds=0.05 * rng.lognormal(0, 0.02), d_req=256, ctx=256 * int(rng.integers(200, 400)))
               for _ in range(300)]
    oc = fed(reports)
    assert oc.passed(D) and oc.fits[D].cost.intercept_s == pytest.approx(0.05, rel=0.05), oc.why(D)


def test_refit_waits_for_a_tenth_of_the_window_and_set_params_refits():
    rng = np.random.default_rng(5)
    reports = eb_stream(rng, 200)
    oc = OnlineCosts(capacity=100)
    for r in reports[:400]:
        oc.observe(r)
    oc.refit()
    n0 = oc.fits[D].n
    decode_after = [r for r in reports[400:] if r.kind is D]
    for r in decode_after[:5]:  # 5 new rows < 100 / 10: the fit stands
        oc.observe(r)
    oc.refit()
    assert oc.fits[D].n == n0 == 100 and oc._fitted_at[D] == oc.windows[D].total - 5
    for r in decode_after[5:10]:
        oc.observe(r)
    oc.refit()
    assert oc._fitted_at[D] == oc.windows[D].total
    oc.set_params(50, 0.003)  # a smaller window and a stricter test: every kind due, one per refit
    assert oc.due() is P and oc.refit() and oc.fits[P].n == len(oc.windows[P]) <= 50 and oc.fits[D].n == 100
    assert oc.due() is D and oc.refit() and oc.due() is None and not oc.refit()
    assert oc.fits[D].n == 50 and oc.max_rel_err == 0.003 and not oc.passed(D)  # 1% noise: median error ~0.7%


def test_one_kind_is_refitted_per_update_the_most_changed_first():
    oc = OnlineCosts(capacity=100)
    for i in range(100):
        oc.observe(rep(P, seconds=1e-2 + 1e-5 * i, p_tok=10 + i, p_req=1))
        oc.observe(rep(D, seconds=2e-2 + 1e-4 * (i % 7), d_req=1 + i % 7, ctx=50))
    oc.refit(force=True)
    assert oc._fitted_at == {P: 100, D: 100, M: 0}
    for i in range(30):  # decode: 30% of its window new; prefill: 15%
        oc.observe(rep(D, seconds=2e-2, d_req=3, ctx=50))
        if i % 2:
            oc.observe(rep(P, seconds=1e-2, p_tok=20, p_req=1))
    oc.refit()
    assert oc._fitted_at == {P: 100, D: 130, M: 0}  # decode only
    oc.refit()
    assert oc._fitted_at == {P: 115, D: 130, M: 0}  # then prefill
    oc.refit()
    assert oc._fitted_at == {P: 115, D: 130, M: 0}  # nothing due
    for _ in range(19):  # under MIN_SAMPLES (20) rows a kind cannot be fitted, so it is never due
        oc.observe(rep(M, seconds=3e-2, p_tok=20, p_req=1, d_req=3, ctx=50))
        assert oc.due() is None
    oc.observe(rep(M, seconds=3e-2, p_tok=20, p_req=1, d_req=3, ctx=50))
    assert oc.due() is M and oc.refit() and oc._fitted_at == {P: 115, D: 130, M: 20}


def test_fit_report_for_a_profile():
    oc = fed(eb_stream(np.random.default_rng(6), 200))
    rep_ = oc.fit_report()
    assert rep_["decode"]["ok"] and rep_["prefill"]["ok"] and "mixed" not in rep_
    assert rep_["decode"]["n"] == len(oc.windows[D]) and rep_["decode"]["rel_err"] < 0.2
    assert rep_["shape"]["decode"] == oc.shapes[D]._asdict() and set(rep_["shape"]) == {"prefill", "decode"}
    assert isinstance(Shape(**rep_["shape"]["prefill"]), Shape)


def test_a_fit_that_raises_is_a_failed_fit_and_not_retried_until_new_rows(monkeypatch):
    """Fault injection (no known input makes ``fit_phase`` raise since the singular-gram fix): the kind gets a
    failed fit that says why, and is not due again until a tenth of its window is new."""
    oc = fed(eb_stream(np.random.default_rng(7), 50))

    def boom(*a, **k):
        raise np.linalg.LinAlgError("Singular matrix")
    monkeypatch.setattr("ebctl.costfit.fit_phase", boom)
    oc.set_params(oc.windows[D].capacity + 1, oc.max_rel_err)  # every kind due
    assert oc.refit() and oc.refit() and oc.due() is None
    assert not oc.passed(D) and oc.why(D) == "fit failed: LinAlgError: Singular matrix"


def test_a_window_grows_on_demand_and_keeps_the_newest_rows_in_order():
    w = IterationWindow(200)
    assert w._y.size == IterationWindow.FIRST_ROWS and w.capacity == 200  # a few reports cost a few rows
    for i in range(1, 501):
        assert w.add((float(i),) + (0.0,) * (len(FEATURES) - 1), float(i))
        if i in (64, 65, 129, 200):
            assert len(w) == i and list(w.rows()[1]) == [float(j) for j in range(1, i + 1)]
    assert w._y.size == 200 and list(w.rows()[1]) == [float(j) for j in range(301, 501)]
    w.resize(50)
    assert list(w.rows()[1]) == [float(j) for j in range(451, 501)]
    w.add((1.0,) * len(FEATURES), 501.0)
    assert list(w.rows()[1]) == [float(j) for j in range(452, 502)]
