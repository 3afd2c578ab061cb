"""The daemon as a real process: several engines, policy tracking the workload, faults, tune and reload."""

from __future__ import annotations

import os
import signal
import socket
import time

import msgspec
import numpy as np
import zmq
from ebd_helpers import finished, report, scaled, wait_for, write_config

from ebctl.link import EngineLink
from ebctl.protocol import ControlReply, ControlRequest, Mode, decode, encode


def feed(links, means, rng, seq0=0, n=60, pace=0.002):
    """``n`` reports per link, 2 completions each with output mean ``means[i]``; returns the next seq."""
    for s in range(seq0, seq0 + n):
        for link, mean in zip(links, means, strict=True):
            link.report(report(link.engine_id, s, finished(rng, mean, 2)))
        time.sleep(pace)
    return seq0 + n


def landed(d, n: int) -> None:
    """Until the daemon has received ``n`` reports: a bound on reports sent then counts what it has seen,
    however far behind a loaded machine keeps it."""
    wait_for(lambda: d.status()["daemon"]["counters"]["received"] >= n, what=f"{n} reports to reach the daemon")


def test_each_engine_gets_its_own_policy_and_it_follows_the_output_lengths(spawn):
    d = spawn()
    rng = np.random.default_rng(0)
    links = [EngineLink.from_config(d.cfg, f"dp{i}") for i in range(3)]
    short, long = 20.0, 400.0  # geometric outputs: p0 = 1/mean, so θ0 (Eq. 3) and k move with the mean

    def policies():
        return [link.policy(time.monotonic()) for link in links]

    def settled(means):
        def ok():
            ps = policies()
            return all(p and p.estimates and abs(p.estimates.mu_o / m - 1) < 0.35 for p, m in zip(ps, means,
                                                                                                  strict=True)) and ps
        return ok

    seq = 0
    means = [short, long, short]
    while not (ps := settled(means)()):
        seq = feed(links, means, rng, seq, n=20)
        landed(d, 3 * seq)
        assert seq < 2000, f"no policies after {seq} reports: {policies()}\n{d.log()}"
    assert [p.engine_id for p in ps] == ["dp0", "dp1", "dp2"]
    assert all(p.mode is Mode.EB for p in ps)
    k_short, k_long = ps[0].k, ps[1].k
    assert k_short > 2 * k_long, (k_short, k_long)  # a short-output stream refills at more free slots
    assert ps[0].estimates.p0 > 5 * ps[1].estimates.p0

    means = [long, short, short]  # dp0 and dp1 swap workloads; dp2 stays
    v_before = [p.version for p in ps]
    while not (ps2 := settled(means)()):
        seq = feed(links, means, rng, seq, n=20)
        landed(d, 3 * seq)
        assert seq < 4000, f"policies did not follow the shift: {policies()}"
    assert ps2[0].k < k_short / 2 and ps2[1].k > 2 * k_long
    assert all(p2.version > v for p2, v in zip(ps2, v_before, strict=True))
    # reports are flushed by each link's I/O thread every few ms: wait until the last one has landed
    status = wait_for(lambda: (st := d.status())["daemon"]["counters"]["received"] >= 3 * seq and st,
                      what="the last reports to reach the daemon")
    assert set(status["engines"]) == {"dp0", "dp1", "dp2"}
    e0 = status["engines"]["dp0"]
    for key in ("mode", "k", "n_max", "theta0", "delta_theta", "theta_star", "n_star", "p0", "eta", "fit_r2",
                "mu_l", "mu_o", "n_obs", "eb_lhs", "eb_rhs", "costs", "cost_fits", "reports", "seq_gaps",
                "last_report_age_s", "last_update_age_s"):
        assert key in e0, key
    assert e0["reports"] == seq and status["daemon"]["counters"]["received"] == 3 * seq
    for link in links:
        assert link.stats()["dropped"] == 0
        link.close()


