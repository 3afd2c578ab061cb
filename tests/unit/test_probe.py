"""eb+'s probes of the other mode (ebctl/probe.py, the controller's use of them) and the controller's measured
threshold wiring (policy versions bound to arms, stock first, status). Expected values are the probe's rules
worked by hand: start, length, spacing from its share, never during a cooldown."""

import dataclasses

import numpy as np
import pytest

from ebctl.controller import Controller, ControllerParams
from ebctl.costfit import OnlineCosts
from ebctl.probe import ModeProbe
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode


def test_probe_lasts_probe_s_and_keeps_to_its_share():
    pr = ModeProbe(probe_s=2.0, share=0.1)
    assert pr.decide(0.0, Mode.MB, "", False) is None  # nothing needed
    assert pr.decide(1.0, Mode.MB, "mixed", True) is None  # a mode switch is cooling down
    assert pr.decide(1.0, Mode.MB, "mixed", False) is Mode.MB  # starts
    assert pr.decide(2.9, None, "", False) is Mode.MB  # goes on for 2 s, whatever is asked meanwhile
    assert pr.decide(3.0, Mode.MB, "mixed", False) is None  # ended
    # the next one no earlier than 2 s / 0.1 = 20 s after the last one started
    assert pr.decide(20.9, Mode.MB, "mixed", False) is None
    assert pr.decide(21.0, Mode.MB, "mixed", False) is Mode.MB
    pr.stop(22.5)
    st = pr.status(41.0)
    assert st["count"] == 2 and st["seconds"] == pytest.approx(2.0 + 1.5) and st["active"] == ""
    assert st["share"] == pytest.approx(3.5 / 41.0) and st["last_for"] == "mixed"
    # the prefill fit is fed by eb; no target, no probe; probe_s = 0: none
    assert ModeProbe(probe_s=1.0, share=0.5).decide(0.0, Mode.EB, "prefill", False) is Mode.EB
    assert ModeProbe().decide(0.0, None, "mixed", False) is None
    assert ModeProbe(probe_s=0.0).decide(0.0, Mode.MB, "mixed", False) is None


def _it(kind, t, *, prefill=0, decode=0, forward=0.01, finished=(), waiting=5):
    return IterationReport(engine_id="e", seq=0, wall_time=t, forward_s=forward, kind=kind, prefill_tokens=prefill,
                           prefill_reqs=1 if prefill else 0, decode_reqs=decode, decode_ctx_tokens=decode * 100,
                           running=decode, waiting=waiting, finished=finished)


def test_costfit_says_when_a_fit_is_missing_or_stale():
    oc = OnlineCosts(200)
    rng = np.random.default_rng(0)
    for i in range(100):
        n = int(rng.integers(10, 200))
        oc.observe(_it(BatchKind.DECODE, float(i), decode=n, forward=0.01 + 1e-4 * n))
    oc.refit(force=True)
    assert oc.missing(BatchKind.DECODE, 100.0, 600.0) == ""
    assert oc.missing(BatchKind.DECODE, 99.0 + 601.0, 600.0) == "decode fit stale (no decode iteration for 601 s)"
    assert oc.missing(BatchKind.MIXED, 100.0, 600.0).startswith("mixed fit missing (0 iterations < 20")


def _drive(ctl, t0, steps, *, kind=BatchKind.DECODE, waiting=5, alpha_d=0.01):
    """EB-like traffic, saturated unless ``waiting`` is 0: decode steps (intercept ``alpha_d``) with one completion
    each, a prefill every 10, timed."""
    rng = np.random.default_rng(1)
    t, pol = t0, ctl.policy
    for i in range(steps):
        n = int(rng.integers(50, 200))
        if i % 10 == 0:
            tok = int(rng.integers(500, 4000))
            t += 0.002 + 2e-5 * tok
            ctl.observe(_it(BatchKind.PREFILL, t, prefill=tok, forward=0.002 + 2e-5 * tok, waiting=waiting))
        t += alpha_d + 1e-4 * n
        ctl.observe(_it(kind, t, decode=n, forward=alpha_d + 1e-4 * n, waiting=waiting,
                        finished=(FinishedRequest(300, int(rng.geometric(0.01))),)))
        pol = ctl.update(t)
    return pol, t


