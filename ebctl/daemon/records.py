"""The daemon's records: one engine id's controller and bookkeeping, and the daemon's counters. Plain data,
read by every other module of ``ebctl.daemon``, which import downward only: ``records`` and ``dispatch`` →
``metrics`` and ``control`` → ``shell`` → ``core``."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import zmq

from ebctl.controller import Controller
from ebctl.protocol import PROTOCOL_VERSION

# ZeroMQ monitor events counted as failed handshakes, by kind
HANDSHAKE_EVENTS = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth"}

RECENT_REPORTS = 4096  # reports kept per engine for `tune calibrate`'s whole-iteration periods (and by bytes:
# daemon.recent_bytes)
SEQ_JUMP = 1 << 20  # a seq this far ahead of the last is a jump (a counter reset or a forged seq), not lost reports


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
    seq_gaps: int = 0  # reports missing from the seq sequence: dropped by the link's full queue
    seq_jumps: int = 0  # seq moved ahead by SEQ_JUMP or more at once: not counted as gaps
    replayed: int = 0  # reports refused because their seq was not above the last one of this process
    instance: str = ""  # the reporting process (EngineLink.instance): another one on this id is refused
    recent: deque = field(default_factory=deque)  # IterationReports without their finished lists, in order
    recent_bytes: int = 0  # bounds.kept_bytes of what ``recent`` holds
    duplicates: int = 0  # reports refused from another process claiming this engine id
    protocol: int = PROTOCOL_VERSION  # the protocol version of its last report: its policies go out in it
    plugin_version: str = ""  # the plugin's package version its last report said ("" before protocol 2)


@dataclass(slots=True)
class Counters:
    received: int = 0
    frames: int = 0  # telemetry frames taken off the socket: each is received, dispatch_received or rejected
    dispatch_received: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {
        "malformed": 0, "version": 0, "validation": 0, "duplicate": 0, "replayed": 0, **{
            f"bound:{b}": 0 for b in ("string", "finished", "requests", "tokens", "engines")}})
    faults: int = 0  # the daemon's own errors while handling one frame, request or reload (each logged)
    policies_refused: int = 0  # policies outside the engine's reported limits: stock published instead
    control_requests: int = 0
    control_errors: int = 0  # every control reply with ok=false: control_refused, plus faults on a request
    control_refused: int = 0  # refused for the request's sake: malformed, unknown op, a tune or reload said no
    control_rejected: dict[str, int] = field(default_factory=lambda: {"malformed": 0, "version": 0,
                                                                       "validation": 0})
    published: int = 0
    republished: int = 0
    publish_errors: int = 0
    handshake_failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HANDSHAKE_EVENTS.values(), 0))
