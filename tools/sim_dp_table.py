"""The SBS must-show table: dispatch policies on a DP-attention (DP+EP) instance, the paper's protocol.

Protocol (SBS paper §5.1 and Table 1): find the baseline's capacity, the highest Poisson rate at which
``total-tokens`` (sglang's) keeps the mean TTFT within the SLO (1 s); run every policy at 40-100% of that
rate; then find each policy's own highest rate within the SLO, and its chunk utilisation and load spread
there. Prompts: the Azure conversation trace's, at most 3,072 tokens (the paper's 0-3K range; mean 850).
Cost models (``ebctl.sim.dp.costs``): ``dpep`` (calibrated to the paper's Table 1) and ``dpep-compute``
(compute scale only). Each point is the mean over ``--seeds`` seeds of runs of ``--forwards`` full-chunk
forward times; the first 10% of each run's requests are left out of the latency figures (an empty system
flatters them). Bisection: 10 steps between 30% and 110% of the full-chunk capacity.

    python tools/sim_dp_table.py                 # 1 and 3 instances of 8 and 16 ranks, both cost models
    python tools/sim_dp_table.py --ranks 8 --cost dpep --seeds 1   # quicker
    python tools/sim_dp_table.py --calibrate     # the dpep slowdown from the paper's Table 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ebctl.sim import workloads
from ebctl.sim.dp import costs as dpcosts
from ebctl.sim.dp import decode
from ebctl.sim.dp.run import DpConfig, poisson, run

POLICIES = ("round-robin", "total-tokens", "sbs")
LOADS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def prompts(max_prompt: int) -> np.ndarray:
    inputs, _, _ = workloads.read_rows(workloads.trace_path("azure-conv"))
    return inputs[inputs <= max_prompt] if max_prompt else inputs


class Bench:
    def __init__(self, cfg: DpConfig, pool: np.ndarray, *, duration: float, seeds: int, slo: float) -> None:
        self.cfg, self.pool, self.duration, self.seeds, self.slo = cfg, pool, duration, seeds, slo
        self.runs = 0

    def point(self, policy: str, rate: float) -> dict[str, float]:
        """Mean over seeds of one policy at one rate."""
        out = []
        n = max(200, int(rate * self.duration))
        for s in range(self.seeds):
            tokens = self.pool[np.random.default_rng(1000 + s).integers(0, self.pool.size, n)]
            m = run(poisson(rate, n, seed=s), tokens, policy, self.cfg, warmup=n // 10)
            out.append((m["ttft_s"]["mean"], m["ttft_s"]["p99"], m["chunk_util"], m["load_spread"],
                        m["forwards_per_s"] / self.cfg.instances, m["busy_share"]))
            self.runs += 1
        mean = np.mean(out, axis=0)
        return {"ttft": mean[0], "p99": mean[1], "util": mean[2], "spread": mean[3], "fwd": mean[4],
                "busy": mean[5]}

    def capacity(self, policy: str, lo: float, hi: float, steps: int = 10) -> float:
        for _ in range(steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.point(policy, mid)["ttft"] <= self.slo else (lo, mid)
        return lo


def prefill_table(ranks: int, cost: str, args: argparse.Namespace, instances: int = 1) -> list[str]:
    cfg = DpConfig(ranks=ranks, mode="attention", chunk=args.chunk, costs=dpcosts.named(cost), instances=instances)
    pool = prompts(args.max_prompt)
    t_full = cfg.costs.prefill.predict(prefill_tokens=cfg.chunk, prefill_reqs=1)
    b = Bench(cfg, pool, duration=args.forwards * t_full, seeds=args.seeds, slo=args.slo)
    t0 = time.perf_counter()
    full = instances * ranks * cfg.chunk / t_full / pool.mean()
    base = b.capacity("total-tokens", 0.3 * full, 1.1 * full)
    shape = f"{instances} instances × {ranks} ranks" if instances > 1 else f"{ranks} ranks"
    lines = [f"**{shape}, DP attention (lockstep), cost model {cost}** (full chunk {t_full:.3f} s): "
             f"total-tokens capacity at mean TTFT ≤ {args.slo:g} s = {base:.1f} req/s (full-chunk capacity "
             f"{full:.1f} req/s)", "",
             "| load | " + " | ".join(f"{p} TTFT mean / p99 s" for p in POLICIES) + " | chunk util rr / tt / sbs | "
             "forwards/s per instance rr / tt / sbs | busy rr / tt / sbs | load spread rr / tt / sbs |",
             "|---" * 8 + "|"]
    for f in LOADS:
        pts = [b.point(p, f * base) for p in POLICIES]
        lines.append(f"| {f:.0%} | " + " | ".join(f"{x['ttft']:.3f} / {x['p99']:.3f}" for x in pts)
                     + " | " + " / ".join(f"{x['util']:.0%}" for x in pts)
                     + " | " + " / ".join(f"{x['fwd']:.2f}" for x in pts)
                     + " | " + " / ".join(f"{x['busy']:.0%}" for x in pts)
                     + " | " + " / ".join(f"{x['spread']:.2f}" for x in pts) + " |")
    lines += ["", "| policy | highest load meeting the SLO | req/s | chunk util there | load spread there |",
              "|---|---|---|---|---|"]
    for p in POLICIES:
        cap = base if p == "total-tokens" else b.capacity(p, 0.3 * full, 1.1 * full)
        x = b.point(p, cap)
        lines.append(f"| {p} | {cap / base:.1%} | {cap:.1f} | {x['util']:.0%} | {x['spread']:.2f} |")
    lines.append(f"\n({b.runs} runs, {time.perf_counter() - t0:.0f} s)\n")
    return lines


def decode_table(args: argparse.Namespace) -> list[str]:
    """Algorithm 3 against sglang's rules on a decode pool: the same Poisson stream of finished prompts."""
    inputs, outputs, _ = workloads.read_rows(workloads.trace_path("azure-conv"))
    rng = np.random.default_rng(7)
    n = int(args.decode_rate * args.decode_duration)
    idx = rng.integers(0, inputs.size, n)
    arrivals = poisson(args.decode_rate, n, seed=8)
    cost = dpcosts.build().decode
    lines = [f"**Decode pool**: {args.decode_units} units in lockstep, KV {args.decode_kv:,} tokens each, "
             f"{args.decode_rate:g} req/s (azure-conv lengths), {n} requests", "",
             "| placement | output tok/s | TPOT ms | KV std/mean | KV max/mean | barrier wait | queue wait ms |",
             "|---|---|---|---|---|---|---|"]
    for p in decode.DECODE_POLICIES:
        m = decode.run(arrivals, inputs[idx], outputs[idx], p, units=args.decode_units, kv_tokens=args.decode_kv,
                       cost=cost)
        lines.append(f"| {p} | {m['out_tok_per_s']:,.0f} | {m['tpot_s'] * 1e3:.1f} | {m['kv_cv']:.2f} | "
                     f"{m['kv_max_over_mean']:.2f} | {m['barrier_wait']:.1%} | {m['queue_wait_s'] * 1e3:.1f} |")
    return [*lines, ""]


