"""Calibration from iteration reports: the fit recovers the costs the reports were made with."""

from __future__ import annotations

import numpy as np
import pytest

from ebctl import calibrate
from ebctl.costmodel import IterationCosts, PhaseCost
from ebctl.protocol import BatchKind
from ebctl.sim import costs, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

TRUTH = IterationCosts(
    prefill=PhaseCost(intercept_s=4e-3, prefill_token_s=2e-5, prefill_req_s=5e-4, switched_s=1.5e-3),
    decode=PhaseCost(intercept_s=3e-3, decode_req_s=2e-4, decode_ctx_token_s=1e-6, switched_s=1e-3),
    mixed=PhaseCost(intercept_s=6e-3, prefill_token_s=2e-5, decode_req_s=2.5e-4, decode_ctx_token_s=1e-6))


class Noisy:
    """TRUTH, each iteration × a right-skewed factor (lognormal, σ = 0.4, mean 1): a real engine's timings."""

    name = "noisy"

    def __init__(self, seed: int) -> None:
        self.inner = costs.IterationCostModel(TRUTH)
        self.rng = np.random.default_rng(seed)

    def step_time(self, batch):
        return self.inner.step_time(batch) * float(self.rng.lognormal(-0.08, 0.4))


class Spy:
    def __init__(self, inner):
        self.inner, self.reports = inner, []
        self.name, self.timeline, self.engine = inner.name, inner.timeline, inner.engine

    def policy(self, now):
        return self.inner.policy(now)

    def observe(self, rep):
        self.reports.append(rep)


def _reports(cost_model, spec: str, mixed: bool) -> list:
    wl = workloads.synthetic(120, 40, 1500, seed=2, outputs="geometric")
    cfg = EngineConfig(max_running=16, token_budget=256, kv_tokens=16384, mixed_chunk=mixed)
    spy = Spy(policies.make(spec, max_running=16, kv_tokens=16384))
    runner.run(wl, spy, cost_model, cfg, concurrency=24)
    return spy.reports


def test_periods_are_the_gaps_between_consecutive_reports():
    reps = _reports(costs.IterationCostModel(TRUTH), "v0", False)
    s = calibrate.periods([reps])
    busy = [r for r in reps if r.kind is not BatchKind.IDLE]
    # the first busy report has no predecessor: every other one is a sample, its period its forward time
    assert sum(len(v) for v in s.y.values()) == len(busy) - 1
    f = calibrate.periods([reps], seconds="forward")
    assert np.concatenate([s.y[k] for k in calibrate.KINDS]).sum() == pytest.approx(
        sum(r.forward_s for r in busy[1:]), rel=1e-9)
    assert sum(len(v) for v in f.y.values()) == len(busy)


def test_fit_recovers_the_costs_the_reports_were_made_with():
    runs = [_reports(costs.IterationCostModel(TRUTH), "v0", False),
            _reports(costs.IterationCostModel(TRUTH), "v0", True)]
    cal = calibrate.fit(calibrate.periods(runs))
    for kind in calibrate.KINDS:
        got, want = cal.costs.phase(kind).coef(), TRUTH.phase(kind).coef()
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12), kind
        assert cal.summary()[str(kind)]["ok"]


def test_fit_on_skewed_timings_keeps_the_total_time():
    runs = [_reports(Noisy(1), "v0", False), _reports(Noisy(2), "v0", True)]
    samples = calibrate.periods(runs)
    cal = calibrate.fit(samples)
    for kind in calibrate.KINDS:
        x, y = samples.x[kind], samples.y[kind]
        assert cal.costs.phase(kind).predict_rows(x).sum() == pytest.approx(y.sum(), rel=1e-9)
        # and the level is the truth's: the noise has mean 1 (lognormal(-0.08, 0.4): e^(−0.08 + 0.08) = 1)
        assert cal.costs.phase(kind).predict_rows(x).sum() == pytest.approx(
            TRUTH.phase(kind).predict_rows(x).sum(), rel=0.05)


def test_calibrated_costs_predict_an_out_of_sample_policy():
    # calibrated on stock and mixed, priced on EB(k=4): the simulated time matches the truth's
    runs = [_reports(costs.IterationCostModel(TRUTH), "v0", False),
            _reports(costs.IterationCostModel(TRUTH), "v0", True)]
    cm = costs.IterationCostModel(calibrate.fit(calibrate.periods(runs)).costs)
    wl = workloads.synthetic(120, 40, 1500, seed=3, outputs="geometric")
    cfg = EngineConfig(max_running=16, token_budget=256, kv_tokens=16384)
    spec = "eb:k=4"
    a = runner.run(wl, policies.make(spec, max_running=16, kv_tokens=16384), cm, cfg, concurrency=24)
    b = runner.run(wl, policies.make(spec, max_running=16, kv_tokens=16384), costs.IterationCostModel(TRUTH), cfg,
                   concurrency=24)
    assert a["tok_per_s"] == pytest.approx(b["tok_per_s"], rel=1e-6)
