"""Where an engine id sits in a fleet: its node, its server and its DP rank; and whether it is gone (pure).

An engine id is ``<prefix>/dp<N>`` (``sglang_patch/lifecycle.learn``): the prefix is ``engine.id_prefix``, else
``daemon.node``. ``ebctl start --join`` names the server, ``<daemon.node>/<server>`` (or ``<server>`` on a
daemon without a node name), so every server under one node daemon has ids of its own. Ids of other shapes
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


def server_prefix(node: str, server: str) -> str:
    """``engine.id_prefix`` for a server named ``server`` that joins the daemon of node ``node``."""
    return f"{node}/{server}" if node else server


def gone(last_report_age_s: float, engine_gone_s: float) -> bool:
    """An engine is gone once it has been silent for ``engine_gone_s``: a working server reports every
    iteration and an idle one every ``HEARTBEAT_S`` (sglang_patch/state.py). NaN (never reported): gone."""
    return not (math.isfinite(last_report_age_s) and last_report_age_s < engine_gone_s)
