"""One polling helper and one timeout scale for the tests (tests/daemon, tests/sglang, tools/bench_hook.py).

A wait in a test only bounds a hang: it returns as soon as its condition holds, so a generous limit costs
nothing on a fast machine and keeps a loaded one (a CI runner beside other jobs, a 2-core laptop) from
failing tests that were merely slow. Every limit goes through one factor, ``SCALE``: the environment
variable EBCTL_TEST_TIMEOUT_SCALE, 3 by default (the limits were written on a quiet machine; on a loaded
2-core one, starting a Python process that imports numpy and scipy took several times as long).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

DEFAULT_SCALE = 3.0


def _scale() -> float:
    raw = os.environ.get("EBCTL_TEST_TIMEOUT_SCALE", "")
    try:
        value = float(raw) if raw else DEFAULT_SCALE
    except ValueError:
        raise RuntimeError(f"EBCTL_TEST_TIMEOUT_SCALE={raw!r}: not a number") from None
    if not value > 0:
        raise RuntimeError(f"EBCTL_TEST_TIMEOUT_SCALE={raw!r}: must be above 0")
    return value


SCALE = _scale()


def scaled(seconds: float) -> float:
    """A limit that only bounds a hang (a subprocess timeout, a join), stretched for this machine."""
    return seconds * SCALE


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.01) -> Any:
    """Poll ``pred`` until it returns something truthy (returned), or fail after ``scaled(timeout)`` s."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:g} s ({timeout:g} s x EBCTL_TEST_TIMEOUT_SCALE "
                                 f"{SCALE:g}) waiting for {what or pred}")
        time.sleep(interval)
