"""Fixtures for the daemon tests: short private temp dirs (ipc paths must stay under ~100 bytes), daemon
subprocesses that are always killed at teardown, an in-process daemon for the metrics registry."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ebd_helpers import DaemonProcess, scaled, wait_for, write_config

from ebctl import config
from ebctl.config import Config
from ebctl.daemon import Daemon
from ebctl.link import ControlClient, DaemonUnreachable


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short private temp dir (unix socket paths are limited to ~107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="ebt-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def spawn(tmp: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """``spawn(cfg_path=None, *args, ready=True)``: start a daemon process; all are killed at teardown."""
    procs: list[DaemonProcess] = []

    def start(cfg_path: Path | None = None, *args: str, ready: bool = True) -> DaemonProcess:
        if cfg_path is None:
            cfg_path = write_config(tmp / "ebctl.toml", tmp / "rt")
        p = DaemonProcess(cfg_path, *args)
        procs.append(p)
        if ready:
            p.wait_ready()
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def fast_cfg(tmp: Path) -> Config:
    return config.load(str(write_config(tmp / "ebctl.toml", tmp / "rt")))


@pytest.fixture
def inproc_daemon(fast_cfg: Config) -> Iterator[Daemon]:
    """A Daemon serving real sockets from a thread of this process (for the metrics registry)."""
    d = Daemon(fast_cfg)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    with ControlClient.from_config(fast_cfg, timeout_s=0.3) as c:
        wait_for(lambda: _answers(c), timeout=10, what="in-process daemon")
    yield d
    d.stop()
    t.join(scaled(5))
    assert not t.is_alive()


def _answers(c: ControlClient) -> bool:
    try:
        return c.request("status").ok
    except DaemonUnreachable:
        return False
