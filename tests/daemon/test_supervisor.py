"""`ebctl start`'s supervisor against real processes: a daemon that refuses its configuration is held (not
restarted in a loop) until its file changes or `ebctl reload`; one `start` per runtime directory; only live
children, and only groups whose leader it has not reaped, are signalled; an engine that stops its own children
(sglang's launcher) gets SIGTERM alone, its group SIGKILL after the grace period; a config file the CLI cannot
read is one line and exit 2."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ebd_helpers import alive, ebctl, kill_group
from ebd_helpers import wait_requests as wait_for
from polling import scaled

from ebctl import config
from ebctl.cli import supervisor
from ebctl.link import ControlClient, DaemonUnreachable


def checked_killpg(monkeypatch) -> list[tuple[int, int]]:
    """Make every ``os.killpg`` first ask the kernel (waitid, without reaping) whether the group's leader is an
    unreaped child of this process; the (pgid, signal) of each one that is not, whose id may be anyone's."""
    bad: list[tuple[int, int]] = []
    real_killpg = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        try:
            os.waitid(os.P_PID, pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            bad.append((pgid, sig))
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", killpg)
    return bad


@pytest.fixture
def rundir():
    d = tempfile.mkdtemp(prefix="ebctl-t", dir="/tmp")  # short: ipc paths are limited to ~100 bytes
    yield d
    os.chmod(d, 0o700)
    shutil.rmtree(d, ignore_errors=True)


def status(rundir: str):
    """The daemon's status data, or None if it does not answer."""
    try:
        cfg = config.load(None, {"daemon.runtime_dir": rundir})
        with ControlClient.from_config(cfg, timeout_s=scaled(1.0)) as c:
            reply = c.request("status")
    except DaemonUnreachable:
        return None
    return reply.data if reply.ok else None


def daemon_pid(rundir: str, other_than: int = 0) -> int | None:
    pid = ((status(rundir) or {}).get("daemon") or {}).get("pid")
    return pid if pid not in (None, other_than) else None


# A stand-in engine (a sleeping process; its pid in a file) under the real `ebctl start`.
DRIVER = textwrap.dedent("""
    import sys
    from ebctl import cli
    from ebctl.cli import run
    pid_file = sys.argv[1]
    engine = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    run.engine_command = lambda engine_, cfg_path, args: (
        [sys.executable, "-c", engine, pid_file], {"EBCTL_CONFIG": cfg_path})
    cli.app(sys.argv[2:], prog_name="ebctl")
""")


def start_fake(rundir: str, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """`ebctl start` with the stand-in engine; its stderr goes to a file (read while it runs)."""
    pid_file, err_file = tmp_path / "engine.pid", tmp_path / "start.err"
    with open(err_file, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(pid_file), "start", "--engine", "sim",
                                 "--runtime-dir", rundir, "--grace", "3", "--set", "daemon.log_level=warning",
                                 *extra], start_new_session=True, stderr=err, text=True)
    return proc, pid_file, err_file


def running(rundir: str, pid_file: Path) -> tuple[int, int]:
    """The daemon's and the engine's pids once both run (the engine starts once the daemon answered `start`)."""
    engine = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the engine"))
    return wait_for(lambda: daemon_pid(rundir), 30, "the daemon"), engine


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C: `ebctl start` stops everything and exits 0."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(scaled(20)) == 0


def held_lines(err_file: Path) -> list[str]:
    return [line for line in err_file.read_text().splitlines() if "a configuration error" in line]


def test_start_holds_a_daemon_that_refuses_its_config_until_the_file_changes(rundir, tmp_path):
    """The restarted daemon exits 2 on a file that is not TOML: one line says so with the daemon's own error,
    no restart follows while the file stays as it is, the engine keeps running; the fixed file starts it."""
    conf = tmp_path / "op.toml"
    conf.write_text("[controller]\ntheta_max = 0.7\n")
    proc, pid_file, err_file = start_fake(rundir, tmp_path, "--config", str(conf))
    try:
        first, engine = running(rundir, pid_file)
        conf.write_text("[controller\ntheta_max = 0.6\n")  # not TOML
        os.kill(first, signal.SIGTERM)  # a clean exit (its sockets gone): restarted, on the broken file
        (line,) = wait_for(lambda: held_lines(err_file), 30, "the configuration error line")
        assert "exited with code 2" in line and "not valid TOML" in line and str(conf) in line
        assert "not restarting" in line and "ebctl reload" in line
        time.sleep(1.0)  # room for restarts that must not come (a backoff would have tried by now)
        assert len(held_lines(err_file)) == 1 and status(rundir) is None
        assert alive(engine) and proc.poll() is None
        conf.write_text("[controller]\ntheta_max = 0.6\n")
        wait_for(lambda: daemon_pid(rundir), 30, "the daemon started again on the fixed file")
        s = status(rundir)["daemon"]
        assert s["restarts"] == 2  # the one after SIGTERM (refused), the one after the fix: none in between
        with ControlClient.from_config(config.load(None, {"daemon.runtime_dir": rundir})) as c:
            assert c.request("config").data["controller"]["theta_max"] == 0.6
        assert "changed" in err_file.read_text()
        stop(proc)
        assert not alive(engine) and not alive(s["pid"])
    finally:
        kill_group(proc)


def test_reload_starts_a_refused_daemon_again_through_start(rundir, tmp_path):
    """A refusal that no file change ends (here: the runtime directory opened to others, then closed again):
    `ebctl reload` finds no daemon, asks `ebctl start` (SIGUSR1, the pid from start.lock) to start one; refused
    again, exit 2 with the daemon's reason; once the cause is gone, exit 0 and the daemon answers."""
    proc, pid_file, err_file = start_fake(rundir, tmp_path)
    try:
        first, _ = running(rundir, pid_file)
        os.chmod(rundir, 0o777)
        os.kill(first, signal.SIGTERM)
        (line,) = wait_for(lambda: held_lines(err_file), 30, "the configuration error line")
        assert "exited with code 2" in line and "mode 0777" in line and "until `ebctl reload`" in line
        r = ebctl("reload", "--runtime-dir", rundir)  # nothing fixed yet: refused again, said as a reload says it
        assert r.returncode == 2 and "refused its configuration again" in r.stderr and "mode 0777" in r.stderr
        assert f"pid {proc.pid}" in r.stderr and len(held_lines(err_file)) == 2
        os.chmod(rundir, 0o700)
        r = ebctl("reload", "--runtime-dir", rundir)
        assert r.returncode == 0 and r.stdout.startswith("reloaded"), (r.stdout, r.stderr)
        assert wait_for(lambda: status(rundir), 10, "the daemon's status")["daemon"]["restarts"] == 3
        assert proc.poll() is None
        stop(proc)
    finally:
        kill_group(proc)


# The supervisor's own handlers, pelted with RETRY_SIGNAL while the main thread waits and clears as `_watch`
# does, then a stop signal. With `threading.Event` for the flags a handler can run while the main thread
# holds that Event's lock, and the process waits for itself forever (6 of 6 runs hung; 0.2 s each with `Flag`).
PELTED = textwrap.dedent("""
    import os, signal, subprocess, sys
    from ebctl import config
    from ebctl.cli import supervisor
    sup = supervisor.Supervisor(config.load(None, {}), 1.0)
    sup.catch_signals(retry=True)
    pelter = ("import os, signal, sys\\n"
              "for _ in range(20000): os.kill(int(sys.argv[1]), int(sys.argv[2]))\\n"
              "os.kill(int(sys.argv[1]), signal.SIGTERM)")
    subprocess.Popen([sys.executable, "-c", pelter, str(os.getpid()), str(int(supervisor.RETRY_SIGNAL))])
    while not sup.stop.wait(0):
        if sup.retry.is_set():
            sup.retry.clear()
    print("stopped")
""")


def test_signals_arriving_while_the_supervisor_waits_never_hang_it():
    """20,000 RETRY_SIGNALs from another process, then SIGTERM, while the main thread waits on `stop` and
    clears `retry` in a tight loop: the process stops."""
    r = subprocess.run([sys.executable, "-c", PELTED], capture_output=True, text=True, timeout=scaled(30))
    assert r.returncode == 0 and r.stdout.strip() == "stopped", r.stderr


def test_reload_signals_no_process_a_stale_lock_file_names(rundir):
    """start.lock left behind names a pid that is now someone else's: `reload` must not signal it (SIGUSR1
    would kill it) and says the daemon is unreachable."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (Path(rundir) / supervisor.LOCK_NAME).write_text(f"{bystander.pid}\n")
        r = ebctl("reload", "--runtime-dir", rundir)
        assert r.returncode == 1 and "not reachable" in r.stderr, r.stderr
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_second_start_refuses_and_leaves_the_first_ones_files(rundir, tmp_path):
    """The first instance's daemon is stopped (SIGSTOP): it answers nothing, yet the runtime directory is the
    first instance's; the second `start` says so in one line, exit 2, and touches nothing there."""
    proc, pid_file, _ = start_fake(rundir, tmp_path)
    first = 0
    try:
        first, _ = running(rundir, pid_file)
        start_toml = Path(rundir) / "start.toml"
        before = start_toml.read_bytes()
        os.kill(first, signal.SIGSTOP)
        r = ebctl("start", "--engine", "sim", "--runtime-dir", rundir, "--grace", "1")
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and f"another ebctl start (pid {proc.pid})" in r.stderr
        assert start_toml.read_bytes() == before
        os.kill(first, signal.SIGCONT)
        assert wait_for(lambda: daemon_pid(rundir), 30, "the first daemon, continued") == first
        stop(proc)
        assert not start_toml.exists()
    finally:
        if first and alive(first):
            os.kill(first, signal.SIGCONT)
        kill_group(proc)


def test_supervisor_keeps_live_children_only_and_signals_only_unreaped_groups(rundir, monkeypatch, capsys):
    """The daemon killed and restarted: the child list is the live daemon and the engine; every
    killpg goes to a group whose leader is an unreaped child of this process (the kernel's own answer, from
    waitid), so its id cannot be another process's."""
    bad = checked_killpg(monkeypatch)
    cfg = config.load(None, {"daemon.runtime_dir": rundir})
    sup = supervisor.Supervisor(cfg, grace=3)

    def daemon_cmd(restarts: int) -> list[str]:
        return [sys.executable, "-m", "ebctl.daemon", "--set", f"daemon.runtime_dir={rundir}", "--set",
                "daemon.log_level=warning", *(["--restarts", str(restarts), "--resume"] if restarts else [])]

    names: list[str] = []
    errors: list[BaseException] = []

    def drive() -> None:
        nonlocal names
        try:
            wait_for(lambda: len(sup.children) == 2, 30, "the engine (the daemon answered the supervisor)")
            pid = wait_for(lambda: daemon_pid(rundir), 30, "the daemon")
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: daemon_pid(rundir, other_than=pid), 30, "a restarted daemon")
            names = [c.name for c in sup.children]
        except BaseException as e:  # reported by the test below
            errors.append(e)
        finally:
            sup.stop.set()

    engine = [sys.executable, "-c", "import time; time.sleep(120)"]
    t = threading.Thread(target=drive)
    t.start()
    code = sup.run(daemon_cmd, engine, dict(os.environ), 30.0, "engine")
    t.join(scaled(60))
    assert not errors, errors
    assert code == 0 and sup.restarts == 1
    assert names == ["daemon", "engine"]
    assert sup.children == [] and bad == []
    assert "ebctl: stopping the engine and the daemon\n" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"[controller]\nmode = \"eb\"\n\xff\xfe\n", b"[controller\nmode = 1\n"],
                         ids=["not-utf8", "not-toml"])
