"""The command line against real processes: a daemon, `ebctl start` supervising a daemon and an engine."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from ebd_helpers import EBCTL, alive, ebctl, kill_group
from ebd_helpers import wait_requests as wait_for
from polling import scaled

from ebctl import config, profiles
from ebctl.link import ControlClient, DaemonUnreachable, EngineLink
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport


@pytest.fixture
def rundir():
    d = tempfile.mkdtemp(prefix="ebctl-t", dir="/tmp")  # short: ipc paths are limited to ~100 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def cfg_for(rundir: str) -> config.Config:
    return config.load(None, {"daemon.runtime_dir": rundir})


def status(rundir: str, timeout_s: float = 1.0):
    """The daemon's status data, or None if it does not answer within ``scaled(timeout_s)``."""
    try:
        with ControlClient.from_config(cfg_for(rundir), timeout_s=scaled(timeout_s)) as c:
            reply = c.request("status")
    except DaemonUnreachable:
        return None
    return reply.data if reply.ok else None


def daemon_config(rundir: str) -> dict:
    with ControlClient.from_config(cfg_for(rundir)) as c:
        return c.request("config").data


@pytest.fixture
def conf_file(tmp_path):
    f = tmp_path / "ebctl.toml"
    f.write_text('[controller]\nmode = "eb"\n')
    return f


@pytest.fixture
def daemon(rundir, conf_file):
    """`ebctl daemon` in the background, answering at ``rundir``."""
    proc = subprocess.Popen([*EBCTL, "daemon", "--runtime-dir", rundir, "--config", str(conf_file),
                             "--set", "daemon.log_level=warning"], start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or status(rundir), 15, "the daemon to answer")
        assert proc.poll() is None, f"ebctl daemon exited with {proc.returncode}"
        yield proc
    finally:
        kill_group(proc)


def reports(rundir: str, engine_id: str) -> int | None:
    return (status(rundir) or {}).get("engines", {}).get(engine_id, {}).get("reports")


def feed(rundir: str, engine_id: str = "e0", n: int = 50) -> None:
    with EngineLink.from_config(cfg_for(rundir), engine_id) as link:
        for seq in range(n):
            link.report(IterationReport(engine_id=engine_id, seq=seq, wall_time=time.time(), forward_s=0.01,
                                        kind=BatchKind.DECODE, decode_reqs=8, decode_ctx_tokens=4000, running=8,
                                        kv_used=4000, kv_total=100_000,
                                        finished=(FinishedRequest(input_len=100, output_len=20),)))
        # linger 0 on close: keep the link open until the daemon has counted every report
        wait_for(lambda: reports(rundir, engine_id) == n, 10, f"the {n} reports of {engine_id}")


def test_status_json_and_table(daemon, rundir):
    feed(rundir)
    wait_for(lambda: (status(rundir) or {}).get("engines"), 5, "the engine to appear")
    r = ebctl("status", "--json", "--runtime-dir", rundir)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["daemon"]["pid"] == daemon.pid
    assert data["engines"]["e0"]["reports"] == 50 and data["engines"]["e0"]["mode"] in ("eb", "mb", "off")
    table = ebctl("status", "--runtime-dir", rundir)
    assert table.returncode == 0 and "engine e0" in table.stdout and "θ̂*" in table.stdout


def test_status_of_an_unknown_engine_names_those_there_are_and_refusals_are_no_problem(daemon, rundir):
    feed(rundir, "b")
    feed(rundir, "a")
    wait_for(lambda: len((status(rundir) or {}).get("engines", {})) == 2, 5, "both engines")
    for asked in (["nosuch"], ["b", "nosuch"]):
        r = ebctl("status", *(x for e in asked for x in ("--engine", e)), "--runtime-dir", rundir)
        assert (r.returncode, r.stderr, r.stdout) == (1, "ebctl status: no engine 'nosuch'; engines: a, b\n", "")
    r = ebctl("status", "--engine", "b", "--runtime-dir", rundir)
    assert r.returncode == 0 and "engine b" in r.stdout and "engine a" not in r.stdout
    # the client's mistake, refused by the daemon (theta_min above theta_max): not the daemon's problem
    assert ebctl("tune", "set", "controller.theta_min=0.95", "--runtime-dir", rundir).returncode == 2
    c = status(rundir)["daemon"]["counters"]
    assert (c["control_refused"], c["control_errors"], c["faults"]) == (1, 1, 0)
    lines = ebctl("status", "--runtime-dir", rundir).stdout.splitlines()
    assert "refused requests 1" in lines and not any(line.startswith("problems") for line in lines), lines


