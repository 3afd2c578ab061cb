"""The DP controller's dispatcher hook by hook, with stand-ins for sglang's objects (no sglang needed).

What is proven here: with no policy, an expired one or ``off``, every request goes to sglang's own dispatch at
once, exactly once, untouched; under ``sbs`` generate requests are held and released to the ranks the core
chose by setting ``routed_dp_rank`` and calling sglang's ``dispatching_with_trace`` (hand-worked placements);
aborts release what they name first; other control messages flush first; an exception anywhere flushes the
buffer through sglang's own dispatch, logs once and leaves the plugin off; nothing held is ever lost.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import msgspec
import pytest
from dispatch_fakes import AbortReq, Ctl, FlushCacheReqInput, GetInternalStateReq, TokenizedEmbeddingReqInput, gen
from dispatch_fakes import armed as fakes_armed

from ebctl.protocol import DispatchPolicy
from sglang_patch import dispatch, dispatch_state
from sglang_patch.dispatch_state import DispatchState
from sglang_patch.fault import Fault


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(dispatch_state, "wall_clock", c)
    return c


def armed(ctl: Ctl, monkeypatch, policy=None, layout="plain", chunk=100) -> DispatchState:
    st = fakes_armed(ctl, policy, layout, chunk)
    monkeypatch.setattr(dispatch, "STATE", st)
    return st


def sbs(version=1, **kw) -> DispatchPolicy:
    kw = {"mode": "sbs", "t_fwd_s": 0.1, "l_net_s": 0.0, **kw}
    return DispatchPolicy(engine_id="dispatch", version=version, **kw)


def tick(st: DispatchState, mono: float = 0.0) -> float:
    st.next_read = 0.0  # read the snapshots at every tick of a test, however close
    return st.tick(mono)


@pytest.mark.parametrize("policy", [None, sbs(mode="off")], ids=["no policy", "off"])
def test_without_sbs_every_request_goes_to_sglang_at_once(monkeypatch, clock, policy):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, policy)
    tick(st)
    reqs = [gen("a"), gen("b", rank=1), TokenizedEmbeddingReqInput(rid="e", input_ids=[1], routed_dp_rank=None)]
    for r in reqs:
        assert ctl.dispatching_with_trace(r) is None
    assert ctl.sent == [("a", None), ("b", 1), ("e", None)]  # untouched, in order, once each
    assert not st.holding and st.passed == 3 and st.arrived == 0
    assert st.link.reports[-1].state == "stock"


def test_held_then_released_where_the_core_placed_them(monkeypatch, clock):
    """Plain DP, 2 idle ranks, chunk 100. Three 10-token requests before the first tick: target 0 (never
    released to) takes all three (C_avail 100). The next one: target 1, idle and quiescent, is due at once."""
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    assert st.holding
    for rid in ("a", "b", "c"):
        ctl.dispatching_with_trace(gen(rid))
    assert ctl.sent == [] and len(st.reqs) == 3  # held, not sent
    ctl.load_snapshot_reader.publish(0, 999.0)
    ctl.load_snapshot_reader.publish(1, 999.0)
    tick(st, 0.001)
    assert ctl.sent == [("a", 0), ("b", 0), ("c", 0)]
    clock.t += 0.0005
    ctl.dispatching_with_trace(gen("d"))
    tick(st, 0.002)
    assert ctl.sent[-1] == ("d", 1)
    assert st.released == 4 and st.releases == 2 and not st.reqs
    assert (st.sent_reqs, st.sent_tokens) == ({0: 3, 1: 1}, {0: 30, 1: 10})


def test_a_send_is_acknowledged_by_the_snapshot_after_the_next_one(monkeypatch, clock):
    ctl = Ctl(ranks=1)
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    ctl.load_snapshot_reader.publish(0, 999.0)
    ctl.dispatching_with_trace(gen("a", 40))
    tick(st, 0.001)  # sent at 1000.0
    assert st.core.in_flight.tokens(0) == 40
    ctl.load_snapshot_reader.publish(0, 1000.01, queued=40)  # a forward ended after the send: may not show it
    clock.t = 1000.02
    tick(st, 0.002)
    assert st.core.in_flight.tokens(0) == 40
    ctl.load_snapshot_reader.publish(0, 1000.03, queued=40)  # its iteration began after 1000.01 > the send
    clock.t = 1000.04
    tick(st, 0.003)
    assert st.core.in_flight.tokens(0) == 0 and st.core.queued[0] == 40


def test_a_send_no_snapshot_shows_is_forgotten_after_the_watchdog_horizon(monkeypatch, clock):
    ctl = Ctl(ranks=1)
    st = armed(ctl, monkeypatch, sbs(t_fwd_s=0.1, watchdog_factor=5.0))
    tick(st)
    ctl.load_snapshot_reader.publish(0, 999.0)
    ctl.dispatching_with_trace(gen("a", 40))
    tick(st, 0.001)
    clock.t += 0.49
    tick(st, 0.002)
    assert st.core.in_flight.tokens(0) == 40
    clock.t += 0.02  # 0.51 s > 5 × 0.1 s, the rank silent all along
    tick(st, 0.003)
    assert st.core.in_flight.tokens(0) == 0


def test_expiry_flushes_the_buffer_through_sglangs_dispatch_in_arrival_order(monkeypatch, clock):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    st.core.clock.set_targets([])  # no target: nothing is ever due (the buffer just waits)
    for rid in ("a", "b", "c"):
        ctl.dispatching_with_trace(gen(rid))
    st.link.p = None  # the daemon's policy expired (EngineLink.policy returns None after the TTL)
    tick(st, 1.0)
    assert ctl.sent == [("a", None), ("b", None), ("c", None)] and st.flushed == 3 and not st.holding
    ctl.dispatching_with_trace(gen("d"))
    assert ctl.sent[-1] == ("d", None) and not st.reqs


def test_an_abort_releases_what_it_names_then_passes_through(monkeypatch, clock):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    st.core.clock.set_targets([])
    for rid in ("job-1", "job-12", "other"):
        ctl.dispatching_with_trace(gen(rid))
    ctl.send_control_message(AbortReq(rid="job-1", abort_all=False))  # sglang matches rid prefixes
    assert ctl.sent == [("job-1", None), ("job-12", None), ("<AbortReq>", None)]
    assert st.aborted == 2 and list(st.reqs) == [2] and st.core.buffered == 1
    ctl.send_control_message(GetInternalStateReq(rid=""))  # reads state: no flush
    assert len(st.reqs) == 1
    ctl.send_control_message(AbortReq(rid="", abort_all=True))
    assert ctl.sent[-2:] == [("other", None), ("<AbortReq>", None)] and not st.reqs


def test_a_control_message_that_changes_state_flushes_first(monkeypatch, clock):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    st.core.clock.set_targets([])
    ctl.dispatching_with_trace(gen("a"))
    ctl.send_control_message(FlushCacheReqInput(rid=""))
    assert ctl.sent == [("a", None), ("<FlushCacheReqInput>", None)] and st.flushed == 1


def test_an_exception_flushes_logs_once_and_leaves_the_plugin_off(monkeypatch, clock, caplog):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    st.fault = Fault("dispatch", 3, "dispatch hook")
    tick(st)
    st.core.clock.set_targets([])
    with caplog.at_level(logging.ERROR, logger="ebctl.sglang"):
        for rid in ("a", "b", "c", "d"):
            ctl.dispatching_with_trace(gen(rid))
    # a, b held; the third call raised: a, b flushed, c sent by sglang as it came, d too (plugin off)
    assert ctl.sent == [("a", None), ("b", None), ("c", None), ("d", None)]
    assert not st.on and st.error == "exception in dispatch hook dispatch" and not st.reqs
    assert sum("exception in dispatch hook" in r.message for r in caplog.records) == 1
    assert st.link.reports[-1].state == "failed"


def test_a_release_sglang_refuses_is_not_lost(monkeypatch, clock):
    ctl = Ctl(fail_routed=True)  # sglang raises on the rank the plugin chose ("not active")
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    ctl.dispatching_with_trace(gen("a"))
    with pytest.raises(ValueError):
        tick(st, 0.001)
    st.fail("tick")  # what the event_loop hook does with an exception of the tick
    assert ctl.sent == [("a", None)] and not st.on  # through sglang's own dispatch, routed_dp_rank cleared


def test_a_request_left_behind_n_limit_releases_goes_to_sglang(monkeypatch, clock):
    """One rank, chunk 10, three 8-token requests, N_limit 0: the first release places two (C_avail 10 > 0,
    then 2 > 0) and leaves the third behind one release: an overload, sent by sglang's own dispatch."""
    ctl = Ctl(ranks=1)
    st = armed(ctl, monkeypatch, sbs(n_limit=0), chunk=10)
    tick(st)
    for rid in ("a", "b", "c"):
        ctl.dispatching_with_trace(gen(rid, 8))
    tick(st, 0.001)
    assert ctl.sent == [("a", 0), ("b", 0), ("c", None)] and st.overloaded == 1 and not st.reqs


