"""The daemon's SBS side (ebctl/daemon/dispatch.py): T̄_fwd per rank from the iteration reports, the DP
controller's dispatcher records, its policy (versioned, tuned live, published on the real sockets), status
and metrics."""

from __future__ import annotations

import time

import pytest
from ebd_helpers import report, wait_for

from ebctl import config
from ebctl.daemon import Daemon
from ebctl.link import EngineLink
from ebctl.protocol import BatchKind, ControlRequest, DispatchPolicy, DispatchReport, RankDispatch, encode


def rep(did: str = "dispatch", instance: str = "i1", **kw) -> DispatchReport:
    return DispatchReport(engine_id=did, instance=instance, wall_time=time.time(), **kw)


@pytest.fixture
def core(fast_cfg) -> Daemon:
    return Daemon(fast_cfg.with_updates({"dispatch.mode": "sbs", "dispatch.l_net_s": "0.002"}))


def test_t_fwd_is_each_ranks_window_mean_and_the_policy_their_mean(core):
    """dp0 forwards 0.01, 0.02, 0.03 (mean 0.02), dp1 0.04 (an idle step and another node's rank left out):
    T̄_fwd = (0.02 + 0.04)/2 = 0.03; with 2 targets, I_opt = (0.03 + 0.002)/2 = 0.016."""
    for seq, (eid, f, kind) in enumerate([("dp0", 0.01, BatchKind.DECODE), ("dp0", 0.02, BatchKind.PREFILL),
                                          ("dp0", 0.03, BatchKind.DECODE), ("dp1", 0.04, BatchKind.DECODE),
                                          ("dp1", 0.5, BatchKind.IDLE), ("n1/dp0", 0.9, BatchKind.DECODE)]):
        core.ingest(encode(report(eid, seq, kind=kind, forward_s=f)), 1.0, 1.0)
    rec = core.ingest(encode(rep(targets=2)), 1.0, 1.0)
    assert rec is core.dispatch.dispatchers["dispatch"]  # a new dispatcher: publish now
    pol = core.dispatch.policy(rec, core.cfg, 5.0)
    assert pol.mode == "sbs" and pol.t_fwd_by_rank == pytest.approx({0: 0.02, 1: 0.04})
    assert pol.t_fwd_s == pytest.approx(0.03) and pol.interval_s == pytest.approx(0.016)
    assert (pol.ttl_s, pol.l_net_s, pol.issued_at, pol.reason) == (core.cfg.controller.ttl_s, 0.002, 5.0, "")
    assert core.dispatch.policy(rec, core.cfg, 6.0).version == pol.version  # same content, same version
    core.ingest(encode(report("dp1", 9, forward_s=0.07)), 1.0, 1.0)
    assert core.dispatch.policy(rec, core.cfg, 7.0).version == pol.version + 1  # T̄_fwd moved


def test_the_window_is_fwd_window_and_follows_a_tune(core):
    for seq in range(100):
        core.ingest(encode(report("dp0", seq, forward_s=0.01 if seq < 90 else 0.05)), 1.0, 1.0)
    rec = core.ingest(encode(rep()), 1.0, 1.0)
    assert core.dispatch.policy(rec, core.cfg, 1.0).t_fwd_s == pytest.approx((54 * 0.01 + 10 * 0.05) / 64)
    reply = core.handle_control([encode(ControlRequest(op="tune", args={"updates": {"dispatch.fwd_window": "10"}}))],
                                2.0)
    assert reply.ok, reply.error
    assert core.dispatch.policy(rec, core.cfg, 2.0).t_fwd_s == pytest.approx(0.05)


def test_before_any_forward_t_default_is_used_and_said(core):
    rec = core.ingest(encode(rep()), 1.0, 1.0)
    pol = core.dispatch.policy(rec, core.cfg, 1.0)
    assert pol.t_fwd_s == core.cfg.dispatch.t_default_s == 0.1
    assert "no rank reported a forward yet: T̄_fwd = dispatch.t_default_s (0.1 s)" in pol.reason


