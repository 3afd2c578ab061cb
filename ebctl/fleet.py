"""Where an engine id sits in a fleet: its node, its server and its DP rank; and whether it is gone (pure).

An engine id is ``<prefix>/dp<N>`` (``sglang_patch/lifecycle.learn``, :func:`id_prefix`): the prefix is
``engine.id_prefix``, else ``<daemon.node>/<server>`` for a server named by ``EBCTL_SERVER`` (``ebctl start
--join --server NAME`` and systemd's ``sglang@NAME`` name it), else ``daemon.node``; so every server under one
node daemon has ids of its own. Ids of other shapes
keep the same reading: the last part names the engine within its server (``dp0``, the simulated ``sim0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Where:
    node: str  # the daemon's node name ("" when it has none)
    server: str  # the server on that node
    rank: str  # the engine within its server: "dp0", "dp1", ... (the simulated engine: "sim0")


def where(engine_id: str, node: str) -> Where:
    """The node, server and rank that ``engine_id`` names on a daemon whose node name is ``node``: the node
    prefix taken off, the last part is the rank and what is before it the server (``-``: none named)."""
    rest = engine_id[len(node) + 1:] if node and engine_id.startswith(node + "/") else engine_id
    server, _, rank = rest.rpartition("/")
    return Where(node=node, server=server or "-", rank=rank)


SERVER_ENV = "EBCTL_SERVER"  # the server's name, in its environment: the plugin reads it at start-up


def id_prefix(configured: str, node: str, server: str) -> str:
    """The engine id prefix of a server: ``engine.id_prefix`` if set, else :func:`server_prefix` for a named
    server, else the node name ("" → ids are ``dp<N>`` alone)."""
    return configured or (server_prefix(node, server) if server else node)


def server_prefix(node: str, server: str) -> str:
    """``engine.id_prefix`` for a server named ``server`` that joins the daemon of node ``node``."""
    return f"{node}/{server}" if node else server


def gone(last_report_age_s: float, engine_gone_s: float) -> bool:
    """An engine is gone once it has been silent for ``engine_gone_s``: a working server reports every
    iteration and an idle one every ``HEARTBEAT_S`` (sglang_patch/state.py). NaN (never reported): gone."""
    return not (math.isfinite(last_report_age_s) and last_report_age_s < engine_gone_s)
