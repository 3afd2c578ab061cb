"""What SBS's dispatch path costs per request and per release, on the pure core (no sockets, no sglang).

The DP controller's part of SBS is: on each arrival, buffer the request; on each release, ask the clock
(``ReleaseClock.due``), build every rank's C_avail, run PBAA (``allocate``) over the buffered batch and
record the sends (``InFlight``); on each rank's end of forward, ``end_forward`` and ``InFlight.ack``.
Decode placement (Algorithm 3) runs ``place_decode`` per batch. None of it blocks: plain arithmetic.
For scale, sglang's own ``total_tokens`` decision (DPBudget: argmin over ranks, then an increment) is
timed the same way, as the simulator reimplements it.

The plugin's part (``sglang_patch/dispatch*.py``, on the stand-ins of tests/sglang/dispatch_fakes.py: a
``DataParallelController`` whose hooked methods call the real hooks around no-op originals): the dispatch
decision per request (the ``dispatching_with_trace`` hook holding it; passing it on with SBS off), and one
release (a tick: read every rank's snapshot from a stand-in reader, acknowledgements, readiness, the core's
release, each request sent through the hook to sglang's dispatch). Run inside the sglang environment, it also
times sglang's own ``ShmLoadSnapshotReader.read_all`` on a real shared-memory file (the one read a tick adds
that the stand-in does not cost).

    python tools/bench_sbs.py            # prints a table: p50 and p99 over repeated timings
    $(bash tools/sglang_env.sh | tail -1)/bin/python tools/bench_sbs.py   # ... with the shared-memory read
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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


def per_request(setup, run, n: int, repeats: int = REPEATS) -> tuple[float, float]:
    """p50 and p99 over repeats of ``run()``'s wall time divided by ``n`` (µs); ``setup()`` untimed before each."""
    xs = []
    for i in range(repeats + 20):
        setup()
        t = time.perf_counter_ns()
        run()
        if i >= 20:
            xs.append((time.perf_counter_ns() - t) / 1e3 / n)
    xs.sort()
    return statistics.median(xs), xs[int(0.99 * (len(xs) - 1))]


