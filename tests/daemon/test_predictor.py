"""The daemon's rankings (ebctl/daemon/predictor.py): a real spawned worker ranks a controller's arms on the
profile's costs, off the caller's path; a ranking that fails leaves the search unranked, and close leaves no
process behind."""

from __future__ import annotations

import math
import multiprocessing
import os
import time

import pytest

from ebctl import predict, profiles
from ebctl.controller import Controller
from ebctl.daemon import Daemon
from ebctl.daemon.predictor import Predictor
from ebctl.daemon.records import Engine
from ebctl.params import ControllerParams
from ebctl.sim import costs, runner, workloads
from ebctl.sim.engine import EngineConfig
from ebctl.sim.policies import Auto

PROFILE = "qwen3-8b/h200"


def _served(predictive: bool = True, **params) -> Controller:
    """A controller that has watched a small simulated engine serve 600 requests (no rankings run)."""
    prof = profiles.load(PROFILE)
    ctl = Controller(ControllerParams(**params), prof.costs, engine_id="e", cost_source=f"profile:{prof.name}",
                     predictive=predictive)
    runner.run(workloads.load("azure-conv", 600, seed=0), Auto("default", ctl), costs.build(prof),
               EngineConfig(max_running=64, kv_tokens=60_000), concurrency=128)
    return ctl


def _until(pred, timeout=240.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_a_worker_ranks_the_arms_and_the_tuner_gets_them(fast_cfg):
    ctl = _served()
    engines = {"e": Engine(ctl, b"e", created=0.0)}
    p = Predictor()
    try:
        p.poll(engines, PROFILE, time.monotonic())
        assert ctl.prediction_request() is None  # one at a time: the worker has it
        workers = {c.pid for c in multiprocessing.active_children()}
        assert workers and os.getpid() not in workers
        assert _until(lambda: (p.poll(engines, PROFILE, time.monotonic()), p.counts["ranked"])[1] == 1)
    finally:
        p.close()
    assert _until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers), 10)
    # the worker's figures are the ones this process computes on the same sample and costs: the same served
    # requests (the simulation is deterministic) give the same request
    sample, fits = _served().prediction_request()
    mine = predict.predict(sample, predict.cost_model(costs.build(profiles.load(PROFILE)), fits))
    assert ctl.predictions == mine
    names = {a.name for a in sample.arms}
    assert {"stock", "mb"} <= names and any(n.startswith("eb@") for n in names)
    model = ctl.tuner.status()["model"]
    assert model is not None and model["arms"]["stock"] == 0.0 and set(model["arms"]) == names
    # the exporter has the running arm's predicted gain (the model's own figure for it) and no record yet
    d = Daemon(fast_cfg)
    d.engines["e"] = engines["e"]
    got = d.registry.get_sample_value("ebctl_model_predicted_gain", {"engine": "e"})
    assert got == pytest.approx(model["predicted_vs_stock"])
    assert math.isnan(d.registry.get_sample_value("ebctl_model_mean_abs_error", {"engine": "e"}))


def test_a_ranking_that_fails_leaves_the_search_unranked():
    ctl = _served()
    engines = {"e": Engine(ctl, b"e", created=0.0)}
    p = Predictor()
    try:
        p.poll(engines, "no-such-profile", time.monotonic())
        assert _until(lambda: (p.poll(engines, "no-such-profile", time.monotonic()), p.counts["failed"])[1] == 1)
    finally:
        p.close()
    assert "no-such-profile" in ctl.predict_error and ctl.tuner.predicted == {}
    assert ctl.prediction_request() is None  # asked again only after PREDICT_EVERY more completions


def test_without_a_profile_or_with_predict_off_nothing_is_asked():
    assert _served(predictive=False).prediction_request() is None
    assert _served(predict=False).prediction_request() is None
