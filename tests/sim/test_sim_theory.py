"""Theory agreement under the paper's linear cost model: Eq. 4, the best fixed θ vs θ0, EB(k=1) = v0."""

from __future__ import annotations

import math

import pytest

from ebctl import model
from ebctl.sim import costs, workloads
from ebctl.sim.engine import EngineConfig

N = 512
MU = 256
# no memory limit, one prefill iteration per refill (Eq. 4's prefill phase), saturated closed loop
CFG = EngineConfig(max_running=N, token_budget=1 << 22, kv_tokens=1 << 30, watermark=0.0)
THETAS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.15, 0.3, 0.6)


@pytest.fixture(scope="module")
def sweep(h200, sim_run):
    lm = costs.LinearCostModel(h200.costs)
    wl = workloads.synthetic(MU, MU, 10_000, seed=1, outputs="geometric")
    out = {th: sim_run(wl, f"eb:theta={th}", lm, CFG, concurrency=4 * N) for th in THETAS}
    return wl, out


def test_eb_k_matches_eq4(h200, sweep):
    wl, out = sweep
    c = h200.costs
    for th, res in out.items():
        k = max(1, math.floor(th * N))
        pred = model.tp_eb(theta=k / N, n=N, alpha_p=c.alpha_p, beta_p=c.beta_p, alpha_d=c.alpha_d,
                           beta_d=c.beta_d, mu_l=float(wl.input_len.mean()), mu_o=float(wl.output_len.mean()))
        assert res["steady_req_per_s"] == pytest.approx(pred, rel=0.02), th


def test_best_fixed_theta_is_near_theta0(h200, sweep):
    _, out = sweep
    c = h200.costs
    theta0 = model.theta0(-math.log1p(-1 / MU) * c.alpha_p / c.alpha_d)  # ≈ 0.033
    best = max(out, key=lambda th: out[th]["steady_req_per_s"])
    assert theta0 / 2 <= best <= theta0 * 2.5
    near = min(out, key=lambda th: abs(th - theta0))
    assert out[near]["steady_req_per_s"] >= 0.995 * out[best]["steady_req_per_s"]
    assert out[0.6]["steady_req_per_s"] < 0.97 * out[best]["steady_req_per_s"]  # the curve does bend


def test_eb_k1_is_v0_under_saturation(h200, sim_run):
    lm = costs.LinearCostModel(h200.costs)
    wl = workloads.synthetic(MU, MU, 4000, seed=2, outputs="geometric")
    v0 = sim_run(wl, "v0", lm, CFG, concurrency=4 * N)
    eb1 = sim_run(wl, "eb:k=1", lm, CFG, concurrency=4 * N)
    assert eb1["total_tok_per_s"] == pytest.approx(v0["total_tok_per_s"], rel=0.01)
    assert v0["steps"] == eb1["steps"]
