"""Policy names → sources of Policy; the auto ones run a Controller on the engine's reports."""

from __future__ import annotations

import math

import pytest

from ebctl.protocol import Mode
from ebctl.sim import costs, policies, workloads
from ebctl.sim.engine import EngineConfig


def make(spec):
    return policies.make(spec, max_running=100, kv_tokens=50_000)


def test_fixed_policies():
    assert make("v0").policy(0.0) is None
    mb = make("mb").policy(3.0)
    assert (mb.mode, mb.n_max, mb.issued_at) == (Mode.MB, 100, 3.0)
    eb = make("eb:k=8").policy(0.0)
    assert (eb.mode, eb.k, eb.n_max, eb.kv_reserve_frac, eb.max_defer_s) == (Mode.EB, 8, 100, 0.0, math.inf)
    assert make("eb:theta=0.3").policy(0.0).k == 30
    assert make("eb:theta=0.001").policy(0.0).k == 1
    p = make("eb:theta=0.5,n=40,kv=0.1,defer=2").policy(0.0)
    assert (p.k, p.n_max, p.kv_reserve_frac, p.max_defer_s) == (20, 40, 0.1, 2.0)
    assert not make("eb:k=8").policy(1e9).expired(1e9)  # re-stamped: never expires on the TTL


@pytest.mark.parametrize("bad", ["eb", "eb:k=0", "eb:k=3,theta=0.2", "eb:theta=1.5", "eb:k=x", "mb:k=3",
                                 "eb-auto:method=magic", "eb+:foo=1", "v1", ""])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError):
        make(bad)


def test_theta_sweep():
    s = policies.theta_sweep()
    assert len(s) == 19 and s[0] == "eb:theta=0.05" and s[-1] == "eb:theta=0.95"


@pytest.mark.parametrize(("spec", "modes"), [("eb-auto:every=20", {"eb"}), ("eb+:every=20", {"eb", "mb"})])
def test_auto_policies_run_the_controller_on_engine_reports(spec, modes, h200, h200_model, sim_run):
    wl = workloads.load("balanced", 800, seed=0)
    cfg = EngineConfig(max_running=128, token_budget=4096, kv_tokens=200_000)
    res = sim_run(wl, spec, h200_model, cfg, concurrency=256, prof=h200)
    tl = res["mode_timeline"]
    assert tl[0][1] == "off"  # cold start: stock until the window holds data
    assert {m for _, m, _, _ in tl[1:]} <= modes and len(tl) >= 2
    fp = res["final_policy"]
    assert 1 <= fp["k"] <= fp["n_max"] <= 128 and 0 < fp["theta_star"] < 1


def test_eb_plus_picks_mb_at_low_concurrency(h200, sim_run):
    # the paper's setting: its kernel costs (with the fitted engine overheads a pure decode step is cheaper
    # than a mixed one even at low load, and Eq. 8, fed the engine's own costs, may rightly pick EB there)
    wl = workloads.load("table3", 600, seed=0)
    cfg = EngineConfig(max_running=1024, token_budget=8192, kv_tokens=700_000)
    low = sim_run(wl, "eb+:every=50", costs.build(h200, "kernels"), cfg, concurrency=16, prof=h200)
    assert low["mode_share"].get("mb", 0) > 0.5


def test_sglang_knob_policies_launch_the_engine_with_the_flag():
    mfs = make("sglang:min-free-slots=4")
    assert mfs.policy(0.0) is None and mfs.engine == {"min_free_slots_delay": 4}  # stock sglang, no plugin
    pdi = make("sglang:pd-interval=3,min-bs=8")
    assert pdi.policy(0.0) is None
    assert pdi.engine == {"prefill_decode_interval": 3, "prefill_decode_interval_min_bs": 8}
    assert make("v0").engine == {} and make("eb:k=2").engine == {}
    assert policies.split_specs("v0,sglang:pd-interval=2,min-bs=4,mb") == ["v0", "sglang:pd-interval=2,min-bs=4", "mb"]


@pytest.mark.parametrize("bad", ["sglang", "sglang:min-free-slots=4,pd-interval=2", "sglang:min-bs=2",
                                 "sglang:pd-interval=2.5", "sglang:min-free-slots=0", "sglang:foo=1",
                                 "sglang:pd-interval=-1", "sglang:pd-interval=inf"])
def test_bad_knob_policies_are_refused(bad):
    with pytest.raises(ValueError, match=r"policy .sglang"):
        make(bad)


def test_min_free_slots_delay_is_eb_k_without_a_timer(h200, h200_model, sim_run):
    """Two implementations of one rule: sglang's MinFreeSlotsDelayer in the engine's rules, and ebctl's phase
    gate under a fixed EB(k) policy with no defer limit (mixing off, no chunking: prompts fit the budget).
    Both hold fresh prefills while requests run and fewer than k slots are free, so the runs are identical."""
    wl = workloads.load("balanced", 300, seed=0)
    cfg = EngineConfig(max_running=64, token_budget=16384, kv_tokens=200_000)
    knob = sim_run(wl, "sglang:min-free-slots=16", h200_model, cfg, concurrency=128, prof=h200)
    gate = sim_run(wl, "eb:k=16", h200_model, cfg, concurrency=128, prof=h200)
    stock = sim_run(wl, "v0", h200_model, cfg, concurrency=128, prof=h200)
    assert knob["makespan_s"] == gate["makespan_s"] and knob["tok_per_s"] == gate["tok_per_s"]
    assert knob["makespan_s"] != stock["makespan_s"]  # the flag reached the engine
