"""EngineLink and ControlClient against real sockets, without a daemon: fake publishers and servers."""

from __future__ import annotations

import random
import threading
import time

import msgspec
import pytest
import zmq
from ebd_helpers import report, scaled, wait_for

from ebctl.link import ControlClient, DaemonUnreachable, EngineLink, topic
from ebctl.protocol import (
    PROTOCOL_VERSION,
    BatchKind,
    ControlReply,
    ControlRequest,
    FinishedRequest,
    IterationReport,
    Mode,
    Policy,
    decode,
    encode,
)
from ebctl.security import SecurityError


@pytest.fixture
def pub(tmp):
    """A PUB socket bound where links look for policies: ``send(engine_id, payload)``."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUB)
    ep = f"ipc://{tmp}/policy.sock"
    s.bind(ep)
    yield Pub(s, ep)
    s.close(linger=0)
    ctx.term()


class Pub:
    def __init__(self, sock, endpoint):
        self.sock, self.endpoint = sock, endpoint

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)


def links(tmp, pub, *ids, **kw):
    return [EngineLink(i, telemetry_endpoint=f"ipc://{tmp}/none.sock", policy_endpoint=pub.endpoint, **kw)
            for i in ids]


def connected(pub, link, engine_id):
    """Wait until the SUB's subscription reached the PUB (the slow-joiner problem): probe until one arrives."""
    probe = Policy(engine_id=engine_id, version=0, ttl_s=60.0)
    def got():
        pub.send(topic(engine_id) + encode(probe))
        return link.policy(time.monotonic()) is not None
    wait_for(got, timeout=5, what=f"subscription of {engine_id}")
    # One connection delivers in order: once a last, marked probe is held, no earlier one is still in flight.
    pub.send(topic(engine_id) + encode(msgspec.structs.replace(probe, ttl_s=61.0)))
    wait_for(lambda: link.policy(time.monotonic()).ttl_s == 61.0, what=f"the last probe of {engine_id}")


def test_report_never_blocks_and_counts_drops_without_a_daemon(tmp):
    """No daemon: report() returns every time (False once the bounded queue is full: dropped and counted) and
    close() returns, ending the link's I/O thread. A call that blocked would never return: each runs on a thread
    of its own, and a generous deadline, whose expiry is the failure, bounds the wait; how long they took is not
    asserted."""
    before = set(threading.enumerate())
    link = EngineLink("e0", telemetry_endpoint=f"ipc://{tmp}/absent.sock", policy_endpoint=f"ipc://{tmp}/p.sock",
                      queue=10)
    io_threads = [th for th in set(threading.enumerate()) - before if th.name.startswith("ebctl-link")]
    results = []

    def returns(call, what):
        th = threading.Thread(target=call, daemon=True)
        th.start()
        wait_for(lambda: not th.is_alive(), timeout=10, what=what)

    returns(lambda: results.extend(link.report(report("e0", i)) for i in range(200)), "200 report() calls")
    assert len(results) == 200
    s = link.stats()
    assert results[0] and not results[-1]
    # every report is counted once: handed to ZeroMQ, still in the bounded queue, or dropped
    assert s["sent"] + s["queued"] == sum(results) and s["dropped"] == results.count(False)
    assert s["sent"] + s["queued"] + s["dropped"] == 200
    assert 1 <= s["sent"] + s["queued"] <= 20  # the queue bound (plus what the transport buffers), not 200
    assert link.policy(time.monotonic()) is None
    assert len(io_threads) == 1 and io_threads[0].is_alive()
    # linger 0: close drops what ZeroMQ still holds for the absent peer instead of waiting for it (forever)
    returns(lambda: (link.close(), link.close()), "close() twice (idempotent)")
    assert not io_threads[0].is_alive()  # the I/O thread ended
    assert link.report(report("e0", 201)) is False  # after close: dropped, no exception


