"""The fleet simulator: smg's routing rules worked by hand from its source (ebctl/sim/gateway.py cites the lines),
what a simulated server answers to a poll, and a small fleet that routes every request exactly once."""

import numpy as np
import pytest

from ebctl import model
from ebctl.protocol import BatchKind, IterationReport
from ebctl.sim import costs, fleet
from ebctl.sim import gateway as gw
from ebctl.sim.engine import EngineConfig
from ebctl.sim.gateway import GatewayParams, WorkerLoad
from ebctl.sim.rules import make_engine

LL = GatewayParams(policy="least_load")
RR = GatewayParams(policy="round_robin")
IDLE = WorkerLoad()


def routes(params, state, k, *, live=None, u=0.0, prompt=100):
    """The workers of ``k`` requests in a row, and the state after them."""
    out = []
    for _ in range(k):
        r, state = gw.route(params, state, prompt_tokens=prompt, live=live or [0] * state.n, u=u)
        out.append(r.worker)
    return out, state


# --- least_load's score, by hand from least_load.rs:191-203 and :225-231 ---------------------------------------

def test_score_terms_by_hand():
    # A: 3,000 queued tokens reported, 1,500 tok/s, half the KV used: 3000/1500 + 0.15·0.5/0.5 = 2.15 s
    assert gw.score(LL, WorkerLoad(waiting_reqs=3, waiting_uncached_tokens=3000, token_usage=0.5,
                                   gen_throughput=1500.0), 0) == pytest.approx(2.15)
    # B: no token count but 2 waiting (2 × p̄ = 2,048), no throughput (the 2,000 tok/s default), KV 0.2:
    # 2048/2000 + 0.15·0.2/0.8 = 1.024 + 0.0375
    b = WorkerLoad(waiting_reqs=2, token_usage=0.2)
    assert gw.score(LL, b, 0) == pytest.approx(1.0615)
    assert gw.score(LL, b, 1024) == pytest.approx((2048 + 1024) / 2000 + 0.0375)  # credit adds to the queue
    # C: KV full is clamped to 0.999: 0.15 · 0.999 / 0.001 = 149.85
    assert gw.score(LL, WorkerLoad(token_usage=1.0, gen_throughput=4000.0), 0) == pytest.approx(149.85)
    # the weight and the defaults are parameters
    p = GatewayParams(kv_pressure_weight=0.0, default_throughput=1000.0, mean_prefill_tokens=512)
    assert gw.score(p, b, 0) == pytest.approx(2 * 512 / 1000)


def test_least_load_water_fills_by_credit_until_the_next_poll():
    # A scores 2.15, B 1.0615 (above); each request sent to B credits p̄ = 1,024 tokens:
    # B 1.5735, 2.0855 (< 2.15, B again), then 2.5975 (> 2.15): A; A is then 2.15 + 1024/1500 = 2.8327 > 2.5975: B
    a = WorkerLoad(waiting_reqs=3, waiting_uncached_tokens=3000, token_usage=0.5, gen_throughput=1500.0)
    b = WorkerLoad(waiting_reqs=2, token_usage=0.2)
    s = gw.poll(LL, gw.start(2), [a, b])
    got, s = routes(LL, s, 5)
    assert got == [1, 1, 1, 0, 1]
    assert s.credit == (1024, 4 * 1024)
    # the next poll (same loads: stale view refreshed) resets every credit, so B is ahead again
    s = gw.poll(LL, s, [a, b])
    assert s.credit == (0, 0) and routes(LL, s, 1)[0] == [1]


def test_least_load_credits_the_prompt_when_the_router_knows_its_tokens():
    # gRPC / input_ids: the credit is the prompt's 500 tokens: B 1.0615, 1.3115, 1.5615, 1.8115, 2.0615, then
    # 2.3115 > 2.15: the sixth goes to A
    p = GatewayParams(policy="least_load", tokens_known=True)
    a = WorkerLoad(waiting_reqs=3, waiting_uncached_tokens=3000, token_usage=0.5, gen_throughput=1500.0)
    s = gw.poll(p, gw.start(2), [a, WorkerLoad(waiting_reqs=2, token_usage=0.2)])
    got, s = routes(p, s, 6, prompt=500)
    assert got == [1, 1, 1, 1, 1, 0] and s.credit == (500, 2500)