def test_a_drained_rank_gets_nothing(monkeypatch, clock):
    ctl = Ctl(ranks=3)
    st = armed(ctl, monkeypatch, sbs(drain_ranks=(0, 2)))
    tick(st)
    for i in range(5):
        clock.t += 0.01
        for r in range(3):
            ctl.load_snapshot_reader.publish(r, clock.t - 0.005)  # a forward ended since the last release
        ctl.dispatching_with_trace(gen(f"r{i}"))
        tick(st, 0.01 * (i + 1))
    assert {rank for _, rank in ctl.sent} == {1} and len(ctl.sent) == 5
    st.link.p = sbs(version=2, drain_ranks=(0, 1, 2))  # nothing left: stock
    tick(st, 1.0)
    assert not st.holding and "drained" in st.reason


def test_a_rank_going_down_rebuilds_the_targets_and_keeps_the_buffer(monkeypatch, clock):
    ctl = Ctl(ranks=3)
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    st.core.clock.set_targets([])  # nothing due: the requests stay held
    for rid in ("a", "b"):
        ctl.dispatching_with_trace(gen(rid))
    ctl.status[0] = False  # ActiveRanksOutput: rank 0 down (sglang keeps it in _active_workers)
    ctl._active_workers = [0, 1]  # elastic EP: rank 2 gone
    tick(st, 1.0)  # a new dispatcher over rank 1 alone, the held requests carried into it and released there
    assert st.core.instances == [[1]] and ctl.sent == [("a", 1), ("b", 1)] and not st.reqs


