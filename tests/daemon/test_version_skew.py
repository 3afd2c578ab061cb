"""Version skew (docs/upgrade.md): the daemon serves plugins of its protocol version and the one before; a plugin
newer than its daemon runs stock and says so once. A real daemon process and real ZeroMQ sockets; the old plugin
speaks version 1's wire format as version 1 defined it (the structs below, copied from protocol version 1), the
newer one is this package copied with its protocol version raised (tools/soak.py's ``versioned_copy``), run in
its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import zmq
from ebd_helpers import finished, report, scaled, wait_for

from ebctl.link import EngineLink
from ebctl.protocol import PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import soak  # noqa: E402


class PolicyV1(msgspec.Struct, tag="policy", kw_only=True, forbid_unknown_fields=True):
    """Protocol version 1's policy, field for field (and refusing any other field: what version 1 sends is
    exactly this)."""

    v: int
    engine_id: str = ""
    version: int = 0
    issued_at: float = 0.0
    ttl_s: float = 10.0
    mode: str = "off"
    k: int = 1
    n_max: int = 1
    kv_reserve_frac: float = 0.0
    max_defer_s: float = 5.0
    pd_interval: int = 0
    reason: str = ""
    estimates: dict | None = None


V1_REPORT_FIELDS = {  # protocol version 1's IterationReport (tag "it"), without plugin_version
    "v", "engine_id", "instance", "seq", "wall_time", "forward_s", "kind", "prefill_reqs", "prefill_tokens",
    "decode_reqs", "decode_ctx_tokens", "prefill_ctx_tokens", "running", "waiting", "kv_used", "kv_total",
    "max_running", "policy_version", "mixed_unavailable", "mixed_unavailable_reason", "group_size",
    "pd_interval_available", "gate_reasons", "finished"}


def v1_frame(seq: int) -> bytes:
    """One report as a version-1 plugin encodes it: the version-1 fields only, ``v`` = 1."""
    done = finished(np.random.default_rng(seq), 20.0, 4)
    d = msgspec.to_builtins(report("old/dp0", seq, done, instance="v1plugin"))
    d = {k: v for k, v in d.items() if k in V1_REPORT_FIELDS or k == "type"}
    d["v"] = 1
    return msgspec.msgpack.encode(d)


def test_the_previous_protocol_is_steered_with_policies_it_can_decode(spawn):
    assert PROTOCOL_VERSION == 2  # the wire format these version-1 structs copy is the version before
    d = spawn()
    ctx = zmq.Context()
    push, sub = ctx.socket(zmq.PUSH), ctx.socket(zmq.SUB)
    try:
        push.connect(d.cfg.endpoint("telemetry"))
        sub.setsockopt(zmq.SUBSCRIBE, b"old/dp0\0")
        sub.connect(d.cfg.endpoint("policy"))
        got: list[PolicyV1] = []
        seq = 0
        deadline = time.monotonic() + scaled(20)
        while time.monotonic() < deadline and not any(p.mode == "eb" for p in got):
            for _ in range(10):
                push.send(v1_frame(seq))
                seq += 1
            while sub.poll(20):
                frame = sub.recv()
                got.append(msgspec.msgpack.decode(frame[len(b"old/dp0\0"):], type=PolicyV1))
        assert got, "no policy for the version-1 plugin"
        assert {p.v for p in got} == {1}
        assert any(p.mode == "eb" and p.n_max > 1 for p in got), got[-1]  # steered, not stock
        st = d.status()
        eng = st["engines"]["old/dp0"]
        assert eng["plugin_protocol"] == 1 and eng["plugin_version"] == ""
        assert st["daemon"]["accepts_protocols"] == [1, 2]
        assert st["daemon"]["counters"]["rejected"]["version"] == 0
        # an engine of this version on the same daemon: its own version, its package version shown
        with EngineLink("new/dp0", telemetry_endpoint=d.cfg.endpoint("telemetry"),
                        policy_endpoint=d.cfg.endpoint("policy"), flush_s=0.01) as link:
            for i in range(200):
                link.report(report("new/dp0", i, finished(np.random.default_rng(i), 20.0, 4)))
                time.sleep(0.002)
            wait_for(lambda: link.policy(time.monotonic()) is not None, timeout=scaled(10), what="a v2 policy")
            assert link.policy(time.monotonic()).v == PROTOCOL_VERSION
            new = d.status()["engines"]["new/dp0"]
            assert new["plugin_protocol"] == PROTOCOL_VERSION and new["plugin_version"] == link.plugin_version
            assert link.plugin_version  # the installed package's version
    finally:
        push.close(linger=0)
        sub.close(linger=0)
        ctx.term()


NEWER_PLUGIN = """
import json, logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from ebctl import protocol
from ebctl.link import EngineLink
from ebctl.protocol import BatchKind, IterationReport
tel, pol, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
steered = 0
with EngineLink("newer/dp0", telemetry_endpoint=tel, policy_endpoint=pol, flush_s=0.02) as link:
    end, seq = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        link.report(IterationReport(engine_id="newer/dp0", seq=seq, wall_time=time.time(), forward_s=0.01,
                                    kind=BatchKind.DECODE, decode_reqs=64, running=64, kv_total=10**7))
        seq += 1
        steered += link.policy(time.monotonic()) is not None
        time.sleep(0.005)
    print(json.dumps({"protocol": protocol.PROTOCOL_VERSION, "steered": steered, "stats": link.stats()}))
