"""A prefill rank (chunked prefill with a token budget per forward) and an instance of ranks.

A rank is sglang's scheduler reduced to what prefill dispatch sees: requests sent to it wait in its socket
(``inbox``) until its next scheduling iteration, which receives them (``recv_requests``) and then forms one
prefill batch: the chunked request first, then the waiting queue in arrival order, until ``chunk`` tokens
are taken; a request that does not fit whole is split and continued first in the next forward (sglang's
chunked prefill, one chunked request at a time: ``managers/schedule_policy.py`` PrefillAdder). At the end
of each forward the rank publishes its load (``scheduler.py:5082``, forced for prefill forwards), which is
all a dispatcher can see of it.

An instance is what runs a forward: under plain DP one rank; under DP attention (DP+EP) all its ranks in
lockstep, where a forward lasts as long as its slowest rank's, and a rank with nothing to do still runs an
idle forward (its intercept) to join the collective. Assumptions: the scheduling gap between forwards and
the dispatcher → rank latency are 0; KV is freed when a prompt is done (instant transfer to decode); KV
capacity never binds on the prefill side.
"""

from __future__ import annotations

from collections import deque

from ebctl.costmodel import PhaseCost
from ebctl.sbs.types import RankLoad


class Req:
    __slots__ = ("arrival", "done", "id", "left", "out", "rank", "sent", "started", "tokens")

    def __init__(self, rid: int, arrival: float, tokens: int, out: int = 1) -> None:
        self.id, self.arrival, self.tokens, self.out = rid, arrival, tokens, out
        self.left = tokens  # prompt tokens not yet prefilled
        self.rank = -1
        self.sent = self.started = self.done = -1.0  # dispatched, first chunk began, prompt done (TTFT)


class PrefillRank:
    def __init__(self, rank: int, chunk: int) -> None:
        self.rank, self.chunk = rank, chunk
        self.inbox: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.waiting_tokens = 0  # Σ prompt tokens of the waiting queue (their seqlen)
        self.chunked: Req | None = None
        self.tokens_done = 0
        self.busy_s = 0.0

    def has_work(self) -> bool:
        return bool(self.inbox or self.waiting or self.chunked)

    def plan(self, now: float) -> list[tuple[Req, int]]:
        """Receive the inbox, then take up to ``chunk`` tokens: the chunked request, then FCFS."""
        for r in self.inbox:
            self.waiting.append(r)
            self.waiting_tokens += r.tokens
        self.inbox.clear()
        budget, batch = self.chunk, []
        if self.chunked is not None:
            take = min(self.chunked.left, budget)
            batch.append((self.chunked, take))
            budget -= take
        while budget > 0 and self.waiting:
            r = self.waiting.popleft()
            self.waiting_tokens -= r.tokens
            take = min(r.left, budget)
            batch.append((r, take))
            budget -= take
            if r.started < 0:
                r.started = now
        return batch

    def finish(self, batch: list[tuple[Req, int]], now: float) -> list[Req]:
        """Apply a forward's batch at its end; return the requests whose prompt is done."""
        done, self.chunked = [], None
        for r, take in batch:
            r.left -= take
            self.tokens_done += take
            if r.left == 0:
                r.done = now
                done.append(r)
            else:
                self.chunked = r
        return done

    def load(self, now: float) -> RankLoad:
        """What the rank publishes (LoadSnapshot fields; load_inquirer.py:82-104 and 141-147)."""
        c = self.chunked
        queued = self.waiting_tokens + (c.left if c else 0)
        used = (c.tokens - c.left) if c else 0  # KV of the chunked request's prefilled part
        return RankLoad(rank=self.rank, timestamp=now, running=0, waiting=len(self.waiting) + (1 if c else 0),
                        queued_tokens=queued, used_tokens=used, total_tokens=used + self.waiting_tokens)


class Instance:
    """Ranks that run their forwards together (one rank under plain DP)."""

    def __init__(self, iid: int, ranks: list[PrefillRank], cost: PhaseCost) -> None:
        self.id, self.ranks, self.cost = iid, ranks, cost
        self.busy = False
        self.started = 0.0
        self.batches: list[list[tuple[Req, int]]] = []
        self.forwards = 0
        self.forward_s = 0.0  # Σ forward durations
        self.util_sum = 0.0  # Σ over forwards of tokens / (ranks · chunk)
        self.straggle_sum = 0.0  # Σ over forwards of max rank tokens / mean rank tokens
        self.wait_s = 0.0  # Σ over forwards and ranks of the time a rank waited for the slowest

    def has_work(self) -> bool:
        return any(r.has_work() for r in self.ranks)

    def start(self, now: float) -> float:
        """Plan every rank's batch; return the forward's duration (the slowest rank's)."""
        self.busy, self.started = True, now
        self.batches = [r.plan(now) for r in self.ranks]
        tokens = [sum(t for _, t in b) for b in self.batches]
        costs = [self.cost.predict(prefill_tokens=t, prefill_reqs=len(b)) for t, b in
                 zip(tokens, self.batches, strict=True)]
        duration = max(costs)
        n = len(self.ranks)
        mean_tok = sum(tokens) / n
        self.forwards += 1
        self.forward_s += duration
        self.util_sum += sum(tokens) / (n * self.ranks[0].chunk)
        self.straggle_sum += max(tokens) / mean_tok if mean_tok > 0 else 1.0
        self.wait_s += sum(duration - c for c in costs)
        for r, c in zip(self.ranks, costs, strict=True):
            r.busy_s += c
        return duration

    def finish(self, now: float) -> list[Req]:
        self.busy = False
        done: list[Req] = []
        for r, b in zip(self.ranks, self.batches, strict=True):
            done += r.finish(b, now)
        self.batches = []
        return done
