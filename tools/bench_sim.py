"""Simulator speed: 4,000 requests at concurrency 2,048 per policy (docs/design.md §4 budget: <= 3 s per policy).

    .venv/bin/python tools/bench_sim.py [--requests 4000] [--concurrency 2048]

Prints one line per (profile, workload, policy): simulated seconds, engine iterations, wall seconds.
"""

from __future__ import annotations

import argparse
import time

from ebctl import profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

POLICIES = ("v0", "mb", "eb-auto", "eb+", "eb:theta=0.3")
WORKLOADS = ("decode-heavy", "balanced", "azure-conv")
PROFILES = ("qwen3-8b/h200", "qwen3-8b/rtx-pro-6000")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=2048)
    args = ap.parse_args()
    worst = 0.0
    print(f"{'profile':<22} {'workload':<13} {'policy':<13} {'sim s':>8} {'iters':>7} {'wall s':>7}")
    for name in PROFILES:
        prof = profiles.load(name)
        cm = costs.build(prof)
        kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
        cfg = EngineConfig(kv_tokens=kv)
        for wname in WORKLOADS:
            wl = workloads.load(wname, args.requests, seed=0)
            for spec in POLICIES:
                src = policies.make(spec, max_running=cfg.max_running, kv_tokens=kv, costs=prof.costs)
                t0 = time.perf_counter()
                res = runner.run(wl, src, cm, cfg, concurrency=args.concurrency)
                wall = time.perf_counter() - t0
                worst = max(worst, wall)
                print(f"{name:<22} {wname:<13} {spec:<13} {res['makespan_s']:>8.1f} "
                      f"{sum(res['steps'].values()):>7} {wall:>7.2f}")
    print(f"slowest: {worst:.2f} s for {args.requests} requests at c={args.concurrency} (budget 3 s)")


if __name__ == "__main__":
    main()