def test_topic_is_the_engine_id_exactly(tmp, pub):
    dp1, dp10 = links(tmp, pub, "dp1", "dp10")
    connected(pub, dp1, "dp1")
    connected(pub, dp10, "dp10")
    pub.send(topic("dp1") + encode(Policy(engine_id="dp1", version=7, ttl_s=60.0, mode=Mode.EB, k=3,
                                          n_max=8)))
    pub.send(topic("dp10") + encode(Policy(engine_id="dp10", version=9, ttl_s=60.0, mode=Mode.MB, k=5,
                                           n_max=8)))
    p1 = wait_for(lambda: (p := dp1.policy(time.monotonic())) and p.version == 7 and p, what="dp1 v7")
    p10 = wait_for(lambda: (p := dp10.policy(time.monotonic())) and p.version == 9 and p, what="dp10 v9")
    assert (p1.engine_id, p1.mode, p1.k) == ("dp1", Mode.EB, 3)
    assert (p10.engine_id, p10.mode, p10.k) == ("dp10", Mode.MB, 5)
    for link in (dp1, dp10):  # neither ever saw the other's frames
        assert sum(link.stats()["rejected"].values()) == 0
        link.close()


def test_bad_policy_frames_are_counted_and_ignored(tmp, pub):
    (link,) = links(tmp, pub, "e0")
    connected(pub, link, "e0")
    good = Policy(engine_id="e0", version=3, ttl_s=60.0, mode=Mode.EB, k=2, n_max=8)
    pub.send(topic("e0") + encode(good))
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.version == 3, what="v3")
    before = link.stats()["rejected"]
    pub.send(topic("e0") + b"\x93\x01garbage")  # not msgpack of a Policy
    pub.send(topic("e0") + encode(msgspec.structs.replace(good, v=PROTOCOL_VERSION + 1, version=4)))  # another version
    pub.send(topic("e0") + encode(msgspec.structs.replace(good, k=0, version=5)))  # k >= 1 violated
    pub.send(topic("e0") + encode(msgspec.structs.replace(good, pd_interval=-1, version=7)))  # pd_interval >= 0
    pub.send(topic("e0") + encode(msgspec.structs.replace(good, pd_interval=1025, version=8)))  # <= 1024
    pub.send(topic("e0") + encode(msgspec.structs.replace(good, engine_id="e1", version=6)))  # wrong id
    pub.send(topic("e0") + b"")
    want = {"malformed": 2, "version": 1, "validation": 3, "engine_id": 1}
    wait_for(lambda: link.policy(time.monotonic()) and all(
        link.stats()["rejected"][k] - before[k] == n for k, n in want.items()), what=f"rejections {want}")
    assert link.policy(time.monotonic()).version == 3  # the good one is still in force
    link.close()


def test_expiry_is_local_receive_time_plus_ttl_whatever_issued_at_says(tmp, pub):
    (link,) = links(tmp, pub, "e0")
    connected(pub, link, "e0")
    link.policy(1e9)  # the probe is now expired (its local receive time is long past)
    for issued_at in (1.0, 4e9):  # a daemon clock far behind, then far ahead, of the engine's
        pub.send(topic("e0") + encode(Policy(engine_id="e0", version=10 + int(issued_at > 2), issued_at=issued_at,
                                             ttl_s=2.0)))
        t0 = 2e9 + issued_at  # the engine's own clock (any monotonic seconds)
        got = wait_for(lambda t0=t0: link.policy(t0), what="policy")
        assert link.policy(t0 + 1.99) is got
        assert link.policy(t0 + 2.0) is None
    link.close()


