"""The data-parallel simulator: hand-worked forwards, sglang's dispatch rules, the paper's §3.2 queueing
result, and SBS's direction on the DP+EP model."""

import numpy as np
import pytest

from ebctl.costmodel import IterationCosts, PhaseCost
from ebctl.sbs.types import RankLoad, SbsParams
from ebctl.sim.dp import costs as dpcosts
from ebctl.sim.dp import decode
from ebctl.sim.dp.dispatch import RoundRobin, TotalTokens
from ebctl.sim.dp.ranks import Req
from ebctl.sim.dp.run import DpConfig, poisson, run


def linear(alpha: float, beta: float) -> IterationCosts:
    return IterationCosts(prefill=PhaseCost(intercept_s=alpha, prefill_token_s=beta))


def test_lockstep_forward_lasts_as_long_as_the_slowest_rank():
    # round-robin puts 100 tokens on rank 0 and 20 on rank 1; one forward: max(0.01 + 0.1, 0.01 + 0.02)
    cfg = DpConfig(ranks=2, mode="attention", chunk=100, costs=linear(0.01, 0.001))
    m = run(np.array([0.0, 0.0]), np.array([100, 20]), "round-robin", cfg)
    assert m["ttft_s"]["mean"] == pytest.approx(0.11) and m["forwards"] == 1
    assert m["chunk_util"] == pytest.approx(120 / 200)
    assert m["load_spread"] == pytest.approx(100 / 60)
    assert m["barrier_wait"] == pytest.approx(0.08 / (0.11 + 0.03 + 0.08))  # rank 1 waits 0.08 of 0.22 s
    plain = run(np.array([0.0, 0.0]), np.array([100, 20]), "round-robin", DpConfig(
        ranks=2, mode="plain", chunk=100, costs=linear(0.01, 0.001)))
    assert plain["ttft_s"]["mean"] == pytest.approx((0.11 + 0.03) / 2)  # independent ranks


def test_instances_run_their_lockstep_forwards_independently():
    # 2 instances × 2 ranks, round-robin: ranks 0-3 get 100, 20, 50, 50 tokens at t = 0. Instance 0's
    # forward lasts max(0.11, 0.03), instance 1's max(0.06, 0.06); rank 1 waits 0.08 at the barrier.
    cfg = DpConfig(ranks=2, instances=2, mode="attention", chunk=100, costs=linear(0.01, 0.001))
    m = run(np.zeros(4), np.array([100, 20, 50, 50]), "round-robin", cfg)
    assert m["forwards"] == 2 and m["ttft_s"]["mean"] == pytest.approx((0.11 * 2 + 0.06 * 2) / 4)
    assert m["chunk_util"] == pytest.approx((120 / 200 + 100 / 200) / 2)
    assert m["barrier_wait"] == pytest.approx(0.08 / (0.11 + 0.03 + 0.06 + 0.06 + 0.08))
    assert m["busy_share"] == pytest.approx((0.11 + 0.06) / (2 * 0.11))  # instance 1 idles after 0.06 s
    with pytest.raises(ValueError, match="instances=2"):
        DpConfig(ranks=2, instances=2, mode="plain")


@pytest.mark.parametrize("instances", [1, 3])
def test_chunk_utilisation_is_offered_tokens_over_forwards(instances):
    # every prompt token is prefilled once, so the mean over forwards is Σ tokens / (forwards · ranks · chunk)
    cfg = DpConfig(ranks=4, instances=instances, chunk=1024)
    tokens = np.random.default_rng(5).integers(1, 3000, size=800)
    for policy in ("round-robin", "total-tokens", "sbs"):
        m = run(poisson(10.0 * instances, 800, seed=6), tokens, policy, cfg)
        assert m["chunk_util"] == pytest.approx(tokens.sum() / (m["forwards"] * 4 * 1024))


def test_chunked_prefill_splits_a_long_prompt():
    cfg = DpConfig(ranks=1, mode="plain", chunk=100, costs=linear(0.0, 0.001))
    m = run(np.array([0.0]), np.array([250]), "sbs", cfg)
    assert m["forwards"] == 3 and m["ttft_s"]["mean"] == pytest.approx(0.25)  # 100 + 100 + 50 tokens