def test_reload_with_a_config_file_it_cannot_read_is_one_line_and_exit_2(tmp_path, rundir, content):
    conf = tmp_path / "bad.toml"
    conf.write_bytes(content)
    r = ebctl("reload", "--config", str(conf), "--runtime-dir", rundir)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("invalid configuration:") and r.stderr.count("\n") == 1, r.stderr
    assert str(conf) in r.stderr and "Traceback" not in r.stderr


# An engine whose first process stops its own child, as sglang's launcher stops its scheduler: on SIGTERM it
# asks the child (SIGUSR1) and exits once the child has; or, told to, it ignores SIGTERM, or dies of it at
# once (sglang's launcher while it loads the model), leaving the child behind. Each process writes the signals
# it got to the log; the child exits a moment after the first, so that a SIGTERM to the whole group is in the
# log whichever signal it handled first.
CHILD = textwrap.dedent("""
    import signal, sys, time
    log, got = sys.argv[1], []
    def on(sig, _):
        with open(log, "a") as f:
            f.write(f"child {signal.Signals(sig).name}\\n")
        got.append(sig)
    signal.signal(signal.SIGTERM, on)
    signal.signal(signal.SIGUSR1, on)
    with open(log, "a") as f:
        f.write("child ready\\n")
    while not got:
        time.sleep(0.01)
    time.sleep(0.3)
""")
LEADER = textwrap.dedent("""
    import signal, subprocess, sys, time
    log, child_code, how = sys.argv[1:4]
    child = subprocess.Popen([sys.executable, "-c", child_code, log])
    while "child ready" not in open(log).read():
        time.sleep(0.01)
    def on_term(*_):
        with open(log, "a") as f:
            f.write("leader SIGTERM\\n")
        if how == "stop":
            child.send_signal(signal.SIGUSR1)
            child.wait()
            sys.exit(0)
    if how != "die":
        signal.signal(signal.SIGTERM, on_term)
    with open(log, "a") as f:
        f.write(f"leader ready {child.pid}\\n")
    while True:
        time.sleep(1)
""")


