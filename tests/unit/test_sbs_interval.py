"""Algorithm 1 and the dual trigger: hand-worked timelines."""

import math

import pytest

from ebctl.sbs.interval import ReleaseClock
from ebctl.sbs.types import RankLoad, SbsParams


def test_interval_is_forward_plus_net_over_active():
    c = ReleaseClock([0, 1, 2, 3], t_default_s=0.1, l_net_s=0.02)
    assert c.interval == pytest.approx((0.1 + 0.02) / 4)  # T_default before any measurement
    c.set_targets([0, 1])  # OnTopologyChange
    assert c.interval == pytest.approx(0.12 / 2)
    c.set_targets([])
    assert c.interval == math.inf and c.due(0.0) is None and c.next_check(0.0) == math.inf


def test_moving_average_over_the_window():
    c = ReleaseClock([0], window=3, t_default_s=1.0)
    for d in (0.04, 0.06, 0.08, 0.10):
        c.end_forward(0, d)
    assert c.t_fwd == pytest.approx((0.06 + 0.08 + 0.10) / 3)  # the oldest sample was evicted
    c.end_forward(0, float("nan"))  # an unmeasured forward still signals readiness, adds no sample
    assert c.t_fwd == pytest.approx(0.08)


def test_staggered_releases_wait_for_interval_and_end_forward():
    c = ReleaseClock([0, 1, 2, 3], t_default_s=0.75, l_net_s=0.25)  # I = (0.75 + 0.25)/4 = 0.25
    for t, who in ((0.0, 0), (0.25, 1), (0.5, 2), (0.75, 3)):
        assert t == 0.0 or c.due(t - 0.01) is None  # interval not elapsed
        assert c.due(t) == who  # never released to: ready; one release per interval, in turn
        c.release(who, t)
    assert c.due(1.0) is None  # every target is busy: none has ended a forward since its release
    assert c.next_check(1.0) == pytest.approx(3.75)  # ... so only rank 0's watchdog (5·T̄) could fire
    c.end_forward(2, 0.25)  # T̄ = 0.25 → I = 0.125
    assert c.interval == pytest.approx(0.125)
    assert c.due(1.0) == 2  # the first ready target in turn: busy 0 and 1 are passed over


def test_interval_counts_from_the_slot_with_one_interval_of_credit():
    c = ReleaseClock([0], t_default_s=1.0, l_net_s=0.0)  # I = 1
    c.release(0, 0.0)  # slots at 1, 2, 3, ...
    c.end_forward(0, 1.0)
    assert c.due(0.99) is None and c.due(1.0) == 0
    c.release(0, 1.5)  # released half an interval late (its forward ended late) ...
    c.end_forward(0, 1.0)
    assert c.due(1.99) is None and c.due(2.0) == 0  # ... the next slot stays at 2.0, not 2.5
    c.release(0, 4.0)  # two intervals late: the credit is capped at one
    c.end_forward(0, 1.0)
    assert c.due(4.0) == 0
    c.release(0, 4.0)
    c.end_forward(0, 1.0)
    assert c.due(4.99) is None and c.due(5.0) == 0


def test_quiescence_is_an_immediate_trigger():
    c = ReleaseClock([0], t_default_s=0.1)  # I = 0.1
    c.release(0, 0.0)
    c.end_forward(0, 0.1)  # ended with work still queued: ready, but the interval holds (T̄ stays 0.1)
    assert c.due(0.05) is None and c.due(0.1) == 0
    c.release(0, 0.1)
    assert RankLoad(rank=0, timestamp=0.15).quiescent and not RankLoad(0, 0.15, queued_tokens=1).quiescent
    c.end_forward(0, 0.1, quiescent=True)  # zero tasks: due at once (§4.1.2), the interval notwithstanding
    assert c.due(0.15) == 0
    c.release(0, 0.15)
    assert c.due(0.3) is None  # the next release needs its EndForward again


def test_watchdog_falls_back_to_fixed_interval_until_the_target_reports():
    c = ReleaseClock([7], t_default_s=0.125, watchdog_factor=4.0, fixed_interval_s=0.375)
    c.release(7, 0.0)
    assert c.due(0.49) is None and c.due(0.5) == 7  # silent for 4·T̄
    c.release(7, 0.5)
    assert c.watchdog_fired == 1
    assert c.due(0.87) is None and c.due(0.875) == 7  # lost: released every fixed interval, no EndForward
    c.release(7, 0.875)
    c.end_forward(7, 0.125)  # it is back: the dual trigger again, I = 0.125 from the slot
    assert c.due(0.87) is None and c.due(0.875) == 7
    c.release(7, 1.0)
    assert c.due(1.25) is None and c.next_check(1.25) == pytest.approx(1.5)  # its watchdog again
    assert c.watchdog_fired == 1


def test_skip_moves_on_without_resetting_the_interval():
    c = ReleaseClock([0, 1], t_default_s=0.1)
    c.release(0, 0.0)
    c.end_forward(0, 0.1)
    assert c.due(0.05) == 1
    c.skip(1)  # no room there
    assert c.due(0.05) == 0 and c.releases == 1


def test_from_params_and_bad_values():
    c = ReleaseClock.from_params([0, 1], SbsParams(t_default_s=0.2, l_net_s=0.0))
    assert c.interval == pytest.approx(0.1)
    with pytest.raises(ValueError, match="watchdog_factor=0"):
        ReleaseClock([0], watchdog_factor=0)
