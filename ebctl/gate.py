"""The per-iteration phase gate the engine asks "may a prefill batch form now?" (docs/design.md §2).

Pure and cheap: numbers the engine already has come in, a decision comes out; the only state is the
phase, which the caller keeps (``PhaseGate`` is a two-field holder around :func:`gate_step`).

EB mode (paper §3.1 and Eq. 23): stay in DECODE until ``free slots = n_max − running`` reaches k while
requests wait and the KV reserve holds (``kv_free_frac ≥ kv_reserve_frac``); then REFILL admits prefills
until the slots are full, the queue is empty or KV falls below the reserve; then DECODE again.
``running == 0`` always admits (nothing to protect, and an idle engine must not wait for k arrivals).
Anti-starvation: once the gate has held waiting requests back for ``max_defer_s`` while a slot was free
for them, it forces a refill, so EB's deferral is bounded. The clock counts only the gate's own deferral,
not queueing for a full batch: under saturation every request queues, and counting that would force a
refill every step and turn EB(k) into k = 1. It is a safety net, not the rule: the controller sets it to a
multiple of its own expected time to free k slots (``controller.py``), so the threshold k decides.

A prefill split over several steps (chunked prefill) must go on once started: while a chunk is in flight
and the gate would hold, it answers CHUNK_IN_FLIGHT: the chunk continues alone (``allow_prefill`` with
``admit_max`` 0: no new request joins it below k).

``PhaseGate`` also counts its decisions by reason (``counts``), so an engine can report why each refill
happened: THRESHOLD, STARVATION and IDLE are the decode → refill switches.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import NamedTuple

from ebctl.protocol import Mode, Policy


class Phase(enum.StrEnum):
    DECODE = "decode"
    REFILL = "refill"


class Reason(enum.StrEnum):
    THRESHOLD = "threshold"  # k free slots reached: refill
    IDLE = "idle"  # nothing running: admit
    STARVATION = "starvation"  # oldest wait ≥ max_defer_s: forced refill
    FILLING = "filling"  # refill continues
    WAIT_K = "wait_k"  # fewer than k free slots
    KV_RESERVE = "kv_reserve"  # Eq. 23 gate: not enough free KV to refill
    FULL = "full"  # refill ended: slots full
    QUEUE_EMPTY = "queue_empty"  # refill ended (or nothing to admit)
    CHUNK_IN_FLIGHT = "chunk_in_flight"  # would hold, but a chunked prefill must go on: it continues alone
    MIXED = "mixed"  # mb mode
    STOCK = "stock"  # off / no policy: engine's own behaviour


# The reasons that switch DECODE → REFILL: why a refill happened.
REFILL_REASONS = (Reason.THRESHOLD, Reason.STARVATION, Reason.IDLE)


class GateDecision(NamedTuple):
    """``allow_prefill``: a prefill (or mixed) batch may form this iteration; ``admit_max``: at most this
    many new requests may be admitted (None: no cap of ours); ``mixed``: whether mixing prefill chunks with
    decode rows is wanted (None: the engine's launch setting). A named tuple: the plugin asks for one every
    scheduler iteration, and a tuple is built several times faster than a frozen dataclass (docs/design.md §4)."""

    phase: Phase
    allow_prefill: bool
    admit_max: int | None
    mixed: bool | None
    reason: Reason


_STOCK = GateDecision(Phase.DECODE, True, None, None, Reason.STOCK)
# The decisions that hold a prefill back do not depend on the numbers: built once.
_QUEUE_EMPTY = GateDecision(Phase.DECODE, False, 0, False, Reason.QUEUE_EMPTY)
_FULL = GateDecision(Phase.DECODE, False, 0, False, Reason.FULL)
_KV_RESERVE = GateDecision(Phase.DECODE, False, 0, False, Reason.KV_RESERVE)
_WAIT_K = GateDecision(Phase.DECODE, False, 0, False, Reason.WAIT_K)


def gate_step(
    phase: Phase,
    policy: Policy | None,
    *,
    running: int,
    waiting: int,
    kv_free_frac: float,
    deferred_s: float,
    chunk_in_flight: bool = False,
) -> GateDecision:
    """One transition of the phase machine. ``policy`` None (none yet, or expired) means stock.
    ``deferred_s``: how long the gate has been refusing waiting requests while a slot was free;
    ``chunk_in_flight``: a prompt's prefill is split over steps and not finished (sglang's ``chunked_req``)."""
    if policy is None or policy.mode is Mode.OFF:
        return _STOCK
    d = _eb_step(phase, policy, running, waiting, kv_free_frac, deferred_s) if policy.mode is Mode.EB else \
        GateDecision(Phase.REFILL, policy.n_max > running, max(policy.n_max - running, 0), True, Reason.MIXED)
    if chunk_in_flight and not d.allow_prefill:  # the chunk goes on, alone: in its phase, admitting nobody
        return d._replace(allow_prefill=True, admit_max=0, reason=Reason.CHUNK_IN_FLIGHT)
    return d


def _eb_step(phase: Phase, policy: Policy, running: int, waiting: int, kv_free_frac: float,
             deferred_s: float) -> GateDecision:
    """EB mode's transition (paper §3.1, the Eq. 23 KV gate, the anti-starvation bound)."""
    free = policy.n_max - running
    if waiting <= 0:
        return _QUEUE_EMPTY
    if running <= 0:
        return GateDecision(Phase.REFILL, True, max(free, 1), False, Reason.IDLE)
    if free <= 0:
        return _FULL
    kv_ok = kv_free_frac >= policy.kv_reserve_frac
    if phase is Phase.REFILL:
        if kv_ok:
            return GateDecision(Phase.REFILL, True, free, False, Reason.FILLING)
        return _KV_RESERVE
    if deferred_s >= policy.max_defer_s:
        # Anti-starvation beats the KV reserve: the engine's own allocator still refuses what cannot fit.
        return GateDecision(Phase.REFILL, True, free, False, Reason.STARVATION)
    if free < policy.k:
        return _WAIT_K
    if not kv_ok:
        return _KV_RESERVE
    return GateDecision(Phase.REFILL, True, free, False, Reason.THRESHOLD)


