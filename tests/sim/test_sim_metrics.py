"""Metrics from a hand-made request table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ebctl.sim import metrics
from ebctl.sim.policies import ModeChange


def test_summarize_by_hand():
    req = {"arrival": np.array([0.0, 0.0, 1.0]), "first_token": np.array([1.0, 2.0, 3.0]),
           "finish": np.array([11.0, 2.0, 5.0]), "input_len": np.array([10, 20, 30]),
           "output_len": np.array([11, 1, 3]), "reason": np.array(["stop", "stop", "stop"])}
    res = metrics.summarize(req, np.array([0.5, 1.0, 1.0, 2.0]), slo_ttft=1.5, slo_tpot=0.9)
    assert res["makespan_s"] == 11.0
    assert res["tok_per_s"] == pytest.approx(15 / 11) and res["total_tok_per_s"] == pytest.approx(75 / 11)
    assert res["ttft_s"]["p50"] == 2.0 and res["ttft_s"]["mean"] == pytest.approx(5 / 3)
    assert res["tpot_s"]["p50"] == pytest.approx(1.0)  # (10/10, —, 2/2)
    # SLOs: request 0 TTFT 1 ok, TPOT 1.0 > 0.9; request 1 TTFT 2 > 1.5; request 2 TTFT 2 > 1.5
    assert res["goodput_frac"] == 0.0 and res["goodput_tok_per_s"] == 0.0
    res = metrics.summarize(req, np.zeros(0), slo_ttft=2.0, slo_tpot=1.0)
    assert res["goodput_frac"] == 1.0 and math.isnan(res["itl_s"]["p99"])
    assert res["goodput_tok_per_s"] == pytest.approx(15 / 11)  # all three within: 11 + 1 + 3 tokens over 11 s
    # each request's longest gap between tokens, for those with two or more: 4 s and 1.5 s
    res = metrics.summarize({**req, "max_gap": np.array([4.0, 0.0, 1.5])}, np.zeros(0), slo_ttft=2.0, slo_tpot=1.0)
    assert res["max_gap_s"]["p50"] == pytest.approx(2.75) and res["max_gap_s"]["mean"] == pytest.approx(2.75)


def test_mode_shares():
    tl = [ModeChange(0.0, "off", 1, 8), ModeChange(2.0, "eb", 1, 8), ModeChange(6.0, "mb", 1, 8)]
    assert metrics.mode_shares(tl, 10.0) == pytest.approx({"off": 0.2, "eb": 0.4, "mb": 0.4})
    assert metrics.mode_shares([], 5.0) == {}


def test_jsonable_is_strict():
    out = metrics.jsonable({"a": math.nan, "b": [np.float64(1.5), np.int64(2)], "c": math.inf})
    assert out == {"a": None, "b": [1.5, 2], "c": None}
