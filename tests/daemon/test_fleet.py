"""A fleet: engine ids read as node/server/rank, engines gone when silent, several servers joining one node
daemon (``ebctl start --join``), and ``ebctl status`` over two daemons on TCP with CURVE (real daemon
processes, real sockets, the real CLI)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from ebd_helpers import EBCTL, ebctl, report, scaled, wait_for, write_config
from test_security import free_ports

from ebctl import fleet, security
from ebctl.ab.procs import tree as ab_tree
from ebctl.cli import fleet as cli_fleet
from ebctl.cli import run
from ebctl.config import Config, ConfigError
from ebctl.link import EngineLink


@pytest.mark.parametrize(("engine_id", "node", "server", "rank"), [
    ("nodeA/port30000/dp1", "nodeA", "port30000", "dp1"),  # start --join on a daemon with a node name
    ("port30000/dp0", "", "port30000", "dp0"),  # ... and on one without
    ("nodeA/dp0", "nodeA", "-", "dp0"),  # start (no --join): the node's one server
    ("dp3", "", "-", "dp3"),
    ("nodeA/a/sim0", "nodeA", "a", "sim0"),  # the simulated engine
    ("sim0", "", "-", "sim0"),
    ("rack2/nodeA/x/dp0", "nodeB", "rack2/nodeA/x", "dp0"),  # another node's prefix is not taken off
])
def test_where_reads_node_server_and_rank(engine_id, node, server, rank):
    assert fleet.where(engine_id, node) == fleet.Where(node, server, rank)


def test_gone_after_the_silence_and_never_reported_is_gone():
    assert not fleet.gone(9.99, 10.0)
    assert fleet.gone(10.0, 10.0)
    assert fleet.gone(math.nan, 10.0)
    assert fleet.server_prefix("nodeA", "s1") == "nodeA/s1" and fleet.server_prefix("", "s1") == "s1"


def test_fleet_file_errors_name_the_entry(tmp):
    bad = tmp / "fleet.toml"
    bad.write_text('[[daemon]]\ncontrol = "tcp://10.0.0.1:5557"\n[[daemon]]\nname = "b"\ncontrol = "10.0.0.2:5557"\n')
    with pytest.raises(ConfigError, match=r"daemon 2: needs control"):
        cli_fleet.members(Config(), [], bad)
    bad.write_text('[[daemon]]\ncontrol = "tcp://10.0.0.1:5557"\nport = 3\n')
    with pytest.raises(ConfigError, match=r"daemon 1"):
        cli_fleet.members(Config(), [], bad)
    with pytest.raises(ConfigError, match=r"--daemon '10.0.0.1:5557'"):
        cli_fleet.members(Config(), ["10.0.0.1:5557"], None)
    got = cli_fleet.members(Config(), ["a=tcp://h:1", "tcp://h:2"], None)
    assert [(m.name, m.control) for m in got] == [("a", "tcp://h:1"), ("", "tcp://h:2")]


def test_engine_gone_in_status_and_metrics(tmp, spawn):
    port = free_ports(1)[0]
    d = spawn(write_config(tmp / "a.toml", tmp / "rt", daemon={"node": "nodeA", "engine_gone_s": 1.0,
                                                               "metrics_port": port}))
    cfg = d.cfg
    with EngineLink.from_config(cfg, "nodeA/s1/dp0") as a, EngineLink.from_config(cfg, "nodeA/s2/dp0") as b:
        for i in range(3):
            a.report(report("nodeA/s1/dp0", i))
            b.report(report("nodeA/s2/dp0", i))
        wait_for(lambda: len(d.status()["engines"]) == 2, what="both engines")
        deadline = time.monotonic() + scaled(3.0)  # s1 keeps reporting (an idle server beats every 2 s), s2 stops
        i = 3
        while time.monotonic() < deadline:
            a.report(report("nodeA/s1/dp0", i))
            i += 1
            time.sleep(0.1)
        st = d.status()
        assert {k: v["gone"] for k, v in st["engines"].items()} == {"nodeA/s1/dp0": False, "nodeA/s2/dp0": True}
        assert st["daemon"]["engine_gone_s"] == 1.0
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)).read().decode()
    assert 'ebctl_engine_up{engine="nodeA/s1/dp0"} 1.0' in text
    assert 'ebctl_engine_up{engine="nodeA/s2/dp0"} 0.0' in text
    assert 'ebctl_engine_info{engine="nodeA/s2/dp0",node="nodeA",rank="dp0",server="s2"} 1.0' in text


def test_servers_join_one_node_daemon(tmp, spawn):
    """Two simulated servers under one daemon, each with ids of its own; a third with a taken name is refused,
    and so is a join with no daemon to join."""
    d = spawn(write_config(tmp / "a.toml", tmp / "rt", daemon={"node": "nodeA"}))
    base = [*EBCTL, "--config", str(d.cfg_path), "start", "--engine", "sim", "--join"]
    procs = [subprocess.Popen([*base, "--server", name, "--", "--speed", "20"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for name in ("s1", "s2")]
    try:
        wait_for(lambda: sorted(d.status()["engines"]) == ["nodeA/s1/sim0", "nodeA/s2/sim0"], 30,
                 "both servers' engines")
        taken = ebctl("--config", str(d.cfg_path), "start", "--engine", "sim", "--join", "--server", "s1")
        assert taken.returncode == 1 and "a server named 's1' already reports" in taken.stderr
        # s2 killed whole (its supervisor and engine: SIGKILL) and restarted under its name at once, as a supervisor
        # would, long before the daemon shows it gone (engine_gone_s 10 s): the join waits until it has been
        # silent for more than two heartbeats, takes it for dead and starts, rather than refusing the name
        for pid in ab_tree(procs[1].pid):
            os.kill(pid, signal.SIGKILL)
        procs[1].wait(scaled(10))
        st = d.status()["engines"]["nodeA/s2/sim0"]
        assert not st["gone"] and st["last_report_age_s"] < run.SILENT_S  # it would have been refused before
        procs[1] = subprocess.Popen([*base, "--server", "s2", "--", "--speed", "20"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
        wait_for(lambda: "engine 'nodeA/s2/sim0': a new process" in d.log(), 30,
                 "the restarted s2 reporting under its old id (the daemon: a new process took over)")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(scaled(20)) == 0, p.stderr.read()
    assert "has been silent for" in procs[1].stderr.read()
    lone = write_config(tmp / "b.toml", tmp / "rt-none")
    alone = subprocess.Popen([*EBCTL, "--config", str(lone), "start", "--engine", "sim", "--join", "--ready-timeout",
                              "0.5", "--server", "s9", "--", "--speed", "20"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(scaled(60), alone.kill)  # bounds the readline below if the engine never speaks
    guard.start()
    try:  # no daemon to join: the engine starts anyway (stock until one answers)
        first = alone.stdout.readline()
    finally:
        guard.cancel()
        alone.terminate()
        _, err = alone.communicate(timeout=scaled(20))
    assert first.startswith("[sim] engine s9/sim0")
    assert "no daemon answers" in err and "starting the engine anyway" in err
    r = ebctl("--config", str(lone), "start", "--engine", "sim", "--server", "x")
    assert r.returncode == 2 and "--join" in r.stderr


def _curve_daemon(tmp, spawn, name: str, operator_public):
    keys = tmp / f"keys-{name}"
    _, server_secret = security.keygen(keys, "daemon")
    allowed = tmp / f"authorized-{name}"
    allowed.mkdir()
    (allowed / "operator.key").write_bytes(operator_public.read_bytes())
    ports = free_ports(3)
    eps = {f"{w}_endpoint": f"tcp://127.0.0.1:{p}" for w, p in zip(("telemetry", "policy", "control"), ports,
                                                                     strict=True)}
    path = write_config(tmp / f"{name}.toml", tmp / f"rt-{name}", daemon={
        **eps, "node": name, "curve_server_key": str(server_secret), "curve_client_key": str(tmp / "op.key_secret"),
        "curve_authorized": str(allowed)})
    return spawn(path), keys / "daemon.key"


def test_status_over_two_daemons_with_curve(tmp, spawn):
    """Two daemons standing in for two nodes (own runtime dirs, TCP, own CURVE server keys): one view from a
    fleet file; a client key they do not authorise gets no answer from either, and each counts the refusal."""
    op_public, op_secret = security.keygen(tmp, "op")
    (a, a_key), (b, b_key) = _curve_daemon(tmp, spawn, "nodeA", op_public), _curve_daemon(tmp, spawn, "nodeB",
                                                                                          op_public)
    for d, eid in ((a, "nodeA/s1/dp0"), (a, "nodeA/s2/dp0"), (b, "nodeB/s1/dp0")):
        with EngineLink.from_config(d.cfg, eid) as link:
            wait_for(lambda link=link, eid=eid: link.report(report(eid, 0)) and link.policy(time.monotonic()),
                     what=f"{eid}'s policy")
    fleet_file = tmp / "fleet.toml"
    rows = "".join(f'[[daemon]]\ncontrol = "{d.cfg.endpoint("control")}"\nserver_key = "{key}"\n'
                   for d, key in ((a, a_key), (b, b_key)))
    fleet_file.write_text(f'client_key = "{op_secret}"\n{rows}')
    r = ebctl("status", "--fleet", str(fleet_file), "--json")
    assert r.returncode == 0, r.stderr
    got = {x["node"]: sorted(x["status"]["engines"]) for x in json.loads(r.stdout)["daemons"]}
    assert got == {"nodeA": ["nodeA/s1/dp0", "nodeA/s2/dp0"], "nodeB": ["nodeB/s1/dp0"]}
    r = ebctl("status", "--fleet", str(fleet_file))
    assert r.returncode == 0, r.stderr
    assert "2 daemons · 3 servers · 3 engines" in r.stdout
    lines = r.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines if ln.startswith("node")][1:] == [["nodeA", "s1"], ["nodeB", "s1"]]

    _, intruder = security.keygen(tmp / "other", "intruder")
    fleet_file.write_text(f'client_key = "{intruder}"\n{rows}')
    r = ebctl("status", "--fleet", str(fleet_file))
    assert r.returncode == 1 and "no daemon of the fleet answered" in r.stderr
    assert r.stdout.count("no answer within") == 2
    for d in (a, b):
        wait_for(lambda d=d: d.status()["daemon"]["counters"]["handshake_failed"]["auth"] >= 1,
                 what="the refused handshake, counted")


def test_cli_fleet_view_without_a_daemon_exits_1(tmp):
    r = subprocess.run([sys.executable, "-m", "ebctl", "status", "-d", f"ipc://{tmp}/none.sock"],
                       capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 1 and "no answer within" in r.stdout
