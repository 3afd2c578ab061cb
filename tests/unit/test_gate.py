"""PhaseGate: every edge of the phase machine, the starvation bound and the KV reserve (docs/design.md §2)."""

import pytest

from ebctl.gate import Phase, PhaseGate, Reason, gate_step
from ebctl.protocol import Mode, Policy

EB = Policy(mode=Mode.EB, k=4, n_max=8, kv_reserve_frac=0.2, max_defer_s=5.0)


def step(phase, policy=EB, *, running, waiting, kv=1.0, wait_s=0.0):
    return gate_step(phase, policy, running=running, waiting=waiting, kv_free_frac=kv, deferred_s=wait_s)


@pytest.mark.parametrize("policy", [None, Policy(mode=Mode.OFF, k=4, n_max=8)])
def test_off_or_no_policy_is_stock(policy):
    for phase in Phase:
        d = step(phase, policy, running=3, waiting=9, kv=0.0, wait_s=100)
        assert (d.allow_prefill, d.admit_max, d.mixed, d.reason) == (True, None, None, Reason.STOCK)


def test_decode_waits_for_k_free_slots():
    d = step(Phase.DECODE, running=5, waiting=10)  # 3 free < k = 4
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.DECODE, False, 0, Reason.WAIT_K)
    d = step(Phase.DECODE, running=4, waiting=10)  # 4 free = k
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.REFILL, True, 4, Reason.THRESHOLD)
    assert d.mixed is False


def test_refill_continues_until_full_then_decode():
    d = step(Phase.REFILL, running=6, waiting=10)  # fewer than k free, but refill goes on until full
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.REFILL, True, 2, Reason.FILLING)
    d = step(Phase.REFILL, running=8, waiting=10)
    assert (d.phase, d.allow_prefill, d.reason) == (Phase.DECODE, False, Reason.FULL)


def test_refill_ends_when_queue_empties():
    d = step(Phase.REFILL, running=5, waiting=0)
    assert (d.phase, d.allow_prefill, d.reason) == (Phase.DECODE, False, Reason.QUEUE_EMPTY)
    d = step(Phase.DECODE, running=0, waiting=0)
    assert (d.phase, d.allow_prefill) == (Phase.DECODE, False)


def test_refill_ends_when_kv_falls_below_reserve():
    d = step(Phase.REFILL, running=5, waiting=10, kv=0.1)
    assert (d.phase, d.allow_prefill, d.reason) == (Phase.DECODE, False, Reason.KV_RESERVE)


def test_kv_reserve_defers_the_switch():
    """Eq. 23: k free slots and waiting requests, but too little free KV: stay in DECODE."""
    d = step(Phase.DECODE, running=2, waiting=10, kv=0.19)
    assert (d.phase, d.allow_prefill, d.reason) == (Phase.DECODE, False, Reason.KV_RESERVE)
    d = step(Phase.DECODE, running=2, waiting=10, kv=0.2)
    assert (d.phase, d.allow_prefill) == (Phase.REFILL, True)


def test_idle_engine_always_admits():
    d = step(Phase.DECODE, running=0, waiting=1, kv=0.0)  # even below the KV reserve, even < k waiting
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.REFILL, True, 8, Reason.IDLE)


def test_starvation_forces_refill_but_not_beyond_n_max():
    d = step(Phase.DECODE, running=6, waiting=1, kv=0.0, wait_s=5.0)
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.REFILL, True, 2, Reason.STARVATION)
    d = step(Phase.DECODE, running=6, waiting=1, kv=1.0, wait_s=4.99)
    assert d.allow_prefill is False
    d = step(Phase.DECODE, running=8, waiting=1, wait_s=100)  # no slot: nothing can be admitted
    assert (d.allow_prefill, d.reason) == (False, Reason.FULL)


def test_n_max_lowered_below_running_admits_nothing():
    d = step(Phase.REFILL, running=12, waiting=3)
    assert (d.phase, d.allow_prefill, d.admit_max) == (Phase.DECODE, False, 0)


def test_mb_mode_mixes_up_to_n_max():
    mb = Policy(mode=Mode.MB, k=4, n_max=8)
    d = step(Phase.DECODE, mb, running=3, waiting=10, kv=0.0)
    assert (d.allow_prefill, d.admit_max, d.mixed, d.reason) == (True, 5, True, Reason.MIXED)
    d = step(Phase.DECODE, mb, running=8, waiting=10)
    assert (d.allow_prefill, d.admit_max) == (False, 0)


def test_starvation_bound_in_a_cycle():
    """Drive the stateful gate: with k never reached, a waiting request is admitted once the gate has
    deferred it for max_defer_s with a slot free, and not before."""
    gate = PhaseGate()
    pol = Policy(mode=Mode.EB, k=8, n_max=8, max_defer_s=2.0)
    admitted_at = None
    for i in range(100):
        t = 10.0 + i * 0.1
        d = gate.decide(pol, running=7, waiting=1, kv_free_frac=1.0, now=t)
        if d.allow_prefill:
            admitted_at = t
            break
    assert admitted_at == pytest.approx(12.0)
    assert d.reason is Reason.STARVATION and gate.phase is Phase.REFILL


