"""Algorithm 2 (PBAA): hand-worked cases from the paper's pseudo-code, then properties over random inputs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ebctl.sbs.pbaa import InFlight, Job, allocate, capacity


def test_capacity_is_chunk_minus_flight_minus_queued():
    assert capacity(3000, 500, 1000) == 1500  # §4.2.1
    assert capacity(3000, 0, 4000) == -1000  # a backlog beyond one chunk: no room


def test_water_filling_by_hand():
    # C_avail: rank0 3000, rank1 1500, rank2 500. Longest first, each to the largest C_avail:
    # 2000→r0 (1000 left), 1200→r1 (300), 800→r0 (200), 600→r2 (−100), 400→r1 (−100).
    new = [Job(0, 800), Job(1, 2000), Job(2, 1200), Job(3, 600), Job(4, 400)]
    a = allocate([], new, {0: 3000, 1: 1500, 2: 500})
    assert a.assigned == ((1, 0), (2, 1), (0, 0), (3, 2), (4, 1))
    assert a.left == () and a.overloaded == ()


def test_carried_over_first_then_no_room_leaves_the_rest():
    # Phase 1 places the pending 700 on rank0 (500 > 0 before it, line 8); then no unit has room,
    # so both new requests wait (Q_next) and, with N_limit = 0, are overloads at once.
    a = allocate([Job(9, 700, waited=2)], [Job(1, 200), Job(2, 300)], {0: 500, 1: 0}, n_limit=0)
    assert a.assigned == ((9, 0),)
    assert a.left == (Job(2, 300, 1), Job(1, 200, 1))  # longest first, each waited one more cycle
    assert a.overloaded == (2, 1)
    assert allocate([], [Job(1, 10)], {0: 0}, n_limit=1).overloaded == ()  # waited 1, not > 1


def test_oldest_carried_over_goes_before_a_longer_younger_one():
    a = allocate([Job(2, 2000, waited=1), Job(1, 100, waited=3)], [], {0: 100})
    assert a.assigned == ((1, 0),) and [j.id for j in a.left] == [2]


def test_ties_go_to_the_lowest_rank_and_the_input_is_not_modified():
    avail = {3: 1000, 1: 1000, 2: 1000}
    a = allocate([], [Job(0, 10)], avail)
    assert a.assigned == ((0, 1),) and avail == {3: 1000, 1: 1000, 2: 1000}


def test_cache_aware_prefers_the_rank_holding_the_prefix():
    # Capacity(r, d) = C_avail − (L − L_hit): rank1 holds 800 of the 1000 tokens → 1000−200 beats 1000−1000.
    hits = {(0, 1): 800}
    a = allocate([], [Job(0, 1000)], {0: 1000, 1: 1000}, hit=lambda j, d: hits.get((j, d), 0))
    assert a.assigned == ((0, 1),)


def test_in_flight_counts_until_acknowledged():
    f = InFlight()
    f.send(0, 500, at=1.0)
    f.send(0, 300, at=2.0)
    assert f.tokens(0) == 800 and f.tokens(1) == 0
    f.ack(0, upto=1.5)  # a forward that started at 1.5 had received the first send only
    assert f.tokens(0) == 300
    f.ack(0, upto=2.0)
    assert f.tokens(0) == 0


jobs = st.lists(st.integers(0, 20_000), max_size=60)
ranks = st.dictionaries(st.integers(0, 63), st.integers(-5_000, 20_000), min_size=1, max_size=16)


@settings(max_examples=300, deadline=None)
@given(pending_len=jobs, new_len=jobs, avail=ranks, n_limit=st.integers(0, 5))
def test_properties(pending_len, new_len, avail, n_limit):
    pending = [Job(i, t, waited=i % 3) for i, t in enumerate(pending_len)]
    new = [Job(1000 + i, t) for i, t in enumerate(new_len)]
    a = allocate(pending, new, avail, n_limit=n_limit)
    # every request exactly once: assigned or left
    ids = [j for j, _ in a.assigned] + [j.id for j in a.left]
    assert sorted(ids) == sorted(j.id for j in pending + new)
    # replay: each request went to a unit with the largest remaining capacity, and that capacity was > 0
    cap, size, last = dict(avail), {j.id: j.tokens for j in pending + new}, {}
    for jid, d in a.assigned:
        assert cap[d] > 0 and cap[d] == max(cap.values())
        cap[d] -= size[jid]
        last[d] = size[jid]
    # no rank over capacity before its last request: the overshoot is less than that request
    for d, c in cap.items():
        if d in last:
            assert -c < last[d]
    # a request is only left behind when no unit has room
    if a.left:
        assert max(cap.values()) <= 0
    # carried-over requests are placed before new ones
    kinds = [j >= 1000 for j, _ in a.assigned]
    assert kinds == sorted(kinds)
    assert all(j.waited >= 1 for j in a.left)
    assert set(a.overloaded) == {j.id for j in a.left if j.waited > n_limit}
