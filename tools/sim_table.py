"""The simulator tables of docs/results/sim_table.md, as Markdown (and the command line that made them).

    .venv/bin/python tools/sim_table.py [--requests 3000] [--jobs 2] [--seed 0] [--engine-rules sglang|vllm]

Runs, on qwen3-8b/rtx-pro-6000 and qwen3-8b/h200 (engine: sglang's rules by default, N = 1,024 slots,
B = 8,192 tokens, the GPU's KV capacity; the default cost model: kernels + the engine overheads fitted to
the paper's measurements, ebctl/sim/gpucost.py):
  A. v0 / mb / eb-auto / eb+ on the three synthetic mixes and the three shipped traces at c = 512, 2048;
  B. eb-auto against the best fixed θ of a sweep (θ = 0.05..0.95) at c = 2048;
  C. eb+ on the paper's Table 3 workload (512/256) at c = 32, 512, 2048;
  D. the non-stationary scenarios (distribution shift, concurrency shift);
  E. theory: EB(θ) vs Eq. 4 and the best fixed θ vs θ0 under the paper's linear cost model.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from ebctl import model, profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

PROFILES = ("qwen3-8b/rtx-pro-6000", "qwen3-8b/h200")
MIXES = ("prefill-heavy", "balanced", "decode-heavy", "azure-code", "azure-conv", "mooncake-conv")
MAIN = ("v0", "mb", "eb-auto", "eb+")
THEORY_THETAS = (0.01, 0.03, 0.1, 0.3, 0.6)


@functools.cache
def _setup(profile: str, cost_model: str = "profile"):
    prof = profiles.load(profile)
    kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
    return prof, costs.build(prof, cost_model), kv


def job(profile: str, workload: str, conc: int, spec: str, requests: int, seed: int,
        theory: bool = False, rules: str = "sglang") -> dict:
    if theory:
        prof = profiles.load(profile)
        cm = costs.LinearCostModel(prof.costs)
        cfg = EngineConfig(rules=rules, max_running=1024, token_budget=1 << 22, kv_tokens=1 << 30, watermark=0.0)
        wl = workloads.synthetic(256, 256, requests, seed=seed, outputs="geometric")
    else:
        prof, cm, kv = _setup(profile)
        cfg = EngineConfig(rules=rules, kv_tokens=kv)
        wl = workloads.load(workload, requests, seed=seed)
    src = policies.make(spec, max_running=cfg.max_running, kv_tokens=cfg.kv_tokens, costs=prof.costs)
    res = runner.run(wl, src, cm, cfg, concurrency=conc)
    keep = ("total_tok_per_s", "steady_req_per_s", "req_per_s", "ttft_s", "tpot_s", "mode_share", "final_policy",
            "preemptions")
    out = {k: res.get(k) for k in keep}
    out.update(profile=profile, workload=workload, conc=conc, policy=spec,
               r=float(wl.output_len.mean() / (wl.input_len.mean() + wl.output_len.mean())),
               mu_l=float(wl.input_len.mean()), mu_o=float(wl.output_len.mean()))
    return out


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.1f}%"


def _eb_share(r: dict) -> str:
    s = r["mode_share"] or {}
    return f"{s.get('eb', 0):.0%} EB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-rules", default="sglang", choices=("sglang", "vllm"))
    args = ap.parse_args()
    n, seed = args.requests, args.seed
    t0 = time.perf_counter()
    jobs: list[tuple] = []
    for p in PROFILES:
        for w in MIXES:
            for c in (512, 2048):
                jobs += [(p, w, c, s, n, seed) for s in MAIN]
            jobs += [(p, w, 2048, s, n, seed) for s in policies.theta_sweep()]
        for c in (32, 512, 2048):
            jobs += [(p, "table3", c, s, n, seed) for s in MAIN]
        jobs += [(p, "dist-shift", 2048, s, 2 * n, seed) for s in MAIN]
        jobs += [(p, "conc-shift", 2048, s, 2 * n, seed) for s in MAIN]
        jobs += [(p, "geometric:L=256,O=256", 4096, f"eb:theta={th}", 4 * n, seed, True) for th in THEORY_THETAS]
        jobs += [(p, "geometric:L=256,O=256", 4096, f"eb:theta={th / 1000:.3f}", 4 * n, seed, True)
                 for th in range(5, 101, 5)]
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        results = list(ex.map(job, *zip(*[j + (False,) * (7 - len(j)) + (args.engine_rules,) for j in jobs],
                                        strict=True), chunksize=4))
    got = {(r["profile"], r["workload"], r["conc"], r["policy"], "theory" if r["workload"].startswith("geo")
            else ""): r for r in results}

    def g(p, w, c, s, theory=False):
        return got[(p, w, c, s, "theory" if theory else "")]

    cmd = "python tools/sim_table.py " + " ".join(sys.argv[1:])
    print(f"Made by `{cmd.strip()}` ({n:,} requests per run, seed {seed}; "
          f"{len(jobs)} runs in {time.perf_counter() - t0:.0f} s). Engine: {args.engine_rules}'s rules, N = 1,024 "
          "slots, B = 8,192-token budget, the GPU's KV capacity (vLLM arithmetic), default cost model (kernels + "
          "engine overheads fitted to the paper). Throughput = (input + output tokens) / makespan.\n")

    print("**A. Throughput (total tokens/s) by policy.** r = μ_O/(μ_L+μ_O); eb+ also shows its time share "
          "in EB mode.\n")
    for p in PROFILES:
        _, _, kv = _setup(p)
        print(f"*{p}* (KV {kv:,} tokens)\n")
        print("| workload | r | c | v0 | mb | eb-auto | eb+ | eb-auto vs mb | best of v0/eb-auto vs mb |")
        print("|---|---|---|---|---|---|---|---|---|")
        for w in MIXES:
            for c in (512, 2048):
                v0, mb, ea, ep = (g(p, w, c, s) for s in MAIN)
                best = max(v0["total_tok_per_s"], ea["total_tok_per_s"])
                print(f"| {w} | {v0['r']:.2f} | {c} | {_fmt(v0['total_tok_per_s'])} | {_fmt(mb['total_tok_per_s'])} "
                      f"| {_fmt(ea['total_tok_per_s'])} | {_fmt(ep['total_tok_per_s'])} ({_eb_share(ep)}) "
                      f"| {_pct(ea['total_tok_per_s'], mb['total_tok_per_s'])} "
                      f"| {_pct(best, mb['total_tok_per_s'])} |")
        print()

    print("**B. eb-auto against the best fixed θ** (c = 2,048; sweep θ = 0.05..0.95 at N = 1,024; θ̂*, N̂*: "
          "eb-auto's final policy; θ0: its Eq. 3 value).\n")
    print("| profile | workload | best fixed θ | its tok/s | flat? (worst θ / best) | v0 / best | eb-auto / best "
          "| eb-auto θ̂* (θ0), N̂* |")
    print("|---|---|---|---|---|---|---|---|")
    for p in PROFILES:
        for w in MIXES:
            sweep = [g(p, w, 2048, s) for s in policies.theta_sweep()]
            best = max(sweep, key=lambda r: r["total_tok_per_s"])
            worst = min(sweep, key=lambda r: r["total_tok_per_s"])
            ea, v0 = g(p, w, 2048, "eb-auto"), g(p, w, 2048, "v0")
            fp = ea["final_policy"] or {}
            bt = best["total_tok_per_s"]
            print(f"| {p} | {w} | {best['policy'].split('=')[1]} | {_fmt(bt)} "
                  f"| {worst['total_tok_per_s'] / bt:.1%} | {v0['total_tok_per_s'] / bt:.1%} "
                  f"| {ea['total_tok_per_s'] / bt:.1%} | {_num(fp.get('theta_star'))} "
                  f"({_num(fp.get('theta0'), 3)}), {fp.get('n_max', '-')} |")
    print()

    print("**C. eb+ by concurrency** (the paper's Table 3 workload: μ_L = 512, μ_O = 256; TTFT p50 in s).\n")
    print("| profile | c | mb | eb-auto | eb+ | eb+ in EB | TTFT p50 mb / eb-auto / eb+ |")
    print("|---|---|---|---|---|---|---|")
    for p in PROFILES:
        for c in (32, 512, 2048):
            mb, ea, ep = (g(p, "table3", c, s) for s in ("mb", "eb-auto", "eb+"))
            print(f"| {p} | {c} | {_fmt(mb['total_tok_per_s'])} | {_fmt(ea['total_tok_per_s'])} "
                  f"| {_fmt(ep['total_tok_per_s'])} | {(ep['mode_share'] or {}).get('eb', 0):.0%} "
                  f"| {mb['ttft_s']['p50']:.2f} / {ea['ttft_s']['p50']:.2f} / {ep['ttft_s']['p50']:.2f} |")
    print()

    print(f"**D. Non-stationary scenarios** ({2 * n:,} requests; dist-shift at c = 2,048, conc-shift "
          "32 → 512 → 1024 → 256 → 2048).\n")
    print("| profile | scenario | v0 | mb | eb-auto | eb+ | eb+ vs better of mb, eb-auto |")
    print("|---|---|---|---|---|---|---|")
    for p in PROFILES:
        for w in ("dist-shift", "conc-shift"):
            v0, mb, ea, ep = (g(p, w, 2048, s) for s in MAIN)
            better = max(mb["total_tok_per_s"], ea["total_tok_per_s"])
            print(f"| {p} | {w} | {_fmt(v0['total_tok_per_s'])} | {_fmt(mb['total_tok_per_s'])} "
                  f"| {_fmt(ea['total_tok_per_s'])} | {_fmt(ep['total_tok_per_s'])} ({_eb_share(ep)}) "
                  f"| {_pct(ep['total_tok_per_s'], better)} |")
    print()

    print(f"**E. Theory** (the paper's linear cost model, no memory limit, N = 1,024, geometric outputs "
          f"μ_L = μ_O = 256, {4 * n:,} requests, c = 4,096; steady requests/s).\n")
    print("| profile | θ | simulated | Eq. 4 | sim / Eq. 4 |")
    print("|---|---|---|---|---|")
    for p in PROFILES:
        c = profiles.load(p).costs
        for th in THEORY_THETAS:
            r = g(p, "geometric:L=256,O=256", 4096, f"eb:theta={th}", True)
            k = max(1, math.floor(th * 1024))
            pred = model.tp_eb(theta=k / 1024, n=1024, alpha_p=c.alpha_p, beta_p=c.beta_p, alpha_d=c.alpha_d,
                               beta_d=c.beta_d, mu_l=r["mu_l"], mu_o=r["mu_o"])
            print(f"| {p} | {th} | {r['steady_req_per_s']:.2f} | {pred:.2f} | {r['steady_req_per_s'] / pred:.3f} |")
    print()
    print("| profile | θ0 (Eq. 3) | best fixed θ (grid 0.005..0.100) | TP(θ nearest θ0) / TP(best) |")
    print("|---|---|---|---|")
    for p in PROFILES:
        c = profiles.load(p).costs
        th0 = model.theta0(-math.log1p(-1 / 256) * c.alpha_p / c.alpha_d)
        grid = {th / 1000: g(p, "geometric:L=256,O=256", 4096, f"eb:theta={th / 1000:.3f}", True)
                for th in range(5, 101, 5)}
        best = max(grid, key=lambda t: grid[t]["steady_req_per_s"])
        near = min(grid, key=lambda t: abs(t - th0))
        print(f"| {p} | {th0:.3f} | {best:.3f} | "
              f"{grid[near]['steady_req_per_s'] / grid[best]['steady_req_per_s']:.2%} |")


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


if __name__ == "__main__":
    main()
