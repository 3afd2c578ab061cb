"""The daemon core's per-engine rules: one process per engine id, the gate's reasons and the auto
anti-starvation clock in status and metrics, and `tune` values across reloads and restarts."""

from __future__ import annotations

import json
import math
import time

import msgspec
import numpy as np
import pytest
from ebd_helpers import finished, report, write_config

from ebctl import config, model
from ebctl.daemon import Daemon
from ebctl.daemon.control import TUNED_FILE
from ebctl.protocol import ControlRequest, encode


def control(d: Daemon, op: str, **args):
    return d.handle_control([encode(ControlRequest(op=op, args=args))], time.time())


@pytest.fixture
def core(fast_cfg) -> Daemon:
    return Daemon(fast_cfg)


def test_a_second_process_on_one_engine_id_is_refused_until_the_first_falls_silent(core):
    ttl = core.cfg.controller.ttl_s
    assert core.ingest(encode(report("e0", 0, instance="aaaa")), 1.0, 100.0) is not None
    core.ingest(encode(report("e0", 1, instance="aaaa")), 1.0, 100.1)
    assert core.ingest(encode(report("e0", 0, instance="bbbb")), 1.0, 100.2) is None  # a second launch: refused
    eng = core.engines["e0"]
    assert (eng.instance, eng.duplicates, core.counters.rejected["duplicate"], eng.controller.seen.reports) == \
        ("aaaa", 1, 1, 2)
    # The first process falls silent for a policy lifetime (an engine restart): the new one takes the id over.
    core.ingest(encode(report("e0", 0, instance="bbbb")), 1.0, 100.1 + ttl + 0.01)
    assert (eng.instance, eng.controller.seen.reports, eng.last_seq) == ("bbbb", 3, 0)
    st = control(core, "status").data["engines"]["e0"]
    assert st["duplicate_reports"] == 1


def test_gate_reasons_reach_status_and_metrics(core):
    core.ingest(encode(report("e0", 0, gate_reasons={"threshold": 18, "starvation": 2, "idle": 5, "wait_k": 40},
                              group_size=2)), 1.0, 1.0)
    st = control(core, "status").data["engines"]["e0"]
    assert st["refills"] == {"threshold": 18, "starvation": 2, "idle": 5}
    assert st["threshold_share"] == pytest.approx(18 / 20)  # idle refills are neither the threshold nor the clock
    assert st["group_size"] == 2
    reg = core.registry
    assert reg.get_sample_value("ebctl_gate_decisions_total", {"engine": "e0", "reason": "wait_k"}) == 40
    assert reg.get_sample_value("ebctl_group_size", {"engine": "e0"}) == 2


def test_auto_anti_starvation_clock_is_four_expected_refill_waits(fast_cfg):
    """max_defer_s = 0: the policy's clock is defer_factor × ζ(k/N)/p0 decode steps × the measured step time,
    computed here from the published p̂0, k and N and the step time the reports carry."""
    cfg = fast_cfg.with_updates({"controller.max_defer_s": 0, "controller.defer_factor": 4})
    d = Daemon(cfg)
    rng = np.random.default_rng(3)
    for s in range(200):
        d.ingest(encode(report("e0", s, finished(rng, 50.0, 1), decode_reqs=64, forward_s=0.02)), 1.0, 1.0)
    pol = d.engines["e0"].controller.policy
    assert pol.version > 0 and pol.estimates is not None
    expected = 4 * model.zeta(pol.k / pol.n_max) / pol.estimates.p0 * 0.02
    assert pol.max_defer_s == pytest.approx(expected, rel=1e-6)
    assert 0 < pol.max_defer_s < 5.0  # the old fixed clock was 5 s
    fixed = Daemon(cfg.with_updates({"controller.max_defer_s": 7.5}))
    for s in range(200):
        fixed.ingest(encode(report("e0", s, finished(rng, 50.0, 1), forward_s=0.02)), 1.0, 1.0)
    assert fixed.engines["e0"].controller.policy.max_defer_s == 7.5  # an operator's value overrides


