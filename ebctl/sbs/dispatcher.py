"""The SBS dispatcher: a buffer released by Algorithm 1's clock, placed by Algorithm 2 (prefill) or 3 (decode).

One class for both callers: the simulator (``ebctl/sim/dp/dispatch.py``) and the SGLang DP-controller plugin
(``sglang_patch/dispatch_state.py``), so the plugin runs the code the simulator measured. Requests are plain
numbers here: an id the caller chooses and a token count.

Targets (``instances``): the rank ids each release goes to. Plain DP: one rank per target (independent
instances, releases staggered across them, I_opt = (T̄_fwd + L_net)/N_ranks); DP attention: all ranks in one
target (one instance in lockstep: one release per forward, PBAA spreads it over the ranks). Decode
(``decode=True``, the decode DP units of a prefill/decode-disaggregated deployment): one target holding
every unit, each release placed by Algorithm 3 (``place_decode``) on (requests, KV tokens) per unit.

What the caller reports: ``arrive`` (a request to buffer), ``observe`` (a rank's latest load: R_queued, and
for decode B and K), ``in_flight.ack`` (sends a snapshot now shows), ``ready`` (a target ended a forward:
Algorithm 1's OnEndForward, with its duration when the caller measures it), ``take`` (requests leaving the
buffer outside a release: aborted, flushed). What it answers: ``release(now)`` (the sends of at most one
release) and ``next_check(now)``.

Choices beyond the paper, made here:
* A cycle is a release: a request placed by none of N_limit releases is an overload event (Algorithm 2
  lines 25-29). ``evict_overloaded``: overloaded requests leave the buffer in ``Release.overloaded``, for
  the caller to send another way (the plugin: sglang's own dispatch; never rejected); otherwise they stay
  queued and are only counted (the simulator, as the paper's FlowControl reports).
* A due target with no room is skipped (``ReleaseClock.skip``) without counting a cycle; after a release
  finds no room anywhere, nothing is due until a target reports again (``blocked``).

Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from ebctl.sbs.interval import ReleaseClock
from ebctl.sbs.iqr import place_decode
from ebctl.sbs.pbaa import InFlight, Job, allocate, capacity
from ebctl.sbs.types import RankLoad, SbsParams


class Release(NamedTuple):
    sends: list[tuple[int, int]]  # (request id, rank), in placement order
    overloaded: list[int]  # request ids taken out of the buffer as overload (evict_overloaded only)
    target: int | None = None  # the target released to (None: no release)


NO_RELEASE = Release([], [])


class Dispatcher:
    """Buffer + ``ReleaseClock`` + PBAA / Algorithm 3 + ``InFlight``, over the ranks of ``instances``."""

    def __init__(self, instances: list[list[int]], chunk: int, params: SbsParams | None = None, *,
                 decode: bool = False, evict_overloaded: bool = False) -> None:
        if not instances or any(not ranks for ranks in instances):
            raise ValueError(f"Dispatcher: every target needs at least one rank (got {instances})")
        self.params = params or SbsParams()
        self.instances, self.chunk, self.decode = [list(r) for r in instances], chunk, decode
        self.evict_overloaded = evict_overloaded
        self.clock = ReleaseClock.from_params(range(len(self.instances)), self.params)
        ranks = [r for rs in self.instances for r in rs]
        self.queued = dict.fromkeys(ranks, 0)  # R_queued from the latest snapshots
        self.batch = dict.fromkeys(ranks, 0)  # decode: B (running + waiting) from the latest snapshots
        self.kv = dict.fromkeys(ranks, 0)  # decode: K (KV held + waiting) from the latest snapshots
        self.in_flight = InFlight()  # tokens sent that no snapshot shows yet (U_flight)
        self.reqs_in_flight = InFlight()  # decode: requests sent that no snapshot shows yet (one "token" each)
        self.pending: list[Job] = []  # Q_pending: left behind at least one cycle
        self.new: list[Job] = []  # Q_new: arrived since the last release
        self.overloads = 0  # requests that went over N_limit cycles
        self.overloaded: set[int] = set()  # ... their ids, when they stay queued (not evict_overloaded)
        self.blocked = False

    @property
    def buffered(self) -> int:
        return len(self.pending) + len(self.new)

    def target_of(self, rank: int) -> int | None:
        for t, ranks in enumerate(self.instances):
            if rank in ranks:
                return t
        return None

    # ---- what the caller reports --------------------------------------------------------------------

    def arrive(self, jid: int, tokens: int, waited: int = 0) -> None:
        (self.pending if waited else self.new).append(Job(jid, tokens, waited))

    def take(self, jids: Iterable[int]) -> list[Job]:
        """Take these requests out of the buffer (aborted, flushed); the jobs found, in buffer order."""
        out = set(jids)
        taken = [j for j in (*self.pending, *self.new) if j.id in out]
        if taken:
            self.pending = [j for j in self.pending if j.id not in out]
            self.new = [j for j in self.new if j.id not in out]
        return taken

    def observe(self, load: RankLoad) -> None:
        """A rank's latest snapshot: R_queued (prefill), B and K (decode)."""
        if load.rank in self.queued:
            self.queued[load.rank] = load.queued_tokens
            self.batch[load.rank] = load.running + load.waiting
            self.kv[load.rank] = load.total_tokens

    def ready(self, target: int, *, quiescent: bool = False, duration_s: float | None = None) -> None:
        """OnEndForward of ``target``; ``duration_s``: the forward's length when the caller measured it (the
        clock's T̄_fwd window), else T̄_fwd comes from elsewhere (``clock.set_forward_time``)."""
        if duration_s is None:
            self.clock.mark_ready(target, quiescent=quiescent)
        else:
            self.clock.end_forward(target, duration_s, quiescent=quiescent)
        self.blocked = False

    # ---- what it answers ----------------------------------------------------------------------------

    def release(self, now: float) -> Release:
        """At most one release: to the first due target with room. Requests sent are recorded in flight."""
        for _ in range(self.clock.n_active):  # skip targets without room, at most once round
            if not self.buffered:
                break
            target = self.clock.due(now)
            if target is None:
                break
            ranks = self.instances[target]
            if self.decode:
                return self._release_decode(target, ranks, now)
            avail = {r: capacity(self.chunk, self.in_flight.tokens(r), self.queued[r]) for r in ranks}
            tokens = {j.id: j.tokens for j in self.pending}
            tokens.update((j.id, j.tokens) for j in self.new)
            alloc = allocate(self.pending, self.new, avail, n_limit=self.params.n_limit)
            if not alloc.assigned:
                self.clock.skip(target)
                self.blocked = True
                continue
            for jid, rank in alloc.assigned:
                self.in_flight.send(rank, tokens[jid], now)
            evicted = self._carry(alloc.left, alloc.overloaded)
            self.clock.release(target, now)
            self.blocked = False
            return Release(list(alloc.assigned), evicted, target)
        return NO_RELEASE

    def _carry(self, left: tuple[Job, ...], overloaded: tuple[int, ...]) -> list[int]:
        """Q_next becomes the pending queue; overloaded requests are counted (and evicted if asked)."""
        new_over = [jid for jid in overloaded if jid not in self.overloaded]
        self.overloads += len(new_over)
        if self.evict_overloaded and overloaded:
            out = set(overloaded)
            self.pending, self.new = [j for j in left if j.id not in out], []
            return list(overloaded)
        self.overloaded.update(new_over)
        self.pending, self.new = list(left), []
        return []

    def _release_decode(self, target: int, ranks: list[int], now: float) -> Release:
        """Algorithm 3 over the target's units: every buffered request placed at once, longest first, on
        B = requests (snapshot + in flight) and K = KV tokens (snapshot + in flight)."""
        jobs = [*self.pending, *self.new]
        b = [self.batch[r] + self.reqs_in_flight.tokens(r) for r in ranks]
        k = [self.kv[r] + self.in_flight.tokens(r) for r in ranks]
        unit_of, _, _ = place_decode([j.tokens for j in jobs], b, k, k=self.params.iqr_k)
        sends = []
        for j, u in zip(jobs, unit_of, strict=True):
            rank = ranks[u]
            self.in_flight.send(rank, j.tokens, now)
            self.reqs_in_flight.send(rank, 1, now)
            sends.append((j.id, rank))
        self.pending, self.new = [], []
        self.clock.release(target, now)
        self.blocked = False
        return Release(sends, [], target)

    def ack(self, rank: int, upto: float) -> None:
        """Sends to ``rank`` made at or before ``upto`` are now shown by its snapshot."""
        self.in_flight.ack(rank, upto)
        self.reqs_in_flight.ack(rank, upto)

    def next_check(self, now: float) -> float:
        return self.clock.next_check(now) if self.buffered and not self.blocked else math.inf
