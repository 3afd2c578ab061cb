"""``ebctl status`` against a real daemon fed by two engines: the live view in an 80×24 terminal (a pty),
streaming when piped, and Ctrl-C whatever the signal dispositions of the process that runs the tests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from ebd_helpers import DaemonProcess, finished, report, scaled, wait_for
from rich.cells import cell_len

from ebctl.link import EngineLink

EBCTL = [sys.executable, "-m", "ebctl"]
ENGINES = ("node-a/dp0", "node-b/dp1")
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, cursor moves, erase line


def default_sigint() -> None:
    """preexec_fn: Ctrl-C (SIGINT) raises KeyboardInterrupt in the child even if this process ignores it.

    A CI runner's background job starts with SIGINT ignored, the children inherit that, and Python then
    installs no handler: without this, a test that stops ``ebctl status --watch`` with SIGINT waits forever.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """This process ignores SIGINT while it starts children, as a CI runner's background job does."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.fixture
def fed(spawn) -> DaemonProcess:
    """A daemon with two engines that have completed enough requests for a policy each."""
    d = spawn()
    rng = np.random.default_rng(0)
    for eid in ENGINES:
        with EngineLink.from_config(d.cfg, eid) as link:
            for seq in range(40):
                link.report(report(eid, seq, finished(rng, 100, 2)))
            # linger 0 on close: keep the link open until the daemon has counted every report
            wait_for(lambda eid=eid: d.status()["engines"].get(eid, {}).get("reports") == 40, 10,
                     f"the reports of {eid}")
    wait_for(lambda: all(d.status()["engines"].get(e, {}).get("version", 0) > 0 for e in ENGINES), 10,
             "a policy for both engines")
    return d


def run_in_terminal(args: list[str], rows: int, cols: int, done: Callable[[str], bool],
                    seconds: float = 30.0) -> tuple[int, str]:
    """Run ``args`` on a pty of ``rows``×``cols`` until ``done(output so far)``, then Ctrl-C; its exit code and
    output. Ended by what it printed, not by a clock: a loaded machine may take seconds to start the CLI;
    ``seconds`` (scaled) only bounds a view that never gets there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "EBCTL_CONFIG", "NO_COLOR")}
    with sigint_ignored():
        proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm"},
                                preexec_fn=default_sigint)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + scaled(seconds)
    try:
        while True:
            if deadline is not None and done(out.decode(errors="replace")):
                deadline = time.monotonic()  # seen enough: Ctrl-C now
            timeout = max(deadline - time.monotonic(), 0.0) if deadline else scaled(2.0)
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                if deadline is None:
                    break
                proc.send_signal(signal.SIGINT)
                deadline = None  # now read until it is quiet
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(scaled(10)), out.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


ERASE = "\r\x1b[2K"  # each refresh first erases the previous frame, line by line


def test_status_watch_in_an_80x24_terminal_shows_the_controller_of_both_engines(fed):
    code, out = run_in_terminal([*EBCTL, "status", "--watch", "--interval", "0.3", "--config", str(fed.cfg_path)],
                                24, 80, done=lambda text: text.count(ERASE) >= 2)
    assert code == 0, out
    frames = out.split(ERASE)
    assert len(frames) >= 3, out  # refreshed at least twice
    first = [CSI.sub("", line) for line in frames[0].split("\r\n")]
    assert len(first) <= 24, first
    assert max(map(cell_len, first)) <= 80, first
    text = "\n".join(first)
    for eid in ENGINES:
        block = text.split(f"engine {eid}")[1].split("engine ")[0]
        for label in ("mode", "k", "N", "age", "θ̂0", "Δθ", "θ̂*", "N̂*", "p̂0", "η̂", "costs", "fits"):
            assert f" {label} " in block, (eid, label, block)


