"""One run: open-loop arrivals through a dispatch policy onto DP ranks; the event loop and its metrics.

Events are arrivals, ends of forwards and the dispatcher's own wake-ups. At an end of forward the
instance's ranks publish their loads, the dispatcher sees them and may release, and only then does the
instance start its next forward, so a release at an end of forward makes the next forward. An idle
instance starts a forward as soon as a request reaches one of its ranks. Deterministic: the same inputs
give the same run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ebctl.costmodel import IterationCosts
from ebctl.sbs.types import SbsParams
from ebctl.sim.dp import costs as dpcosts
from ebctl.sim.dp import dispatch
from ebctl.sim.dp.ranks import Instance, PrefillRank, Req


@dataclass(frozen=True)
class DpConfig:
    ranks: int = 8  # DP ranks of one instance (attention); independent ranks (plain)
    mode: Literal["attention", "plain"] = "attention"  # lockstep DP attention (DP+EP), or independent ranks
    # attention: lockstep instances of ``ranks`` ranks each, behind one dispatcher (the SBS paper's 3P1D
    # deployment has three prefill instances of 8 ranks); plain DP has one rank per instance, so 1 only
    instances: int = 1
    chunk: int = 3072  # prefill tokens per rank and forward (the paper's "Prefill Chunk Size (3K)")
    costs: IterationCosts = field(default_factory=dpcosts.build)
    # the simulator delivers a release at once, so its L_net is 0: an L_net above the real latency makes
    # every release wait past the forward it was meant for (even 1 ms too much costs capacity)
    sbs: SbsParams = field(default_factory=lambda: SbsParams(l_net_s=0.0))

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.chunk < 1 or self.mode not in ("attention", "plain"):
            raise ValueError(f"DpConfig: ranks={self.ranks} (>= 1), chunk={self.chunk} (>= 1), "
                             f"mode={self.mode!r} (attention or plain)")
        if self.instances < 1 or (self.mode == "plain" and self.instances != 1):
            raise ValueError(f"DpConfig: instances={self.instances}: >= 1 under attention; 1 under plain DP "
                             "(each rank is its own instance there: give more ranks)")
        if self.costs.prefill is None:
            raise ValueError("DpConfig: the cost model has no prefill cost")


def build(cfg: DpConfig) -> tuple[list[PrefillRank], list[Instance]]:
    """Ranks 0..ranks·instances−1; instance i holds ranks [i·ranks, (i+1)·ranks) under attention."""
    n = cfg.ranks
    ranks = [PrefillRank(i, cfg.chunk) for i in range(n * cfg.instances)]
    if cfg.mode == "attention":
        return ranks, [Instance(i, ranks[i * n:(i + 1) * n], cfg.costs.prefill) for i in range(cfg.instances)]
    return ranks, [Instance(i, [r], cfg.costs.prefill) for i, r in enumerate(ranks)]


def run(arrival_s: np.ndarray, tokens: np.ndarray, policy: str, cfg: DpConfig, *, warmup: int = 0) -> dict[str, Any]:
    """Every request through ``policy`` (round-robin, total-tokens, sbs); the metrics of :func:`summarise`,
    the latency ones without the first ``warmup`` requests (an empty system flatters them)."""
    if arrival_s.shape != tokens.shape or arrival_s.size == 0:
        raise ValueError("arrival_s and tokens: one non-empty 1-d array each, of one length")
    if np.any(np.diff(arrival_s) < 0) or tokens.min() < 1:
        raise ValueError("arrival times must be sorted and every prompt >= 1 token")
    ranks, instances = build(cfg)
    disp = dispatch.make(policy, [[r.rank for r in i.ranks] for i in instances], cfg.chunk, cfg.sbs)
    reqs = [Req(i, float(a), int(t)) for i, (a, t) in enumerate(zip(arrival_s, tokens, strict=True))]
    events: list[tuple[float, int, int]] = []  # (time, seq, instance id or -1 for a wake-up)
    seq, wake_at, nxt = 0, math.inf, 0

    def push(t: float, what: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, what))

    def start(inst: Instance, now: float) -> None:
        if not inst.busy and inst.has_work():
            push(now + inst.start(now), inst.id)

    def deliver(sends: dispatch.Sends, now: float) -> None:
        for req, rank in sends:
            req.sent, req.rank = now, rank
            ranks[rank].inbox.append(req)

    while nxt < len(reqs) or events:
        if nxt < len(reqs) and (not events or reqs[nxt].arrival <= events[0][0]):
            req = reqs[nxt]
            nxt += 1
            now = req.arrival
            deliver(disp.arrive(req, now), now)
            if nxt < len(reqs) and reqs[nxt].arrival == now:
                continue  # requests arriving together reach an idle rank together
        else:
            now, _, what = heapq.heappop(events)
            if what >= 0:
                inst = instances[what]
                inst.finish(now)
                disp.end_forward(inst.id, inst.started, now, [r.load(now) for r in inst.ranks])
            elif now != wake_at:
                continue  # a superseded wake-up
        deliver(disp.release(now), now)
        for inst in instances:
            start(inst, now)
        w = disp.next_check(now)
        if w < math.inf and w != wake_at:
            wake_at = w
            push(w, -1)
    return summarise(reqs, instances, disp, cfg, warmup=warmup)


def _pct(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99))}


def summarise(reqs: list[Req], instances: list[Instance], disp: Any, cfg: DpConfig, *, warmup: int = 0
              ) -> dict[str, Any]:
    """TTFT (prompt done − arrival), its two waits (at the dispatcher: sent − arrival; in the engine:
    first chunk − sent), prompt tokens/s over the run, chunk utilisation (tokens a forward prefilled over
    its instance's ranks × chunk, mean over forwards), forwards per second and the busy share (the
    instances' forward time over instances × the run), and the load spread: under DP attention the mean
    over forwards of the busiest rank's tokens over the mean rank's (1 = even) and the share of rank time
    spent waiting at the barrier for the slowest rank; under plain DP the busiest rank's busy time over
    the mean's.

    Chunk utilisation at equal load is fixed by the forward rate: Σ tokens = the offered prompt tokens, so
    the mean over forwards is offered tokens / (forwards · ranks · chunk). A policy that runs more,
    shorter forwards over the same requests shows a lower utilisation; only a higher load (or an instance
    left idle so forwards fill up) raises it."""
    arrival = np.array([r.arrival for r in reqs])
    done = np.array([r.done for r in reqs])
    if (done < 0).any():
        raise RuntimeError(f"{int((done < 0).sum())} requests never finished (simulator bug)")
    timed = reqs[min(max(0, warmup), len(reqs) - 1):]
    ttft = done[len(reqs) - len(timed):] - arrival[len(reqs) - len(timed):]
    span = float(done.max() - arrival.min()) or 1e-9
    forwards = sum(i.forwards for i in instances)
    busy = np.array([r.busy_s for i in instances for r in i.ranks])
    if cfg.mode == "attention":
        spread = sum(i.straggle_sum for i in instances) / max(1, forwards)
        waited = sum(i.wait_s for i in instances)
        rank_time = sum(busy) + waited
        barrier = waited / rank_time if rank_time > 0 else 0.0
    else:
        spread = float(busy.max() / busy.mean()) if busy.mean() > 0 else 1.0
        barrier = 0.0
    return {"policy": disp.name, "requests": len(reqs), "ranks": cfg.ranks, "instances": cfg.instances,
            "mode": cfg.mode, "chunk": cfg.chunk,
            "offered_req_per_s": (len(reqs) - 1) / float(arrival.max() - arrival.min() or 1e-9),
            "ttft_s": _pct(ttft), "dispatch_wait_s": _pct(np.array([r.sent - r.arrival for r in timed])),
            "engine_wait_s": _pct(np.array([r.started - r.sent for r in timed])),
            "req_per_s": len(reqs) / span, "prompt_tok_per_s": sum(r.tokens for r in reqs) / span,
            "chunk_util": sum(i.util_sum for i in instances) / max(1, forwards), "forwards": forwards,
            "forwards_per_s": forwards / span,
            "busy_share": sum(i.forward_s for i in instances) / (len(instances) * span),
            "load_spread": spread, "barrier_wait": barrier,
            "overloads": len(getattr(disp, "overloaded", ())),
            "releases": getattr(getattr(disp, "clock", None), "releases", 0),
            "watchdog_fired": getattr(getattr(disp, "clock", None), "watchdog_fired", 0)}


def poisson(rate: float, n: int, *, seed: int = 0) -> np.ndarray:
    """Arrival times of ``n`` requests at ``rate`` per second (exponential gaps, seeded), starting at 0."""
    if not rate > 0 or n < 1:
        raise ValueError(f"poisson: rate={rate} (> 0), n={n} (>= 1)")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
