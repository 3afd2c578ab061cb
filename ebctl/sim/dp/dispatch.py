"""Dispatch policies: sglang 0.5.23's ``round_robin`` and ``total_tokens``, and SBS on the pure core.

Each policy sees what the real DP controller sees: requests as they arrive, and the load every rank
publishes at the end of each forward. ``arrive`` returns the sends made at once; ``release`` the sends
made by a timer or an end of forward; ``next_check`` when ``release`` should be asked again.
"""

from __future__ import annotations

import math

from ebctl.sbs.interval import ReleaseClock
from ebctl.sbs.pbaa import InFlight, Job, allocate, capacity
from ebctl.sbs.types import RankLoad, SbsParams
from ebctl.sim.dp.ranks import Req

Sends = list[tuple[Req, int]]
POLICIES = ("round-robin", "total-tokens", "sbs")


class RoundRobin:
    """``DataParallelController.round_robin_scheduler`` (data_parallel_controller.py:880-899): the next
    active rank in turn, whatever its load."""

    name = "round-robin"

    def __init__(self, n_ranks: int) -> None:
        self.n, self.counter = n_ranks, 0
        self.buffered = 0

    def arrive(self, req: Req, now: float) -> Sends:
        rank = self.counter % self.n
        self.counter = (self.counter + 1) % self.n
        return [(req, rank)]

    def end_forward(self, iid: int, started: float, now: float, loads: list[RankLoad]) -> None:
        pass

    def release(self, now: float) -> Sends:
        return []

    def next_check(self, now: float) -> float:
        return math.inf


class TotalTokens(RoundRobin):
    """``DPBudget`` with ``LoadBalanceMethod.TOTAL_TOKENS`` (data_parallel_controller.py:122-155): the
    rank with the fewest (num_total_tokens, running + waiting requests), then a speculative increment of
    that rank by the request's prompt length. The budget is refreshed from the shared-memory snapshots at
    most every 20 ms (``refresh_load_budget``, :346-361), skipping a rank whose snapshot timestamp has not
    moved, so increments made since the rank's last snapshot are overwritten by it."""

    name = "total-tokens"
    REFRESH_S = 0.02

    def __init__(self, n_ranks: int) -> None:
        super().__init__(n_ranks)
        self.total_requests = [0] * n_ranks
        self.total_tokens = [0] * n_ranks
        self.last_timestamp = [0.0] * n_ranks
        self.shm: dict[int, RankLoad] = {}  # the latest snapshot each rank published
        self.last_refresh = -math.inf

    def end_forward(self, iid: int, started: float, now: float, loads: list[RankLoad]) -> None:
        for load in loads:
            self.shm[load.rank] = load

    def arrive(self, req: Req, now: float) -> Sends:
        if now - self.last_refresh >= self.REFRESH_S:
            self.last_refresh = now
            for load in self.shm.values():  # DPBudget.update_budget
                if load.timestamp == self.last_timestamp[load.rank]:
                    continue
                self.last_timestamp[load.rank] = load.timestamp
                self.total_requests[load.rank] = load.running + load.waiting
                self.total_tokens[load.rank] = load.total_tokens
        rank = min(range(self.n), key=lambda i: (self.total_tokens[i], self.total_requests[i]))
        self.total_requests[rank] += 1
        self.total_tokens[rank] += req.tokens
        return [(req, rank)]


class Sbs:
    """Staggered batch scheduling: buffer, release on the dual trigger (``ReleaseClock``), place by PBAA
    (``allocate``) over the ranks of the target instance with C_avail = chunk − in flight − queued.

    ``instances``: the rank ids of each instance (plain DP: one rank each; DP attention: all in one)."""

    name = "sbs"

    def __init__(self, instances: list[list[int]], chunk: int, params: SbsParams | None = None) -> None:
        self.params = params or SbsParams()
        self.instances, self.chunk = instances, chunk
        self.clock = ReleaseClock.from_params(range(len(instances)), self.params)
        self.queued = {r: 0 for ranks in instances for r in ranks}  # R_queued from the latest snapshots
        self.in_flight = InFlight()
        self.pending: list[Job] = []
        self.new: list[Job] = []
        self.reqs: dict[int, Req] = {}
        self.overloaded: set[int] = set()  # requests left behind more than N_limit cycles
        self.blocked = False  # the last release found no room anywhere: wait for an end of forward

    @property
    def buffered(self) -> int:
        return len(self.pending) + len(self.new)

    def arrive(self, req: Req, now: float) -> Sends:
        self.reqs[req.id] = req
        self.new.append(Job(req.id, req.tokens))
        return []

    def end_forward(self, iid: int, started: float, now: float, loads: list[RankLoad]) -> None:
        for load in loads:
            self.queued[load.rank] = load.queued_tokens
            self.in_flight.ack(load.rank, started)  # the forward received everything sent by its start
        self.clock.end_forward(iid, now - started, quiescent=all(load.quiescent for load in loads))
        self.blocked = False

    def release(self, now: float) -> Sends:
        sends: Sends = []
        for _ in range(self.clock.n_active):  # skip targets without room, at most once round
            if not self.buffered:
                break
            target = self.clock.due(now)
            if target is None:
                break
            avail = {r: capacity(self.chunk, self.in_flight.tokens(r), self.queued[r])
                     for r in self.instances[target]}
            alloc = allocate(self.pending, self.new, avail, n_limit=self.params.n_limit)
            if not alloc.assigned:
                self.clock.skip(target)
                self.blocked = True
                continue
            for jid, rank in alloc.assigned:
                req = self.reqs.pop(jid)
                self.in_flight.send(rank, req.tokens, now)
                sends.append((req, rank))
            self.pending, self.new = list(alloc.left), []
            self.overloaded.update(alloc.overloaded)
            self.clock.release(target, now)
            self.blocked = False
            break
        return sends

    def next_check(self, now: float) -> float:
        return self.clock.next_check(now) if self.buffered and not self.blocked else math.inf


def make(name: str, instances: list[list[int]], chunk: int, params: SbsParams | None = None):
    n = sum(len(r) for r in instances)
    if name == "round-robin":
        return RoundRobin(n)
    if name == "total-tokens":
        return TotalTokens(n)
    if name == "sbs":
        return Sbs(instances, chunk, params)
    raise ValueError(f"unknown dispatch policy {name!r}; known: {', '.join(POLICIES)}")
