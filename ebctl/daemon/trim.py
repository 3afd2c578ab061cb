"""Giving freed heap back to the system after a burst: glibc's ``malloc_trim(0)``, at most every ``TRIM_S``.

A daemon that was stopped (SIGSTOP, a debugger, a host under memory pressure) finds its telemetry socket's
backlog at once when it resumes: up to ``rcvhwm`` frames, queued by libzmq's I/O thread in its own arena and
decoded by the loop. Once they are handled the chunks are free, but glibc returns to the kernel only what lies at
the top of each heap, so the process keeps that peak's pages: its RSS steps up with every burst and never comes
down (``tools/daemon_rss.py`` measured +2.4, +0.6, +0.2 MB after successive 30-s stops). ``malloc_trim(0)``
releases every whole free page of every arena (``madvise(MADV_DONTNEED)``), so the RSS follows what is in use.

The loop calls ``Trimmer.due(mono)`` on its republish tick and ``trim()`` when it says so. Where the C library has
no ``malloc_trim`` (musl, macOS) nothing is done: this only returns memory, it never fails the daemon.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger("ebctl.daemon")

TRIM_S = 60.0  # the shortest interval between two trims (a trim walks the free chunks: milliseconds)


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a callable returning 1 when memory was released; None where libc lacks it."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(fn(0))


class Trimmer:
    """``due(mono)``: whether ``every_s`` has passed since the last trim; ``trim()``: run it, count it and how long
    it took (``count``, ``last_s``, ``total_s`` for status and the memory probe)."""

    def __init__(self, every_s: float = TRIM_S, fn: Callable[[], int] | None = None) -> None:
        self.every_s = every_s
        self.fn = fn if fn is not None else malloc_trim()
        self.next = -math.inf
        self.count, self.released, self.last_s, self.total_s = 0, 0, 0.0, 0.0

    @property
    def available(self) -> bool:
        return self.fn is not None

    def due(self, mono: float) -> bool:
        if self.fn is None or mono < self.next:
            return False
        self.next = mono + self.every_s
        return True

    def trim(self) -> None:
        if self.fn is None:
            return
        t0 = time.perf_counter()
        self.released += self.fn()
        self.last_s = time.perf_counter() - t0
        self.total_s += self.last_s
        self.count += 1