def test_a_prefixed_dispatcher_pairs_with_its_own_ranks_only(core):
    core.ingest(encode(report("n1/dp3", 0, forward_s=0.2)), 1.0, 1.0)
    core.ingest(encode(report("dp3", 0, forward_s=0.9)), 1.0, 1.0)
    rec = core.ingest(encode(rep("n1/dispatch")), 1.0, 1.0)
    assert core.dispatch.policy(rec, core.cfg, 1.0).t_fwd_by_rank == {3: pytest.approx(0.2)}


def test_bad_dispatcher_ids_are_refused_and_counted(core):
    before = core.counters.rejected["validation"]
    assert core.ingest(encode(rep("dispatcher")), 1.0, 1.0) is None
    assert core.ingest(encode(rep("x/dispatchy")), 1.0, 1.0) is None
    assert core.counters.rejected["validation"] == before + 2 and not core.dispatch.dispatchers


def test_a_new_process_on_the_id_is_published_to_at_once_and_counted(core):
    assert core.ingest(encode(rep(instance="a")), 1.0, 1.0) is not None
    assert core.ingest(encode(rep(instance="a", seq=1)), 1.0, 1.0) is None
    rec = core.ingest(encode(rep(instance="b")), 1.0, 1.0)
    assert rec is not None and rec.restarts == 1


def test_status_shows_the_dispatcher(core):
    core.ingest(encode(rep(state="sbs", buffered=3, released=40, releases=20, load_spread=1.25,
                           rank=(RankDispatch(0, 22, 800), RankDispatch(1, 18, 700)))), 1.0, time.monotonic())
    reply = core.handle_control([encode(ControlRequest(op="status"))], 1.0)
    st = reply.data["dispatchers"]["dispatch"]
    assert (st["state"], st["buffered"], st["released"], st["releases"], st["load_spread"]) == ("sbs", 3, 40, 20, 1.25)
    assert st["rank"][1][:3] == [1, 18, 700] and st["reports"] == 1 and st["policy"] is None


def test_the_policy_reaches_the_dispatchers_link_and_a_tune_changes_it(spawn, tmp):
    """Real sockets: the plugin's link (EngineLink with DispatchPolicy) reports, the daemon publishes; ``tune
    dispatch.mode=off`` is published at once (a new version), not left to the republish timer: the daemon serves
    one control request per turn of its loop and publishes what a tune changed right after replying, so the
    status asked for next already shows the new policy as the one published; the link then receives it."""
    d = spawn(None, "--set", "dispatch.mode=sbs", "--set", "daemon.republish_s=500", "--set", "controller.ttl_s=600")
    link = EngineLink.from_config(d.cfg, "dispatch", policy_type=DispatchPolicy)
    try:
        def polled() -> DispatchPolicy | None:
            link.report(rep(instance=link.instance))
            return link.policy(time.monotonic())
        p = wait_for(polled, 10, "a dispatch policy")
        assert p.mode == "sbs" and p.engine_id == "dispatch" and p.ttl_s == 600.0
        with d.client() as c:
            assert c.request("tune", updates={"dispatch.mode": "off"}).ok
            st = c.request("status").data["dispatchers"]["dispatch"]  # the next request the daemon serves
        assert st["policy"]["mode"] == "off" and st["policy"]["version"] > p.version and st["reports"] >= 1
        p2 = wait_for(lambda: (q := link.policy(time.monotonic())) is not None and q.mode == "off" and q, 10,
                      "mode off")  # the deadline only bounds a hang
        assert p2.version == st["policy"]["version"]
    finally:
        link.close()


