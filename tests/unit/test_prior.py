"""The model's record and the trial's test with the prediction as its prior (ebctl/prior.py), on hand-worked
numbers."""

import math

import numpy as np
import pytest

from ebctl import prior
from ebctl.trial import verdict


def test_the_records_error_sd_is_shrunk_towards_the_prior():
    r = prior.Record()
    assert r.n == 0 and r.sd() == pytest.approx(0.03) and math.isnan(r.mean_abs())
    r = r.add(0.02, 0.03).add(0.01, -0.01).add(math.nan, 0.0)  # a NaN figure is not recorded
    # errors +0.01 and −0.02: √((0.0001 + 0.0004 + 2 · 0.03²) / (2 + 2))
    assert r.n == 2 and r.sd() == pytest.approx(math.sqrt(0.0023 / 4)) and r.mean_abs() == pytest.approx(0.015)
    for _ in range(40):
        r = r.add(0.0, 0.0)
    assert r.n == prior.KEEP and r.sd() == pytest.approx(math.sqrt(2 * 0.03**2 / (prior.KEEP + 2)))


def test_a_trusted_prediction_decides_on_one_pair_that_alone_would_not():
    d = np.array([0.01])
    # pair sd shrunk to prior_sd 0.01: s² = 0.0001; the model's sd 0.01: precisions 10,000 + 10,000
    v = prior.judge(d, predicted=0.02, model_sd=0.01, prior_sd=0.01, min_pairs=1, max_pairs=5, min_effect=0.005)
    assert v.effect == pytest.approx(0.015) and v.half_width == pytest.approx(1.96 / math.sqrt(20_000))
    assert v.decision == "win"  # 0.015 − 0.01386 > 0 and 0.015 ≥ ln 1.005
    assert verdict(d, prior_sd=0.01, min_pairs=1, max_pairs=5, min_effect=0.005).decision != "win"
    # a model with a poor record weighs little: precision 100 against 10,000, mean (2 + 100) / 10,100
    weak = prior.judge(d, predicted=0.02, model_sd=0.1, prior_sd=0.01, min_pairs=1, max_pairs=5, min_effect=0.005)
    assert weak.effect == pytest.approx(102 / 10_100) and weak.decision == ""
    # a predicted loss with a pair that agrees: the posterior mean −0.015 ≤ 0 loses
    assert prior.judge(-d, predicted=-0.02, model_sd=0.01, prior_sd=0.01, min_pairs=1, max_pairs=5,
                       min_effect=0.005).decision == "lose"
    # a trusted prediction the pairs contradict: (0.02 · 10,000 − 0.02 · 20,000) / 30,000 < 0: it loses
    assert prior.judge(np.array([-0.02, -0.02]), predicted=0.02, model_sd=0.01, prior_sd=0.01, min_pairs=1,
                       max_pairs=5, min_effect=0.005).decision == "lose"


def test_at_once_needs_a_record_and_a_lead_far_beyond_its_error():
    r = prior.Record()
    assert not prior.at_once(0.5, r, 0.005)  # no record: never
    for _ in range(3):
        r = r.add(0.01, 0.01)
    sd = math.sqrt(2 * 0.03**2 / 5)  # errors 0: the prior alone, weighed 2 against 3 trials
    assert r.sd() == pytest.approx(sd)
    assert prior.at_once(math.log1p(0.005) + 4 * sd + 1e-4, r, 0.005)
    assert not prior.at_once(math.log1p(0.005) + 4 * sd - 1e-4, r, 0.005)
