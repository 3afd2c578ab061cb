"""Cost models: the kernel terms (decode context, long prompts), the overheads every iteration pays, the
interference bound read off the kernel table, the IterationCosts model, and which model a profile gets."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from ebctl import profiles
from ebctl.costmodel import IterationCosts, PhaseCost
from ebctl.sim import costs, gpucost
from ebctl.sim.costs import Batch


def _decode(ctx, n):
    return Batch(decode_ctx=np.full(n, ctx, dtype=np.int64))


@pytest.fixture(scope="module")
def kernels(h200):
    return costs.build(h200, "kernels")


def test_decode_at_context_512_is_the_measured_linear_cost(h200, kernels):
    c = h200.costs
    for n in (1, 64, 512):
        assert kernels.step_time(_decode(512, n)) == pytest.approx(c.alpha_d + c.beta_d * n, rel=1e-12)


def test_decode_cost_grows_with_context_as_measured(kernels):
    t = [kernels.step_time(_decode(ctx, 512)) for ctx in (128, 512, 2048, 8192)]
    assert t == sorted(t) and len(set(t)) == 4
    # attention kernel: 0.1402 ms at 128 and 1.1462 ms at 2048 per layer for 512 queries, × 36 layers
    assert t[2] - t[0] == pytest.approx((1.1462 - 0.1402) * 1e-3 * 36, rel=1e-9)
    # beyond the table: linear in the context (the last measured slope)
    slope = (1.1462 - 0.5834) / 1024 * 1e-3 * 36
    assert t[3] - t[2] == pytest.approx(slope * 6144, rel=1e-9)


def test_prefill_is_linear_below_the_calibrated_lengths_and_grows_beyond(h200, kernels):
    c = h200.costs
    short = Batch(chunk_starts=[0], chunk_lens=[2048], prefill_tokens=2048)
    assert kernels.step_time(short) == pytest.approx(c.alpha_p + c.beta_p * 2048)
    long_chunk = Batch(chunk_starts=[30_000], chunk_lens=[2048], prefill_tokens=2048)
    assert kernels.step_time(long_chunk) > 1.5 * kernels.step_time(short)
    plain = costs.build(h200, "kernels", prefill_attention=False)
    assert plain.step_time(long_chunk) == pytest.approx(c.alpha_p + c.beta_p * 2048)


def test_every_kind_pays_the_overheads(h200, kernels):
    o = gpucost.Overheads(iter_s=2e-3, req_s=3e-5, interference=0.5, switch_s=4e-3)
    cm = kernels.with_overheads(o)
    pre = Batch(chunk_starts=[0, 0], chunk_lens=[300, 200], prefill_tokens=500, switched=True)
    dec = _decode(700, 100)
    mixed = Batch(chunk_starts=[0], chunk_lens=[300], prefill_tokens=300, decode_ctx=dec.decode_ctx)
    # by hand: kernels + 2 ms + 30 µs per request (+ 4 ms for a switch)
    assert cm.step_time(pre) == pytest.approx(kernels.step_time(pre) + 2e-3 + 2 * 3e-5 + 4e-3)
    assert cm.step_time(dec) == pytest.approx(kernels.step_time(dec) + 2e-3 + 100 * 3e-5)
    # mixed: the prompt's and the rows' kernels with one α_d, + φ × the rows' attention at context 700
    attention = 100 * float(kernels.attention(700))
    parts = (kernels.step_time(Batch(chunk_starts=[0], chunk_lens=[300], prefill_tokens=300))
             + kernels.step_time(dec) - h200.costs.alpha_p)
    assert kernels.step_time(mixed) == pytest.approx(parts)
    assert cm.step_time(mixed) == pytest.approx(parts + 2e-3 + 101 * 3e-5 + 0.5 * attention)
    with pytest.raises(ValueError, match="req_s"):
        gpucost.Overheads(req_s=-1.0)
    with pytest.raises(ValueError, match="overlap"):
        gpucost.Overheads(overlap=1.5)


@pytest.mark.parametrize("n", [20, 400])
def test_the_overlap_hides_the_smaller_of_the_fixed_cost_and_the_batch_work(h200, kernels, n):
    # by hand from the profile: a decode step at context 512 is α_d (fixed) + n·β_d (the batch's work);
    # ω = 1 is the roofline max of the two, ω = 0.5 hides half of the smaller one
    c = h200.costs
    fixed, work = c.alpha_d, n * c.beta_d
    dec = _decode(512, n)
    assert kernels.with_overheads(gpucost.Overheads(overlap=1.0)).step_time(dec) == pytest.approx(max(fixed, work))
    half = kernels.with_overheads(gpucost.Overheads(overlap=0.5)).step_time(dec)
    assert half == pytest.approx(fixed + work - 0.5 * min(fixed, work))
    pre = Batch(chunk_starts=[0], chunk_lens=[4 * n], prefill_tokens=4 * n)  # prefill-only: α_p is the fixed part
    assert kernels.with_overheads(gpucost.Overheads(overlap=1.0)).step_time(pre) == \
        pytest.approx(max(c.alpha_p, 4 * n * c.beta_p))


def test_interference_bound_is_the_worst_measured_mixing_slowdown():
    # RTX PRO 6000, 10% of 512 requests are 2,048-token prompts: mixed 17.7767 ms; apart, 51 prompts at
    # 0.1976 ms and 461 decodes at context 2,048 (2.8957 ms for 512): the largest slowdown in the table
    apart = 2.8957 * 461 / 512
    want = (17.7767 - 51 * 0.1976 - apart) / apart
    assert gpucost.interference_bound("RTX-PRO-6000") == pytest.approx(want, rel=1e-9)
    assert 1.5 < gpucost.interference_bound("H200") < 2.5
    assert gpucost.interference_bound("B300") == 0.0  # no kernel table: no evidence of interference


def test_linear_model_is_the_papers():
    c = profiles.load("qwen3-8b/h200").costs
    lm = costs.LinearCostModel(c)
    assert lm.step_time(_decode(5000, 10)) == pytest.approx(c.alpha_d + 10 * c.beta_d)
    assert lm.step_time(Batch(prefill_tokens=300)) == pytest.approx(c.alpha_p + 300 * c.beta_p)
    assert lm.step_time(Batch()) == 0.0


def test_iteration_cost_model_prices_each_kind_with_its_phase_cost():
    ic = IterationCosts(prefill=PhaseCost(intercept_s=1e-3, prefill_token_s=1e-5, switched_s=5e-4),
                        decode=PhaseCost(intercept_s=2e-3, decode_req_s=1e-4, decode_ctx_token_s=1e-7))
    cm = costs.IterationCostModel(ic)
    assert cm.step_time(Batch(chunk_starts=[0], chunk_lens=[100], prefill_tokens=100, switched=True)) == \
        pytest.approx(1e-3 + 100e-5 + 5e-4)
    assert cm.step_time(_decode(300, 10)) == pytest.approx(2e-3 + 10e-4 + 3000e-7)
    # no mixed cost: prefill part + decode part, one intercept (the smaller dropped)
    mixed = Batch(chunk_starts=[0], chunk_lens=[100], prefill_tokens=100, decode_ctx=np.full(10, 300))
    assert cm.step_time(mixed) == pytest.approx(2e-3 + 100e-5 + 10e-4 + 3000e-7)
    with pytest.raises(ValueError, match="decode"):
        costs.IterationCostModel(IterationCosts(prefill=ic.prefill))


def test_which_model_a_profile_gets(h200):
    cm = costs.build(h200)
    stored = json.loads(resources.files("ebctl.data").joinpath("sim_overheads.json").read_text())
    assert cm.overheads == gpucost.Overheads(**stored["gpus"]["H200"]["overheads"])
    assert costs.build(profiles.load("llama-3.1-8b/h200")).overheads == gpucost.Overheads()  # not fitted
    assert costs.describe(costs.build(profiles.load("llama-3.1-8b/h200")))["name"] == "kernels only"
    with pytest.raises(ValueError, match="cost model"):
        costs.build(h200, "magic")


def test_a_profile_from_tune_calibrate_is_priced_with_its_iteration_costs():
    ic = IterationCosts(prefill=PhaseCost(intercept_s=1e-3), decode=PhaseCost(intercept_s=2e-3))
    prof = profiles.Profile(name="calibrated-dp0", model="m", gpu="g", costs=profiles.load("qwen3-8b/h200").costs,
                            iteration_costs=ic)
    cm = costs.build(prof)
    assert isinstance(cm, costs.IterationCostModel) and "forward" in cm.name
    assert cm.step_time(_decode(100, 3)) == pytest.approx(2e-3)


def test_a_noisy_machine_prices_every_policy_on_the_same_path_with_the_stated_spread():
    """The path depends on the seed alone (a longer one keeps the start of a shorter one); the white part of
    sd 0.3 per 1-s cell averages to 0.3/√10 = 0.095 over 10 s; the AR(1) drift has the stated sd and, one
    correlation time apart, a correlation of about e^−1; an iteration's time is the base time × e^x(t), its
    clock the busy time priced so far."""
    import math

    from ebctl import model
    from ebctl.sim.costs import Batch, LinearCostModel, NoisyCostModel

    base = LinearCostModel(model.Costs(alpha_p=0.0, beta_p=0.0, alpha_d=0.5, beta_d=0.0))
    a, b = NoisyCostModel(base, seed=3), NoisyCostModel(base, seed=3)
    assert a.log_speed(10_000.0) == b.log_speed(10_000.0)
    short = NoisyCostModel(base, seed=3)
    assert [short.log_speed(t) for t in range(100)] == [a.log_speed(t) for t in range(100)]
    assert NoisyCostModel(base, seed=4).log_speed(5.0) != a.log_speed(5.0)

    white = NoisyCostModel(base, white=0.3, drift=0.0, seed=1)
    x = np.array([white.log_speed(t) for t in range(200_000)])
    assert np.std(x.reshape(-1, 10).mean(axis=1)) == pytest.approx(0.3 / math.sqrt(10), rel=0.03)
    drift = NoisyCostModel(base, white=0.0, drift=0.05, tau_s=300.0, seed=2)
    y = np.array([drift.log_speed(t) for t in range(300_000)])
    assert np.std(y) == pytest.approx(0.05, rel=0.1)
    assert np.corrcoef(y[:-300], y[300:])[0, 1] == pytest.approx(math.exp(-1), abs=0.08)

    m = NoisyCostModel(base, seed=5)
    decode = Batch(decode_ctx=np.array([10]))
    t1 = m.step_time(decode)
    assert t1 == pytest.approx(0.5 * math.exp(m.log_speed(0.0))) and m.clock == pytest.approx(t1)
    t2 = m.step_time(decode)
    assert t2 == pytest.approx(0.5 * math.exp(m.log_speed(t1))) and m.clock == pytest.approx(t1 + t2)
    assert m.step_time(Batch()) == 0.0 and m.clock == pytest.approx(t1 + t2)