def test_round_robin_cycles():
    rr = RoundRobin(3)
    assert [rr.arrive(Req(i, 0.0, 1), 0.0)[0][1] for i in range(5)] == [0, 1, 2, 0, 1]


def test_total_tokens_is_sglangs_dp_budget():
    tt = TotalTokens(2)
    tt.end_forward(0, 0.9, 1.0, [RankLoad(0, 1.0, total_tokens=500), RankLoad(1, 1.0, total_tokens=100)])
    assert tt.arrive(Req(0, 1.0, 300), 1.0)[0][1] == 1  # refreshed: 100 < 500, then rank 1 counts 400
    assert tt.arrive(Req(1, 1.01, 200), 1.01)[0][1] == 1  # no refresh within 20 ms: 400 < 500 → 600
    assert tt.arrive(Req(2, 1.015, 10), 1.015)[0][1] == 0  # 500 < 600
    # rank 0 publishes again (its timestamp moved); rank 1 does not: its speculative 600 survives
    tt.end_forward(0, 1.0, 1.02, [RankLoad(0, 1.02, total_tokens=100), RankLoad(1, 1.0, total_tokens=100)])
    assert tt.arrive(Req(3, 1.03, 10), 1.03)[0][1] == 0
    assert tt.total_tokens == [110, 600]


def test_the_papers_queueing_result_t_over_2n():
    """§3.2: N gated instances of constant service time T, always busy. Immediate dispatch waits T/2 in
    the device; staggered releases every T/N wait T/(2N) at the scheduler. TTFT = wait + T."""
    n_inst, t = 4, 0.1
    cfg = DpConfig(ranks=n_inst, mode="plain", chunk=10**6, costs=linear(t, 0.0),
                   sbs=SbsParams(t_default_s=t, l_net_s=0.0))
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 20, 4000))  # 200/s: five per instance and forward
    tokens = np.full(4000, 100)
    rr = run(arrivals, tokens, "round-robin", cfg)["ttft_s"]["mean"]
    sbs = run(arrivals, tokens, "sbs", cfg)["ttft_s"]["mean"]
    assert rr == pytest.approx(t + t / 2, rel=0.03)
    assert sbs == pytest.approx(t + t / (2 * n_inst), rel=0.03)


@pytest.mark.parametrize("ranks", [8, 16])
def test_sbs_beats_total_tokens_on_mean_ttft_under_dp_attention(ranks):
    # the DP+EP model at about 60% of its full-chunk capacity, prompts like the paper's (at most 3K)
    cfg = DpConfig(ranks=ranks, mode="attention")
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 2000, size=3000)
    full = cfg.chunk * ranks / cfg.costs.prefill.predict(prefill_tokens=cfg.chunk, prefill_reqs=1)
    arrivals = poisson(0.6 * full / tokens.mean(), 3000, seed=2)
    tt = run(arrivals, tokens, "total-tokens", cfg)
    sbs = run(arrivals, tokens, "sbs", cfg)
    assert sbs["ttft_s"]["mean"] < tt["ttft_s"]["mean"]
    assert sbs["engine_wait_s"]["mean"] < 1e-3 < tt["engine_wait_s"]["mean"]  # no queueing in the device


def test_sbs_staggers_across_instances_like_the_paper():
    # the paper's deployment (three lockstep instances of 8 ranks) at about half of the full-chunk
    # capacity: staggered releases cut the wait behind a running forward (§3.2: T/2 → T/(2N)), so the
    # gain is the paper's order (30-40%), not the few percent of one instance
    cfg = DpConfig(ranks=8, instances=3)
    tokens = np.random.default_rng(1).integers(50, 2000, size=3000)
    full = 3 * cfg.chunk * 8 / cfg.costs.prefill.predict(prefill_tokens=cfg.chunk, prefill_reqs=1)
    arrivals = poisson(0.5 * full / tokens.mean(), 3000, seed=2)
    tt = run(arrivals, tokens, "total-tokens", cfg)["ttft_s"]["mean"]
    sbs = run(arrivals, tokens, "sbs", cfg)["ttft_s"]["mean"]
    assert sbs < 0.85 * tt


