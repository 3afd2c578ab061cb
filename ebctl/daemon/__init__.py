"""The ebctl daemon (docs/design.md): reports in, one Controller per engine id, policies out, a control API.

Modules, each importing only those listed before it: ``records`` (per-engine state, counters),
``metrics`` (the Prometheus collector), ``control`` (the control ops), ``shell`` (sockets, loop, signals),
``core`` (``Daemon``: ingest and control dispatch; ``main``). ``python -m ebctl.daemon`` runs it.
"""

from ebctl.daemon.core import Daemon, main

__all__ = ["Daemon", "main"]