@pytest.mark.parametrize("stops_group,how,must,may", [
    (True, "stop", {"leader SIGTERM", "child SIGUSR1"}, set()),  # sglang: the leader alone told, it stops the child
    (False, "stop", {"leader SIGTERM", "child SIGTERM"}, {"child SIGUSR1"}),  # the sim engine, the daemon: all told
    (True, "die", {"child SIGTERM"}, set()),  # the leader gone, what it left is SIGTERMed at once
    (True, "ignore", {"leader SIGTERM"}, set()),  # a leader that does nothing: its group SIGKILLed after the grace
], ids=["leader-stops-its-group", "group", "leader-dies-first", "leader-ignores-sigterm"])
def test_stop_signals_the_leader_alone_when_it_stops_its_own_group(rundir, tmp_path, monkeypatch, capsys,
                                                                   stops_group, how, must, may):
    bad = checked_killpg(monkeypatch)
    log = tmp_path / "signals.log"
    log.write_text("")
    sup = supervisor.Supervisor(config.load(None, {"daemon.runtime_dir": rundir}), grace=3)
    daemon = [sys.executable, "-m", "ebctl.daemon", "--set", f"daemon.runtime_dir={rundir}", "--set",
              "daemon.log_level=warning"]
    engine = [sys.executable, "-c", LEADER, str(log), CHILD, how]
    t = threading.Thread(target=lambda: (wait_for(lambda: "leader ready" in log.read_text(), 30, "the engine"),
                                         sup.stop.set()))
    t.start()
    try:
        code = sup.run(lambda _: daemon, engine, dict(os.environ), 30.0, "engine", engine_stops_group=stops_group)
    finally:
        sup.stop.set()
        t.join(40)
    lines = log.read_text().splitlines()
    child = int(next(line for line in lines if line.startswith("leader ready")).split()[-1])
    got = {line for line in lines if "ready" not in line}
    assert code == 0 and sup.children == [] and bad == []
    assert must <= got <= must | may
    assert not alive(child)
    assert ("the engine ignored SIGTERM for 3 s: SIGKILL" in capsys.readouterr().err) == (how == "ignore")