def test_tuned_keys_survive_a_reload_that_leaves_them_alone_and_a_resumed_restart(tmp):
    path = write_config(tmp / "ebctl.toml", tmp / "rt", controller={"theta_max": 0.8, "delta": 0.0})
    cfg = config.load(str(path))
    (tmp / "rt").mkdir(mode=0o700)
    d = Daemon(cfg)
    assert control(d, "tune", updates={"controller.theta_max": "0.6", "controller.delta": "0.001"}).ok
    assert control(d, "status").data["daemon"]["tuned"] == {"controller.theta_max": 0.6, "controller.delta": 0.001}
    # The file changes delta (and something else), not theta_max: theta_max stays tuned, delta is the file's.
    write_config(path, tmp / "rt", controller={"theta_max": 0.8, "delta": 0.002, "theta_min": 0.02})
    r = control(d, "reload")
    assert r.ok, r.error
    assert (d.cfg.controller.theta_max, d.cfg.controller.delta, d.cfg.controller.theta_min) == (0.6, 0.002, 0.02)
    assert r.data["tuned_kept"] == ["controller.theta_max"]
    assert r.data["tuned_replaced_by_file"] == ["controller.delta"]
    assert json.loads((tmp / "rt" / TUNED_FILE).read_text()) == {"controller.theta_max": 0.6}
    # A supervisor's restart resumes them; a plain start does not.
    assert Daemon(config.load(str(path)), resume=True).cfg.controller.theta_max == 0.6
    assert Daemon(config.load(str(path))).cfg.controller.theta_max == 0.8
    # Tuning a key back to the file's value un-tunes it.
    assert control(d, "tune", updates={"controller.theta_max": "0.8"}).ok
    assert control(d, "status").data["daemon"]["tuned"] == {}


def test_a_saved_tuned_key_that_no_longer_validates_is_skipped(tmp):
    path = write_config(tmp / "ebctl.toml", tmp / "rt")
    (tmp / "rt").mkdir(mode=0o700)
    (tmp / "rt" / TUNED_FILE).write_text(json.dumps({"controller.theta_max": 7, "controller.delta": 0.003,
                                                     "daemon.runtime_dir": "/elsewhere"}))
    d = Daemon(config.load(str(path)), resume=True)
    assert d.tuned == {"controller.delta": 0.003}
    assert d.cfg.controller.delta == 0.003 and not math.isclose(d.cfg.controller.theta_max, 7)


def test_calibrate_carries_the_whole_iteration_periods_for_the_simulator(core):
    """The daemon's fit is of forward passes; the simulator needs whole iterations (the gaps between
    consecutive reports). Reports whose period is 3 ms + 0.2 ms per decode request while the forward is only
    60% of it: the profile's sim section recovers the period's model, not the forward's."""
    rng = np.random.default_rng(5)
    t = 1000.0
    for seq in range(1500):
        if seq % 10 == 0:
            tok = int(rng.integers(100, 2000))
            period, kind_kw = 0.004 + 2e-6 * tok, {"kind": "prefill", "decode_reqs": 0, "prefill_tokens": tok,
                                                    "prefill_reqs": 2}
        else:
            n = int(rng.integers(4, 64))
            period, kind_kw = 0.003 + 2e-4 * n, {"decode_reqs": n, "decode_ctx_tokens": n * int(rng.integers(50, 500))}
        t += period
        r = report("e0", seq, finished(rng, 50.0, 1), forward_s=0.6 * period, **kind_kw)
        core.ingest(encode(msgspec.structs.replace(r, wall_time=t)), t, 1.0)
    reply = control(core, "calibrate")
    assert reply.ok, reply.error
    dec = reply.data["sim"]["iteration_costs"]["decode"]
    assert dec["intercept_s"] == pytest.approx(0.003, rel=0.05)
    assert dec["decode_req_s"] == pytest.approx(2e-4, rel=0.05)
    assert reply.data["sim"]["fit"]["decode"]["ok"]
    assert reply.data["iteration_costs"]["decode"]["decode_req_s"] == pytest.approx(0.6 * 2e-4, rel=0.05)
