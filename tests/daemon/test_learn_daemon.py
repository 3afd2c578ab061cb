"""The measured threshold and eb+'s probes as the daemon shows them: status (over the wire) and metrics."""

from __future__ import annotations

import time

import msgspec
import numpy as np
from ebd_helpers import finished, report

from ebctl import config
from ebctl.daemon import Daemon
from ebctl.protocol import BatchKind, ControlRequest, encode


def _saturated_load(d: Daemon, rng: np.random.Generator) -> None:
    """300 iterations, one prefill in four, requests always waiting (probes may run): the prefill and decode
    fits pass, no mixed iteration runs."""
    for s in range(300):
        if s % 4 == 0:
            tok = int(rng.integers(200, 4000))
            r = report("dp0", s, kind=BatchKind.PREFILL, decode_reqs=0, prefill_tokens=tok, prefill_reqs=1,
                       forward_s=(2e-3 + 3e-5 * tok) * rng.normal(1, 0.01), waiting=8)
        else:
            n = int(rng.integers(8, 200))
            r = report("dp0", s, finished(rng, 50.0, 1), decode_reqs=n, waiting=8,
                       forward_s=(9e-3 + 5e-5 * n) * rng.normal(1, 0.01))
        d.ingest(encode(r), time.time(), time.monotonic())


def _status(d: Daemon) -> dict:
    rep = d.handle_control([encode(ControlRequest(op="status"))], time.time())
    assert rep.ok
    msgspec.msgpack.encode(rep)  # it goes over the wire
    return rep.data["engines"]["dp0"]


def test_status_and_metrics_show_the_tuner_and_the_probes(fast_cfg):
    cfg = fast_cfg.with_updates({"controller.mode": "eb+", "controller.theta_method": "measured"})
    d = Daemon(cfg)
    rng = np.random.default_rng(0)
    _saturated_load(d, rng)
    e = _status(d)
    # the tuner starts at stock, warming up; no mb probe although the mixed fit is missing (the search's first
    # trial will be mb's, which measures the same mixed batches): eb+ probes eb for its prefill fit instead
    assert e["theta_method"] == "measured" and e["tuner"]["arm"] == "stock" and e["tuner"]["trials"] == 0
    assert e["tuner"]["incumbent"] == "stock" and e["tuner"]["state"] == "warming up"
    assert "measured: warming up at stock" in e["reason"] and "probe: eb for the prefill cost fit" in e["reason"]
    assert e["mode"] == "eb" and e["probes"]["count"] == 1 and e["probes"]["last_for"] == "prefill"
    reg, lab = d.registry, {"engine": "dp0"}
    assert reg.get_sample_value("ebctl_tuner_arm", {**lab, "kind": "stock"}) == 1.0
    assert reg.get_sample_value("ebctl_tuner_arm", {**lab, "kind": "eb"}) == 0.0
    assert reg.get_sample_value("ebctl_tuner_trials_total", {**lab, "outcome": "won"}) == 0.0
    assert reg.get_sample_value("ebctl_probes_total", lab) == 1.0
    # with the closed forms (no measured search) eb+ probes mb for its mixed cost fit, and shows it
    probing = Daemon(fast_cfg.with_updates({"controller.mode": "eb+", "controller.theta_method": "paper"}))
    _saturated_load(probing, np.random.default_rng(0))
    e = _status(probing)
    assert "probe: mb for the mixed cost fit" in e["reason"]
    assert e["mode"] == "mb" and e["probes"]["count"] == 1 and e["probes"]["active"] == "mb"
    assert e["probes"]["last_for"] == "mixed"
    reg = probing.registry
    assert reg.get_sample_value("ebctl_probes_total", lab) == e["probes"]["count"]
    assert reg.get_sample_value("ebctl_probe_seconds_total", lab) == e["probes"]["seconds"]
    # a daemon without the measured method shows no tuner and exports no tuner gauge
    plain = Daemon(config.load(cfg.path))
    plain.ingest(encode(report("dp0", 0, finished(rng, 50.0, 40))), time.time(), time.monotonic())
    assert plain.registry.get_sample_value("ebctl_tuner_arm", {**lab, "kind": "stock"}) is None