def test_daemon_stops_cleanly_on_ctrl_c_and_sigterm(daemon, rundir, conf_file):
    daemon.send_signal(signal.SIGINT)
    assert daemon.wait(scaled(10)) == 0
    assert not (Path(rundir) / "control.sock").exists()
    again = subprocess.Popen([*EBCTL, "daemon", "--runtime-dir", rundir, "--config", str(conf_file)],
                             start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: status(rundir), 15, "the second daemon to answer")
        again.terminate()
        assert again.wait(scaled(10)) == 0
    finally:
        kill_group(again)


def test_tune_calibrate_writes_a_loadable_profile(daemon, rundir, tmp_path):
    r = ebctl("tune", "calibrate", "--runtime-dir", rundir)
    assert r.returncode == 1 and "no engine has reported yet" in r.stderr
    with EngineLink.from_config(cfg_for(rundir), "e1") as link:
        for seq in range(400):
            size = 1 + seq % 50
            if seq % 2:
                r = IterationReport(engine_id="e1", seq=seq, wall_time=time.time(), forward_s=1e-3 + 2e-5 * 64 * size,
                                    kind=BatchKind.PREFILL, prefill_reqs=1, prefill_tokens=64 * size, running=1)
            else:
                r = IterationReport(engine_id="e1", seq=seq, wall_time=time.time(), forward_s=9e-3 + 5e-5 * size,
                                    kind=BatchKind.DECODE, decode_reqs=size, decode_ctx_tokens=100 * size,
                                    running=size)
            link.report(r)
        wait_for(lambda: reports(rundir, "e1") == 400, 10, "reports")  # before the link closes (linger 0)
    out = tmp_path / "e1.json"
    r = ebctl("tune", "calibrate", "--out", str(out), "--engine", "e1", "--runtime-dir", rundir)
    assert r.returncode == 0, r.stderr
    assert f"daemon.profile={out}" in r.stderr
    costs = profiles.load(str(out)).costs
    assert costs.alpha_p == pytest.approx(1e-3, rel=1e-3) and costs.beta_d == pytest.approx(5e-5, rel=1e-3)


def test_tune_set_good_and_bad(daemon, rundir):
    r = ebctl("tune", "set", "controller.mode=eb+", "controller.delta=1e-6", "--runtime-dir", rundir)
    assert r.returncode == 0, r.stderr
    assert 'controller.mode = "eb+" (was "eb")' in r.stdout
    assert daemon_config(rundir)["controller"]["mode"] == "eb+"
    # valid alone, refused by the daemon as a whole (theta_min > theta_max): exit 2, nothing changed
    r = ebctl("tune", "set", "controller.mode=mb", "controller.theta_min=0.95", "--runtime-dir", rundir)
    assert r.returncode == 2 and "controller.theta_min" in r.stderr and "theta_max" in r.stderr
    # refused here, before the daemon sees it
    r = ebctl("tune", "set", "controller.mode=fast", "--runtime-dir", rundir)
    assert r.returncode == 2 and "allowed: one of eb, eb+, mb, off" in r.stderr
    shown = ebctl("config", "show", "--daemon", "--runtime-dir", rundir)
    assert shown.returncode == 0 and 'mode = "eb+"' in shown.stdout and "theta_min = 0.01" in shown.stdout