def test_eb_plus_probes_mb_while_the_mixed_fit_is_missing_then_returns():
    prm = ControllerParams(mode="eb+", theta_method="paper", update_every=20, min_window=10, probe_s=2.0,
                           probe_share=0.05, mode_cooldown=0)
    ctl = Controller(prm)
    pol, t = _drive(ctl, 0.0, 400)  # the decode and prefill fits pass; no mixed iteration ever ran
    assert ctl.online_costs.passed(BatchKind.DECODE) and not ctl.online_costs.passed(BatchKind.MIXED)
    st = ctl.probe.status(t)
    assert st["count"] >= 1 and st["last_for"] == "mixed"
    # probing runs MB for 2 s, then EB again until 2 / 0.05 = 40 s after the probe started
    ctl.steer.probe = type(ctl.probe)(2.0, 0.05)
    pol = ctl.update(t)
    assert pol.mode is Mode.MB and "probe: mb for the mixed cost fit" in pol.reason
    pol = ctl.update(t + 2.5)
    assert pol.mode is Mode.EB
    assert ctl.update(t + 39.0).mode is Mode.EB and ctl.update(t + 42.5).mode is Mode.MB
    # no probe in plain eb, none while a switch cools down
    plain = Controller(dataclasses.replace(prm, mode="eb"))
    _drive(plain, 0.0, 400)
    cooling = Controller(dataclasses.replace(prm, mode_cooldown=10**6))
    cooling.carry = cooling.carry._replace(updates_since_switch=0)  # a switch just happened
    _drive(cooling, 0.0, 400)
    assert plain.probe.count == 0 and cooling.probe.count == 0
    # nor below saturation (nobody waits): the same traffic with an empty queue; then one iteration in ten
    # with a queue (under the 90% a probe needs), then a queue on every one
    idle = Controller(prm)
    _, t = _drive(idle, 0.0, 400, waiting=0)
    assert idle.online_costs.passed(BatchKind.DECODE) and not idle.online_costs.passed(BatchKind.MIXED)
    assert idle.probe.count == 0 and idle.seen.waiting_share.value == 0.0
    for i in range(400):
        idle.observe(_it(BatchKind.DECODE, t + 0.02 * i, decode=100, forward=0.02, waiting=5 if i % 10 == 0 else 0))
    assert idle.update(t + 8.0).mode is not Mode.MB and idle.probe.count == 0
    _, t = _drive(idle, t + 8.0, 400)
    assert idle.probe.count >= 1 and idle.seen.waiting_share.value > 0.9


def test_no_mb_probe_while_the_decode_intercept_is_not_identified():
    """The same traffic with decode steps that cost 1e-4 s per request and nothing per step: the decode fit
    passes, but its intercept is under 1% of the mean step, so Eq. 3 and Eq. 8 stay on the profile's costs
    (Eq. 8 takes the three online fits or none) and a probe for the mixed fit would buy nothing. None runs: on
    simulated RTX PRO 6000, dist-shift phase 1, three such probes cost eb+ 1% of the phase's throughput."""
    prm = ControllerParams(mode="eb+", theta_method="paper", update_every=20, min_window=10, probe_s=2.0,
                           probe_share=0.05, mode_cooldown=0)
    ctl = Controller(prm)
    _drive(ctl, 0.0, 400, alpha_d=0.0)
    oc = ctl.online_costs
    assert oc.passed(BatchKind.DECODE) and oc.passed(BatchKind.PREFILL) and not oc.intercept_identified()
    assert ctl.probe.count == 0 and "not identified" in ctl.status()["cost_reason"]


def test_measured_starts_at_stock_and_binds_each_policy_version_to_its_arm():
    ctl = Controller(ControllerParams(mode="eb", theta_method="measured", update_every=20, min_window=10))
    pol, t = _drive(ctl, 0.0, 200)
    assert pol.mode is Mode.OFF and "measured: warming up at stock" in pol.reason
    assert ctl.tuner._versions[pol.version].arm == "stock"
    st = ctl.status()
    assert st["theta_method"] == "measured" and st["tuner"]["incumbent"] == "stock"
    assert st["tuner"]["trials"] == 0
    # a challenger the tuner picks is published at once, with a new version bound to it
    ctl.tuner.steady, ctl.tuner.saturated = True, True
    ctl.tuner.trial = None
    ctl.tuner._run("eb@4")
    pol2 = ctl.update(t + 0.001)
    assert pol2.version == pol.version + 1 and pol2.mode is Mode.EB
    assert ctl.tuner._versions[pol2.version].arm == "eb@4" and pol2.k == int(0.4 * pol2.n_max)
    assert pol2.estimates.theta_star == pytest.approx(0.4)


