"""The daemon's records: one engine id's controller and bookkeeping, and the daemon's counters. Plain data,
read by every other module of ``ebctl.daemon``, which import downward only: ``records`` → ``metrics``,
``control`` and ``shell`` → ``core``."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import zmq

from ebctl.controller import Controller

# ZeroMQ monitor events counted as failed handshakes, by kind
HANDSHAKE_EVENTS = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth"}

MAX_ENGINES = 4096  # engine ids beyond this are refused (validation): a bounded daemon, whatever peers send
RECENT_REPORTS = 4096  # reports kept per engine for `tune calibrate`'s whole-iteration periods


@dataclass(slots=True)
class Engine:
    """One engine id's controller and bookkeeping (monotonic times)."""

    controller: Controller
    topic: bytes
    created: float
    last_report: float = math.nan
    last_update: float = math.nan  # when the policy version last changed
    published: int = -1  # policy version last published
    last_seq: int = -1
    seq_gaps: int = 0  # reports missing from the seq sequence: dropped by the link's full queue, or coalesced
    instance: str = ""  # the reporting process (EngineLink.instance): another one on this id is refused
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_REPORTS))  # IterationReports, in order
    duplicates: int = 0  # reports refused from another process claiming this engine id


@dataclass(slots=True)
class Counters:
    received: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {"malformed": 0, "version": 0, "validation": 0,
                                                               "duplicate": 0})
    control_requests: int = 0
    control_errors: int = 0
    control_rejected: dict[str, int] = field(default_factory=lambda: {"malformed": 0, "version": 0,
                                                                       "validation": 0})
    published: int = 0
    republished: int = 0
    publish_errors: int = 0
    handshake_failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HANDSHAKE_EVENTS.values(), 0))