def test_kill9_then_restart_links_fail_open_and_come_back(spawn, tmp):
    """While the daemon lives, its re-publishing alone keeps the policies alive; after kill -9 the links keep the
    last one for exactly its TTL, then fall back to stock; reports to the dead daemon are dropped and counted,
    never waited on; a new daemon on the same sockets is picked up. Nothing here measures wall time: re-publishing
    shows in the issued_at (the daemon's clock) of the policy a link holds, the TTL in the link's own record of
    when it saw the last policy, and every wait is a deadline that only bounds a hang."""
    import threading

    d = spawn()
    ttl = d.cfg.controller.ttl_s
    links = [EngineLink(f"dp{i}", telemetry_endpoint=d.cfg.endpoint("telemetry"),
                        policy_endpoint=d.cfg.endpoint("policy"), queue=50) for i in range(2)]
    calls, seq = 0, 0

    def step():
        nonlocal calls, seq
        for link in links:
            link.report(report(link.engine_id, seq))
            calls += 1
        seq += 1
        time.sleep(0.001)
        return [link.policy(time.monotonic()) for link in links]

    def held():
        return [link.policy(time.monotonic()) for link in links]

    first = wait_for(lambda: all(p := step()) and p, what="first policies")
    # no more reports: what the links receive now is re-published; both must come to hold (in force) a policy
    # issued more than 1.5 TTL after their first: the daemon kept issuing them without a report for longer than a TTL
    alive = wait_for(lambda: all(p := held()) and all(q.issued_at > f.issued_at + 1.5 * ttl
                                                        for q, f in zip(p, first, strict=True)) and p,
                     what="policies re-published for 1.5 TTL without a report")
    d.kill9()
    wait_for(lambda: not any(held()), timeout=ttl + 2, what="policies to expire")  # then stock behaviour
    for link, before in zip(links, alive, strict=True):
        st = link.stats()
        seen, until = st["policy_received_at"], st["policy_expires_at"]
        assert abs(until - seen - ttl) < 1e-9, st  # in force for its TTL from when the link first saw it
        last = link.policy(until - 1e-6)  # on the link's clock, just before and at the expiry
        assert last is not None and last.issued_at >= before.issued_at and link.policy(until) is None
    dead = []  # the daemon stays dead for a while: reports pile up and are dropped, never block (a thread of their
    # own: a report() that blocked would run into the deadline)
    stepping = threading.Thread(target=lambda: dead.extend(step() for _ in range(300)), daemon=True)
    stepping.start()
    wait_for(lambda: not stepping.is_alive(), what="300 steps against the dead daemon")
    assert len(dead) == 300 and not any(any(ps) for ps in dead)
    d2 = spawn(d.cfg_path)  # a new daemon on the same sockets; the links do nothing special
    ps = wait_for(lambda: all(p := step()) and p, timeout=10, what="policies from the restarted daemon")
    assert [p.engine_id for p in ps] == ["dp0", "dp1"]
    stats = [link.stats() for link in links]
    assert all(s["dropped"] > 0 and s["sent"] + s["queued"] + s["dropped"] == calls // 2 for s in stats), stats
    assert set(d2.status()["engines"]) == {"dp0", "dp1"}
    for link in links:
        link.close()


def test_garbage_on_every_socket_is_counted_and_the_daemon_lives(spawn):
    d = spawn()
    ctx = zmq.Context()
    rng = np.random.default_rng(1)
    try:
        push = ctx.socket(zmq.PUSH)
        push.connect(d.cfg.endpoint("telemetry"))
        good = report("e0", 1)
        for _ in range(5):
            push.send(rng.bytes(int(rng.integers(1, 300))))
        push.send(b"")
        push.send(encode(msgspec.structs.replace(good, v=99)))  # a newer protocol
        push.send(encode(msgspec.structs.replace(good, running=-5)))  # out of range
        push.send(encode(msgspec.structs.replace(good, engine_id="")))
        push.send_multipart([b"\x01", b"\x02"])
        push.send(encode(good))
        wait_for(lambda: (c := d.status()["daemon"]["counters"])["received"] == 1
                 and sum(c["rejected"].values()) == 11, what="reports counted")
        c = d.status()["daemon"]["counters"]
        assert {k: n for k, n in c["rejected"].items() if n} == {"malformed": 8, "version": 1, "validation": 2}

        req = ctx.socket(zmq.REQ)
        req.connect(d.cfg.endpoint("control"))
        req.rcvtimeo = 3000
        for frames in ([rng.bytes(64)], [b""], [encode(ControlRequest(op="status", v=7))], [b"a", b"b"],
                       [encode(ControlRequest(op="format-disk"))]):
            req.send_multipart(frames)
            rep = decode(req.recv(), ControlReply)  # the REP socket always answers
            assert not rep.ok and rep.error
        assert "ops: status" in rep.error
        c = d.status()["daemon"]["counters"]
        assert c["control_rejected"] == {"malformed": 3, "version": 1, "validation": 0}
        assert c["control_errors"] == 5

        xsub = ctx.socket(zmq.XSUB)  # the PUB socket only ever hears subscriptions: send it nonsense ones
        xsub.connect(d.cfg.endpoint("policy"))
        for _ in range(5):
            xsub.send(rng.bytes(40))
        xsub.send(b"\x01")  # subscribe to everything ...
        sub_all = wait_for(lambda: xsub.poll(100) and xsub.recv(), what="a republished policy via XSUB")
        assert sub_all.startswith(b"e0\0")

        for which in ("telemetry", "policy", "control"):  # not even ZMTP: raw bytes on the unix sockets
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.cfg.endpoint(which).removeprefix("ipc://"))
            s.sendall(b"\xff" + rng.bytes(200))
            s.close()
        wait_for(lambda: sum(d.status()["daemon"]["counters"]["handshake_failed"].values()) >= 1,
                 what="handshake failures counted")
        assert d.proc.poll() is None and d.status()["daemon"]["counters"]["received"] == 1
    finally:
        ctx.destroy(linger=0)