def _drive_mixed(ctl, t0, steps):
    """A stock server with mixed chunks, saturated: every prompt is mixed into the decode batch, so no
    prefill-only iteration runs; a mixed step every 5, decode steps with one completion each."""
    rng = np.random.default_rng(2)
    t = t0
    for i in range(steps):
        n = int(rng.integers(50, 200))
        if i % 5 == 0:
            tok = int(rng.integers(100, 1000))
            f = 0.01 + 1e-4 * n + 2e-5 * tok
            t += f
            ctl.observe(IterationReport(engine_id="e", seq=0, wall_time=t, forward_s=f, kind=BatchKind.MIXED,
                                        prefill_tokens=tok, prefill_reqs=2, decode_reqs=n, decode_ctx_tokens=n * 100,
                                        running=n, waiting=5))
        t += 0.01 + 1e-4 * n
        ctl.observe(_it(BatchKind.DECODE, t, decode=n, forward=0.01 + 1e-4 * n,
                        finished=(FinishedRequest(300, int(rng.geometric(0.01))),)))
        ctl.update(t)
    return t


def test_a_fit_that_never_passed_is_probed_during_a_trial_a_stale_one_waits():
    """The real CPU server's case (docs/results/learn_real.md): under stock with mixed chunks only an EB probe feeds
    the prefill fit, and the tuner's first trial can outlast the load. A missing fit is probed in the trial,
    which pauses (its window in progress dropped, the arm settles again) and goes on; a stale fit waits."""
    prm = ControllerParams(mode="eb+", theta_method="measured", update_every=20, min_window=10, probe_s=2.0,
                           probe_share=0.05, mode_cooldown=0, cost_stale_s=60.0)
    ctl = Controller(prm)
    t = _drive_mixed(ctl, 0.0, 400)
    oc = ctl.online_costs
    assert oc.passed(BatchKind.DECODE) and oc.passed(BatchKind.MIXED) and not oc.passed(BatchKind.PREFILL)
    ctl.steer.probe = ModeProbe(2.0, 0.05)  # whatever probed so far: a fresh budget
    ctl.tuner.trial, ctl.tuner.settling = None, 0
    ctl.tuner.ref_lns = [8.0, 8.0, 8.0]  # the incumbent's steady windows (MIN_REF): its noise is known
    ctl.tuner._start_trial(type("W", (), {"arm": "x", "end": t, "saturated": False})())
    trial = ctl.tuner.trial
    # this server mixes on its own (stock ran MIXED steps): mb is its stock, and the first challenger is EB
    assert trial is not None and ctl.tuner.stock_mixes and trial.challenger.startswith("eb@")
    pol = ctl.update(t + 0.01)
    assert pol.mode is Mode.EB and "probe: eb for the prefill cost fit" in pol.reason
    assert ctl.tuner.trial is trial and ctl.tuner.window is None and ctl.tuner.settling == 2  # stock: 2
    # the probe's decode steps (the gate holds the queue at N) do not count as the engine's own admission limit
    reach = ctl.tuner.reach
    for i in range(50):
        ctl.observe(IterationReport(engine_id="e", seq=0, wall_time=t + 0.02 + 0.01 * i, forward_s=0.01,
                                    kind=BatchKind.DECODE, decode_reqs=3, decode_ctx_tokens=300, running=3,
                                    waiting=50, policy_version=pol.version))
    assert ctl.tuner.reach == reach or (np.isnan(reach) and np.isnan(ctl.tuner.reach))
    # the trial's arm again: its first window, A0, is the incumbent's (stock)
    assert ctl.update(t + 2.5).mode is Mode.OFF and ctl.tuner.arm == "stock" and ctl.tuner.trial is trial
    # one pause per trial: 40 s later the probe budget allows another and the fit still has not passed, but the
    # trial, which drops windows at every pause, runs on
    assert not oc.passed(BatchKind.PREFILL)
    assert ctl.update(t + 45.0).mode is Mode.OFF and ctl.probe.count == 1 and ctl.tuner.trial is trial
    # stale fits (passed, their last iteration long ago) are not probed while a trial runs, and are after it
    stale = Controller(prm)
    t = _drive(stale, 0.0, 400)[1]
    t = _drive_mixed(stale, t, 400)
    stale.online_costs.refit(force=True)
    assert all(stale.online_costs.passed(k) for k in (BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED))
    t += 61.0
    assert stale.online_costs.missing(BatchKind.PREFILL, t, 60.0).startswith("prefill fit stale")
    stale.steer.probe = ModeProbe(2.0, 0.05)
    stale.tuner.ref_lns = [8.0, 8.0, 8.0]
    stale.tuner._start_trial(type("W", (), {"arm": "x", "end": t, "saturated": False})())
    assert stale.update(t).mode is not Mode.EB and stale.probe.count == 0
    stale.tuner._end_trial("aborted", "test")
    pol = stale.update(t + 0.01)  # every fit is stale by now; the mixed one is probed first
    assert pol.mode is Mode.MB and "probe: mb for the mixed cost fit" in pol.reason


