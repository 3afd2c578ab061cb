"""Benchmark of the pure core: one controller update (fit + solve) at W = 500 and 2,000 (the measured θ's tuner
included), one update that refits a cost fit (2,000 iterations of one kind) and the recompute that follows it,
one report observed, one gate decision.

Budgets (docs/design.md §4): update <= 2 ms at W = 2,000; gate a few µs. Run: python tools/bench_core.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ebctl.controller import Controller, ControllerParams
from ebctl.gate import PhaseGate
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode, Policy


def _p50_p99(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[int(0.99 * len(times)) - 1]


def _filled(method: str, window: int, mode: str, seed: int = 0) -> Controller:
    rng = np.random.default_rng(seed)
    ctl = Controller(ControllerParams(window=window, update_every=10**9, theta_method=method, mode=mode,
                                      n_min_interval_s=0.0))
    outs, ins = rng.geometric(1 / 300, window), rng.integers(50, 4000, window)
    for i in range(0, window, 16):
        fin = tuple(FinishedRequest(int(a), int(b)) for a, b in zip(ins[i:i + 16], outs[i:i + 16], strict=True))
        n = int(rng.integers(32, 512))
        ctl.observe(IterationReport(engine_id="b", seq=i, wall_time=0.0, forward_s=0.009 + 4.6e-5 * n,
                                    kind=BatchKind.DECODE, decode_reqs=n, running=n, kv_total=500_000,
                                    finished=fin))
        tok = int(rng.integers(256, 8192))
        ctl.observe(IterationReport(engine_id="b", seq=i, wall_time=0.0, forward_s=0.0013 + 2.5e-5 * tok,
                                    kind=BatchKind.PREFILL, prefill_reqs=1, prefill_tokens=tok, kv_total=500_000))
    ctl.since_update = ctl.params.update_every
    ctl.update(0.0, at_once=True)  # the cost fits and a first policy: every update timed below recomputes
    assert ctl.updates == 1, ctl.last_error
    return ctl


def bench_update(method: str, window: int, mode: str = "eb", reps: int = 200) -> tuple[float, float]:
    ctl = _filled(method, window, mode)
    times = []
    for r in range(reps):
        ctl.since_update = ctl.params.update_every  # force a full recompute (fit + solve) each time
        t = time.perf_counter()
        ctl.update(float(r))
        times.append(time.perf_counter() - t)
    assert ctl.errors == 0, ctl.last_error
    return _p50_p99(times)


def _iteration(rng: np.random.Generator, kind: BatchKind, seq: int) -> IterationReport:
    """One report of ``kind`` with a cost that depends on its features, 10% noise, every 10th after a switch."""
    n, tok = int(rng.integers(32, 512)), int(rng.integers(256, 8192))
    ctx = n * int(rng.integers(100, 2000))
    pre, dec = kind != BatchKind.DECODE, kind != BatchKind.PREFILL
    cost = (0.009 + 4.6e-5 * n * dec + 2e-9 * ctx * dec + 2.5e-5 * tok * pre + 0.002 * (seq % 10 == 0))
    return IterationReport(engine_id="b", seq=seq, wall_time=0.0, forward_s=cost * float(rng.lognormal(0, 0.1)),
                           kind=kind, decode_reqs=n if dec else 0, decode_ctx_tokens=ctx if dec else 0,
                           prefill_reqs=1 if pre else 0, prefill_tokens=tok if pre else 0, running=n,
                           kv_total=500_000,  # a completion each, so the controller's window is full
                           finished=(FinishedRequest(int(rng.integers(50, 4000)), int(rng.geometric(1 / 300))),))


def bench_refit(kind: BatchKind, reps: int = 50) -> tuple[tuple[float, float], tuple[float, float]]:
    """An update due when one kind's cost fit (``cost_window`` = 2,000 iterations per kind) is due too: before
    each, a tenth of that kind's window is new. That update refits the cost fit; the next one (the next report)
    recomputes. (p50, p99) of each."""
    rng = np.random.default_rng(3)
    ctl = Controller(ControllerParams(update_every=10**9, theta_method="measured", mode="eb+",
                                      n_min_interval_s=0.0))
    window = ctl.params.cost_window
    seq = 0
    for k in (BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED):
        for _ in range(window):
            ctl.observe(_iteration(rng, k, seq))
            seq += 1
    ctl.since_update = ctl.params.update_every
    ctl.update(0.0, at_once=True)  # fits every kind once
    refits, recomputes = [], []
    for r in range(reps):
        for _ in range(window // 10):
            ctl.observe(_iteration(rng, kind, seq))
            seq += 1
        ctl.since_update = ctl.params.update_every
        fitted, updates = ctl.online_costs.windows[kind].total, ctl.updates
        t = time.perf_counter()
        ctl.update(float(r + 1))
        t1 = time.perf_counter()
        ctl.update(float(r + 1.5))
        t2 = time.perf_counter()
        assert ctl.online_costs._fitted_at[kind] == fitted and ctl.updates == updates + 1  # a refit, a recompute
        refits.append(t1 - t)
        recomputes.append(t2 - t1)
    assert ctl.errors == 0, ctl.last_error
    return _p50_p99(refits), _p50_p99(recomputes)


def bench_observe(method: str, mode: str, n: int = 20_000) -> tuple[float, float]:
    """One report through ``Controller.observe`` + ``update`` between two recomputes (the hazard window, the cost
    windows, the tuner's window, the probe check), per report, in chunks of 1,000."""
    ctl = _filled(method, 2000, mode)
    rng = np.random.default_rng(2)
    reps = []
    for i in range(n):
        m = int(rng.integers(32, 512))
        fin = (FinishedRequest(300, 200),) if i % 8 == 0 else ()
        reps.append(IterationReport(engine_id="b", seq=i, wall_time=1.0 + 0.01 * i, forward_s=0.01,
                                    kind=BatchKind.DECODE if i % 10 else BatchKind.PREFILL, decode_reqs=m,
                                    prefill_tokens=0 if i % 10 else 2048, running=m, waiting=40,
                                    policy_version=ctl.policy.version, kv_total=500_000, finished=fin))
    samples = []
    for chunk in range(0, n, 1000):
        t = time.perf_counter()
        for r in reps[chunk:chunk + 1000]:
            ctl.observe(r)
            ctl.update(r.wall_time)
        samples.append((time.perf_counter() - t) / 1000)
    assert ctl.errors == 0, ctl.last_error
    return _p50_p99(samples)


def bench_gate(n: int = 200_000) -> tuple[float, float]:
    gate, pol = PhaseGate(), Policy(mode=Mode.EB, k=32, n_max=256, kv_reserve_frac=0.1)
    rng = np.random.default_rng(1)
    running = rng.integers(0, 257, n).tolist()
    samples = []
    for chunk in range(0, n, 1000):
        t = time.perf_counter()
        for r in running[chunk:chunk + 1000]:
            gate.decide(pol, running=r, waiting=10, kv_free_frac=0.5, now=0.1)
        samples.append((time.perf_counter() - t) / 1000)
    return _p50_p99(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    print("| what | p50 | p99 |\n|---|---|---|")
    for method, window, mode in (("paper", 500, "eb"), ("paper", 2000, "eb"), ("paper", 2000, "eb+"),
                                 ("cfr", 2000, "eb"), ("exact-fluid", 2000, "eb"), ("measured", 2000, "eb+")):
        p50, p99 = bench_update(method, window, mode, a.reps)
        print(f"| controller update, W={window}, theta={method}, mode={mode} | {p50 * 1e3:.3f} ms "
              f"| {p99 * 1e3:.3f} ms |")
    for kind in (BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED):
        (p50, p99), (r50, r99) = bench_refit(kind)
        print(f"| controller update with a {kind.value} cost refit (2,000 iterations), theta=measured, mode=eb+ | "
              f"{p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms |")
        print(f"| the recompute that follows it (the next update) | {r50 * 1e3:.3f} ms | {r99 * 1e3:.3f} ms |")
    for method, mode in (("paper", "eb"), ("measured", "eb+")):
        p50, p99 = bench_observe(method, mode)
        print(f"| one report: observe + update between recomputes, theta={method}, mode={mode} | "
              f"{p50 * 1e6:.1f} µs | {p99 * 1e6:.1f} µs |")
    p50, p99 = bench_gate()
    print(f"| gate decision (PhaseGate.decide) | {p50 * 1e6:.2f} µs | {p99 * 1e6:.2f} µs |")


if __name__ == "__main__":
    main()
