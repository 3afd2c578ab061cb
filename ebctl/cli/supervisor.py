"""``ebctl start``'s supervision: the daemon and the engine as two children, each in its own process group
(the engine's own children included).

The engine is the service; the daemon only steers it. So a daemon that dies is restarted (with backoff,
logged, counted: the new daemon shows ``restarts`` in status and resumes the keys ``tune`` had changed),
and the engine is never stopped because of it: it runs its policy until the TTL, then stock, until the new
daemon publishes (docs/design.md §3). A daemon that exits 2 refused its configuration (a file that is not
valid TOML or not UTF-8, a bad key or endpoint): started again it would refuse again, so it is restarted only
once the config file changes (looked at every second: size, mtime, content hash) or ``ebctl reload`` asks;
the engine keeps serving meanwhile. The engine's exit stops the daemon and ends ``start`` with 0 when the
engine exited 0, else 1. Ctrl-C (or SIGTERM/SIGHUP) stops both, the engine first: SIGTERM, then SIGKILL to the
group after the grace period. sglang's SIGTERM goes to its launcher alone: the launcher drains and stops its
own children, and to it a scheduler that a signal stopped first is a crash (SIGQUIT, crash diagnostics). Linux
also SIGTERMs both if ``ebctl start`` itself dies (``PR_SET_PDEATHSIG``).

One ``start`` per runtime directory: it holds an flock on ``start.lock`` there for its life (``StartLock``),
so a second one is refused before it touches the first one's files. The file names the supervisor's pid;
``ebctl reload``, finding no daemon, sends that pid SIGUSR1 (``holder`` checks that the pid has the file
open: a pid left by a killed ``start`` may be another process's by now). SIGUSR1, not SIGHUP: to ``start``,
a command in the foreground, SIGHUP means its terminal hung up.

The supervisor signals only process groups it started, and only while their id cannot be another's: a
child's leader is left unreaped until its group is stopped (``Child``), and ``children`` holds live ones only.
"""

