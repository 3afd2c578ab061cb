"""What SBS's dispatch path costs per request and per release, on the pure core (no sockets, no sglang).

The DP controller's part of SBS is: on each arrival, buffer the request; on each release, ask the clock
(``ReleaseClock.due``), build every rank's C_avail, run PBAA (``allocate``) over the buffered batch and
record the sends (``InFlight``); on each rank's end of forward, ``end_forward`` and ``InFlight.ack``.
Decode placement (Algorithm 3) runs ``place_decode`` per batch. None of it blocks: plain arithmetic.
For scale, sglang's own ``total_tokens`` decision (DPBudget: argmin over ranks, then an increment) is
timed the same way, as the simulator reimplements it.

    python tools/bench_sbs.py            # prints a table: p50 and p99 over repeated timings
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ebctl.sbs.interval import ReleaseClock
from ebctl.sbs.iqr import place_decode
from ebctl.sbs.pbaa import InFlight, Job, allocate, capacity
from ebctl.sbs.types import RankLoad
from ebctl.sim.dp.dispatch import TotalTokens
from ebctl.sim.dp.ranks import Req

REPEATS = 300


def timed(fn, repeats: int = REPEATS) -> tuple[float, float]:
    """p50 and p99 of ``fn()``'s wall time in µs (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    xs = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        fn()
        xs.append((time.perf_counter_ns() - t) / 1e3)
    xs.sort()
    return statistics.median(xs), xs[int(0.99 * (len(xs) - 1))]


def release_case(ranks: int, batch: int, rng: np.random.Generator):
    """One release: due() + C_avail of every rank + PBAA over ``batch`` new and a few carried-over
    requests + the sends recorded."""
    clock = ReleaseClock([0], t_default_s=0.1)
    flight = InFlight()
    queued = {r: int(x) for r, x in enumerate(rng.integers(0, 3072, ranks))}
    new = [Job(i, int(t)) for i, t in enumerate(rng.integers(50, 3000, batch))]
    pending = [Job(10_000 + i, int(t), 1) for i, t in enumerate(rng.integers(50, 3000, max(1, batch // 8)))]

    def release() -> None:
        if clock.due(1e9) is None:
            raise RuntimeError("the clock should be due")
        avail = {r: capacity(3072, flight.tokens(r), q) for r, q in queued.items()}
        alloc = allocate(pending, new, avail, n_limit=10)
        for _, rank in alloc.assigned:
            flight.send(rank, 1, 0.0)
        for r in queued:
            flight.ack(r, 0.0)  # keep the ledger from growing across repeats

    return release


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for ranks, batch in ((8, 8), (8, 32), (16, 32), (16, 128), (64, 128)):
        p50, p99 = timed(release_case(ranks, batch, rng))
        per = batch + max(1, batch // 8)
        rows.append((f"release: due + C_avail + PBAA + sends, {ranks} ranks, {per} requests", p50, p99,
                     p50 / per))
    clock = ReleaseClock(range(16), t_default_s=0.1)
    rows.append(("end of forward: ReleaseClock.end_forward", *timed(lambda: clock.end_forward(3, 0.1)), None))
    flight = InFlight()
    rows.append(("arrival: buffer one request (list append of a Job)", *timed(lambda: [].append(Job(1, 100))), None))

    def ack() -> None:
        flight.send(2, 100, 1.0)
        flight.ack(2, 1.0)

    rows.append(("U_flight: InFlight.send + ack", *timed(ack), None))
    for units, batch in ((16, 8), (32, 32)):
        b = rng.integers(20, 50, units).tolist()
        k = rng.integers(40_000, 130_000, units).tolist()
        lengths = rng.integers(500, 5000, batch).tolist()
        p50, p99 = timed(lambda b=b, k=k, lengths=lengths: place_decode(lengths, b, k))
        rows.append((f"decode: place_decode (Algorithm 3), {units} units, {batch} requests", p50, p99, p50 / batch))
    tt = TotalTokens(16)
    tt.end_forward(0, 0.0, 0.5, [RankLoad(r, 0.5, total_tokens=1000 * r) for r in range(16)])
    req = Req(0, 1.0, 100)
    rows.append(("sglang total_tokens decision (DPBudget, 16 ranks), for scale",
                 *timed(lambda: tt.arrive(req, 1.0)), None))
    print("| what | p50 µs | p99 µs | p50 µs per request |")
    print("|---|---|---|---|")
    for what, p50, p99, per in rows:
        print(f"| {what} | {p50:.1f} | {p99:.1f} | {'' if per is None else f'{per:.2f}'} |")


if __name__ == "__main__":
    main()