def plugin_rows() -> list[tuple]:
    """The DP-controller plugin on stand-ins: the dispatch decision and one release."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang"))
    from dispatch_fakes import Ctl, armed, gen

    from ebctl.protocol import DispatchPolicy
    from sglang_patch import dispatch

    rows: list[tuple] = []
    sbs = DispatchPolicy(engine_id="dispatch", version=1, mode="sbs", t_fwd_s=0.05, l_net_s=0.0)
    reqs = [gen(f"r{i}", 100 + 37 * i % 250) for i in range(128)]  # 100-349 tokens: a batch fits one release

    def state(ctl: Ctl, policy, layout="plain"):
        st = dispatch.STATE = armed(ctl, policy, layout, chunk=3072)
        st.tick(0.0)  # applies the policy
        st.next_poll = st.next_report = math.inf  # the timed ticks: snapshots and releases only
        return st

    for label, policy in (("SBS on: the hook holds it", sbs), ("SBS off: the hook passes it to sglang", None)):
        ctl = Ctl(2)
        st = state(ctl, policy)

        def reset(st=st, ctl=ctl) -> None:
            st.reqs.clear()
            if st.core is not None:
                st.core.pending, st.core.new = [], []
            ctl.sent.clear()
            for r in reqs[:32]:
                r.routed_dp_rank = None

        def offer(ctl=ctl) -> None:
            for r in reqs[:32]:
                ctl.dispatching_with_trace(r)

        rows.append((f"plugin dispatch decision, {label} (per request, 32 in a row)",
                     *per_request(reset, offer, 32), None))
    noop = Ctl(2)
    rows.append(("for scale: the stand-in of sglang's dispatch alone (per request)",
                 *per_request(lambda: noop.sent.clear(), lambda: [noop._dispatch(r) for r in reqs[:32]], 32), None))
    for ranks, batch, layout in ((2, 8, "plain"), (8, 32, "attention"), (16, 128, "attention")):
        ctl = Ctl(ranks)
        st = state(ctl, sbs, layout)

        def refill(st=st, ctl=ctl, batch=batch, ranks=ranks) -> None:
            st.reqs.clear()
            st.core.pending, st.core.new = [], []
            ctl.sent.clear()
            for r in reqs[:batch]:
                r.routed_dp_rank = None
                ctl.dispatching_with_trace(r)
            now = time.time()  # every rank published after the last release, idle: due at once
            for rank in range(ranks):
                ctl.load_snapshot_reader.publish(rank, now)
                st.core.ack(rank, math.inf)  # the last release's sends shown: C_avail = chunk − queued
            st.next_read = 0.0

        def release(st=st, ctl=ctl, batch=batch) -> None:
            st.tick(1.0)
            if len(ctl.sent) != batch:
                raise RuntimeError(f"the release sent {len(ctl.sent)} of {batch}")

        p50, p99 = per_request(refill, release, 1)
        rows.append((f"plugin release: tick (snapshots, readiness, PBAA, sends through the hook), {ranks} ranks "
                     f"({layout}), {batch} requests", p50, p99, p50 / batch))
    ctl = Ctl(8)
    st = state(ctl, sbs, "attention")
    for r in reqs[:8]:
        r.routed_dp_rank = None
        ctl.dispatching_with_trace(r)
    st.next_read = 0.0
    st.tick(1.0)  # released: in flight from now on, nothing new from the ranks

    def quiet_tick(st=st) -> None:
        st.next_read = 0.0
        st.tick(2.0)

    rows.append(("plugin tick with requests in flight and nothing due, 8 ranks (every dispatch.poll_s)",
                 *timed(quiet_tick), None))
    rows += shm_rows()
    return rows


def shm_rows() -> list[tuple]:
    """sglang's own shared-memory snapshot read (``ShmLoadSnapshotReader.read_all``), where sglang is installed."""
    try:
        from sglang.srt.managers.load_snapshot import (
            LoadSnapshot,
            MemoryMetrics,
            QueueMetrics,
            ShmLoadSnapshotReader,
            ShmLoadSnapshotWriter,
        )
    except ImportError:
        return [("sglang's ShmLoadSnapshotReader.read_all: not measured (sglang not installed here)", math.nan,
                 math.nan, None)]
    rows = []
    for ranks in (2, 8, 16):
        fd, path = tempfile.mkstemp(prefix="ebctl-bench-loads-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.close(fd)
        try:
            writers = [ShmLoadSnapshotWriter(path, ranks, r) for r in range(ranks)]
            for r, w in enumerate(writers):  # the sections a scheduler fills (load_inquirer.get_loads)
                w.write(LoadSnapshot(timestamp=time.time(), dp_rank=r, num_running_reqs=12, num_waiting_reqs=3,
                                     num_waiting_uncached_tokens=900, num_used_tokens=40_000, num_total_tokens=41_000,
                                     max_total_num_tokens=500_000, max_running_requests=256, token_usage=0.08,
                                     memory=MemoryMetrics(weight_gb=15.2, kv_cache_gb=30.1, graph_gb=1.2,
                                                          token_capacity=500_000),
                                     queues=QueueMetrics(waiting=3, grammar=0, paused=0, retracted=0,
                                                         prealloc_ready=0)))
            reader = ShmLoadSnapshotReader(path, ranks)
            p50, p99 = timed(reader.read_all)
            if len(reader.read_all()) != ranks:
                raise RuntimeError("the reader did not see every rank")
            rows.append((f"sglang's ShmLoadSnapshotReader.read_all, {ranks} ranks (once per tick)", p50, p99, None))
            reader.close()
            for w in writers:
                w.close()
        finally:
            os.unlink(path)
    return rows


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
    rows += plugin_rows()
    print("| what | p50 µs | p99 µs | p50 µs per request |")
    print("|---|---|---|---|")
    for what, p50, p99, per in rows:
        print(f"| {what} | {p50:.1f} | {p99:.1f} | {'' if per is None else f'{per:.2f}'} |")


if __name__ == "__main__":
    main()