import contextlib
import ctypes
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(eq=False)
class Child:
    """A child in its own process group, whose id is the leader's pid. The leader is left unreaped (a zombie)
    after it exits until its group has been stopped: a zombie keeps its pid, and so the group's id, from
    being reused, so every ``killpg`` here reaches this child's group. Once the leader is reaped, the group is
    never signalled again, even if members remain: the id is then ours only while a member lives, and that
    cannot be checked at the instant of a ``killpg``."""

    name: str
    proc: subprocess.Popen
    leader_stops_group: bool = False  # SIGTERM goes to the leader alone: it stops the rest of its group itself
    last_line: str = ""  # the last non-empty line it wrote to stderr, where ``tee_stderr`` reads it
    reader: threading.Thread | None = None

    def exit_code(self) -> int | None:
        """The leader's exit code (``-N``: killed by signal N) once it has exited, None while it runs;
        without reaping it."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        if not _CAN_PEEK:
            return self.proc.poll()
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere
            return self.proc.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def group_alive(self) -> bool:
        """Anything of its group still running (zombies don't count; without /proc: the leader)."""
        members = group_members(self.proc.pid)
        if members is None or self.proc.returncode is not None:
            return self.exit_code() is None
        return bool(members)

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc.returncode is not None:  # reaped: the group's id may be another's by now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def signal_leader(self, sig: signal.Signals) -> None:
        if self.proc.returncode is not None:  # reaped: the pid may be another's by now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, sig)

    def reap(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        if self.reader is not None:
            self.reader.join(1.0)  # its last lines are on screen, and in last_line, before anything is said of it

    def tee_stderr(self) -> None:
        """Copy the child's stderr to ours line by line, remembering the last non-empty one (why it exited)."""
        out = getattr(sys.stderr, "buffer", None)
        for raw in self.proc.stderr:  # type: ignore[union-attr]
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.last_line = line
            with contextlib.suppress(OSError, ValueError):
                if out is not None:
                    sys.stderr.flush()
                    out.write(raw)
                    out.flush()
                else:
                    sys.stderr.write(raw.decode(errors="replace"))
        self.proc.stderr.close()  # type: ignore[union-attr]


_CAN_PEEK = hasattr(os, "waitid") and hasattr(os, "WNOWAIT")


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
CONFIG_ERROR = 2  # the daemon's exit code for a configuration it refuses (a bad file, key or endpoint)
WATCH_S = 1.0  # how often the config file is looked at while a refused daemon waits for it to change
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, a service manager's stop, a closed terminal
RETRY_SIGNAL = signal.SIGUSR1  # ``ebctl reload``'s way to a supervisor whose daemon is down


def restart_delay(rc: int, lived_s: float, backoff: float) -> tuple[float | None, float]:
    """After the daemon exited with ``rc`` having run ``lived_s``: how long to wait before starting it again
    (None: not until its config file changes or ``ebctl reload``; a refused configuration would be refused
    again) and the backoff after that."""
    if rc == CONFIG_ERROR:
        return None, backoff
    if lived_s >= STABLE_S:
        backoff = RESTART_BACKOFF_S[0]
    return backoff, min(2 * backoff, RESTART_BACKOFF_S[1])


def fingerprint(path: str) -> tuple[int, int, str] | None:
    """What tells that a file changed: its size, mtime and content hash; None if it cannot be read."""
    try:
        st = os.stat(path)
        data = Path(path).read_bytes()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest()


LOCK_NAME = "start.lock"


class RunDirBusy(Exception):
    """Another ``ebctl start`` holds the runtime directory."""


class StartLock:
    """One ``ebctl start`` per runtime directory: an flock on ``start.lock`` there, held for the supervisor's
    life (the kernel drops it however the process ends). A second ``start`` is refused before it touches
    anything of the first's, whatever state the first one's daemon is in. While the supervisor can take
    ``RETRY_SIGNAL``, the file holds its pid, and while its daemon is held on a refused configuration, the
    count of refusals and the daemon's last line (``Holder``): ``ebctl reload`` tells from them that its
    retry was refused too."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            other = holder(run_dir)
            raise RunDirBusy(f"another ebctl start{f' (pid {other.pid})' if other else ''} holds runtime_dir "
                             f"{run_dir}: stop it or use another --runtime-dir") from None

    def announce(self, refused: int = 0, said: str = "") -> None:
        data = (f"{os.getpid()}\n" + (f"refused {refused}\n{said}\n" if refused else "")).encode(errors="replace")
        # over the old text, then cut to length: the file is never empty, so a reader (``holder``) always finds a pid
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def withdraw(self) -> None:
        os.ftruncate(self.fd, 0)

    def release(self) -> None:
        self.withdraw()
        os.close(self.fd)


@dataclass(frozen=True)
class Holder:
    pid: int
    refused: int = 0  # while a daemon that refused its configuration is held: how many have; else 0
    said: str = ""  # that daemon's last line


def holder(run_dir: str | os.PathLike) -> Holder | None:
    """The ``ebctl start`` holding ``run_dir`` and ready for ``RETRY_SIGNAL``, or None. The pid its lock file
    names counts only if that process has that very file open: a file left by a killed ``start`` names a pid
    that may have been reused since. Without /proc, None."""
    path = Path(run_dir) / LOCK_NAME
    try:
        st = os.stat(path)
        lines = path.read_text(errors="replace").splitlines()
        pid = int(lines[0]) if lines else 0
        refused = int(lines[1].removeprefix("refused ")) if len(lines) > 1 else 0
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.path.samestat(os.stat(fd), st):
                return Holder(pid, refused, lines[2] if len(lines) > 2 else "")
    return None


class Flag:
    """A flag that signal handlers set and the main thread waits on. Not ``threading.Event``: its ``set`` takes
    a lock that the main thread holds for a moment inside its own ``wait``, ``is_set`` aside; a handler runs on
    the main thread, so a signal arriving in that moment waits for itself forever (the signal module's docs
    warn against locks in handlers; cpython#126434). Setting a bool takes no lock; waiting sleeps in slices,
    each resumed after a handler runs (PEP 475), so a set is seen within ``SLICE_S``. Any thread may set it."""

    SLICE_S = 0.02

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """True once set, False after ``timeout`` seconds if it was not."""
        deadline = time.monotonic() + timeout
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.SLICE_S))
        return self._set


class Supervisor:
    """The daemon and the engine in their own process groups: the daemon restarted when it dies (not after a
    refused configuration, until that changes), both stopped when the engine exits or on a signal."""

    def __init__(self, cfg: Config, grace: float) -> None:
        self.cfg, self.grace = cfg, grace
        self.stop = Flag()
        self.retry = Flag()  # RETRY_SIGNAL: start a daemon that is down now
        self.children: list[Child] = []  # live ones only, in the order they are stopped in reverse
        self.restarts = 0
        self.refusals = 0  # daemons that exited with CONFIG_ERROR
        self.config_file = str(Path(cfg.path).resolve()) if cfg.path else ""
        self.seen: tuple[int, int, str] | None = None  # the config file as the last daemon started was given it
        self.lock: StartLock | None = None

    def run(self, daemon_cmd: Callable[[int], list[str]], engine_cmd: list[str], env: dict[str, str],
            ready_timeout: float, engine_name: str, lock: StartLock | None = None,
            engine_stops_group: bool = False) -> int:
        """``daemon_cmd(restarts)``: the daemon's command line for its ``restarts``-th restart (0: the first
        start). ``lock`` gets this process's pid once ``RETRY_SIGNAL`` is handled. ``engine_stops_group``: the
        engine's first process stops its own children on SIGTERM (``Child.leader_stops_group``). Returns the
        exit code of ``ebctl start``."""
        old = self.catch_signals(retry=True)
        self.lock = lock
        if lock is not None:
            lock.announce()
        try:
            self.seen = fingerprint(self.config_file) if self.config_file else None
            daemon = self.spawn("daemon", daemon_cmd(0), env)
            ready = self.wait_ready(daemon, ready_timeout)
            if ready != 0:
                return ready
            if self.stop.is_set():
                return 0
            engine = self.spawn(engine_name, engine_cmd, env, leader_stops_group=engine_stops_group)
            say(f"ebctl: daemon (pid {daemon.proc.pid}) at {self.cfg.endpoint('control')} and "
                f"{engine_name} (pid {engine.proc.pid}) running; Ctrl-C stops both")
            return self._watch(daemon, engine, daemon_cmd, env, engine_name)
        finally:
            if lock is not None:
                lock.withdraw()
            for c in reversed(list(self.children)):  # the engine first: it fails open without the daemon
                self.terminate(c)
            for s, h in old.items():
                signal.signal(s, h)

    def catch_signals(self, retry: bool) -> dict[int, Any]:
        """``STOP_SIGNALS`` set ``stop``; with ``retry``, ``RETRY_SIGNAL`` sets ``retry``. The handlers they
        replace, by signal, for the caller to put back."""
        old = {s: signal.signal(s, lambda *_: self.stop.set()) for s in STOP_SIGNALS}
        if retry:
            old[RETRY_SIGNAL] = signal.signal(RETRY_SIGNAL, lambda *_: self.retry.set())
        return old

    def run_engine(self, engine_cmd: list[str], env: dict[str, str], engine_name: str,
                   engine_stops_group: bool = False) -> int:
        """``start --join``: the engine alone, under a daemon this process neither started nor restarts (the
        node's service manager does; without it the engine runs stock). Ctrl-C (or SIGTERM/SIGHUP) stops the
        engine; returns 0 when the engine exited 0 or was stopped, else 1."""
        old = self.catch_signals(retry=False)
        try:
            engine = self.spawn(engine_name, engine_cmd, env, leader_stops_group=engine_stops_group)
            say(f"ebctl: {engine_name} (pid {engine.proc.pid}) running under the daemon at "
                f"{self.cfg.endpoint('control')}; Ctrl-C stops it")
            while not self.stop.wait(0.2):
                rc = engine.exit_code()
                if rc is not None:
                    say(f"ebctl: the {engine_name} {describe_exit(rc)}")
                    return 0 if rc == 0 else 1
            say(f"ebctl: stopping the {engine_name}")
            return 0
        finally:
            for c in reversed(list(self.children)):
                self.terminate(c)
            for s, h in old.items():
                signal.signal(s, h)

    def _watch(self, daemon: Child, engine: Child, daemon_cmd: Callable[[int], list[str]], env: dict[str, str],
               engine_name: str) -> int:
        backoff, started = RESTART_BACKOFF_S[0], time.monotonic()
        up = True
        restart_at: float | None = None  # when a daemon that is down starts again (None: when told to)
        next_look = 0.0
        while not self.stop.wait(0.2):
            rc = engine.exit_code()
            if rc is not None:
                say(f"ebctl: the {engine_name} {describe_exit(rc)}; "
                    + ("stopping the daemon" if up else "the daemon is down"))
                return 0 if rc == 0 else 1
            now = time.monotonic()
            if up:
                if self.retry.is_set():
                    self.retry.clear()
                    say(f"ebctl: the daemon (pid {daemon.proc.pid}) is running: `ebctl reload` reaches it itself")
                rc = daemon.exit_code()
                if rc is None:
                    continue
                self.terminate(daemon)  # anything it left in its process group; its last words read
                up = False
                delay, backoff = restart_delay(rc, now - started, backoff)
                keeps = (f"The {engine_name} keeps serving (its policy expires after its TTL, then stock behaviour "
                         "until a new daemon publishes)")
                if delay is None:
                    restart_at = None
                    said = f" (it said: {daemon.last_line})" if daemon.last_line else ""
                    watched = f"{self.config_file} changes or " if self.config_file else ""
                    say(f"ebctl: the daemon {describe_exit(rc)}: a configuration error{said}; not restarting it "
                        f"until {watched}`ebctl reload`. {keeps}")
                    self.refusals += 1
                    if self.lock is not None:
                        self.lock.announce(self.refusals, daemon.last_line)
                else:
                    restart_at = now + delay
                    say(f"ebctl: the daemon {describe_exit(rc)}; restart {self.restarts + 1} in {delay:g} s. "
                        f"{keeps}")
                continue
            why = ""
            if self.retry.is_set():
                self.retry.clear()
                why = "`ebctl reload` asked"
            elif restart_at is not None and now >= restart_at:
                why = "due"
            elif restart_at is None and self.config_file and now >= next_look:
                next_look = now + WATCH_S
                seen = fingerprint(self.config_file)
                if seen is not None and seen != self.seen:
                    why = f"{self.config_file} changed"
            if why:
                self.restarts += 1
                self.seen = fingerprint(self.config_file) if self.config_file else None
                daemon = self.spawn("daemon", daemon_cmd(self.restarts), env, first=True)  # stopped last
                up, started = True, now
                if self.lock is not None:
                    self.lock.announce()
                say(f"ebctl: daemon restarted (pid {daemon.proc.pid}, restart {self.restarts}"
                    + ("" if why == "due" else f": {why}") + ")")
        say("ebctl: stopping the " + " and the ".join(c.name for c in reversed(self.children)))
        return 0

    def spawn(self, name: str, cmd: list[str], env: dict[str, str], first: bool = False,
              leader_stops_group: bool = False) -> Child:
        """The daemon's stderr passes through here (``Child.tee_stderr``): its last line says why it exited."""
        tee = name == "daemon"
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_pdeathsig(),
                                stderr=subprocess.PIPE if tee else None)
        child = Child(name, proc, leader_stops_group)
        if tee:
            child.reader = threading.Thread(target=child.tee_stderr, name=f"{name}-stderr", daemon=True)
            child.reader.start()
        self.children.insert(0 if first else len(self.children), child)
        return child

    def wait_ready(self, daemon: Child, timeout: float) -> int:
        """0 once the daemon answers (or on a stop signal), else the exit code for ``start``: 2 if it refused
        its configuration, 1 otherwise."""
        ep = self.cfg.endpoint("control")
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            rc = daemon.exit_code()
            if rc is not None:
                self.terminate(daemon)
                said = f": {daemon.last_line}" if daemon.last_line else ""
                what = "a configuration error" if rc == CONFIG_ERROR else "failed"
                say(f"ebctl: the daemon {describe_exit(rc)} before answering at {ep} ({what}{said})")
                return 2 if rc == CONFIG_ERROR else 1
            if answers(self.cfg, timeout_s=0.5):
                return 0
            if time.monotonic() > deadline:
                say(f"ebctl: the daemon did not answer at {ep} within {timeout:g} s; stopping it")
                return 1
            self.stop.wait(0.1)
        return 0

    def terminate(self, child: Child) -> None:
        """SIGTERM to the child's group (to its leader alone if that stops the group itself and still runs;
        to the group too if the leader exits leaving members), SIGKILL to the group after the grace period;
        returns when the group is gone and the child reaped, no longer one of ``children``."""
        leader_only = child.leader_stops_group and child.exit_code() is None
        (child.signal_leader if leader_only else child.signal_group)(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while child.group_alive() and time.monotonic() < deadline:
            if leader_only and child.exit_code() is not None:  # it died, leaving members (sglang still loading)
                child.signal_group(signal.SIGTERM)
                leader_only = False
            time.sleep(0.05)
        if child.group_alive():
            say(f"ebctl: the {child.name} ignored SIGTERM for {self.grace:g} s: SIGKILL")
            child.signal_group(signal.SIGKILL)
            deadline = time.monotonic() + 5
            while child.group_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        child.reap(5)
        with contextlib.suppress(ValueError):
            self.children.remove(child)
