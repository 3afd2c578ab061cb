"""The shared SBS dispatcher (ebctl.sbs.dispatcher): hand-worked releases, overloads, aborts, decode placement."""

import math

import pytest

from ebctl.sbs.dispatcher import Dispatcher
from ebctl.sbs.types import RankLoad, SbsParams

P = SbsParams(t_default_s=0.1, l_net_s=0.0)


def test_plain_dp_staggers_releases_over_targets():
    """Two idle single-rank targets, I_opt = 0.1/2 = 0.05 s. The first release goes at once to target 0; the
    next target is ready (never released to) but not idle, so it waits one interval after the first slot."""
    d = Dispatcher([[0], [1]], chunk=100, params=P)
    d.arrive(1, 30)
    assert d.release(10.0).sends == [(1, 0)]
    d.arrive(2, 30)
    assert d.release(10.04).target is None and d.next_check(10.04) == pytest.approx(10.05)
    assert d.release(10.05).sends == [(2, 1)]


def test_lockstep_target_spreads_one_release_over_its_ranks():
    """DP attention: one target of 2 ranks, C_avail 100 − queued (0, 60) = (100, 40). Longest first: 50 → rank 0
    (100 → 50), 45 → rank 0 (50 > 40 → 5), 30 → rank 1 (40 → 10), 20 → rank 1 (10 > 5 → −10)."""
    d = Dispatcher([[0, 1]], chunk=100, params=P)
    d.observe(RankLoad(1, 1.0, queued_tokens=60))
    for jid, tokens in ((1, 20), (2, 50), (3, 30), (4, 45)):
        d.arrive(jid, tokens)
    rel = d.release(5.0)
    assert rel.sends == [(2, 0), (4, 0), (3, 1), (1, 1)] and rel.target == 0
    assert (d.in_flight.tokens(0), d.in_flight.tokens(1)) == (95, 50)


def test_a_request_left_behind_n_limit_releases_is_evicted_when_asked():
    """Chunk 10, one rank, N_limit 1: each release places one 10-token request (C_avail 10 → 0) and leaves the
    rest behind; the third request has waited 2 releases > 1 after the second release."""
    for evict in (False, True):
        d = Dispatcher([[0]], chunk=10, params=SbsParams(t_default_s=0.1, l_net_s=0.0, n_limit=1),
                       evict_overloaded=evict)
        for jid in (1, 2, 3):
            d.arrive(jid, 10)
        assert d.release(1.0).sends == [(1, 0)]
        d.ack(0, 1.0)  # the rank shows it now (and has prefilled it)
        d.ready(0)
        rel = d.release(2.0)
        assert rel.sends == [(2, 0)] and d.overloads == 1
        if evict:
            assert rel.overloaded == [3] and d.buffered == 0
        else:
            assert rel.overloaded == [] and d.overloaded == {3} and d.buffered == 1


def test_no_room_skips_without_counting_a_cycle_and_blocks_until_a_report():
    d = Dispatcher([[0]], chunk=10, params=SbsParams(t_default_s=0.1, l_net_s=0.0, n_limit=0))
    d.observe(RankLoad(0, 1.0, queued_tokens=10))  # C_avail = 0
    d.arrive(1, 5)
    assert d.release(1.0).target is None and d.blocked and d.next_check(1.0) == math.inf
    assert d.pending == [] and d.overloads == 0  # a skip is not a cycle
    d.observe(RankLoad(0, 1.1, queued_tokens=0))
    d.ready(0)
    assert d.release(1.2).sends == [(1, 0)]


def test_take_removes_requests_from_both_queues():
    d = Dispatcher([[0]], chunk=10, params=P)
    for jid in (1, 2, 3):
        d.arrive(jid, 10)
    d.release(1.0)  # 1 placed, 2 and 3 carried over
    d.arrive(4, 1)
    assert [j.id for j in d.take([3, 4, 99])] == [3, 4]
    assert [j.id for j in d.pending] == [2] and d.new == [] and d.buffered == 1


def test_decode_places_the_whole_buffer_by_algorithm_3_with_in_flight_counted():
    """Units B = (3, 3), K = (1000, 100): 500 → unit 1 (B equal, less KV): (3, 1000) vs (4, 600); then 400 →
    unit 0 (fewer requests). The next release sees those sends in flight: B = (4, 4), K = (1400, 600):
    300 → unit 1."""
    d = Dispatcher([[0, 1]], chunk=0, params=P, decode=True)
    d.observe(RankLoad(0, 1.0, running=3, total_tokens=1000))
    d.observe(RankLoad(1, 1.0, running=2, waiting=1, total_tokens=100))
    d.arrive(1, 400)
    d.arrive(2, 500)
    assert sorted(d.release(2.0).sends) == [(1, 0), (2, 1)]
    d.ready(0)
    d.arrive(3, 300)
    assert d.release(3.0).sends == [(3, 1)]
    d.ack(0, 2.0)
    d.ack(1, 2.0)
    assert d.reqs_in_flight.tokens(1) == 1 and d.in_flight.tokens(1) == 300


def test_every_target_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        Dispatcher([[0], []], chunk=10)