HOLDS_KEPT = 8192  # the most recent hold durations PhaseGate keeps


class PhaseGate:
    """Holds the phase, the deferral clock and the decision counts between iterations; the rest is
    :func:`gate_step`. ``counts[reason]``: decisions taken for that reason since the gate was made;
    ``holds``: how long each of the last holds kept a waiting request from a free slot before the gate
    admitted again (seconds; recorded once per hold, so nothing per step)."""

    __slots__ = ("counts", "defer_since", "holds", "last", "phase")

    def __init__(self) -> None:
        self.phase = Phase.DECODE
        self.last: GateDecision = _STOCK
        self.defer_since: float | None = None  # when the gate began refusing a request it had a slot for
        self.counts: dict[Reason, int] = dict.fromkeys(Reason, 0)
        self.holds: deque[float] = deque(maxlen=HOLDS_KEPT)

    def decide(self, policy: Policy | None, *, running: int, waiting: int, kv_free_frac: float,
               now: float, chunk_in_flight: bool = False) -> GateDecision:
        since = self.defer_since
        d = gate_step(self.phase, policy, running=running, waiting=waiting, kv_free_frac=kv_free_frac,
                      deferred_s=0.0 if since is None else now - since, chunk_in_flight=chunk_in_flight)
        admits = d.allow_prefill and d.admit_max != 0  # a chunk going on alone admits nobody: still held
        if admits or waiting <= 0 or (policy is not None and running >= policy.n_max):
            if admits and since is not None:
                self.holds.append(now - since)
            self.defer_since = None
        elif since is None:
            self.defer_since = now
        self.phase = d.phase
        self.last = d
        self.counts[d.reason] += 1
        return d

    def rest(self) -> None:
        """Nothing waits: the state ``decide(eb policy, waiting=0, ...)`` leaves, whatever the other numbers
        (DECODE, no deferral clock), without asking :func:`gate_step`. The plugin calls this instead of
        ``decide`` on every step whose queue is empty (most steps of a busy server): there is nothing to
        admit, so the decision cannot matter, and the gate's cost is kept for steps where it does."""
        self.phase = Phase.DECODE
        self.defer_since = None
        self.last = _QUEUE_EMPTY
        self.counts[Reason.QUEUE_EMPTY] += 1