"""


def test_a_newer_plugin_runs_stock_and_says_so_once(spawn, tmp):
    d = spawn()
    pkg = soak.versioned_copy(tmp / "next", PROTOCOL_VERSION + 1)
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    p = subprocess.run([sys.executable, "-c", NEWER_PLUGIN, d.cfg.endpoint("telemetry"), d.cfg.endpoint("policy"),
                        str(scaled(4.0))], capture_output=True, text=True, env=env, timeout=scaled(60), cwd=tmp)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["protocol"] == PROTOCOL_VERSION + 1
    assert out["steered"] == 0  # stock the whole time
    assert out["stats"]["rejected"]["version"] >= 1  # the daemon's stock notices, refused
    assert out["stats"]["daemon_protocol"] == PROTOCOL_VERSION
    warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING")]
    assert len(warnings) == 1, p.stderr
    assert (f"speaks protocol version {PROTOCOL_VERSION}, this plugin {PROTOCOL_VERSION + 1}: running stock until "
            "the daemon is upgraded") in warnings[0]
    st = d.status()
    assert "newer/dp0" not in st["engines"]
    assert st["daemon"]["newer_plugins"]["newer/dp0"]["protocol"] == PROTOCOL_VERSION + 1
    assert [w for w in st["daemon"]["warnings"] if "'newer/dp0'" in w] == [
        f"engine 'newer/dp0' runs a plugin of protocol {PROTOCOL_VERSION + 1}, newer than this daemon's "
        f"{PROTOCOL_VERSION}: its reports are refused and it runs stock; upgrade the daemon (docs/upgrade.md)"]
    assert st["daemon"]["counters"]["rejected"]["version"] >= 100  # every report of it refused, counted
    assert d.log().count("newer than this daemon's") == 1


def test_a_next_version_daemon_serves_this_plugin_and_this_cli(tmp):
    """The soak's upgrade: a daemon one protocol version ahead (the copy) steers an engine of this version and
    answers this version's control client, each in its own version."""
    from ebd_helpers import DaemonProcess, write_config

    pkg = soak.versioned_copy(tmp / "next", PROTOCOL_VERSION + 1)
    cfg_path = write_config(tmp / "ebctl.toml", tmp / "rt")
    old, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = str(pkg)
    os.chdir(tmp)  # `python -m` puts the working directory first on sys.path: not this checkout's package
    try:
        d = DaemonProcess(cfg_path)
    finally:
        os.chdir(cwd)
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    try:
        d.wait_ready()
        st = d.status()  # this version's client, answered in this version
        assert st["daemon"]["protocol"] == PROTOCOL_VERSION + 1
        with EngineLink("cur/dp0", telemetry_endpoint=d.cfg.endpoint("telemetry"),
                        policy_endpoint=d.cfg.endpoint("policy"), flush_s=0.01) as link:
            for i in range(200):
                link.report(report("cur/dp0", i, finished(np.random.default_rng(i), 20.0, 4)))
                time.sleep(0.002)
            wait_for(lambda: (p := link.policy(time.monotonic())) is not None and p.mode == "eb",
                     timeout=scaled(10), what="a policy from the next-version daemon")
            assert link.stats()["rejected"]["version"] == 0
        assert d.status()["engines"]["cur/dp0"]["plugin_protocol"] == PROTOCOL_VERSION
    finally:
        d.stop()
