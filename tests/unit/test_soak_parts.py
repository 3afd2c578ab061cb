"""tools/soak.py's pure parts with hand-worked numbers: the fault schedule, the within-process slope of RSS and
fds (a restarted daemon has its own intercept), what "flat" means, and the checks over a made-up record."""

from __future__ import annotations

import math

from tools_module import tool


def test_every_round_runs_every_fault_once_in_a_seeded_order():
    with tool("soak") as soak:
        a, b = soak.schedule(3, 4), soak.schedule(3, 4)
        assert a == b and len(a) == 4 * len(soak.FAULTS)
        for r in range(4):
            assert sorted(a[r * 8:(r + 1) * 8]) == sorted(soak.FAULTS)
        assert soak.schedule(4, 4) != a


def test_the_slope_is_pooled_within_each_daemon_process():
    # pid 1: 10, 12, 14 MB at 0, 1, 2 s; pid 2 (restarted, lower): 5, 7 at 3, 4 s: 2 MB/s within each,
    # whereas one line through all five points would slope down
    pts = [(0, 1, 10.0), (1, 1, 12.0), (2, 1, 14.0), (3, 2, 5.0), (4, 2, 7.0)]
    with tool("soak") as soak:
        slope, se, n = soak.within_slope(pts, after=0.0)
        assert math.isclose(slope, 7200.0) and se < 1e-9 and n == 5
        slope, _, n = soak.within_slope(pts, after=1.0)  # from t = 1: pid 1's 12, 14 and pid 2's two
        assert math.isclose(slope, 7200.0) and n == 4
        # 101, 99, 101, 99 MB at t = 0..3: mean t 1.5, sxx = 2.25 + 0.25 + 0.25 + 2.25 = 5,
        # sxy = (−1.5)(1) + (−0.5)(−1) + (0.5)(1) + (1.5)(−1) = −2: b = −0.4 MB/s, with residuals, so se > 0
        s2, se2, _ = soak.within_slope([(t, 7, 100.0 + (-1) ** t) for t in range(4)], after=0.0)
        assert math.isclose(s2, -0.4 * 3600)
        assert se2 > 0


def test_flat_is_within_noise_or_small_against_the_mean():
    with tool("soak") as soak:
        assert soak.flat(10.0, 4.0, 100.0, rel=0.05, absolute=2.0)  # 10/h within 3 se (12)
        assert soak.flat(4.0, 0.1, 100.0, rel=0.05, absolute=2.0)  # 4 MB/h under 5% of 100 MB
        assert not soak.flat(20.0, 1.0, 100.0, rel=0.05, absolute=2.0)  # 20 MB/h: a leak
        assert soak.flat(math.nan, math.nan, 100.0, rel=0.05, absolute=2.0)  # too few samples: not judged


def test_the_checks_fail_a_lost_request_and_a_slow_return_of_control():
    with tool("soak") as soak:
        faults = [{"fault": f, "t": 0.0, "end": 1.0} for f in soak.FAULTS]
        for r in faults:
            if r["fault"] in soak.DAEMON_FAULTS:
                r["control_s"] = 2.0
            if r["fault"] == "upgrade":
                r.update(next_protocol=3, back_protocol=2, control_back_s=1.0)
            if r["fault"] == "reload":
                r.update(bad_refused=True, good_ok=True, still_controlled=True)
            if r["fault"] == "tune":
                r.update(ok=True, still_controlled=True)
            if r["fault"] == "tracefull":
                r.update(controlled_while_full=True, plugins_on=True)
            if r["fault"] == "server":
                r["in_flight_killed"] = [1]
        reqs = [{"n": 0, "ok": True}, {"n": 1, "ok": False, "error": "killed"}]  # n = 1 was on the killed server
        doc = {"faults": faults, "samples": [], "requests": reqs, "protocol": 2}
        assert all(ok for ok, _ in soak.checks(doc, {}, quick=True))
        lost = {**doc, "requests": [*reqs, {"n": 2, "ok": False, "error": "timeout"}]}
        bad = [line for ok, line in soak.checks(lost, {}, quick=True) if not ok]
        assert len(bad) == 1 and "1 lost otherwise" in bad[0] and "timeout" in bad[0]
        slow = [dict(r, control_s=16.0) if r["fault"] == "kill9" else r for r in faults]
        bad = [line for ok, line in soak.checks({**doc, "faults": slow}, {}, quick=True) if not ok]
        assert len(bad) == 1 and "worst 16.0 s" in bad[0]


def test_killed_in_flight_is_what_was_running_on_the_killed_server_between_down_and_kill():
    # s2 marked down at 100.0, killed at 101.0. Request 1: sent to s2 at 99, failed at 101.05 (cut by the kill);
    # 2: s2, sent at 99, completed (not lost); 3: s1, failed at 101 (another server: lost); 4: s2, sent at 99,
    # failed at 99.5 before the server was marked down (not the kill's); 5: s2, sent at 102 after the kill
    # (lost); 6: an old record's listed id.
    faults = [{"fault": "server", "server": "s2", "down_at": 100.0, "killed_at": 101.0},
              {"fault": "server", "in_flight_killed": [6]}, {"fault": "kill9"}]
    reqs = [{"n": 1, "server": "s2", "sent": 99.0, "done": 101.05, "ok": False},
            {"n": 2, "server": "s2", "sent": 99.0, "done": 101.05, "ok": True},
            {"n": 3, "server": "s1", "sent": 99.0, "done": 101.0, "ok": False},
            {"n": 4, "server": "s2", "sent": 99.0, "done": 99.5, "ok": False},
            {"n": 5, "server": "s2", "sent": 102.0, "done": 102.1, "ok": False}]
    with tool("soak") as soak:
        assert soak.killed_in_flight(faults, reqs) == {1, 6}


def test_the_order_runs_three_full_rounds_then_only_faults_that_keep_the_daemon():
    with tool("soak") as soak:
        order = soak.soak_order(5, quick=False)
        assert sorted(order[:24]) == sorted(soak.FAULTS * 3)
        assert not set(order[24:]) & {"kill9", "rundir", "upgrade"} and len(order[24:]) == 5 * 100
        assert sorted(soak.soak_order(5, quick=True)) == sorted(soak.FAULTS)


def test_aged_keeps_each_process_from_its_own_age():
    # pid 1 first seen at 0 s, pid 2 at 50 s: with min_age 20, pid 1 from t = 20, pid 2 from t = 70
    pts = [(0, 1, 1.0), (10, 1, 2.0), (20, 1, 3.0), (50, 2, 4.0), (60, 2, 5.0), (70, 2, 6.0), (80, 2, 7.0)]
    with tool("soak") as soak:
        assert soak.aged(pts, 20.0) == [(20, 1, 3.0), (70, 2, 6.0), (80, 2, 7.0)]
