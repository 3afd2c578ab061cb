"""Per-call cost of the engine side: ``EngineLink.report`` + ``EngineLink.policy`` (docs/design.md §4 budget for
the hook work per iteration: p50 <= 10 µs, p99 <= 50 µs, Python).

Each iteration times one ``report(r)`` + one ``policy(now)`` with ``perf_counter_ns``:
  - no daemon at all: the send queue fills and reports are dropped (the path while the daemon is down);
  - daemon up (a subprocess), back to back: the code's own cost, caches warm;
  - daemon up, one iteration per 1 ms / 10 ms of sleep, like a real engine between forward passes. Each
    send then has to wake ZeroMQ's I/O thread, and the caller's caches have gone cold during the sleep;
    the "baseline" row times the cheapest possible work (encoding the report) under the same pacing, so
    what the machine charges for coming back from sleep is not mistaken for the link's cost.

    python tools/bench_link.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from ebctl import config
from ebctl.link import ControlClient, EngineLink
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport


def reports(engine_id: str, n: int) -> list[IterationReport]:
    fin = (FinishedRequest(812, 190),)
    return [IterationReport(engine_id=engine_id, seq=i, wall_time=1.7e9 + i * 0.01, forward_s=0.012,
                            kind=BatchKind.DECODE, decode_reqs=64, decode_ctx_tokens=57_000, running=64, waiting=3,
                            kv_used=61_000, kv_total=400_000, policy_version=1, finished=fin if i % 3 == 0 else ())
            for i in range(n)]


def measure(call: Callable[[IterationReport], object], rs: list[IterationReport], pace_s: float = 0.0) -> np.ndarray:
    """ns per call; ``pace_s`` sleeps between calls like a real engine's iterations."""
    out = np.empty(len(rs), dtype=np.int64)
    clock, sleep = time.perf_counter_ns, time.sleep
    for i, r in enumerate(rs):
        t0 = clock()
        call(r)
        out[i] = clock() - t0
        if pace_s:
            sleep(pace_s)
    return out


def link_call(link: EngineLink) -> Callable[[IterationReport], object]:
    report, policy, mono = link.report, link.policy, time.monotonic

    def call(r: IterationReport) -> object:
        report(r)
        return policy(mono())
    return call


def show(name: str, ns: np.ndarray, link: EngineLink | None = None) -> None:
    p50, p99, p999 = np.percentile(ns, [50, 99, 99.9]) / 1e3
    extra = ""
    if link is not None:
        s = link.stats()
        extra = f"   sent {s['sent']:,}, dropped {s['dropped']:,}, policies {s['policies_received']:,}"
    print(f"{name:<40} {len(ns):>7,} calls  p50 {p50:5.1f} µs  p99 {p99:6.1f} µs  p99.9 {p999:6.1f} µs{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ebl-"))
    atexit.register(shutil.rmtree, tmp, True)
    n_1ms, n_10ms = min(a.calls, 5000), min(a.calls, 500)

    cfg_none = config.load(None, {"daemon.runtime_dir": str(tmp / "nobody")})
    with EngineLink.from_config(cfg_none, "dp0") as link:
        show("no daemon, back to back (dropping)", measure(link_call(link), reports("dp0", a.calls)), link)

    cfg_file = tmp / "ebctl.toml"
    cfg_file.write_text(f'[daemon]\nruntime_dir = "{tmp / "rt"}"\nlog_level = "warning"\nrepublish_s = 0.05\n'
                        '[controller]\nttl_s = 1.0\nupdate_every = 20\nmin_window = 20\n')
    cfg = config.load(str(cfg_file))
    daemon = subprocess.Popen([sys.executable, "-m", "ebctl.daemon", "--config", str(cfg_file)])
    try:
        with ControlClient.from_config(cfg, timeout_s=0.5) as client:
            client.wait_ready(30, alive=lambda: daemon.poll() is None)
            for i, (name, n, pace) in enumerate((("back to back", a.calls, 0.0), ("1 ms sleep between", n_1ms, 1e-3),
                                                 ("10 ms sleep between", n_10ms, 1e-2))):
                with EngineLink.from_config(cfg, f"dp{i}") as link:
                    call = link_call(link)
                    measure(call, reports(link.engine_id, 500), pace_s=1e-3)  # connected, first policies in
                    show(f"daemon up, {name}", measure(call, reports(link.engine_id, n), pace), link)
                if pace:
                    enc = msgspec.msgpack.Encoder().encode
                    show(f"  baseline (encode only), {name}", measure(enc, reports("x", n), pace))
            client.request("shutdown")
        daemon.wait(10)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    print("budget: p50 <= 10 µs, p99 <= 50 µs")


if __name__ == "__main__":
    main()