def test_metrics_per_dispatcher(inproc_daemon):
    d = inproc_daemon
    d.ingest(encode(rep(state="sbs", buffered=4, arrived=10, released=6, releases=3, passed=2, watchdog_fired=1,
                        interval_s=0.01, rank=(RankDispatch(0, 4, 100, in_flight_tokens=30), RankDispatch(1, 2, 50)))),
             time.time(), time.monotonic())
    val = d.registry.get_sample_value
    assert val("ebctl_dispatch_buffered", {"dispatcher": "dispatch"}) == 4
    assert val("ebctl_dispatch_sbs", {"dispatcher": "dispatch"}) == 1
    assert val("ebctl_dispatch_requests_total", {"dispatcher": "dispatch", "how": "released"}) == 6
    assert val("ebctl_dispatch_requests_total", {"dispatcher": "dispatch", "how": "passed"}) == 2
    assert val("ebctl_dispatch_rank_requests_total", {"dispatcher": "dispatch", "rank": "1"}) == 2
    assert val("ebctl_dispatch_rank_in_flight_tokens", {"dispatcher": "dispatch", "rank": "0"}) == 30
    assert val("ebctl_dispatch_watchdog_firings_total", {"dispatcher": "dispatch"}) == 1
    assert val("ebctl_dispatch_interval_seconds", {"dispatcher": "dispatch"}) == pytest.approx(0.01)


def test_drain_ranks_are_validated_and_published_sorted(core):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, {"dispatch.drain_ranks": "1,a"})
    assert "dispatch.drain_ranks='1,a'" in str(e.value) and "'a' is not a DP rank" in str(e.value)
    core.cfg = core.cfg.with_updates({"dispatch.drain_ranks": " 3, 1,3"})
    rec = core.ingest(encode(rep()), 1.0, 1.0)
    assert core.dispatch.policy(rec, core.cfg, 1.0).drain_ranks == (1, 3)


def test_status_view_shows_a_dispatcher_in_80_columns():
    from rich.console import Console

    from ebctl.cli.view import status_view
    st = {"state": "stock", "layout": "plain", "ranks": 2, "buffered": 0, "buffered_max": 12, "released": 1234,
          "releases": 700, "hold_mean_s": 0.0021, "hold_max_s": 0.0113, "interval_s": 0.0025, "t_fwd_s": 0.004,
          "watchdog_fired": 1, "lost": 0, "load_spread": 1.07, "rank": [[0, 640, 9000, 1, 0, 0, 17, 140],
                                                                        [1, 594, 8100, 1, 0, 0, 14, 0]],
          "passed": 31, "flushed": 3, "reason": "no policy from the daemon (none yet, or expired)",
          "policy": {"version": 6}, "last_report_age_s": 0.07}
    con = Console(width=80, record=True)
    con.print(status_view({"daemon": {"pid": 1}, "engines": {}, "dispatchers": {"dispatch": st}}))
    lines = con.export_text().splitlines()
    text = "\n".join(lines)
    assert all(len(ln) <= 80 for ln in lines)
    assert "dispatcher dispatch · stock · policy v6 · plain, 2 ranks" in text
    assert "released 1,234 in 700 · wait 2.1 ms (max 11.3 ms)" in text
    assert "I_opt 2.5 ms · T̄_fwd 4 ms · watchdog 1, lost 0 · spread 1.07" in text
    assert "0: 640 sent, 140 tok in flight · 1: 594 sent, 0 tok in flight" in text
    assert "passed 31 · flushed 3 · no policy from the daemon" in text


def test_ebctl_start_asks_sglang_for_a_snapshot_after_every_forward_when_sbs_is_on():
    from ebctl.cli.run import Engine, engine_args_for
    on, off = config.load(None, {"dispatch.mode": "sbs"}), config.load(None)
    args = ["--dp-size", "2"]
    assert engine_args_for(Engine.SGLANG, on, args) == [*args, "--load-snapshot-publish-interval", "1"]
    assert engine_args_for(Engine.SGLANG, off, args) == args
    assert engine_args_for(Engine.SIM, on, args) == args
    mine = [*args, "--load-snapshot-publish-interval", "4"]
    assert engine_args_for(Engine.SGLANG, on, mine) == mine  # the operator's own value stays
    assert engine_args_for(Engine.SGLANG, on, ["--load-snapshot-publish-interval=4"]) == \
        ["--load-snapshot-publish-interval=4"]
