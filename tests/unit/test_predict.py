"""The model's ranking (ebctl/predict.py): each arm on the engine simulator over the sample's requests, checked
against hand-worked throughputs under the paper's linear costs."""

import math

import pytest

from ebctl import model
from ebctl.predict import ArmSpec, Prediction, Sample, cost_model, gains, predict
from ebctl.protocol import Mode
from ebctl.sim.costs import LinearCostModel


def _sample(arms, *, inputs=(1,), outputs=(100,), c=4, slots=4, requests=400):
    return Sample(inputs, outputs, concurrency=c, slots=slots, kv_tokens=100_000, token_budget=8192,
                  mixed_chunk=False, arms=tuple(arms), requests=requests)


def test_a_decode_bound_engine_runs_at_its_slots_over_the_step_time():
    """Prompts of one token (prefill ~free), outputs of 100, 4 slots, decode steps of 10 ms whatever the batch:
    4 requests in lockstep make 100 tokens each (the first from the prefill) every 99 steps: 400 / 0.99 s."""
    cm = LinearCostModel(model.Costs(alpha_p=1e-6, beta_p=0.0, alpha_d=0.01, beta_d=0.0))
    (p,) = predict(_sample([ArmSpec("stock", Mode.OFF)]), cm)
    assert p.arm == "stock" and p.tok_s == pytest.approx(400 / 0.99, rel=0.02)
    assert p.tpot_p99_s == pytest.approx(0.01, rel=0.01) and p.goodput_tok_s == p.tok_s


def test_mixed_batches_save_the_prefill_intercept_under_the_linear_model():
    """Under the paper's linear model a mixed step costs α_d + β_p·p + β_d·n, the two exclusive steps that much
    plus α_p: with α_p = 50 ms and a prefill per few decode steps, mb must run well ahead of stock. The same sample
    twice gives the same figures (the simulator is deterministic)."""
    cm = LinearCostModel(model.Costs(alpha_p=0.05, beta_p=1e-5, alpha_d=0.01, beta_d=1e-4))
    arms = [ArmSpec("stock", Mode.OFF), ArmSpec("mb", Mode.MB)]
    s = _sample(arms, inputs=(200, 50, 400), outputs=(50, 20, 80), c=64, slots=32, requests=600)
    preds = predict(s, cm)
    assert predict(s, cm) == preds
    g = gains(preds, against="stock")
    assert g["stock"] == 0.0 and g["mb"] > math.log(1.05)
    assert all(math.isfinite(p.ttft_p99_s) and math.isfinite(p.tpot_p99_s) for p in preds)


def test_gains_and_the_cost_model_a_request_names():
    preds = (Prediction("stock", 100.0, 1, 1, 50.0, 1), Prediction("mb", 110.0, 1, 1, 40.0, 1),
             Prediction("eb@4", 0.0, 1, 1, 0.0, 1))
    g = gains(preds, against="stock")
    assert g["mb"] == pytest.approx(math.log(1.1)) and math.isnan(g["eb@4"])
    assert gains(preds, against="stock", goodput=True)["mb"] == pytest.approx(math.log(0.8))
    # under targets an arm meeting none is worth its rate × 1% (slo.FLOOR), as the tuner's windows are
    none = (Prediction("stock", 100.0, 1, 1, 0.0, 1), Prediction("pdi@8", 100.0, 1, 1, 30.0, 1))
    assert gains(none, against="stock", goodput=True)["pdi@8"] == pytest.approx(math.log(30 / 1))
    profile = object()
    assert cost_model(profile, None) is profile
    with pytest.raises(ValueError, match="no costs to predict with"):
        cost_model(None, None)


def test_a_bad_sample_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match=r"as many inputs as outputs.*\(2, 1\)"):
        Sample((1, 2), (3,), concurrency=1, slots=1, kv_tokens=10, token_budget=1, mixed_chunk=False, arms=())
    with pytest.raises(ValueError, match="must be >= 1"):
        _sample([], c=0)