def test_tune_and_reload_refuse_bad_values_and_keep_the_running_config(spawn, tmp):
    d = spawn()
    rng = np.random.default_rng(2)
    link = EngineLink.from_config(d.cfg, "e0")
    seq = 0
    while not ((p := link.policy(time.monotonic())) and p.version >= 1):
        seq = feed([link], [50.0], rng, seq, n=10)
        landed(d, seq)
        assert seq < 1000
    window = d.cfg.controller.window

    bad = d.request("tune", updates={"controller.window": "-3"})
    assert not bad.ok and "controller.window" in bad.error and "'-3'" in bad.error and "allowed: int >= 10" in bad.error
    bad = d.request("tune", updates={"controller.mode": "eb+", "controller.eps": "2"})  # one bad key spoils all
    assert not bad.ok and "controller.eps" in bad.error
    bad = d.request("tune", updates={"daemon.control_endpoint": "ipc:///tmp/x"})
    assert not bad.ok and "restart" in bad.error
    assert not d.request("tune", updates="controller.mode=mb").ok
    cfg_now = d.request("config").data
    assert cfg_now["controller"]["window"] == window and cfg_now["controller"]["mode"] == "eb"

    good = d.request("tune", updates={"controller.mode": "mb", "controller.window": 120})
    assert good.ok and good.data["changed"] == {"controller.mode": ["eb", "mb"], "controller.window": [window, 120]}
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.mode is Mode.MB, what="mb policy after tune")

    d.cfg_path.write_text("[controller]\nwindow = \n")  # broken TOML
    bad = d.request("reload")
    assert not bad.ok and "not valid TOML" in bad.error and str(d.cfg_path) in bad.error
    write_config(d.cfg_path, tmp / "rt", controller={"window": 5})  # valid TOML, value out of range
    bad = d.request("reload")
    assert not bad.ok and "controller.window=5" in bad.error and "running config stays" in bad.error
    assert d.request("config").data["controller"]["window"] == 120  # the tuned value still in force
    assert d.status()["daemon"]["counters"]["control_errors"] == 6

    write_config(d.cfg_path, tmp / "rt", controller={"window": 300, "mode": "eb"})
    os.kill(d.proc.pid, signal.SIGHUP)  # SIGHUP = reload
    wait_for(lambda: d.request("config").data["controller"]["window"] == 300, what="SIGHUP reload")
    # The file changed window (the file wins over the tuned 120), not mode (eb before and after): the tuned
    # mb stays, and status says so.
    assert d.request("config").data["controller"]["mode"] == "mb"
    assert d.status()["daemon"]["tuned"] == {"controller.mode": "mb"}
    assert d.request("tune", updates={"controller.mode": "eb"}).ok
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.mode is Mode.EB, what="eb policy after tune")
    write_config(d.cfg_path, tmp / "rt", daemon={"metrics_port": 9999}, controller={"window": 300})
    rep = d.request("reload")
    assert rep.ok and rep.data["needs_restart"] == ["daemon.metrics_port"]
    assert d.request("config").data["daemon"]["metrics_port"] == 0
    link.close()


def test_sigterm_and_shutdown_stop_cleanly_and_a_second_daemon_is_refused(spawn, tmp):
    d = spawn()
    second = spawn(d.cfg_path, ready=False)
    assert second.proc.wait(scaled(15)) == 1 and "another ebctl daemon" in second.log()
    assert d.request("status").ok  # the first one is untouched
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(scaled(10)) == 0
    assert not (tmp / "rt" / "control.sock").exists()  # sockets removed on the way out
    d2 = spawn(d.cfg_path)
    rep = d2.request("shutdown")
    assert rep.ok and rep.data["bye"] == d2.proc.pid
    assert d2.proc.wait(scaled(10)) == 0