def test_with_latency_targets_no_probe_before_the_first_trial_nor_in_a_trial_nor_after():
    """The same server with latency targets: the prefill fit stays missing, and yet no eb probe runs before the
    measured search's first trial (it would drop the incumbent's next two whole windows, and put off the trial
    that checks an arm against the targets), nor while a trial runs, nor between trials (an EB challenger's
    refills feed the fit; a probe's refills stall every running request's decoding); nor an mb probe where every
    fit is stale between trials (the test above probes mb there without targets)."""
    prm = ControllerParams(mode="eb+", theta_method="measured", update_every=20, min_window=10, probe_s=2.0,
                           probe_share=0.05, mode_cooldown=0, slo_ttft_s=1.0, slo_tpot_s=0.015)
    ctl = Controller(prm)
    t = _drive_mixed(ctl, 0.0, 400)
    oc = ctl.online_costs
    assert oc.passed(BatchKind.DECODE) and oc.passed(BatchKind.MIXED) and not oc.passed(BatchKind.PREFILL)
    assert ctl.seen.waiting_share.value > 0.9  # saturated: without targets a probe would have run (test above)
    assert ctl.tuner.counts["trials"] == 0 and ctl.probe.count == 0
    ctl.tuner.trial, ctl.tuner.settling = None, 0
    ctl.tuner.ref_lns = [8.0, 8.0, 8.0]
    ctl.tuner._start_trial(type("W", (), {"arm": "x", "end": t, "saturated": False})())
    assert ctl.tuner.trial is not None
    assert ctl.update(t + 0.01).mode is not Mode.EB and ctl.probe.count == 0
    ctl.tuner._end_trial("aborted", "test")
    pol = ctl.update(t + 0.02)
    assert pol.mode is not Mode.EB and "probe" not in pol.reason and ctl.probe.count == 0
    assert ctl.tuner.trial is None and not ctl.online_costs.passed(BatchKind.PREFILL)  # between trials, still missing
    stale = Controller(dataclasses.replace(prm, cost_stale_s=60.0))
    t = _drive(stale, 0.0, 400)[1]
    t = _drive_mixed(stale, t, 400)
    stale.online_costs.refit(force=True)
    t += 61.0
    assert stale.online_costs.missing(BatchKind.MIXED, t, 60.0).startswith("mixed fit stale")
    stale.steer.probe = ModeProbe(2.0, 0.05)
    stale.tuner.ref_lns = [8.0, 8.0, 8.0]
    stale.tuner._start_trial(type("W", (), {"arm": "x", "end": t, "saturated": False})())
    stale.tuner._end_trial("aborted", "test")
    pol = stale.update(t + 0.01)
    assert pol.mode is not Mode.MB and "probe" not in pol.reason and stale.probe.count == 0
