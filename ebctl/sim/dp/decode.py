"""The decode pool of a prefill/decode-disaggregated deployment: decode DP units in lockstep, and where a
request whose prompt is done goes: sglang's ``round-robin`` or ``total-tokens``, or Algorithm 3 (``sbs``).

Each unit holds running requests; a request is admitted when its whole sequence (prompt + output) fits
in the unit's KV (sglang's decode side preallocates before the transfer), else it waits on that unit.
Every step each running request makes one token; a step lasts as long as the slowest unit's (the DP+EP
barrier), each unit costing α_d + β_d·B + γ·K (B requests, K KV tokens). Requests arriving during a step
join at the next one; ``sbs`` places them together there by Algorithm 3 on (B = running + waiting,
K = KV held + waiting), the other two place each on arrival from the loads of the last step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ebctl.costmodel import PhaseCost
from ebctl.sbs.iqr import place_decode
from ebctl.sbs.types import RankLoad
from ebctl.sim.dp.dispatch import RoundRobin, TotalTokens
from ebctl.sim.dp.ranks import Req

DECODE_POLICIES = ("round-robin", "total-tokens", "sbs")


class Unit:
    def __init__(self, uid: int, kv_tokens: int) -> None:
        self.id, self.cap = uid, kv_tokens
        self.running: list[Req] = []
        self.waiting: list[Req] = []
        self.kv = 0  # KV tokens reserved by the running requests

    def admit(self, now: float) -> None:
        while self.waiting and self.kv + self.waiting[0].tokens + self.waiting[0].out <= self.cap:
            r = self.waiting.pop(0)
            self.kv += r.tokens + r.out
            r.left, r.sent = r.out, now  # tokens still to make; admitted at
            self.running.append(r)

    def load(self, now: float) -> RankLoad:
        pending = sum(r.tokens + r.out for r in self.waiting)
        return RankLoad(rank=self.id, timestamp=now, running=len(self.running), waiting=len(self.waiting),
                        used_tokens=self.kv, total_tokens=self.kv + pending)


def run(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, policy: str, *, units: int,
        kv_tokens: int, cost: PhaseCost, iqr_k: float = 1.5) -> dict[str, Any]:
    """Requests entering the decode pool at ``arrival_s``; the pool's throughput, TPOT and KV spread."""
    if policy not in DECODE_POLICIES:
        raise ValueError(f"unknown decode policy {policy!r}; known: {', '.join(DECODE_POLICIES)}")
    if (prompt + output).max() > kv_tokens:
        raise ValueError(f"a request of {int((prompt + output).max())} tokens exceeds kv_tokens={kv_tokens}")
    pool = [Unit(i, kv_tokens) for i in range(units)]
    reqs = [Req(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrival_s, prompt, output,
                                                                                   strict=True))]
    immediate = {"round-robin": RoundRobin, "total-tokens": TotalTokens}.get(policy)
    disp = immediate(units) if immediate else None
    buffer: list[Req] = []
    now, nxt, steps, tokens_out = 0.0, 0, 0, 0
    kv_cv, kv_maxmean, wait_share, busy = [], [], [], 0.0
    ends: list[float] = []  # per request: when its last token was made

    def place(batch: list[Req]) -> None:
        if disp is not None:
            for r in batch:
                pool[disp.arrive(r, r.arrival)[0][1]].waiting.append(r)
            return
        b = [len(u.running) + len(u.waiting) for u in pool]
        k = [u.kv + sum(r.tokens + r.out for r in u.waiting) for u in pool]
        unit_of, _, _ = place_decode([r.tokens + r.out for r in batch], b, k, k=iqr_k)
        for r, u in zip(batch, unit_of, strict=True):
            pool[u].waiting.append(r)

    while nxt < len(reqs) or any(u.running or u.waiting for u in pool) or buffer:
        if not any(u.running or u.waiting for u in pool) and not buffer:
            now = max(now, reqs[nxt].arrival)  # idle: jump to the next arrival
        while nxt < len(reqs) and reqs[nxt].arrival <= now:
            buffer.append(reqs[nxt])
            nxt += 1
        if disp is not None:  # immediate policies placed each on arrival, from the last step's loads
            buffer.sort(key=lambda r: r.arrival)
        place(buffer)
        buffer = []
        for u in pool:
            u.admit(now)
        costs = [cost.predict(decode_reqs=len(u.running), decode_ctx_tokens=u.kv) for u in pool]
        dur = max(costs)
        kv = np.array([u.kv for u in pool], dtype=float)
        if kv.mean() > 0:
            kv_cv.append(kv.std() / kv.mean())
            kv_maxmean.append(kv.max() / kv.mean())
        wait_share.append(sum(dur - c for c in costs) / (dur * units))
        now += dur
        busy += dur
        steps += 1
        for u in pool:
            still = []
            for r in u.running:
                r.left -= 1
                if r.started < 0:
                    r.started = now  # its first decode token
                tokens_out += 1
                if r.left == 0:
                    r.done = now
                    u.kv -= r.tokens + r.out
                    ends.append(now)
                else:
                    still.append(r)
            u.running = still
        if disp is not None:
            disp.end_forward(0, now - dur, now, [u.load(now) for u in pool])
    tpot = np.array([(r.done - r.started) / max(1, r.out - 1) for r in reqs if r.out > 1])
    span = max(ends) - float(arrival_s.min())
    return {"policy": policy, "units": units, "requests": len(reqs), "steps": steps,
            "out_tok_per_s": tokens_out / span, "tpot_s": float(tpot.mean()) if tpot.size else 0.0,
            "kv_cv": float(np.mean(kv_cv)), "kv_max_over_mean": float(np.mean(kv_maxmean)),
            "barrier_wait": float(np.mean(wait_share)),
            "queue_wait_s": float(np.mean([r.sent - r.arrival for r in reqs]))}
