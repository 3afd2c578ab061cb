"""What the command line loads. ``ebctl --help``, ``status``, ``tune set`` and ``reload`` start in a fraction of a
second only while they load none of the numeric stack (numpy, scipy), the controller and what it computes with, the
simulator, or pydantic (typer >= 0.29 would coerce every option through it: ``ebctl.cli.common``). Structural, not
timed: each runs as ``python -m ebctl`` in a subprocess that writes the names in ``sys.modules`` at its exit; a
fake daemon (a REP socket answering as the daemon does) serves the commands that talk to one."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest
import zmq

from ebctl.protocol import ControlReply, ControlRequest, decode, encode

HEAVY = ("numpy", "scipy", "pydantic", "ebctl.controller", "ebctl.tuner", "ebctl.trial", "ebctl.model",
         "ebctl.estimate", "ebctl.costmodel", "ebctl.costfit", "ebctl.profiles", "ebctl.sim", "ebctl.daemon")

# `python -m ebctl ARGS`, then the loaded modules' names into the file $EBCTL_TEST_MODULES (atexit: after the
# command's SystemExit too)
RUN = """
import atexit, json, os, runpy, sys
atexit.register(lambda: open(os.environ["EBCTL_TEST_MODULES"], "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["ebctl", *sys.argv[1:]]
runpy.run_module("ebctl", run_name="__main__", alter_sys=True)
"""


def run(workdir: str, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command's result and the modules it had loaded at exit."""
    out = os.path.join(workdir, "modules.json")
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"} | {"EBCTL_TEST_MODULES": out}
    proc = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, env=env, timeout=60)
    with open(out) as f:
        return proc, set(json.load(f))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def rich(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == "rich" or m.startswith(("rich.", "markdown_it")))


@pytest.fixture
def rundir():
    d = tempfile.mkdtemp(prefix="ebctl-t", dir="/tmp")  # short: ipc paths are limited to ~100 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


STATUS = {"daemon": {"pid": 1, "uptime_s": 5.0, "engines": 1, "counters": {"received": 10, "published": 2}},
          "engines": {"e0": {"mode": "eb", "k": 12, "n_max": 200, "theta_star": 0.31, "reports": 10}}}
REPLIES = {"status": STATUS, "tune": {"changed": {"controller.probe_s": [3.0, 4.0]}}, "reload": {"changed": {}}}


@pytest.fixture
def daemon(rundir):
    """A control endpoint at ``rundir`` that answers status, tune and reload as the daemon would."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.bind(f"ipc://{rundir}/control.sock")
    stop = threading.Event()
    ops: list[str] = []

    def serve() -> None:
        while not stop.is_set():
            if sock.poll(50):
                req = decode(sock.recv(), ControlRequest)
                ops.append(req.op)
                sock.send(encode(ControlReply(ok=True, data=REPLIES[req.op])))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield rundir, ops
    stop.set()
    thread.join(5)
    sock.close(linger=0)
    ctx.term()


def test_help_loads_no_numeric_stack_nor_controller(rundir):
    proc, modules = run(rundir, "--help")
    assert proc.returncode == 0 and "status" in proc.stdout, proc.stderr
    assert heavy(modules) == []
    assert "ebctl.link" not in modules and "zmq" not in modules  # nothing talks to a daemon


def test_status_without_a_daemon_loads_only_the_client(rundir):
    proc, modules = run(rundir, "--runtime-dir", rundir, "status", "--json")
    assert proc.returncode == 1 and "not reachable" in proc.stderr, proc.stderr
    assert heavy(modules) == [] and rich(modules) == []


def test_status_tune_reload_against_a_daemon_load_no_numeric_stack(daemon):
    rundir, ops = daemon
    proc, modules = run(rundir, "--runtime-dir", rundir, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engines"]["e0"]["k"] == 12
    assert "ebctl.link" in modules and heavy(modules) == [] and rich(modules) == []  # --json: no rich either

    proc, modules = run(rundir, "--runtime-dir", rundir, "tune", "set", "controller.probe_s=4")
    assert proc.returncode == 0 and "controller.probe_s = 4.0 (was 3.0)" in proc.stdout, proc.stderr
    assert heavy(modules) == [] and rich(modules) == []

    proc, modules = run(rundir, "--runtime-dir", rundir, "reload")
    assert proc.returncode == 0 and "nothing changed" in proc.stdout, proc.stderr
    assert heavy(modules) == [] and rich(modules) == []

    proc, modules = run(rundir, "--runtime-dir", rundir, "status")  # the table: rich, and still nothing heavy
    assert proc.returncode == 0 and "engine e0" in proc.stdout, proc.stderr
    assert heavy(modules) == [] and "rich.console" in modules
    assert ops == ["status", "tune", "reload", "status"]


def test_simulate_help_in_the_command_list_is_the_simulators_own():
    """``ebctl simulate`` is registered without importing the simulator; its line in ``ebctl --help`` is a
    copy of the simulator's docstring, kept equal here."""
    from ebctl.cli import local
    from ebctl.sim.cli import simulate

    assert " ".join(simulate.__doc__.split()) == local.SIMULATE_HELP