def calibrate(args: argparse.Namespace) -> None:
    """The dpep slowdown: the paper's Table 1 forward time over the compute model's total-tokens forward
    time at the same chunk utilisation (the derivation is in ebctl/sim/dp/costs.py)."""
    from ebctl.sim.dp.ranks import Instance

    durations: list[float] = []
    start = Instance.start

    def timed(self: Instance, now: float) -> float:
        d = start(self, now)
        durations.append(d)
        return d

    Instance.start = timed  # type: ignore[method-assign]
    pool = prompts(args.max_prompt)
    factors = []
    for chunk, qps, util in ((3072, 57, 0.5183), (5120, 70, 0.530)):  # the paper's Table 1, baseline rows
        t_paper = util * 8 * chunk / (qps / 3 * 1000)  # three instances, 1K-token prompts, never idle
        cfg = DpConfig(ranks=8, chunk=chunk, costs=dpcosts.named("dpep-compute"))
        lo, hi = 5.0, 500.0
        for _ in range(14):  # the rate at which total-tokens runs at the paper's utilisation
            mid = (lo + hi) / 2
            n = int(mid * 60)
            durations.clear()
            m = run(poisson(mid, n, seed=0), pool[np.random.default_rng(0).integers(0, pool.size, n)],
                    "total-tokens", cfg)
            lo, hi = (mid, hi) if m["chunk_util"] < util else (lo, mid)
        factors.append(t_paper / float(np.mean(durations)))
        print(f"chunk {chunk}: paper forward {t_paper:.3f} s at {util:.1%}; simulated {np.mean(durations):.4f} s "
              f"at {m['chunk_util']:.1%} → factor {factors[-1]:.2f}")
    Instance.start = start  # type: ignore[method-assign]
    print(f"mean factor {np.mean(factors):.2f} (ebctl.sim.dp.costs.DPEP_SLOWDOWN = {dpcosts.DPEP_SLOWDOWN})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--instances", type=int, nargs="+", default=[1, 3],
                    help="lockstep instances behind the dispatcher (the paper's deployment: 3)")
    ap.add_argument("--chunk", type=int, default=3072)
    ap.add_argument("--max-prompt", type=int, default=3072, help="drop longer prompts; 0: keep all")
    ap.add_argument("--cost", nargs="+", default=list(dpcosts.NAMES), help="dpep, dpep-compute")
    ap.add_argument("--forwards", type=float, default=400.0, help="run length in full-chunk forward times")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--slo", type=float, default=1.0, help="mean-TTFT SLO (s)")
    ap.add_argument("--decode-units", type=int, default=16)
    ap.add_argument("--decode-kv", type=int, default=120_000)
    ap.add_argument("--decode-rate", type=float, default=100.0)
    ap.add_argument("--decode-duration", type=float, default=120.0, help="simulated seconds")
    ap.add_argument("--calibrate", action="store_true", help="print the dpep slowdown's derivation and exit")
    args = ap.parse_args()
    if args.calibrate:
        calibrate(args)
        return
    for cost in args.cost:
        print(f"cost model {cost}: {dpcosts.describe(dpcosts.named(cost))}\n")
        for n in args.instances:
            for r in args.ranks:
                print("\n".join(prefill_table(r, cost, args, n)), flush=True)
    print("\n".join(decode_table(args)))


if __name__ == "__main__":
    main()
