"""Daemon ingest rate: iteration reports per second (budget: >= 20,000/s on one core, docs/design.md §4).

Two measurements:
  1. sockets: a daemon subprocess (``python -m ebctl.daemon``) and a sender subprocess pushing N
     pre-encoded reports over ipc as fast as it can; the rate is read from the daemon's ``status``
     counter (the daemon is single-threaded: its loop is the one core).
  2. in-process: the same frames through ``Daemon.ingest`` (decode → observe → update) without sockets,
     split into stages to show where the time goes (``--profile`` adds a cProfile listing).

The stream is a realistic mix: 80% decode, 10% prefill, 10% mixed iterations, 0.3 finished requests per
report (batch 64, mean output ~200 tokens), default controller settings (update every 100 completions).

    python tools/bench_daemon.py [--reports 200000] [--engines 4] [--profile]
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from ebctl import config
from ebctl.controller import Controller
from ebctl.daemon import Daemon
from ebctl.link import ControlClient
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, decode, encode


def make_frames(n: int, engines: int, seed: int = 0) -> list[bytes]:
    """``n`` encoded IterationReports round-robin over ``engines`` ids (ready to send)."""
    rng = np.random.default_rng(seed)
    kind_of = (BatchKind.DECODE, BatchKind.PREFILL, BatchKind.MIXED)
    kinds = rng.choice(3, size=n, p=[0.8, 0.1, 0.1])
    n_fin = rng.poisson(0.3, size=n)
    outs = rng.geometric(1 / 200, size=int(n_fin.sum()) + 1)
    ins = rng.integers(50, 2000, size=outs.size)
    frames, j, t0 = [], 0, time.time()
    for i in range(n):
        fin = tuple(FinishedRequest(int(ins[j + m]), int(outs[j + m])) for m in range(n_fin[i]))
        j += n_fin[i]
        kind = kind_of[kinds[i]]
        d = 0 if kind is BatchKind.PREFILL else int(rng.integers(32, 96))
        p = 0 if kind is BatchKind.DECODE else int(rng.integers(256, 4096))
        fwd = 8.9e-3 + 4.6e-5 * d + 2.5e-5 * p + float(rng.normal(0, 2e-4))
        frames.append(encode(IterationReport(
            engine_id=f"dp{i % engines}", seq=i // engines, wall_time=t0 + i * 1e-3, forward_s=max(fwd, 1e-4),
            kind=kind, prefill_reqs=1 if p else 0, prefill_tokens=p, decode_reqs=d, decode_ctx_tokens=d * 900,
            running=d or 64, waiting=8, kv_used=60_000, kv_total=400_000, finished=fin)))
    return frames


def sender(endpoint: str, n: int, engines: int) -> None:
    frames = make_frames(n, engines, seed=1)
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.sndhwm = 0  # unbounded: the bench must not drop, it measures the receiver
    s.connect(endpoint)
    for f in frames:
        s.send(f)
    s.close(linger=-1)  # wait until everything left
    ctx.term()


def bench_sockets(n: int, engines: int) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="ebb-"))
    atexit.register(shutil.rmtree, tmp, True)
    cfg_file = tmp / "ebctl.toml"
    cfg_file.write_text(f'[daemon]\nruntime_dir = "{tmp / "rt"}"\nlog_level = "warning"\n')
    cfg = config.load(str(cfg_file))
    daemon = subprocess.Popen([sys.executable, "-m", "ebctl.daemon", "--config", str(cfg_file)])
    client = ControlClient.from_config(cfg, timeout_s=0.5)
    try:
        client.wait_ready(30, alive=lambda: daemon.poll() is None)
        push = subprocess.Popen([sys.executable, __file__, "--_sender", cfg.endpoint("telemetry"), str(n),
                                 str(engines)])
        t_first = n_first = None
        received, last_change, last = 0, time.monotonic(), -1
        while received < n and time.monotonic() - last_change < 10:
            received = client.request("status").data["daemon"]["counters"]["received"]
            now = time.monotonic()
            if received != last:
                last, last_change = received, now
            if t_first is None and received > 0:
                t_first, n_first = now, received
            time.sleep(0.02)
        t_done = time.monotonic()
        push.wait(30)
        status = client.request("status").data
        client.request("shutdown")
        daemon.wait(10)
    finally:
        client.close()
        for p in (daemon,):
            if p.poll() is None:
                p.kill()
    rate = (received - n_first) / (t_done - t_first)
    ups = sum(e["updates"] for e in status["engines"].values())
    print(f"sockets:    {received:,} of {n:,} reports from {engines} engines, {ups} policy updates; "
          f"ingest {rate:,.0f} reports/s (daemon process, ipc)")
    return rate


def bench_inprocess(n: int, engines: int, profile: bool) -> None:
    frames = make_frames(n, engines)
    cfg = config.load(None, {"daemon.runtime_dir": "/nonexistent/ebctl-bench"})  # no sockets here
    now = time.time()

    t = time.perf_counter()
    reports = [decode(f, IterationReport) for f in frames]
    t_decode = time.perf_counter() - t

    ctls = {f"dp{i}": Controller(cfg.controller, engine_id=f"dp{i}") for i in range(engines)}
    t_observe = t_update = 0.0
    clock = time.perf_counter
    for r in reports:  # both stages timed in one pass (perf_counter costs ~0.05 µs a call)
        c = ctls[r.engine_id]
        t0 = clock()
        c.observe(r)
        t1 = clock()
        c.update(now)
        t2 = clock()
        t_observe += t1 - t0
        t_update += t2 - t1
    updates = sum(c.updates for c in ctls.values())

    d = Daemon(cfg)
    t = time.perf_counter()
    for f in frames:
        d.ingest(f, now, 0.0)
    t_all = time.perf_counter() - t
    us = 1e6 / n
    print(f"in-process: Daemon.ingest {n / t_all:,.0f} reports/s ({t_all * us:.1f} µs/report): "
          f"decode+validate {t_decode * us:.1f} µs, observe {t_observe * us:.1f} µs, "
          f"update {t_update * us:.1f} µs ({updates} recomputes; all update time over them: "
          f"{t_update / max(updates, 1) * 1e3:.2f} ms, the cheap per-report updates between them included)")
    if profile:
        prof, d = cProfile.Profile(), Daemon(cfg)
        prof.runcall(lambda: [d.ingest(f, now, 0.0) for f in frames])
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_sender":
        sender(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=200_000)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--profile", action="store_true", help="cProfile the in-process ingest")
    ap.add_argument("--skip-sockets", action="store_true")
    a = ap.parse_args()
    bench_inprocess(min(a.reports, 100_000), a.engines, a.profile)
    if not a.skip_sockets:
        rate = bench_sockets(a.reports, a.engines)
        print(f"budget >= 20,000 reports/s: {'met' if rate >= 20_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
