"""One polling helper for the test helpers of tests/daemon and tests/sglang (and tools/bench_hook.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.01) -> Any:
    """Poll ``pred`` until it returns something truthy (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or pred}")
        time.sleep(interval)