def read_until(proc: subprocess.Popen, done, timeout: float = 15.0) -> str:
    """Read ``proc``'s stdout as it comes until ``done(text so far)``; fails after ``scaled(timeout)`` s."""
    fd, out = proc.stdout.fileno(), b""
    deadline = time.monotonic() + scaled(timeout)
    while not done(out.decode(errors="replace")):
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            proc.kill()
            pytest.fail(f"no more output after {out!r}; stderr: {proc.stderr.read()!r}")
        out += chunk
    return out.decode()


def watch(fed: DaemonProcess, *args: str) -> subprocess.Popen:
    """``ebctl status --watch ARGS`` with stdout on a pipe, started as a CI runner's background job would."""
    with sigint_ignored():
        return subprocess.Popen([*EBCTL, "status", "--watch", "--interval", "0.2", *args, "--config",
                                 str(fed.cfg_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=default_sigint)


def ctrl_c(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=scaled(10))
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode


STAMP = re.compile(r"^─* ?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ─", re.M)  # the rule that starts each view


def test_status_watch_piped_streams_one_view_per_refresh(fed):
    proc = watch(fed)
    text = read_until(proc, lambda t: len(STAMP.findall(t)) >= 3)
    assert ctrl_c(proc) == 0
    first_view = STAMP.split(text)[1]
    assert all(f"engine {e}" in first_view for e in ENGINES) and " θ̂* " in first_view


def test_status_watch_json_refreshes_until_ctrl_c(fed):
    """One JSON document per line; Ctrl-C ends it with exit 0 even when the test runner ignores SIGINT."""
    proc = watch(fed, "--json")
    first, second = read_until(proc, lambda t: t.count("\n") >= 2).splitlines()[:2]
    assert ctrl_c(proc) == 0
    first, second = json.loads(first), json.loads(second)
    assert second["daemon"]["uptime_s"] > first["daemon"]["uptime_s"]
    assert set(second["engines"]) == set(ENGINES)


def test_status_once_and_filtered(fed):
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"}
    r = subprocess.run([*EBCTL, "status", "--engine", ENGINES[1], "--config", str(fed.cfg_path)],
                       capture_output=True, text=True, timeout=scaled(20), env=env)
    assert r.returncode == 0, r.stderr
    assert f"engine {ENGINES[1]}" in r.stdout and f"engine {ENGINES[0]}" not in r.stdout
    full = subprocess.run([*EBCTL, "status", "--all", "--config", str(fed.cfg_path)], capture_output=True,
                          text=True, timeout=scaled(20), env=env)
    assert full.returncode == 0 and "published_version" in full.stdout and "handshake_failed" in full.stdout
    none = subprocess.run([*EBCTL, "status", "--engine", "nope", "--config", str(fed.cfg_path)],
                          capture_output=True, text=True, timeout=scaled(20), env=env)
    assert none.returncode == 1 and "no engine 'nope'; engines: node-a/dp0, node-b/dp1" in none.stderr


def test_config_show_says_whose_configuration_it_prints(fed, tmp_path):
    """Without --daemon: this command's file and --set; with it: what the running daemon uses, tune included."""
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"}
    cli = [*EBCTL, "--config", str(fed.cfg_path)]
    t = scaled(20)
    assert subprocess.run([*cli, "tune", "set", "controller.delta=0.001"], env=env, timeout=t).returncode == 0
    mine = subprocess.run([*cli, "config", "show"], capture_output=True, text=True, env=env, timeout=t)
    theirs = subprocess.run([*cli, "config", "show", "--daemon"], capture_output=True, text=True, env=env, timeout=t)
    assert mine.stdout.startswith(f"# this command's configuration: {fed.cfg_path} (the running daemon's: ")
    assert theirs.stdout.startswith(f"# the running daemon's configuration ({fed.cfg.endpoint('control')}), "
                                    f"from {fed.cfg_path}")
    assert "\ndelta = 0.0\n" in mine.stdout and "\ndelta = 0.001\n" in theirs.stdout
