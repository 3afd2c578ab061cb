"""SIGTERM answered at once: sglang's launcher looks for it only every 5 s.

sglang 0.5.23 stops a server on SIGTERM by setting ``TokenizerManager.gracefully_exit``
(``SignalHandler.sigterm_handler``, srt/managers/tokenizer_manager.py:4066-4070); a task,
``TokenizerManager.sigterm_watchdog`` (l.3508-3509), polls that flag with ``await asyncio.sleep(5)`` and only
then drains the requests still open and stops the schedulers. So ``ebctl start`` took 4-9 s to stop an idle
server on Ctrl-C, most of it that sleep. The hook below waits for the flag in short steps, then hands over to
sglang's own watchdog, which finds the flag set and goes straight to its drain (its 5-s steps while requests
are open are sglang's drain policy and are kept).

Only in the process that serves HTTP: the one without a multiprocessing parent. Registering the target
imports tokenizer_manager (``pkgutil.resolve_name`` in ``HookRegistry``), which the schedulers never load.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import multiprocessing
from typing import Final

TARGET: Final = "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog"
POLL_S: Final = 0.1  # how often the flag is looked at (sglang: 5 s)

log = logging.getLogger("ebctl.sglang")


def sigterm_watchdog(original, manager, *args, **kwargs):
    """AROUND hook: the coroutine sglang schedules as a task, which waits for the flag in ``POLL_S`` steps."""
    return _watch(original, manager, *args, **kwargs)


async def _watch(original, manager, *args, **kwargs):
    try:
        while not manager.gracefully_exit:
            await asyncio.sleep(POLL_S)
    except Exception:  # fail open to sglang's own watchdog (a CancelledError is no Exception: it propagates)
        log.warning("ebctl: fast SIGTERM watch failed; sglang's own (5-s) watch takes over", exc_info=True)
    return await original(manager, *args, **kwargs)


def install() -> bool:
    """Register the hook in the launcher (no multiprocessing parent); True if registered."""
    if multiprocessing.parent_process() is not None:
        return False
    try:  # the launcher imports it anyway; a release without this coroutine keeps sglang's own watch
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        if not inspect.iscoroutinefunction(TokenizerManager.sigterm_watchdog):
            return False
    except Exception:
        return False

    HookRegistry.register(TARGET, sigterm_watchdog, HookType.AROUND)
    return True
