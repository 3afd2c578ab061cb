"""Ctrl-C ends an ``ebctl`` command with one line, "interrupted", and exit code 130 (128 + SIGINT), never a
traceback: also while the command line's modules load, where an interrupted C extension can surface as an
ImportError ("initialization failed") rather than a KeyboardInterrupt. The commands whose way to stop is
Ctrl-C (``daemon``, ``start``, ``status --watch``) take it themselves and exit 0. Standard library only: it
must be in place before anything slow is imported."""

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import NoReturn

EXIT_CODE = 130
_seen = False  # a SIGINT arrived through ``_on_sigint``: whatever failed after it, it set off


def _on_sigint(signum: int, frame: object) -> None:
    global _seen
    _seen = True
    raise KeyboardInterrupt


def interrupted() -> NoReturn:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    raise SystemExit(EXIT_CODE)


@contextlib.contextmanager
def ends_quietly() -> Iterator[None]:
    """Inside: Ctrl-C, and any error it set off, ends the process through ``interrupted``. A SIGINT that is
    ignored (a background job) stays ignored."""
    with contextlib.suppress(ValueError):  # not the main thread: the handler is the main thread's business
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        interrupted()
    except SystemExit:
        raise
    except BaseException:
        if _seen:
            interrupted()
        raise
