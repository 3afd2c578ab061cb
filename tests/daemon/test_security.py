"""Runtime directory permissions, plaintext TCP refused, CURVE with keys from keygen (real daemon processes)."""

from __future__ import annotations

import os
import socket
import stat
import time

import pytest
import zmq.auth
from ebd_helpers import report, scaled, wait_for, write_config

from ebctl import config, security
from ebctl.link import EngineLink
from ebctl.security import SecurityError


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_runtime_dir_is_created_0700_even_under_a_lax_umask(tmp):
    old = os.umask(0)
    try:
        p = security.ensure_runtime_dir(tmp / "a" / "rt")
    finally:
        os.umask(old)
    assert p.is_dir() and mode(p) == 0o700
    assert security.ensure_runtime_dir(p) == p  # an existing private one is fine


@pytest.mark.parametrize("case", ["group-readable", "world-open", "other-owner", "symlink", "file"])
def test_runtime_dir_that_others_could_enter_is_refused(tmp, case):
    p = tmp / "rt"
    if case == "symlink":
        (tmp / "real").mkdir(mode=0o700)
        p.symlink_to(tmp / "real")
        needle = "symbolic link"
    elif case == "file":
        p.write_text("")
        needle = "not a directory"
    else:
        p.mkdir()
        os.chmod(p, {"group-readable": 0o750, "world-open": 0o777, "other-owner": 0o700}[case])
        needle = "mode 07" if case != "other-owner" else "belongs to uid"
        if case == "other-owner":
            if os.geteuid() != 0:
                pytest.skip("needs root to give the directory away")
            os.chown(p, 65534, 65534)
    with pytest.raises(SecurityError, match=needle):
        security.ensure_runtime_dir(p)


def test_daemon_creates_a_private_runtime_dir_and_refuses_a_loose_one(tmp, spawn):
    d = spawn()
    rt = tmp / "rt"
    assert mode(rt) == 0o700
    assert {"telemetry.sock", "policy.sock", "control.sock"} <= {f.name for f in rt.iterdir()}
    d.request("shutdown")
    assert d.proc.wait(scaled(10)) == 0
    os.chmod(rt, 0o755)
    loose = spawn(None, ready=False)
    assert loose.proc.wait(scaled(15)) == 2
    assert "0755" in loose.log() and "chmod 700" in loose.log()


def test_check_endpoints():
    tcp = {"daemon.telemetry_endpoint": "tcp://127.0.0.1:5555"}
    with pytest.raises(SecurityError, match=r"curve_server_key.*ebctl keygen.*insecure"):
        security.check_endpoints(config.load(None, tcp))
    security.check_endpoints(config.load(None, {**tcp, "daemon.insecure": "true"}))
    security.check_endpoints(config.load(None, {}))  # ipc everywhere: fine
    with pytest.raises(SecurityError, match="abstract"):
        security.check_endpoints(config.load(None, {"daemon.control_endpoint": "ipc://@ebctl"}))


def test_keygen_modes_and_no_silent_overwrite(tmp):
    pub, sec = security.keygen(tmp / "keys", "daemon")
    assert mode(tmp / "keys") == 0o700 and mode(sec) == 0o600 and mode(pub) == 0o644
    public, secret = zmq.auth.load_certificate(sec)
    assert secret and zmq.auth.load_certificate(pub) == (public, None)
    assert security.server_public_key(str(sec)) == public  # read from the public twin
    assert security.client_keypair(secret.decode()) == (public, secret)  # a Z85 secret works as well
    with pytest.raises(SecurityError, match="exists"):
        security.keygen(tmp / "keys", "daemon")
    assert security.keygen(tmp / "keys", "daemon", force=True)[0] == pub
    assert zmq.auth.load_certificate(sec)[0] != public


def tcp_config(tmp, **daemon):
    ports = free_ports(3)
    eps = {f"{w}_endpoint": f"tcp://127.0.0.1:{p}" for w, p in zip(("telemetry", "policy", "control"), ports,
                                                                     strict=True)}
    return write_config(tmp / "tcp.toml", tmp / "rt", daemon={**eps, **daemon})


def test_plaintext_tcp_refused_without_insecure(tmp, spawn):
    path = tcp_config(tmp)
    d = spawn(path, ready=False)
    assert d.proc.wait(scaled(15)) == 2
    assert "--insecure" in d.log() and "ebctl keygen" in d.log()
    ok = spawn(path, "--insecure")  # explicitly asked for: serves plaintext
    cfg = config.load(str(path), {"daemon.insecure": "true"})
    with EngineLink.from_config(cfg, "e0") as link:
        wait_for(lambda: link.report(report("e0", 0)) and link.policy(time.monotonic()), what="plaintext policy")
    assert ok.status()["daemon"]["counters"]["received"] >= 1


def test_curve_handshake_with_keys_from_keygen(tmp, spawn):
    keys, allowed = tmp / "keys", tmp / "authorized"
    _, server_secret = security.keygen(keys, "daemon")
    client_public, client_secret = security.keygen(keys, "engine")
    _, intruder_secret = security.keygen(tmp / "other", "intruder")
    allowed.mkdir()
    (allowed / "engine.key").write_bytes(client_public.read_bytes())
    path = tcp_config(tmp, curve_server_key=str(server_secret), curve_client_key=str(client_secret),
                      curve_authorized=str(allowed))
    d = spawn(path)  # wait_ready already spoke CURVE to the control socket with the client key
    cfg = config.load(str(path))
    with EngineLink.from_config(cfg, "e0") as link:
        pol = wait_for(lambda: link.report(report("e0", 0)) and link.policy(time.monotonic()), what="CURVE policy")
        assert pol.engine_id == "e0"
    intruder = EngineLink("e1", telemetry_endpoint=cfg.endpoint("telemetry"), policy_endpoint=cfg.endpoint("policy"),
                          curve_client_key=str(intruder_secret), curve_server_public=str(server_secret))
    for i in range(20):
        intruder.report(report("e1", i))
    wait_for(lambda: d.status()["daemon"]["counters"]["handshake_failed"]["auth"] >= 1, what="refused handshake")
    time.sleep(0.3)
    assert intruder.policy(time.monotonic()) is None
    status = d.status()
    assert list(status["engines"]) == ["e0"]  # nothing of the intruder's got in
    intruder.close()
    crowd = [EngineLink(f"x{i}", telemetry_endpoint=cfg.endpoint("telemetry"), policy_endpoint=cfg.endpoint("policy"),
                        curve_client_key=str(intruder_secret), curve_server_public=str(server_secret))
             for i in range(8)]
    try:  # a crowd of strangers: every failure counted, the log bounded (5 lines, then every 1000th)
        wait_for(lambda: sum(d.status()["daemon"]["counters"]["handshake_failed"].values()) >= 12, 15,
                 "the crowd's refused handshakes")
        assert d.log().count("handshake failed") == 5
    finally:
        for link in crowd:
            link.close()