def test_stale_loads_an_idle_looking_worker_takes_requests_until_credit_catches_up():
    # the poll saw A with 10,240 queued tokens at 2,000 tok/s (5.12 s) and B idle: between polls, whatever the
    # servers do, B takes requests while 0.512·k < 5.12, i.e. the first 10; the 11th is an exact tie, drawn by u
    a = WorkerLoad(waiting_reqs=5, waiting_uncached_tokens=10240, gen_throughput=2000.0)  # 5 < 8: not vetoed
    s = gw.poll(LL, gw.start(2), [a, IDLE])
    got, s = routes(LL, s, 10)
    assert got == [1] * 10
    assert gw.route(LL, s, prompt_tokens=1, live=[0, 0], u=0.0)[0].worker == 0  # ties in index order: u < 1/2
    assert gw.route(LL, s, prompt_tokens=1, live=[0, 0], u=0.5)[0].worker == 1
    # a poll that now shows both idle: equal scores again, and credits from zero
    s = gw.poll(LL, s, [IDLE, IDLE])
    assert routes(LL, s, 1, u=0.9)[0] == [1] and routes(LL, s, 1, u=0.1)[0] == [0]


def test_least_load_before_any_poll_is_join_shortest_queue_and_one_worker_gets_no_credit():
    s = gw.start(3)
    r, s2 = gw.route(LL, s, prompt_tokens=10, live=[3, 1, 1], u=0.0)
    assert r == gw.Route(1, False) and s2.credit == (0, 1024, 0)
    assert gw.route(LL, s, prompt_tokens=10, live=[3, 1, 1], u=0.7)[0].worker == 2
    # overload veto leaves one worker: the policy returns it without crediting (least_load.rs:377-380)
    s = gw.poll(LL, gw.start(3), [WorkerLoad(waiting_reqs=8), IDLE, WorkerLoad(token_usage=0.8)])
    r, s2 = gw.route(LL, s, prompt_tokens=10, live=[0, 0, 0], u=0.0)
    assert r == gw.Route(1, False) and s2.credit == (0, 0, 0)


# --- round_robin and the overload veto ----------------------------------------------------------------------

def test_round_robin_cycles_over_the_available_workers():
    s = gw.start(3)
    got, s = routes(RR, s, 7)
    assert got == [0, 1, 2, 0, 1, 2, 0] and s.counter == 7
    # worker 1 reported 8 waiting: the counter goes on over [0, 2]: 7 % 2 = 1 → 2, 8 % 2 = 0 → 0, then 2
    s = gw.poll(RR, s, [IDLE, WorkerLoad(waiting_reqs=8), IDLE])
    assert routes(RR, s, 3)[0] == [2, 0, 2]


def test_overload_thresholds_are_inclusive_and_either_signal_vetoes():
    assert not gw.overloaded(RR, WorkerLoad(waiting_reqs=7, token_usage=0.7999))
    assert gw.overloaded(RR, WorkerLoad(waiting_reqs=8))
    assert gw.overloaded(RR, WorkerLoad(token_usage=0.8))
    off = GatewayParams(policy="round_robin", overload_waiting_reqs=None, overload_token_usage=None)
    assert not off.protection
    s = gw.poll(off, gw.start(2), [WorkerLoad(waiting_reqs=100, token_usage=1.0)] * 2)
    assert s.overloaded == (False, False)


def test_all_vetoed_goes_to_the_fewest_in_flight_without_asking_the_policy():
    full = WorkerLoad(waiting_reqs=9, waiting_uncached_tokens=9000, token_usage=0.9)
    for p in (RR, LL):
        s = gw.poll(p, gw.start(3), [full] * 3)
        r, s2 = gw.route(p, s, prompt_tokens=10, live=[5, 2, 4], u=0.0)
        assert r == gw.Route(1, True) and s2 == s  # no counter step, no credit
        assert gw.route(p, s, prompt_tokens=10, live=[2, 5, 2], u=0.6)[0] == gw.Route(2, True)


def test_params_are_checked():
    with pytest.raises(ValueError):
        GatewayParams(policy="cache_aware")
    with pytest.raises(ValueError):
        GatewayParams(poll_interval_s=0)
    with pytest.raises(ValueError):
        GatewayParams(overload_waiting_reqs=0)
    with pytest.raises(ValueError):
        gw.poll(LL, gw.start(2), [IDLE])


# --- what a simulated server reports ------------------------------------------------------------------------

def _report(kind: BatchKind, decode: int, t: float) -> IterationReport:
    return IterationReport(engine_id="x", seq=0, wall_time=t, forward_s=0.1, kind=kind, decode_reqs=decode)


