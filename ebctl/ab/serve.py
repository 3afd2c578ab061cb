"""One configuration's server, started fresh and stopped: ``python -m sglang.launch_server`` (``alone``,
``plugin``) or ``python -m ebctl start --engine sglang --`` (``ebctl``, its own runtime directory: a cold start),
with the user's launch arguments and the configuration's flags, in a process group of its own. Ready when
sglang's ``/health_generate`` answers 200 (sglang answers 503 while it starts, then runs a one-token generate
for it); every process of the tree is recorded then, and ``close`` leaves none of them running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ebctl.ab import procs

HIDDEN_ENV = ("SGLANG_PLUGINS", "EBCTL_CONFIG")  # set per configuration, never inherited


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in a launch_server command line (the last one given)."""
    out = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith(name + "="):
            out = a.split("=", 1)[1]
    return out


def endpoint(args: list[str], port: int) -> tuple[list[str], str]:
    """The launch arguments with a host and port (the user's where given, else 127.0.0.1 and ``port``) and the
    URL the client reaches them at."""
    host, given = option(args, "--host"), option(args, "--port")
    extra = [*([] if host else ["--host", "127.0.0.1"]), *([] if given else ["--port", str(port)])]
    reach = "127.0.0.1" if host in (None, "0.0.0.0", "::", "") else host
    return [*args, *extra], f"http://{reach}:{given or port}"


def plugin_toml(sets: list[str]) -> str:
    """The plugin's config file for a ``plugin`` configuration's ``KEY=VALUE`` items."""
    from ebctl import config

    return config.to_toml(config.load(None, dict(item.split("=", 1) for item in sets)), docs=False)


def command(python: str, cfg: dict[str, Any], args: list[str], work: Path) -> tuple[list[str], dict[str, str]]:
    """argv and the environment entries of one configuration's server (those ``HIDDEN_ENV`` are set here)."""
    env = dict(cfg["env"])
    if cfg["engine"] == "ebctl":
        sets = [x for kv in cfg["sets"] for x in ("--set", kv)]
        return ([python, "-m", "ebctl", "--runtime-dir", str(work / "rt"), *sets, "start", "--engine", "sglang",
                 "--", *args, *cfg["flags"]], env)
    env["SGLANG_PLUGINS"] = "ebctl" if cfg["engine"] == "plugin" else "none"  # "none": no plugin has that name
    if cfg["sets"]:
        conf = work / "plugin.toml"
        conf.write_text(plugin_toml(cfg["sets"]))
        env["EBCTL_CONFIG"] = str(conf)
    return [python, "-m", "sglang.launch_server", *args, *cfg["flags"]], env


def _status(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Server:
    """A configuration's server, started by the constructor; ``ready(timeout)`` waits for it, ``close()``
    stops it. ``url``, ``proc`` (the process started), ``pids`` (its tree as recorded), ``log``, ``control``
    (the daemon's control endpoint for ``ebctl``, else None)."""

    def __init__(self, python: str, cfg: dict[str, Any], args: list[str], work: Path, url: str,
                 env: dict[str, str]) -> None:
        work.mkdir(parents=True, exist_ok=True)
        argv, own = command(python, cfg, args, work)
        full = {k: v for k, v in {**os.environ, **env}.items() if k not in HIDDEN_ENV}
        full.update(own)
        full.setdefault("PYTHONUNBUFFERED", "1")
        self.url, self.ebctl = url, cfg["engine"] == "ebctl"
        self.control = f"ipc://{work / 'rt' / 'control.sock'}" if self.ebctl else None
        self.log = work / ("start.log" if self.ebctl else "server.log")
        self.argv = argv
        self.t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, env=full, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd="/")
        self.pids: list[int] = [self.proc.pid]

    def ready(self, timeout: float) -> float:
        """Wait until ``/health_generate`` answers 200; the seconds since the start. RuntimeError if the server
        exits first (with its log's tail), TimeoutError after ``timeout`` s."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} before it was ready; "
                                   f"{self.log}:\n{self.tail()}")
            with contextlib.suppress(OSError):
                if _status(f"{self.url}/health_generate") == 200:
                    break
            if time.monotonic() - self.t0 > timeout:
                raise TimeoutError(f"the server did not answer /health_generate within {timeout:.0f} s; "
                                   f"{self.log}:\n{self.tail()}")
            time.sleep(0.5)
        self.remember()
        return time.monotonic() - self.t0

    def remember(self) -> list[int]:
        """Add the live processes of its tree to ``pids`` (what ``close`` makes sure are gone)."""
        self.pids = sorted(set(self.pids) | set(procs.tree(self.proc.pid)))
        return self.pids

    def tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""

    def close(self, grace: float = 20.0) -> list[int]:
        """Stop it: Ctrl-C to ``ebctl start`` (what stops its daemon and engine), SIGTERM to sglang's launcher
        (it takes its scheduler and detokenizer down); after ``grace`` s, or once that process is gone, SIGKILL to
        its process group and to every recorded pid still running. The pids left running (none, normally)."""
        if self.proc.poll() is None:
            self.remember()
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT if self.ebctl else signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace * (3 if self.ebctl else 1))  # ebctl start waits for sglang, then the daemon
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in procs.alive(self.pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while (left := procs.alive(self.pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left


def daemon_status(endpoint: str) -> dict | None:
    """The daemon's ``status`` over its control socket; None when it does not answer within 1 s."""
    from ebctl.link import ControlClient, DaemonUnreachable

    try:
        with ControlClient(endpoint, timeout_s=1.0) as c:
            r = c.request("status")
    except DaemonUnreachable:
        return None
    return r.data if r.ok else None