def test_newest_version_wins_and_a_restarted_daemon_is_followed(tmp, pub):
    (link,) = links(tmp, pub, "e0")
    connected(pub, link, "e0")

    def send(version, issued_at):
        pub.send(topic("e0") + encode(Policy(engine_id="e0", version=version, issued_at=issued_at, ttl_s=60.0)))

    send(5, 100.0)
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.version == 5, what="v5")
    send(3, 90.0)  # older, from the same daemon: ignored
    send(5, 101.0)  # a re-publish: refreshes
    wait_for(lambda: link.policy(time.monotonic()).issued_at == 101.0, what="refresh of v5")
    assert link.policy(time.monotonic()).version == 5
    send(1, 200.0)  # a restarted daemon starts again at low versions, issued later: follow it
    wait_for(lambda: link.policy(time.monotonic()).version == 1, what="v1 of the restarted daemon")
    seen = link.stats()["policies_received"]
    send(4, 201.0)
    send(2, 150.0)  # drained with v4 or after it: the newest stays either way
    wait_for(lambda: link.policy(time.monotonic()) and link.stats()["policies_received"] == seen + 2,
             what="v4 and v2 taken in")
    assert link.policy(time.monotonic()).version == 4
    link.close()


def test_plaintext_tcp_refused_unless_insecure(tmp):
    with pytest.raises(SecurityError, match="insecure"):
        EngineLink("e0", telemetry_endpoint="tcp://127.0.0.1:5999", policy_endpoint="tcp://127.0.0.1:5998")
    with pytest.raises(SecurityError, match="CURVE"):
        ControlClient("tcp://127.0.0.1:5997")
    EngineLink("e0", telemetry_endpoint="tcp://127.0.0.1:5999", policy_endpoint="tcp://127.0.0.1:5998",
               insecure=True).close()
    with pytest.raises(ValueError, match="engine_id"):
        EngineLink("a\0b", telemetry_endpoint=f"ipc://{tmp}/t", policy_endpoint=f"ipc://{tmp}/p")


def test_control_client_times_out_then_recovers_lazy_pirate(tmp):
    ep = f"ipc://{tmp}/control.sock"
    client = ControlClient(ep, timeout_s=0.2)
    raised = []

    def ask():
        try:
            client.request("status")
        except DaemonUnreachable as err:
            raised.append(err)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    # it gives up, not never: a request that hung would run into this deadline (its duration is not asserted)
    wait_for(lambda: not asking.is_alive(), timeout=10, what="the request to an absent daemon to give up")
    assert len(raised) == 1 and str(tmp) in str(raised[0])
    assert isinstance(raised[0], ConnectionError) and raised[0].endpoint == ep

    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.bind(ep)
    seen = []

    def serve(n):
        for _ in range(n):
            req = decode(rep.recv(), ControlRequest)
            seen.append((req.op, req.args))
            rep.send(b"not a reply" if req.op == "garbage" else encode(ControlReply(ok=True, data=req.op)))

    th = threading.Thread(target=serve, args=(2,), daemon=True)
    th.start()
    try:
        assert client.request("status", verbose=True).data == "status"  # the same client, a rebuilt socket
        bad = client.request("garbage")
        assert not bad.ok and "bad reply" in bad.error
        assert seen == [("status", {"verbose": True}), ("garbage", {})]
    finally:
        th.join(5)
        client.close()
        rep.close(linger=0)
        ctx.term()


def test_control_client_wait_ready_gives_up_on_a_dead_daemon(tmp):
    from ebctl.link import ControlClient, DaemonUnreachable
    client = ControlClient(f"ipc://{tmp}/nobody.sock", timeout_s=0.05)
    asked, checked = [], []
    real_request = client.request

    def request(op, **args):
        asked.append(op)
        return real_request(op, **args)

    def alive():  # the daemon process lives through two unanswered requests, then it is gone
        checked.append(len(asked))
        return len(checked) < 3

    client.request = request
    with pytest.raises(DaemonUnreachable, match=r"nobody\.sock"):
        client.wait_ready(30, alive=alive)
    # it asked whether the process lives after each unanswered request, and stopped at the first "no": three
    # requests, not the 30 s it was offered
    assert asked == ["status"] * 3 and checked == [1, 2, 3]
    client.close()