def test_decode_layout_places_by_algorithm_3(monkeypatch, clock):
    """B = (5, 1), K = (100, 100); requests of 30 and 20 tokens: 30 → unit 1 (fewest requests), then
    (2, 130) against (5, 100): 20 → unit 1 again."""
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs(), layout="decode")
    tick(st)
    ctl.load_snapshot_reader.publish(0, 999.0, running=5, used=100, total=100)
    ctl.load_snapshot_reader.publish(1, 999.0, running=1, used=100, total=100)
    ctl.dispatching_with_trace(gen("a", 20))
    ctl.dispatching_with_trace(gen("b", 30))
    tick(st, 0.001)
    assert sorted(ctl.sent) == [("a", 1), ("b", 1)]


def test_follow_bootstrap_room_is_never_held(monkeypatch, clock):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    st.setup = dataclasses.replace(st.setup, never="--load-balance-method follow_bootstrap_room")
    tick(st)
    ctl.dispatching_with_trace(gen("a"))
    assert ctl.sent == [("a", None)] and not st.holding


def test_the_report_carries_fresh_rank_loads_while_nothing_is_held(monkeypatch, clock):
    # a request that names its rank goes straight to sglang, so nothing is held or in flight; the rank's
    # snapshot still reaches the next report (seen on CI: the daemon showed both ranks idle for 10 s)
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    ctl.dispatching_with_trace(gen("hog", 30, rank=1))
    ctl.load_snapshot_reader.publish(1, 999.0, running=1, used=30)
    clock.t += 0.25
    st.tick(1.0)  # the report is due; no read is due (nothing held)
    rep = st.link.reports[-1]
    assert rep.buffered == 0 and rep.rank[1].running == 1 and rep.rank[0].running == 0


def test_the_report_carries_counters_and_each_rank(monkeypatch, clock):
    ctl = Ctl()
    st = armed(ctl, monkeypatch, sbs())
    tick(st)
    ctl.load_snapshot_reader.publish(0, 999.0, running=2, queued=7, used=50)
    ctl.load_snapshot_reader.publish(1, 999.0)
    for rid in ("a", "b"):
        ctl.dispatching_with_trace(gen(rid, 30))
    clock.t += 0.25
    tick(st, 0.001)
    st.report(clock.t)
    rep = st.link.reports[-1]
    assert (rep.state, rep.arrived, rep.released, rep.releases, rep.buffered) == ("sbs", 2, 2, 1, 0)
    assert rep.hold_mean_s == pytest.approx(0.25) and rep.targets == 2 and rep.ranks == 2
    assert rep.load_spread == pytest.approx(60 / 30)  # 60 tokens to rank 0, none to rank 1: max over mean
    assert msgspec.structs.astuple(rep.rank[0]) == (0, 2, 60, 2, 0, 7, 50, 60) and rep.rank[1].sent_reqs == 0
    assert rep.interval_s == pytest.approx(0.1 / 2) and not math.isnan(rep.t_fwd_s)