def test_reload_keeps_the_old_config_when_the_file_is_broken(daemon, rundir, conf_file):
    conf_file.write_text('[controller]\nmode = "mb"\n')
    r = ebctl("reload", "--runtime-dir", rundir)
    assert r.returncode == 0, r.stderr
    assert daemon_config(rundir)["controller"]["mode"] == "mb"
    conf_file.write_text('[controller]\nmode = "eb"\nwindow = "big"\n')
    r = ebctl("reload", "--runtime-dir", rundir)
    assert r.returncode == 2 and "controller.window" in r.stderr
    cfg = daemon_config(rundir)
    assert cfg["controller"]["mode"] == "mb" and cfg["daemon"]["runtime_dir"] == rundir  # --runtime-dir kept


# `ebctl start` with a stand-in engine: a process that starts a grandchild (as SGLang starts its schedulers),
# records both pids, then sleeps, or exits with a code after a while.
FAKE_ENGINE = textwrap.dedent("""
    import subprocess, sys, time
    pids_file, exit_after, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(pids_file + ".tmp", "w") as f:
        f.write(f"{__import__('os').getpid()} {grandchild.pid}")
    __import__("os").replace(pids_file + ".tmp", pids_file)
    time.sleep(exit_after)
    sys.exit(code)
""")

DRIVER = textwrap.dedent("""
    import sys
    from ebctl import cli
    from ebctl.cli import run
    fake, pids_file, exit_after, code = sys.argv[1:5]
    run.engine_command = lambda engine, cfg_path, args: (
        [sys.executable, "-c", fake, pids_file, exit_after, code], {"EBCTL_CONFIG": cfg_path})
    cli.app(sys.argv[5:], prog_name="ebctl")
""")


def start_fake(rundir: str, tmp_path: Path, *extra: str, exit_after: float = 120, code: int = 0) -> tuple:
    pids_file = tmp_path / "engine.pids"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, FAKE_ENGINE, str(pids_file), str(exit_after), str(code),
                             "start", "--engine", "sim", "--runtime-dir", rundir, "--grace", "3",
                             "--set", "daemon.log_level=warning", *extra],
                            start_new_session=True, stderr=subprocess.PIPE, text=True)
    return proc, pids_file


def test_start_ctrl_c_stops_daemon_engine_and_grandchildren(rundir, tmp_path):
    proc, pids_file = start_fake(rundir, tmp_path)
    try:
        wait_for(pids_file.exists, 20, "the engine to start")
        engine_pid, grandchild_pid = map(int, pids_file.read_text().split())
        daemon_pid = status(rundir)["daemon"]["pid"]
        assert (Path(rundir) / "start.toml").is_file()
        assert all(map(alive, (daemon_pid, engine_pid, grandchild_pid)))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=scaled(15))
        assert proc.returncode == 0, err
        assert "stopping" in err
        assert not any(map(alive, (daemon_pid, engine_pid, grandchild_pid)))
        assert not (Path(rundir) / "start.toml").exists()
    finally:
        kill_group(proc)


def test_children_die_with_a_killed_start(rundir, tmp_path):
    """SIGKILL leaves `ebctl start` no chance to clean up: the kernel SIGTERMs its children (PDEATHSIG).
    (Grandchildren are the engine's to stop on SIGTERM, as SGLang does; the stand-in engine does not.)"""
    proc, pids_file = start_fake(rundir, tmp_path)
    pids: list[int] = []
    try:
        wait_for(pids_file.exists, 20, "the engine to start")
        pids = [status(rundir)["daemon"]["pid"], *map(int, pids_file.read_text().split())]
        proc.kill()
        proc.wait(scaled(5))
        wait_for(lambda: not alive(pids[0]) and not alive(pids[1]), 10, "the daemon and the engine to stop")
    finally:
        kill_group(proc)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_start_stops_the_daemon_when_the_engine_dies(rundir, tmp_path):
    proc, pids_file = start_fake(rundir, tmp_path, exit_after=1.0, code=3)
    try:
        wait_for(pids_file.exists, 20, "the engine to start")
        daemon_pid = wait_for(lambda: (status(rundir) or {}).get("daemon", {}).get("pid"), 5, "the daemon")
        _, err = proc.communicate(timeout=scaled(15))
        assert proc.returncode == 1
        assert "exited with code 3" in err and "stopping the daemon" in err
        assert not alive(daemon_pid)
    finally:
        kill_group(proc)