def test_a_report_that_cannot_be_encoded_is_dropped_and_never_wedges_the_queue(tmp):
    """The SGLang plugin queues the wire record itself (``IterationReport``, built by name in the hook); the I/O
    thread only encodes it. A report it cannot encode is dropped and counted, and the next one leaves, whole:
    the frame read back equals the report queued, its instance stamped by the link when the engine left it out."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{tmp}/t.sock")
    link = EngineLink("e0", telemetry_endpoint=f"ipc://{tmp}/t.sock", policy_endpoint=f"ipc://{tmp}/p.sock")
    try:
        done = (FinishedRequest(12, 7, "length", 0.25, 0.01),)  # no NaN: a NaN field never compares equal
        good = IterationReport(engine_id="e0", seq=3, wall_time=1.7e9, forward_s=0.004, kind=BatchKind.DECODE,
                               decode_reqs=5, decode_ctx_tokens=321, running=5, waiting=2, kv_used=400, kv_total=1000,
                               max_running=16, policy_version=7, group_size=2, gate_reasons={"wait_k": 4},
                               finished=done)
        bad = msgspec.structs.replace(good, seq=2, finished=(object(),))  # a struct does not check types: encode does
        assert link.report(bad)
        assert link.report(good)
        frame = pull.recv() if pull.poll(int(scaled(5) * 1000)) else None
        assert frame is not None, "the good report never arrived: a bad one wedged the queue"
        assert decode(frame, IterationReport) == msgspec.structs.replace(good, instance=link.instance,
                                                                       plugin_version=link.plugin_version)
        assert len(link.instance) == 8
        s = link.stats()
        assert (s["sent"], s["dropped"], s["unencodable"]) == (1, 1, 1), s
    finally:
        link.close()
        pull.close(0)
        ctx.term()


def _rejected(link) -> dict[str, int]:
    return dict(link.stats()["rejected"])


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before[k] for k, n in after.items() if n != before[k]}


def test_garbage_policy_frames_are_dropped_and_counted_and_the_next_good_one_applies(tmp, pub):
    """Whatever bytes arrive under the engine's topic, ``policy()`` never raises: each bad frame is counted
    once under one reason, and a valid policy after them is applied."""
    (link,) = links(tmp, pub, "e0")
    connected(pub, link, "e0")
    good = Policy(engine_id="e0", version=1, ttl_s=60.0, mode=Mode.EB, k=2, n_max=8)
    crafted = [  # by hand: 5 malformed, 1 for another id, 1 of another version, 1 that fails validation
        b"",
        # a map whose key is invalid UTF-8 (made the old decoder raise UnicodeDecodeError): msgspec skips the
        # unknown key unread, which leaves a Policy of defaults, for engine "" (not "e0")
        b"\x81\xa1\xff\x01",
        b"\xc1",  # a byte msgpack never uses
        encode(good)[:-1],  # cut short
        encode(good) + b"\x00",  # trailing data
        b"\x91" * 5000 + b"\xc0",  # nested 5000 deep
        msgspec.msgpack.encode({"type": "policy", "v": PROTOCOL_VERSION + 1, "k": "x"}),  # another version, unfit
        msgspec.msgpack.encode({"type": "policy", "v": PROTOCOL_VERSION, "engine_id": "e0", "k": 0}),  # k >= 1
    ]
    before = _rejected(link)
    for frame in crafted:
        pub.send(topic("e0") + frame)
    pub.send(topic("e0") + encode(good))
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.version == 1, what="v1 after the crafted frames")
    assert _delta(_rejected(link), before) == {"malformed": 5, "engine_id": 1, "version": 1, "validation": 1}

    rng = random.Random(25)
    sent = 0
    for version in range(2, 7):  # rounds of 30: well inside the receive queue (64), so none is lost
        before = _rejected(link)
        for _ in range(30):
            pub.send(topic("e0") + rng.randbytes(rng.randint(0, 48)))
        sent += 30
        pub.send(topic("e0") + encode(msgspec.structs.replace(good, version=version)))
        wait_for(lambda v=version: link.policy(time.monotonic()).version == v, what=f"v{version}")
        assert sum(_delta(_rejected(link), before).values()) == 30  # each random frame refused, once
    assert sent == 150 and link.stats()["policy_version"] == 6
    link.close()


def test_a_decoder_that_raises_anything_only_drops_the_frame(tmp, pub, monkeypatch):
    """The decoder promises ProtocolError only; the link does not depend on it: any exception is a
    malformed frame, and the policy in force stays."""
    import ebctl.link

    real = ebctl.link.decode
    errors = {b"U": UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), b"R": RecursionError(),
              b"K": KeyError("v"), b"M": MemoryError()}

    def decode(data, kind):
        if bytes(data[:1]) in errors:
            raise errors[bytes(data[:1])]
        return real(data, kind)

    (link,) = links(tmp, pub, "e0")
    connected(pub, link, "e0")
    monkeypatch.setattr(ebctl.link, "decode", decode)
    pub.send(topic("e0") + encode(Policy(engine_id="e0", version=3, ttl_s=60.0)))
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.version == 3, what="v3")
    before = _rejected(link)
    for marker in errors:
        pub.send(topic("e0") + marker + b"...")
    pub.send(topic("e0") + encode(Policy(engine_id="e0", version=4, ttl_s=60.0)))
    wait_for(lambda: link.policy(time.monotonic()).version == 4, what="v4 after the frames that raised")
    assert _delta(_rejected(link), before) == {"malformed": 4}
    link.close()


def test_a_policy_beyond_the_engines_limits_is_refused_counted_and_the_one_in_force_stays(tmp, pub):
    (link,) = links(tmp, pub, "e0", max_running=16)
    connected(pub, link, "e0")
    at_limit = Policy(engine_id="e0", version=1, ttl_s=86_400.0, mode=Mode.EB, k=16, n_max=16)  # all at bounds
    pub.send(topic("e0") + encode(at_limit))
    wait_for(lambda: (p := link.policy(time.monotonic())) and p.version == 1, what="v1 at the limits")
    before = _rejected(link)
    for version, changes in ((2, {"n_max": 17}), (3, {"k": 9, "n_max": 8}), (4, {"ttl_s": 86_400.5}),
                             (5, {"ttl_s": 1e7, "n_max": 17})):  # two faults: counted once, as the first (ttl)
        pub.send(topic("e0") + encode(msgspec.structs.replace(at_limit, version=version, **changes)))
    want = {"n_max": 1, "k": 1, "ttl": 2}
    wait_for(lambda: link.policy(time.monotonic()) and _delta(_rejected(link), before) == want,
             what=f"refusals {want}")
    assert link.policy(time.monotonic()).version == 1  # still the one in force
    pub.send(topic("e0") + encode(msgspec.structs.replace(at_limit, version=6, k=3, n_max=8)))
    wait_for(lambda: link.policy(time.monotonic()).version == 6, what="v6 within the limits")
    link.close()


def test_the_io_thread_wakes_once_per_flush_yet_a_policy_arrives_at_once(tmp, pub):
    """Each wake of the I/O thread takes the engine process's GIL, so an idle link wakes about once per
    ``flush_s`` (not once per ms); a policy still wakes it on arrival, long before the flush is due."""
    (link,) = links(tmp, pub, "dp0", flush_s=0.5)
    try:
        w0, t0 = link.wakes, time.monotonic()
        time.sleep(1.5)
        woke, spent = link.wakes - w0, time.monotonic() - t0
        assert woke <= spent / 0.5 + 2, f"{woke} wakes in {spent:.2f} s with flush_s = 0.5"
        (slow,) = links(tmp, pub, "dp1", flush_s=30.0)  # a flush that would never come within the test
        try:
            connected(pub, slow, "dp1")  # a 5-s wait at most: only a policy's arrival can wake it in time
            assert slow.stats()["wakes"] <= 1 + slow.policies
        finally:
            slow.close()
    finally:
        link.close()
