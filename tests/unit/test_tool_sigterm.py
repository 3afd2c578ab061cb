"""The real-server tools stop their servers when they are sent SIGTERM (tools/sglang_cpu/server.py
``exit_on_sigterm``): run in the background they ignore SIGINT, and Python's default SIGTERM ends a tool at once,
leaving the sglang server and ``ebctl start`` it launched serving. Checked on a real process: a child started in a
``try``/``finally`` that stops it, as the tools start their servers, is gone after the parent's SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from server import exit_on_sigterm
    if sys.argv[2] == "handled":
        exit_on_sigterm()
    child = subprocess.Popen(["sleep", "300"])
    try:
        print(child.pid, flush=True)
        time.sleep(300)
    finally:
        child.kill()
        child.wait()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone, only not yet reaped by its (dead) parent
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _run(mode: str) -> tuple[int, int]:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(REPO / "tools" / "sglang_cpu"), mode],
                         stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
    return rc, child


def test_sigterm_runs_the_tools_finally_blocks():
    rc, child = _run("handled")
    time.sleep(0.2)
    assert rc == 128 + signal.SIGTERM and not _alive(child)


def test_without_it_the_child_is_left_running():
    """The check above can fail: Python's default SIGTERM skips the finally block."""
    rc, child = _run("default")
    try:
        assert rc == -signal.SIGTERM and _alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