def test_every_request_finishes_once_under_each_policy():
    cfg = DpConfig(ranks=3, mode="plain", chunk=512)
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, 3000, size=500)
    arrivals = poisson(40.0, 500, seed=4)
    for policy in ("round-robin", "total-tokens", "sbs"):
        m = run(arrivals, tokens, policy, cfg)
        assert m["requests"] == 500 and m["ttft_s"]["p50"] > 0
        assert m["prompt_tok_per_s"] == pytest.approx(tokens.sum() / (m["requests"] / m["req_per_s"]))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="mode='tp'"):
        DpConfig(mode="tp")
    with pytest.raises(ValueError, match="sorted"):
        run(np.array([1.0, 0.0]), np.array([1, 1]), "sbs", DpConfig(ranks=1))
    with pytest.raises(ValueError, match="unknown dispatch policy 'fast'"):
        run(np.array([0.0]), np.array([1]), "fast", DpConfig(ranks=1))


def test_dpep_costs_scale_the_moe_profile():
    from ebctl import profiles
    p = profiles.load("qwen3-30b-a3b/h200").costs
    compute = dpcosts.named("dpep-compute").prefill
    assert compute.intercept_s == p.alpha_p
    assert compute.prefill_token_s == pytest.approx(p.beta_p * 37 / 4 / 3.3)
    paper = dpcosts.named("dpep").prefill  # × the slowdown the paper's Table 1 implies
    assert paper.predict(prefill_tokens=3072) == pytest.approx(5.8 * compute.predict(prefill_tokens=3072))
    assert dpcosts.named("qwen3-8b/h200").prefill.prefill_token_s == profiles.load("qwen3-8b/h200").costs.beta_p


def test_decode_pool_by_hand():
    # 2 units, KV 20 tokens each, three requests of 10 + 2 tokens at t = 0, step = 0.01 + 0.001·B.
    # rr and Algorithm 3 both place r0 → unit 0, r1 → unit 1, r2 → unit 0 (B ties → lowest unit), where
    # it waits: 12 + 12 > 20. Steps 1-2 (0.011 each) finish r0 and r1; r2 runs in steps 3-4.
    cost = PhaseCost(intercept_s=0.01, decode_req_s=0.001)
    for policy in ("round-robin", "sbs"):
        m = decode.run(np.zeros(3), np.full(3, 10), np.full(3, 2), policy, units=2, kv_tokens=20, cost=cost)
        assert m["steps"] == 4 and m["out_tok_per_s"] == pytest.approx(6 / 0.044)
        assert m["queue_wait_s"] == pytest.approx(0.022 / 3) and m["tpot_s"] == pytest.approx(0.011)
    with pytest.raises(ValueError, match="exceeds kv_tokens=10"):
        decode.run(np.zeros(3), np.full(3, 10), np.full(3, 2), "sbs", units=2, kv_tokens=10, cost=cost)


def test_cli_dp_json_and_errors():
    import json

    import typer
    from typer.testing import CliRunner

    from ebctl.sim import cli

    app = typer.Typer()
    app.command()(cli.simulate)
    runner = CliRunner()
    r = runner.invoke(app, ["--dp", "2", "--rate", "20", "--requests", "200", "--workload", "azure-conv", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [x["policy"] for x in out["results"]] == ["round-robin", "total-tokens", "sbs"]
    assert out["ranks"] == 2 and out["mode"] == "attention" and all(x["requests"] == 200 for x in out["results"])
    r = runner.invoke(app, ["--dp", "2", "--instances", "2", "--rate", "20", "--requests", "200", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["instances"] == 2
    r = runner.invoke(app, ["--dp", "2", "--instances", "2", "--dp-mode", "plain", "--rate", "20"])
    assert r.exit_code == 2 and "instances=2" in r.output
    r = runner.invoke(app, ["--dp", "2", "--rate", "20", "--requests", "50", "--dispatch", "fast"])
    assert r.exit_code == 2 and "'fast'" in r.output and "round-robin, total-tokens, sbs" in r.output
    r = runner.invoke(app, ["--dp", "2", "--requests", "50", "--workload", "balanced"])  # no timestamps, no rate
    assert r.exit_code == 2 and "open loop needs arrival times" in r.output
