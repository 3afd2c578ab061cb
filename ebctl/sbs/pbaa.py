"""Where prefills go: Algorithm 2, the Prioritized Batch Allocation Algorithm (PBAA), and its capacity model.

Capacity of DP unit i for the next forward (§4.2.1):

    C_avail(i) = C_chunk − U_flight(i) − R_queued(i)

C_chunk: tokens one forward of a rank prefills (sglang's chunked prefill size); U_flight: tokens sent to
the rank that its latest load snapshot does not show yet (:class:`InFlight`); R_queued: the backlog the
snapshot shows (``RankLoad.queued_tokens``).

GreedyDispatch (Algorithm 2 lines 1-15): requests longest first; each goes to the unit with the largest
Capacity(r, d) = C_avail(d) − (L(r) − L_hit(r, d)) (L_hit = 0 in basic mode), provided that unit's
C_avail is still > 0 (line 8), which then drops by the request's uncached length; otherwise the request
waits for the next cycle (Q_next). Carried-over requests are placed before new ones (lines 18-22); a
request left behind more than N_limit cycles is reported as an overload (lines 25-29).

Choices the paper leaves open, made here:
* Line 8 tests the capacity *before* the request, so a unit with any room takes a request longer than
  that room (a prompt longer than C_chunk could never be placed otherwise); the rest of it is chunked
  into the unit's next forwards, and its backlog lowers that unit's next C_avail. So a unit's assignment
  can exceed its C_avail by less than the length of the last request it took, never more.
* Ties in capacity go to the lowest rank id.
* Carried-over requests are ordered by cycles waited (most first), then by length (longest first):
  Algorithm 2's "previous cycles" may be several, and the oldest must not starve behind newer long ones.
* Overload (FlowControl) is reported, not acted on: the caller decides to throttle or reject; the request
  stays queued and keeps its priority.

Pure: plain numbers in, an :class:`Allocation` out.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple


class Job(NamedTuple):
    """A buffered prefill request: ``tokens`` = prompt tokens to compute (L(r)), ``waited`` = cycles it
    has been left behind so far."""

    id: int
    tokens: int
    waited: int = 0


class Allocation(NamedTuple):
    assigned: tuple[tuple[int, int], ...]  # (job id, rank), in placement order
    left: tuple[Job, ...]  # Q_next, each with waited + 1
    overloaded: tuple[int, ...]  # ids in Q_next now over N_limit


def capacity(chunk_tokens: int, in_flight: int, queued: int) -> int:
    """C_avail = C_chunk − U_flight − R_queued (§4.2.1); may be negative (a backlog beyond one chunk)."""
    return chunk_tokens - in_flight - queued


def allocate(pending: Iterable[Job], new: Iterable[Job], avail: dict[int, int], *, n_limit: int = 10,
             hit: Callable[[int, int], int] | None = None) -> Allocation:
    """Algorithm 2: place ``pending`` (Q_pending) then ``new`` (Q_new) on the ranks of ``avail``
    (rank → C_avail). ``hit(job id, rank)``: cached prompt tokens of that job on that rank (the
    cache-aware mode); None: basic mode. ``avail`` is not modified."""
    cap = dict(avail)
    assigned: list[tuple[int, int]] = []
    left: list[Job] = []
    older = sorted(pending, key=lambda j: (-j.waited, -j.tokens))
    newer = sorted(new, key=lambda j: -j.tokens)  # stable: equal lengths keep arrival order
    place = _greedy if hit is None else _greedy_cache_aware
    for queue in (older, newer):
        place(queue, cap, assigned, left, hit)
    bumped = tuple(j._replace(waited=j.waited + 1) for j in left)
    return Allocation(tuple(assigned), bumped, tuple(j.id for j in bumped if j.waited > n_limit))


def _greedy(queue: Sequence[Job], cap: dict[int, int], assigned: list, left: list, _hit: object) -> None:
    """Basic mode: argmax_d C_avail(d) − L(r) is argmax_d C_avail(d); a heap keyed (−C_avail, rank)."""
    heap = [(-c, d) for d, c in cap.items()]
    heapq.heapify(heap)
    for i, job in enumerate(queue):
        if not heap or -heap[0][0] <= 0:  # no unit has room: the rest waits (line 12)
            left.extend(queue[i:])
            break
        neg, d = heapq.heappop(heap)
        c = -neg - job.tokens
        cap[d] = c
        heapq.heappush(heap, (-c, d))
        assigned.append((job.id, d))


def _greedy_cache_aware(queue: Sequence[Job], cap: dict[int, int], assigned: list, left: list,
                        hit: Callable[[int, int], int]) -> None:
    """Cache-aware mode: argmax_d C_avail(d) − (L(r) − L_hit(r, d)), ties to the lowest rank."""
    for job in queue:
        best, best_val = None, 0
        for d in sorted(cap):
            val = cap[d] - (job.tokens - min(job.tokens, max(0, hit(job.id, d))))
            if best is None or val > best_val:
                best, best_val = d, val
        if best is None or cap[best] <= 0:
            left.append(job)
            continue
        cap[best] = best_val
        assigned.append((job.id, best))


class InFlight:
    """U_flight: tokens sent to each rank that its load snapshots do not show yet.

    A send at ``t`` is shown by a snapshot of a forward that started at or after the rank received it;
    the caller acknowledges with that forward's start time (``ack(rank, started_s)``), or with the
    snapshot's timestamp minus L_net when forward durations are unknown."""

    def __init__(self) -> None:
        self._sent: dict[int, list[tuple[float, int]]] = {}
        self._tokens: dict[int, int] = {}

    def send(self, rank: int, tokens: int, at: float) -> None:
        self._sent.setdefault(rank, []).append((at, tokens))
        self._tokens[rank] = self._tokens.get(rank, 0) + tokens

    def ack(self, rank: int, upto: float) -> None:
        """Drop the sends to ``rank`` made at or before ``upto`` (the snapshot now counts them)."""
        sent = self._sent.get(rank)
        if not sent:
            return
        keep = [s for s in sent if s[0] > upto]
        self._sent[rank] = keep
        self._tokens[rank] = sum(t for _, t in keep)

    def tokens(self, rank: int) -> int:
        return self._tokens.get(rank, 0)
