"""The ebctl daemon (docs/design.md): reports in, one Controller per engine id, policies out, a control API.

Modules, each importing only those listed before it: ``records`` (per-engine state, counters),
``dispatch`` (the SBS dispatchers' side), ``metrics`` (the Prometheus collector), ``control`` (the settings in
force and the control ops), ``shell`` (sockets, loop, signals), ``core`` (``Daemon``: ingest and control
dispatch, composing the other three; ``main``). ``python -m ebctl.daemon`` runs it.
"""

from ebctl.daemon.core import Daemon, main

__all__ = ["Daemon", "main"]
