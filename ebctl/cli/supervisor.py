"""``ebctl start``'s supervision: the daemon and the engine as two children, each in its own process group
(the engine's own children included).

The engine is the service; the daemon only steers it. So a daemon that dies is restarted (with backoff,
logged, counted: the new daemon shows ``restarts`` in status and resumes the keys ``tune`` had changed),
and the engine is never stopped because of it: it runs its policy until the TTL, then stock, until the new
daemon publishes (docs/design.md §3). The engine's exit stops the daemon and ends ``start``
with 0 when the engine exited 0, else 1. Ctrl-C (or SIGTERM/SIGHUP) stops both, the engine first: SIGTERM,
then SIGKILL after the grace period. Linux also SIGTERMs both if ``ebctl start`` itself dies
(``PR_SET_PDEATHSIG``).
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ebctl.cli.common import answers, say
from ebctl.config import Config


def _pdeathsig() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when ``ebctl start`` dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass
class Child:
    name: str
    proc: subprocess.Popen

    def group_alive(self) -> bool:
        """The child or anything it spawned (its own process group) still running (zombies don't count)."""
        self.proc.poll()
        members = group_members(self.proc.pid)
        if members is not None:
            return bool(members)
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def group_members(pgid: int) -> list[int] | None:
    """Pids of the live (not zombie) processes in group ``pgid``, from /proc; None without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = text[text.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            out.append(int(d.name))
    return out


def describe_exit(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-rc).name}"
    return f"exited with code {rc}"


RESTART_BACKOFF_S = (0.5, 30.0)  # the first restart waits this long, doubling up to the second figure
STABLE_S = 60.0  # a daemon that lived this long resets the backoff


class Supervisor:
    """The daemon and the engine in their own process groups: the daemon restarted when it dies, both
    stopped when the engine exits or on a signal."""

    def __init__(self, cfg: Config, grace: float) -> None:
        self.cfg, self.grace = cfg, grace
        self.stop = threading.Event()
        self.children: list[Child] = []
        self.restarts = 0

    def run(self, daemon_cmd: Callable[[int], list[str]], engine_cmd: list[str], env: dict[str, str],
            ready_timeout: float, engine_name: str) -> int:
        """``daemon_cmd(restarts)``: the daemon's command line for its ``restarts``-th restart (0: the first
        start). Returns the exit code of ``ebctl start``."""
        old = {s: signal.signal(s, lambda *_: self.stop.set())
               for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            daemon = self.spawn("daemon", daemon_cmd(0), env)
            if not self.wait_ready(daemon, ready_timeout):
                return 1
            if self.stop.is_set():
                return 0
            engine = self.spawn(engine_name, engine_cmd, env)
            say(f"ebctl: daemon (pid {daemon.proc.pid}) at {self.cfg.endpoint('control')} and "
                f"{engine_name} (pid {engine.proc.pid}) running; Ctrl-C stops both")
            return self._watch(daemon, engine, daemon_cmd, env, engine_name)
        finally:
            for c in reversed(self.children):  # the engine first: it fails open without the daemon
                self.terminate(c)
            for s, h in old.items():
                signal.signal(s, h)

    def _watch(self, daemon: Child, engine: Child, daemon_cmd: Callable[[int], list[str]], env: dict[str, str],
               engine_name: str) -> int:
        backoff, started, restart_at = RESTART_BACKOFF_S[0], time.monotonic(), None
        while not self.stop.wait(0.2):
            rc = engine.proc.poll()
            if rc is not None:
                say(f"ebctl: the {engine_name} {describe_exit(rc)}; stopping the daemon")
                return 0 if rc == 0 else 1
            now = time.monotonic()
            if restart_at is None and daemon.proc.poll() is not None:
                if now - started >= STABLE_S:
                    backoff = RESTART_BACKOFF_S[0]
                self.restarts += 1
                restart_at = now + backoff
                say(f"ebctl: the daemon {describe_exit(daemon.proc.returncode)}; restart {self.restarts} in "
                    f"{backoff:g} s. The {engine_name} keeps serving (its policy expires after its TTL, then "
                    "stock behaviour until the new daemon publishes)")
                self.terminate(daemon)  # anything it left in its process group
                backoff = min(2 * backoff, RESTART_BACKOFF_S[1])
            if restart_at is not None and now >= restart_at:
                self.children.remove(daemon)
                daemon = self.spawn("daemon", daemon_cmd(self.restarts), env)
                self.children.insert(0, daemon)  # stopped after the engine
                started, restart_at = now, None
                say(f"ebctl: daemon restarted (pid {daemon.proc.pid}, restart {self.restarts})")
        say("ebctl: stopping the " + " and the ".join(c.name for c in reversed(self.children)))
        return 0

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_pdeathsig())
        child = Child(name, proc)
        self.children.append(child)
        return child

    def wait_ready(self, daemon: Child, timeout: float) -> bool:
        ep = self.cfg.endpoint("control")
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            rc = daemon.proc.poll()
            if rc is not None:
                say(f"ebctl: the daemon {describe_exit(rc)} before answering at {ep}")
                return False
            if answers(self.cfg, timeout_s=0.5):
                return True
            if time.monotonic() > deadline:
                say(f"ebctl: the daemon did not answer at {ep} within {timeout:g} s; stopping it")
                return False
            self.stop.wait(0.1)
        return True

    def terminate(self, child: Child) -> None:
        """SIGTERM to the child's group, SIGKILL after the grace period; returns when the group is gone."""
        child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while child.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.group_alive():
            say(f"ebctl: the {child.name} ignored SIGTERM for {self.grace:g} s: SIGKILL")
            child.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(5)
