"""Cost models: the decode context term, the no-β_MB rule, and the MB calibration against measured points."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from ebctl import profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim import interference as calibrate
from ebctl.sim.costs import Batch
from ebctl.sim.engine import EngineConfig


def _decode(ctx, n):
    return Batch(decode_ctx=np.full(n, ctx, dtype=np.int64))


def test_decode_at_context_512_is_the_measured_linear_cost(h200, h200_model):
    c = h200.costs
    for n in (1, 64, 512):
        assert h200_model.step_time(_decode(512, n)) == pytest.approx(c.alpha_d + c.beta_d * n, rel=1e-12)


def test_decode_cost_grows_with_context_as_measured(h200_model):
    t = [h200_model.step_time(_decode(ctx, 512)) for ctx in (128, 512, 2048, 8192)]
    assert t == sorted(t) and len(set(t)) == 4
    # attention kernel: 0.1402 ms at 128 and 1.1462 ms at 2048 per layer for 512 queries, × 36 layers
    assert t[2] - t[0] == pytest.approx((1.1462 - 0.1402) * 1e-3 * 36, rel=1e-9)
    # beyond the table: linear in the context (the last measured slope)
    slope = (1.1462 - 0.5834) / 1024 * 1e-3 * 36
    assert t[3] - t[2] == pytest.approx(slope * 6144, rel=1e-9)


def test_prefill_is_linear_below_the_calibrated_lengths_and_grows_beyond(h200, h200_model):
    c = h200.costs
    short = Batch(chunk_starts=[0], chunk_lens=[2048], prefill_tokens=2048)
    assert h200_model.step_time(short) == pytest.approx(c.alpha_p + c.beta_p * 2048)
    long_chunk = Batch(chunk_starts=[30_000], chunk_lens=[2048], prefill_tokens=2048)
    assert h200_model.step_time(long_chunk) > 1.5 * h200_model.step_time(short)
    plain = costs.build(h200, prefill_attention=False)
    assert plain.step_time(long_chunk) == pytest.approx(c.alpha_p + c.beta_p * 2048)


def test_mixed_without_beta_mb_is_the_sum_minus_alpha_p():
    prof = profiles.load("qwen3-30b-a3b/h200")
    assert not prof.costs.has_mixed
    cm = costs.build(prof)
    p = Batch(chunk_starts=[0], chunk_lens=[1000], prefill_tokens=1000)
    d = _decode(700, 100)
    mixed = Batch(chunk_starts=[0], chunk_lens=[1000], prefill_tokens=1000, decode_ctx=d.decode_ctx)
    assert cm.step_time(mixed) == pytest.approx(cm.step_time(p) + cm.step_time(d) - prof.costs.alpha_p)


def test_mixed_with_beta_mb_costs_more_than_its_parts_minus_alpha_p(h200, h200_model):
    mixed = Batch(chunk_starts=[0], chunk_lens=[1000], prefill_tokens=1000, decode_ctx=np.full(1000, 700))
    parts = (h200_model.step_time(Batch(chunk_starts=[0], chunk_lens=[1000], prefill_tokens=1000))
             + h200_model.step_time(_decode(700, 1000)) - h200.costs.alpha_p)
    assert h200_model.step_time(mixed) > parts * 1.05  # interference at r = 0.5 (φ ≈ 1.4)


def test_linear_model_is_the_papers():
    c = profiles.load("qwen3-8b/h200").costs
    lm = costs.LinearCostModel(c)
    assert lm.step_time(_decode(5000, 10)) == pytest.approx(c.alpha_d + 10 * c.beta_d)
    assert lm.step_time(Batch(prefill_tokens=300)) == pytest.approx(c.alpha_p + 300 * c.beta_p)
    assert lm.step_time(Batch()) == 0.0


def _fit_points():
    raw = json.loads(resources.files("ebctl.data").joinpath("measured_profiles.json").read_text())
    p = next(p for p in raw["profiles"] if p["gpu"] == "H200" and p["model"] == "Qwen/Qwen3-8B")
    return [(f["mu_L"], f["mu_O"], f["tok_per_s_v1"]) for f in p["beta_mb"]["fit_points"]]


@pytest.mark.parametrize(("mu_l", "mu_o", "measured"), _fit_points())
def test_saturated_mb_reproduces_the_measured_vllm_v1_throughput(h200, h200_model, mu_l, mu_o, measured):
    """A saturated mixed-batching run (c = 2,048, vLLM v1 defaults) within 10% of tok_per_s_v1."""
    kv = hardware.kv_capacity_tokens(h200.model, h200.gpu)
    cfg = EngineConfig(rules="vllm", max_running=1024, token_budget=8192, kv_tokens=kv)
    wl = workloads.synthetic(mu_l, mu_o, 5000, seed=11)
    res = runner.run(wl, policies.make("mb", max_running=1024, kv_tokens=kv), h200_model, cfg, concurrency=2048)
    assert res["steady_total_tok_per_s"] == pytest.approx(measured, rel=0.10)
    # and the context-blind sum of exclusive costs (no interference) would not be
    plain = h200_model.with_interference(None)
    res0 = runner.run(wl, policies.make("mb", max_running=1024, kv_tokens=kv), plain, cfg, concurrency=2048)
    if mu_l <= mu_o:
        assert res0["steady_total_tok_per_s"] > measured * 1.10


@pytest.mark.parametrize("name", ["qwen3-8b/h200", "qwen3-8b/rtx-pro-6000"])
def test_stored_calibration_is_current(name):
    """CALIBRATED is what `python -m ebctl.sim.calibrate` computes now (engine or profile changes show here)."""
    prof = profiles.load(name)
    base = costs.ProfileCostModel.from_profile(prof, calibrate=False)
    kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
    stored = calibrate.CALIBRATED[calibrate.fingerprint(base, kv)]
    fresh = calibrate.calibrate_interference(base, kv_tokens=kv)
    assert fresh.knots == pytest.approx(stored[0], rel=1e-9)
    assert fresh.values == pytest.approx(stored[1], rel=1e-6, abs=1e-9)


def test_interference_is_piecewise_linear_and_bounded():
    f = costs.Interference((0.2, 0.5, 0.8), (0.0, 1.0, 4.0))
    assert [f(0.0), f(0.2), f(0.35), f(0.5), f(0.65), f(1.0)] == pytest.approx([0, 0, 0.5, 1, 2.5, 4])
    assert costs.Interference((0.5,), (-3.0,))(0.5) == -1.0
    with pytest.raises(ValueError):
        costs.Interference((0.5, 0.2), (0.0, 1.0))
