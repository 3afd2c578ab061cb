"""Helpers of the daemon tests: config files with small TTLs, daemon subprocesses, report builders, polling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polling
import pytest
from polling import scaled, wait_for  # noqa: F401  (re-exported: the daemon tests import them from here)

from ebctl import config
from ebctl.link import ControlClient, DaemonUnreachable
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport

FAST = {  # small windows and TTLs: policies within a few dozen reports, expiry within a second; the paper's
    # controller (eb, θ0 + Δθ), whose policy follows the reports at once (the default, eb+ with the measured θ,
    # starts at stock and moves only on measured gains: tests/daemon/test_learn_daemon.py)
    "controller": {"ttl_s": 1.0, "update_every": 10, "min_window": 20, "window": 100, "n_min_interval_s": 0.0,
                   "kv_capacity_tokens": 10_000_000, "n_max_limit": 256, "mode": "eb", "theta_method": "paper"},
    "daemon": {"republish_s": 0.2, "log_level": "info"},
}




def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    return repr(v)


def write_config(path: Path, runtime_dir: Path, **sections: dict) -> Path:
    merged = {s: {**FAST.get(s, {}), **sections.get(s, {})} for s in ("daemon", "controller")}
    merged["daemon"].setdefault("runtime_dir", str(runtime_dir))
    lines = []
    for section, values in merged.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def report(engine_id: str, seq: int, finished: tuple[FinishedRequest, ...] = (), *, kind=BatchKind.DECODE,
           decode_reqs: int = 64, forward_s: float | None = None, **kw) -> IterationReport:
    if forward_s is None:
        forward_s = 8.9e-3 + 4.6e-5 * decode_reqs
    return IterationReport(engine_id=engine_id, seq=seq, wall_time=time.time(), forward_s=forward_s, kind=kind,
                           decode_reqs=decode_reqs, running=kw.pop("running", 64), kv_total=kw.pop("kv_total", 10**7),
                           finished=finished, **kw)


def finished(rng: np.random.Generator, mean_out: float, n: int) -> tuple[FinishedRequest, ...]:
    """``n`` completions with geometric output lengths of mean ``mean_out`` (constant hazard 1/mean)."""
    return tuple(FinishedRequest(int(i), int(o)) for i, o in zip(rng.integers(50, 500, n),
                                                                   rng.geometric(1.0 / mean_out, n), strict=True))


class DaemonProcess:
    """``python -m ebctl.daemon`` in a subprocess, its stderr in a file."""

    def __init__(self, cfg_path: Path, *args: str) -> None:
        self.cfg_path = cfg_path
        self.cfg = config.load(str(cfg_path), _overrides(args))
        self.log_path = cfg_path.with_suffix(f".{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "ebctl.daemon", "--config", str(cfg_path), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout_s: float | None = None) -> ControlClient:
        """A control client; the default timeout only bounds a daemon that never answers, so it is scaled."""
        d = self.cfg.daemon
        return ControlClient(self.cfg.endpoint("control"), timeout_s=scaled(2.0) if timeout_s is None else timeout_s,
                             curve_client_key=d.curve_client_key, curve_server_public=d.curve_server_key,
                             insecure=d.insecure)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until the daemon answers ``status`` (fails with its log if it exits first); ``timeout`` is scaled."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        with self.client(timeout_s=0.3) as c:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    if c.request("status").ok:
                        return
                except DaemonUnreachable:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"daemon not ready after {timeout:g} s:\n{self.log()}")

    def request(self, op: str, **args):
        with self.client() as c:
            return c.request(op, **args)

    def status(self) -> dict:
        rep = self.request("status")
        assert rep.ok, rep.error
        return rep.data

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(scaled(10))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(scaled(10))
        self._log.close()


def _overrides(args: tuple[str, ...]) -> dict[str, str]:
    out, it = {}, iter(args)
    for a in it:
        if a == "--set":
            k, _, v = next(it).partition("=")
            out[k] = v
        elif a == "--insecure":
            out["daemon.insecure"] = "true"
    return out


EBCTL = [sys.executable, "-m", "ebctl"]


def ebctl(*args: str, timeout: float = 40) -> subprocess.CompletedProcess:
    """The CLI, without an EBCTL_CONFIG from the caller's environment; ``timeout`` (scaled) only bounds a hang."""
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"}
    return subprocess.run([*EBCTL, *args], capture_output=True, text=True, timeout=scaled(timeout), env=env)


def alive(pid: int) -> bool:
    """Running and not a zombie (a zombie has exited; only its parent has yet to read the status)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def kill_group(proc: subprocess.Popen) -> None:
    """Teardown: whatever a test left behind in the group of ``proc`` goes."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(3)
            break
        except subprocess.TimeoutExpired:
            continue


def wait_requests(pred, timeout: float, what: str):
    """polling.wait_for (the limit scaled for a loaded machine), polling every 50 ms: each poll is a request."""
    return polling.wait_for(pred, timeout, what, interval=0.05)
