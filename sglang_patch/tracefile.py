"""The plugin's trace file (``engine.trace_dir``): diagnosis only, so a write it cannot make stops the trace, not
the plugin.

A full or failing filesystem (``ENOSPC``, ``EIO``, a removed mount) makes ``write`` raise ``OSError``. Raised
inside a hook, that would switch the plugin off for the life of the scheduler (``guard.guarded``): a diagnosis
file would have cost the server its policy. ``TraceFile.write`` catches it instead, logs it once, closes the file
and writes nothing more; ``stopped`` says why, for the plugin's status.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger("ebctl")


class TraceFile:
    """A line-buffered text file that stops on its first failed write (``stopped``: the error) instead of
    raising."""

    __slots__ = ("f", "path", "stopped")

    def __init__(self, path: str) -> None:
        self.path = path
        self.f: Any = open(path, "a", buffering=1)  # noqa: SIM115 -- open for the process's life
        self.stopped = ""

    def write(self, line: str) -> None:
        f = self.f
        if f is None:
            return
        try:
            f.write(line)
        except OSError as e:
            self.stopped = f"{type(e).__name__}: {e}"
            self.f = None
            log.warning("ebctl: the trace %s stopped (%s); the plugin goes on without it", self.path, self.stopped)
            with contextlib.suppress(OSError):
                f.close()

    def close(self) -> None:
        f, self.f = self.f, None
        if f is not None:
            f.close()