def test_gen_throughput_ticks_every_40_decode_batches_and_goes_stale():
    m = fleet.Meter()
    for k in range(1, 40):
        m = fleet.meter_step(m, _report(BatchKind.DECODE, 10, 0.1 * k))
    m = fleet.meter_step(m, _report(BatchKind.PREFILL, 0, 3.95))  # not a decode batch: neither counts nor ticks
    assert fleet.meter_read(m, 3.95) == 0.0
    m = fleet.meter_step(m, _report(BatchKind.DECODE, 10, 4.0))  # the 40th: 400 tokens over 4.0 s
    assert fleet.meter_read(m, 4.0) == pytest.approx(100.0) and m.tokens == 0 and m.tic == 4.0
    assert fleet.meter_read(m, 34.0) == pytest.approx(100.0) and fleet.meter_read(m, 34.01) == 0.0


def test_load_report_counts_the_queue_and_the_chunked_rest():
    cm = costs.LinearCostModel(model.Costs(alpha_p=0.01, beta_p=1e-4, alpha_d=0.01, beta_d=1e-3))
    e = make_engine(EngineConfig(max_running=8, token_budget=100, kv_tokens=1000), cm)
    for n_in in (150, 40, 30):
        e.add(n_in, 5, 0.0)
    assert fleet.load_report(e, fleet.Meter(), 0.0) == WorkerLoad(3, 220, 0.0, 0.0)
    r = e.step(0.0)  # 100 of the 150-token prompt: the other two wait, 50 tokens of it still to prefill
    assert fleet.load_report(e, fleet.Meter(), r.wall_time) == WorkerLoad(2, 40 + 30 + 50, 0.1, 0.0)


# --- a small fleet ------------------------------------------------------------------------------------------

CPU = costs.LinearCostModel(model.Costs(alpha_p=8e-3, beta_p=4e-5, alpha_d=12e-3, beta_d=4e-4))
SMALL = EngineConfig(max_running=16, token_budget=256, kv_tokens=16384)


def _requests(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(10, 200, n), rng.integers(1, 40, n)


@pytest.mark.parametrize("router", gw.POLICIES)
@pytest.mark.parametrize("servers", ["v0", "default"])
def test_every_request_is_routed_once_and_all_complete_at_low_load(router, servers):
    arrivals = fleet.poisson(20.0, 20.0, seed=1)  # ~400 requests over 20 s on 3 servers of ~17 req/s each
    ins, outs = _requests(arrivals.size, 2)
    cfg = fleet.FleetConfig(instances=3, servers=servers, gateway=GatewayParams(policy=router, poll_interval_s=2),
                            engine=SMALL, horizon_s=30.0)
    res = fleet.run(arrivals, ins, outs, cfg, CPU)
    where = np.array(res["where"])
    assert res["arrived"] == res["routed"] == arrivals.size == where.size and where.min() >= 0
    assert res["completed"] == arrivals.size and res["no_first_token"] == 0 and res["stalled"] == 0
    per = np.bincount(where, minlength=3)
    assert per.min() > 0  # every server got some
    if router == "round_robin":
        assert per.max() - per.min() <= 1  # nothing vetoed at this load: a plain cycle
    assert res["output_tok_s"] * cfg.horizon_s == pytest.approx(outs.sum())  # every output token made by T


def test_one_poll_at_t0_leaves_least_load_water_filling_on_credit_alone():
    # the poll interval outlasts the run: the only loads ever seen are t = 0's (all idle, no throughput), so
    # every score is credit / 2,000 and least_load sends the requests out evenly, whatever the servers do
    arrivals = fleet.poisson(30.0, 10.0, seed=3)
    ins, outs = _requests(arrivals.size, 4)
    cfg = fleet.FleetConfig(instances=4, gateway=GatewayParams(policy="least_load", poll_interval_s=1000),
                            engine=SMALL, horizon_s=10.0)
    per = np.bincount(fleet.run(arrivals, ins, outs, cfg, CPU)["where"], minlength=4)
    assert per.sum() == arrivals.size and per.max() - per.min() <= 1


def test_the_horizon_stops_the_run_and_what_waits_is_counted():
    arrivals = np.array([0.0, 0.5, 3.0])  # the third arrives after T
    cfg = fleet.FleetConfig(instances=2, gateway=RR, engine=SMALL, horizon_s=1.0)
    res = fleet.run(arrivals, np.array([50, 50, 50]), np.array([1000, 2, 2]), cfg, CPU)
    assert res["arrived"] == 2 and res["where"] == [0, 1]
    assert res["completed"] == 1  # the 1,000-token answer is still running at T
    with pytest.raises(ValueError):
        fleet.run(np.array([1.0, 0.0]), np.array([5, 5]), np.array([5, 5]), cfg, CPU)