def test_start_exits_0_when_the_engine_finishes_normally(rundir, tmp_path):
    proc, _ = start_fake(rundir, tmp_path, exit_after=1.0, code=0)
    try:
        _, err = proc.communicate(timeout=scaled(20))
        assert proc.returncode == 0, err
        assert "exited with code 0" in err
    finally:
        kill_group(proc)


def test_start_restarts_a_killed_daemon_and_never_stops_the_engine(rundir, tmp_path):
    """kill -9 of the daemon: the engine (and its child) keep running, a new daemon answers on the same
    endpoints, says it is restart 1, and has the keys `tune` had changed; Ctrl-C still stops everything."""
    proc, pids_file = start_fake(rundir, tmp_path)
    try:
        wait_for(pids_file.exists, 20, "the engine to start")
        engine_pid, grandchild_pid = map(int, pids_file.read_text().split())
        first = wait_for(lambda: (status(rundir) or {}).get("daemon", {}).get("pid"), 10, "the daemon")
        r = ebctl("tune", "set", "controller.theta_max=0.55", "--runtime-dir", rundir)
        assert r.returncode == 0, r.stderr
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: (status(rundir) or {}).get("daemon", {}).get("pid") not in (None, first)
                          and status(rundir)["daemon"], 20, "a restarted daemon")
        assert second["restarts"] == 1 and second["tuned"] == {"controller.theta_max": 0.55}
        assert daemon_config(rundir)["controller"]["theta_max"] == 0.55
        assert alive(engine_pid) and alive(grandchild_pid) and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=scaled(20))
        assert proc.returncode == 0, err
        assert "restart 1" in err and "keeps serving" in err
        assert not any(map(alive, (second["pid"], engine_pid, grandchild_pid)))
    finally:
        kill_group(proc)


def test_start_reload_rereads_the_operators_config_file(rundir, tmp_path):
    conf = tmp_path / "op.toml"
    conf.write_text("[controller]\ntheta_max = 0.7\n")
    proc, _ = start_fake(rundir, tmp_path, "--config", str(conf))
    try:
        wait_for(lambda: status(rundir), 20, "the daemon")
        assert daemon_config(rundir)["controller"]["theta_max"] == 0.7
        conf.write_text("[controller]\ntheta_max = 0.6\n")
        r = ebctl("reload", "--runtime-dir", rundir)
        assert r.returncode == 0 and "theta_max" in r.stdout, (r.stdout, r.stderr)
        assert daemon_config(rundir)["controller"]["theta_max"] == 0.6
    finally:
        kill_group(proc)


def test_start_refuses_a_second_daemon(daemon, rundir, tmp_path):
    proc, pids_file = start_fake(rundir, tmp_path)
    try:
        _, err = proc.communicate(timeout=scaled(15))
        assert proc.returncode == 1 and "already answers" in err and not pids_file.exists()
        assert daemon.poll() is None  # the running one is untouched
    finally:
        kill_group(proc)


@pytest.mark.skipif(importlib.util.find_spec("ebctl.sim.live") is None,
                    reason="ebctl.sim.live (the simulated engine) is not in this tree yet")
def test_start_sim_smoke(rundir):
    proc = subprocess.Popen([*EBCTL, "start", "--engine", "sim", "--runtime-dir", rundir, "--grace", "3",
                             "--set", "daemon.log_level=warning"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        engines = wait_for(lambda: (status(rundir) or {}).get("engines"), 30, "the simulated engine to report")
        (engine,) = engines.values()
        assert engine["reports"] > 0
        daemon_pid = status(rundir)["daemon"]["pid"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=scaled(15))
        assert proc.returncode == 0, err
        assert not alive(daemon_pid)
    finally:
        kill_group(proc)