def test_queueing_for_a_full_batch_is_not_deferral():
    """Under saturation (no free slot) requests queue but the gate is not deferring them: the clock must
    not run, or EB(k) would collapse into k = 1 as soon as slots free up."""
    gate = PhaseGate()
    pol = Policy(mode=Mode.EB, k=4, n_max=8, max_defer_s=1.0)
    for i in range(50):  # 5 s with the batch full
        gate.decide(pol, running=8, waiting=100, kv_free_frac=1.0, now=i * 0.1)
    d = gate.decide(pol, running=7, waiting=100, kv_free_frac=1.0, now=5.0)
    assert (d.allow_prefill, d.reason) == (False, Reason.WAIT_K)
    d = gate.decide(pol, running=7, waiting=100, kv_free_frac=1.0, now=5.99)
    assert d.allow_prefill is False
    d = gate.decide(pol, running=7, waiting=100, kv_free_frac=1.0, now=6.0)
    assert (d.allow_prefill, d.reason) == (True, Reason.STARVATION)


def test_full_eb_cycle_counts_prefill_batches():
    """A saturated queue: a refill starts exactly when k slots are free, fills them, then decodes."""
    gate = PhaseGate()
    running, switches = 8, []
    for it in range(40):
        d = gate.decide(EB, running=running, waiting=100, kv_free_frac=1.0, now=it * 0.01)
        if d.allow_prefill:
            switches.append(8 - running)
            running += d.admit_max  # the engine admits what it may
        elif it % 2 == 0:
            running -= 1  # a completion every other iteration
    assert switches and all(s == 4 for s in switches)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("since", [None, 3.0])
@pytest.mark.parametrize("policy", [EB, Policy(mode=Mode.EB, k=1, n_max=2, kv_reserve_frac=0.9, max_defer_s=0.1)])
def test_rest_is_decide_with_an_empty_queue(phase, since, policy):
    """The plugin's shortcut for an empty queue leaves the gate as ``decide(waiting=0)`` would, from any state
    and whatever the other numbers."""
    for running, kv, now in [(0, 1.0, 0.0), (1, 0.0, 5.0), (2, 0.5, 100.0), (9, 0.1, 4.0)]:
        a, b = PhaseGate(), PhaseGate()
        for g in (a, b):
            g.phase, g.defer_since = phase, since
        d = a.decide(policy, running=running, waiting=0, kv_free_frac=kv, now=now)
        b.rest()
        assert (b.phase, b.defer_since, b.last) == (a.phase, a.defer_since, a.last) == (Phase.DECODE, None, d)


def test_a_chunk_in_flight_goes_on_alone_while_the_gate_holds():
    """sglang's chunked prefill must continue once started; below k it continues admitting nobody."""
    d = gate_step(Phase.DECODE, EB, running=5, waiting=10, kv_free_frac=1.0, deferred_s=0.0, chunk_in_flight=True)
    assert (d.phase, d.allow_prefill, d.admit_max, d.reason) == (Phase.DECODE, True, 0, Reason.CHUNK_IN_FLIGHT)
    # When the gate would admit anyway, the chunk changes nothing: new requests may join it.
    d = gate_step(Phase.DECODE, EB, running=4, waiting=10, kv_free_frac=1.0, deferred_s=0.0, chunk_in_flight=True)
    assert (d.allow_prefill, d.admit_max, d.reason) == (True, 4, Reason.THRESHOLD)
    # Stock: untouched.
    assert gate_step(Phase.DECODE, None, running=5, waiting=10, kv_free_frac=1.0, deferred_s=0.0,
                     chunk_in_flight=True).reason is Reason.STOCK


def test_the_deferral_clock_keeps_running_while_a_chunk_goes_on_alone():
    g = PhaseGate()
    pol = Policy(mode=Mode.EB, k=4, n_max=8, max_defer_s=5.0)
    g.decide(pol, running=5, waiting=3, kv_free_frac=1.0, now=100.0)  # held: the clock starts at 100
    d = g.decide(pol, running=5, waiting=3, kv_free_frac=1.0, now=103.0, chunk_in_flight=True)
    assert d.reason is Reason.CHUNK_IN_FLIGHT and g.defer_since == 100.0  # nobody was admitted
    d = g.decide(pol, running=5, waiting=3, kv_free_frac=1.0, now=105.0)
    assert d.reason is Reason.STARVATION  # 5 s after the hold began, not after the chunk


def test_decisions_are_counted_by_reason():
    g = PhaseGate()
    pol = Policy(mode=Mode.EB, k=4, n_max=8, max_defer_s=1e9)
    for running in (5, 5, 4, 6, 8):  # wait_k, wait_k, threshold, filling, full
        g.decide(pol, running=running, waiting=9, kv_free_frac=1.0, now=0.0)
    g.rest()
    expected = {Reason.WAIT_K: 2, Reason.THRESHOLD: 1, Reason.FILLING: 1, Reason.FULL: 1, Reason.QUEUE_EMPTY: 1}
    assert {r: n for r, n in g.counts.items() if n} == expected


def test_each_hold_ended_by_an_admission_is_recorded_once():
    g = PhaseGate()
    pol = Policy(mode=Mode.EB, k=4, n_max=8, max_defer_s=100.0)
    g.decide(pol, running=5, waiting=3, kv_free_frac=1.0, now=10.0)  # held from 10
    g.decide(pol, running=5, waiting=3, kv_free_frac=1.0, now=11.0)
    g.decide(pol, running=4, waiting=3, kv_free_frac=1.0, now=12.5)  # k free: admitted after 2.5 s
    g.decide(pol, running=6, waiting=3, kv_free_frac=1.0, now=13.0)  # filling: no hold
    g.decide(pol, running=8, waiting=3, kv_free_frac=1.0, now=14.0)  # full: queueing, not a hold
    g.decide(pol, running=7, waiting=3, kv_free_frac=1.0, now=15.0)  # held from 15
    g.decide(pol, running=7, waiting=0, kv_free_frac=1.0, now=16.0)  # the queue emptied: no admission
    assert list(g.holds) == [2.5]
