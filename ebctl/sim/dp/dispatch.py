"""Dispatch policies: sglang 0.5.23's ``round_robin`` and ``total_tokens``, and SBS on the pure core.

Each policy sees what the real DP controller sees: requests as they arrive, and the load every rank
publishes at the end of each forward. ``arrive`` returns the sends made at once; ``release`` the sends
made by a timer or an end of forward; ``next_check`` when ``release`` should be asked again.
"""

from __future__ import annotations

import math

from ebctl.sbs.dispatcher import Dispatcher
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
    """Staggered batch scheduling on the shared core (``ebctl.sbs.dispatcher.Dispatcher``: the buffer, the
    dual trigger of ``ReleaseClock``, PBAA over the ranks of the target instance with C_avail = chunk − in
    flight − queued), the same code the SGLang DP-controller plugin runs. Here a forward's duration is
    known, so it feeds T̄_fwd itself, and a send is acknowledged by the first forward that started after it.

    ``instances``: the rank ids of each instance (plain DP: one rank each; DP attention: all in one)."""

    name = "sbs"

    def __init__(self, instances: list[list[int]], chunk: int, params: SbsParams | None = None) -> None:
        self.core = Dispatcher(instances, chunk, params)
        self.params, self.instances, self.chunk = self.core.params, instances, chunk
        self.clock = self.core.clock
        self.reqs: dict[int, Req] = {}

    @property
    def buffered(self) -> int:
        return self.core.buffered

    @property
    def overloaded(self) -> set[int]:
        return self.core.overloaded

    def arrive(self, req: Req, now: float) -> Sends:
        self.reqs[req.id] = req
        self.core.arrive(req.id, req.tokens)
        return []

    def end_forward(self, iid: int, started: float, now: float, loads: list[RankLoad]) -> None:
        for load in loads:
            self.core.observe(load)
            self.core.ack(load.rank, started)  # the forward received everything sent by its start
        self.core.ready(iid, quiescent=all(load.quiescent for load in loads), duration_s=now - started)

    def release(self, now: float) -> Sends:
        return [(self.reqs.pop(jid), rank) for jid, rank in self.core.release(now).sends]

    def next_check(self, now: float) -> float:
        return self.core.next_check(now)


def make(name: str, instances: list[list[int]], chunk: int, params: SbsParams | None = None):
    n = sum(len(r) for r in instances)
    if name == "round-robin":
        return RoundRobin(n)
    if name == "total-tokens":
        return TotalTokens(n)
    if name == "sbs":
        return Sbs(instances, chunk, params)
    raise ValueError(f"unknown dispatch policy {name!r}; known: {', '.join(POLICIES)}")
