"""``ebctl start``'s supervision: the daemon and the engine as two children, each in its own process group
(the engine's own children included); whichever dies, or a signal, stops the other, SIGTERM then SIGKILL
after the grace period. Linux also SIGTERMs them if ``ebctl start`` itself dies (``PR_SET_PDEATHSIG``).
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


class Supervisor:
    """Two children in their own process groups; whichever dies (or a signal) stops the other."""

    def __init__(self, cfg: Config, grace: float) -> None:
        self.cfg, self.grace = cfg, grace
        self.stop = threading.Event()
        self.children: list[Child] = []

    def run(self, daemon_cmd: list[str], engine_cmd: list[str], env: dict[str, str], ready_timeout: float,
            engine_name: str) -> int:
        old = {s: signal.signal(s, lambda *_: self.stop.set())
               for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            daemon = self.spawn("daemon", daemon_cmd, env)
            if not self.wait_ready(daemon, ready_timeout):
                return 1
            if self.stop.is_set():
                return 0
            engine = self.spawn(engine_name, engine_cmd, env)
            say(f"ebctl: daemon (pid {daemon.proc.pid}) at {self.cfg.endpoint('control')} and "
                f"{engine_name} (pid {engine.proc.pid}) running; Ctrl-C stops both")
            while not self.stop.wait(0.2):
                for c in self.children:
                    rc = c.proc.poll()
                    if rc is not None:
                        others = " and ".join(o.name for o in self.children if o is not c)
                        say(f"ebctl: the {c.name} {describe_exit(rc)}; stopping the {others}")
                        return 1
            say("ebctl: stopping the " + " and the ".join(c.name for c in reversed(self.children)))
            return 0
        finally:
            for c in reversed(self.children):  # the engine first: it fails open without the daemon
                self.terminate(c)
            for s, h in old.items():
                signal.signal(s, h)

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
