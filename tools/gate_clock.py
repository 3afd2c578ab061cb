"""Why EB refills happen, with the anti-starvation clock as the controller sets it and with the old fixed 5 s.

    .venv/bin/python tools/gate_clock.py [--requests 8000] [--concurrency 2048] [--jobs 2] [--seed 0]

The simulator (sglang's rules, N = 1,024 slots, the GPU's KV capacity, the default cost model) runs eb-auto
at saturation on the shipped traces and the synthetic mixes, on qwen3-8b/rtx-pro-6000 and qwen3-8b/h200,
twice: the clock the controller computes (``controller.max_defer_s = 0``: ``defer_factor`` × the expected
time to free k slots, published with each policy) and a fixed ``max_defer_s = 5``. For each run: the gate's
decode → refill switches by cause (the threshold k, the clock, an idle engine), the threshold's share of the
switches of a busy engine, the holds (how long a waiting request was kept from a free slot before the
gate admitted again) at p99 and at most, against the largest clock the run published, TTFT p99 and
throughput. The clock is a safety net: at least 90% of the switches should be the threshold's.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ebctl import profiles
from ebctl.gate import Reason
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

PROFILES = ("qwen3-8b/rtx-pro-6000", "qwen3-8b/h200")
WORKLOADS = ("azure-conv", "azure-code", "mooncake-conv", "prefill-heavy", "balanced", "decode-heavy")
CLOCKS = {"auto": "eb-auto", "5 s": "eb-auto:defer=5"}


@functools.cache
def _setup(profile: str):
    prof = profiles.load(profile)
    kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
    return prof, costs.build(prof, "profile"), kv


def job(profile: str, workload: str, clock: str, requests: int, conc: int, seed: int) -> dict:
    prof, cm, kv = _setup(profile)
    cfg = EngineConfig(kv_tokens=kv)
    wl = workloads.load(workload, requests, seed=seed)
    src = policies.make(CLOCKS[clock], max_running=cfg.max_running, kv_tokens=cfg.kv_tokens, costs=prof.costs)
    clocks: set[float] = set()
    res = runner.run(wl, src, cm, cfg, concurrency=conc, keep_engine=True,
                     on_step=lambda now, rep: clocks.add(src.controller.policy.max_defer_s))
    gate = res["_engine"].gate
    counts = {r: gate.counts[r] for r in (Reason.THRESHOLD, Reason.STARVATION, Reason.IDLE)}
    holds = np.asarray(gate.holds, dtype=float)
    busy = counts[Reason.THRESHOLD] + counts[Reason.STARVATION]
    return {"profile": profile, "workload": workload, "clock": clock,
            "threshold": counts[Reason.THRESHOLD], "starvation": counts[Reason.STARVATION],
            "idle": counts[Reason.IDLE], "share": counts[Reason.THRESHOLD] / busy if busy else float("nan"),
            "hold_p99": float(np.percentile(holds, 99)) if holds.size else 0.0,
            "hold_max": float(holds.max()) if holds.size else 0.0, "clock_s": max(clocks),
            "ttft_p99": res["ttft_s"]["p99"], "tok_s": res["total_tok_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--concurrency", type=int, default=2048)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    grid = [(p, w, c) for p in PROFILES for w in WORKLOADS for c in CLOCKS]
    with ProcessPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(job, *zip(*grid, strict=True), [a.requests] * len(grid), [a.concurrency] * len(grid),
                           [a.seed] * len(grid)))
    by = {(r["profile"], r["workload"], r["clock"]): r for r in rows}
    print(f"`python tools/gate_clock.py --requests {a.requests} --concurrency {a.concurrency} --seed {a.seed}` "
          f"({len(rows)} runs in {time.perf_counter() - t0:.0f} s). Refills: decode → refill switches by cause "
          "(threshold / clock / idle); share: the threshold's share of a busy engine's switches; hold: how long "
          "a waiting request was kept from a free slot; clock: the largest max_defer_s published.\n")
    print("| profile | workload | clock | refills (threshold / clock / idle) | threshold share | hold p99 / max "
          "(s) | clock (s) | TTFT p99 (s) | tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 1.0
    for p in PROFILES:
        for w in WORKLOADS:
            for c in CLOCKS:
                r = by[(p, w, c)]
                if c == "auto" and r["share"] == r["share"]:
                    worst = min(worst, r["share"])
                print(f"| {p} | {w} | {c} | {r['threshold']} / {r['starvation']} / {r['idle']} | {r['share']:.1%} "
                      f"| {r['hold_p99']:.2f} / {r['hold_max']:.2f} | {r['clock_s']:.2f} | {r['ttft_p99']:.1f} | "
                      f"{r['tok_s']:,.0f} |")
    print(f"\nauto clock: the threshold caused at least {worst:.1%} of the busy switches in every run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
