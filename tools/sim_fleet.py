"""A fleet of simulated sglang servers behind smg's gateway: round_robin against least_load, stock servers against
servers each running ebctl's default controller, at 40%, 70% and 100% of the fleet's stock capacity.

    .venv/bin/python tools/sim_fleet.py [--quick] [--write] [--horizon S] [--seed 0] [--jobs 2]

Each server is the engine ``ebctl simulate`` runs by default (Qwen3-8B on H200, the fitted GPU cost model, sglang
0.5.23's rules, 1,024 slots, B = 8,192, the GPU's KV capacity), either stock (``v0``) or under a ``default``
controller of its own; the gateway is smg 1.13.0 at its defaults (``ebctl/sim/gateway.py``: loads polled every
10 s, the overload veto at 8 waiting requests or 0.8 KV usage, least_load crediting p̄ = 1,024 tokens per request
as its HTTP path does). Capacity: N × one stock server's saturated throughput, measured here first (closed loop,
c = 2,048 = twice the slots, Azure conversation lengths, requests/s between the 20th and 80th percentile finish
times). Arrivals: Poisson at the load's share of that capacity, lengths drawn from the shipped Azure conversation
trace (``ebctl/data/traces/azure2023_conv.csv``); the same arrivals and lengths for every router and server
policy at one fleet size and load. Every run starts empty and cold and lasts a fixed simulated time (120 s;
``--horizon``; longer would pass ten minutes), one seed: a full run is 24 runs, about 8 minutes on this project's
2-core VM with ``--jobs 2``.

``--quick``: 2 and 4 servers, 15 s (a few seconds; printed, not written).
``--write``: also write the table to docs/results/sim_fleet.md.
"""

from __future__ import annotations

import argparse
import datetime
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ebctl import profiles
from ebctl.sim import costs, fleet, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig
from ebctl.sim.gateway import GatewayParams

PROFILE, WORKLOAD = "qwen3-8b/h200", "azure-conv"
ROUTERS = ("round_robin", "least_load")
SERVERS = ("v0", "default")
LOADS = (0.4, 0.7, 1.0)
OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "sim_fleet.md"


def setup() -> tuple[EngineConfig, costs.CostModel]:
    prof = profiles.load(PROFILE)
    return EngineConfig(kv_tokens=hardware.kv_capacity_tokens(prof.model, prof.gpu)), costs.build(prof)


def capacity(requests: int, seed: int) -> dict[str, float]:
    """One stock server saturated: closed loop at twice its slots; its steady requests/s and output tok/s."""
    cfg, cm = setup()
    wl = workloads.load(WORKLOAD, requests, seed=seed)
    src = policies.make("v0", max_running=cfg.max_running, kv_tokens=cfg.kv_tokens)
    res = runner.run(wl, src, cm, cfg, concurrency=2 * cfg.max_running)
    return {"req_s": res["steady_req_per_s"], "tok_s": res["steady_tok_per_s"]}


def job(n: int, router: str, servers: str, load: float, rate: float, horizon: float, seed: int) -> dict[str, Any]:
    cfg, cm = setup()
    arrivals = fleet.poisson(rate, horizon, seed=seed * 1000 + n * 10 + round(load * 10))
    wl = workloads.load(WORKLOAD, max(1, arrivals.size), seed=seed * 1000 + n * 10 + round(load * 10) + 1)
    t0 = time.perf_counter()
    res = fleet.run(arrivals, wl.input_len[:arrivals.size], wl.output_len[:arrivals.size],
                    fleet.FleetConfig(instances=n, servers=servers, gateway=GatewayParams(policy=router), engine=cfg,
                                      horizon_s=horizon, seed=seed), cm)
    res.pop("where")
    res.update(load=load, rate=rate, wall_s=time.perf_counter() - t0)
    return res


def _modes(m: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(m.items()))


def table(results: dict[tuple, dict[str, Any]], sizes: tuple[int, ...]) -> list[str]:
    lines = ["| servers (N) | router | per server | load | offered req/s | arrived | completed | output tok/s "
             "| vs stock | TTFT p50 s | TTFT p99 s | TPOT p99 ms | no first token | vetoed per poll (mean / most) "
             "| all vetoed | requests per server, fewest / most (× mean) | modes at T |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        for router in ROUTERS:
            for load in LOADS:
                for servers in SERVERS:
                    r = results[(n, router, servers, load)]
                    base = results[(n, router, "v0", load)]["output_tok_s"]
                    vs = "" if servers == "v0" else f"{r['output_tok_s'] / base - 1:+.1%}"
                    lines.append(
                        f"| {n} | {router} | {'stock' if servers == 'v0' else 'default'} | {load:.0%} "
                        f"| {r['rate']:,.1f} | {r['arrived']:,} | {r['completed']:,} | {r['output_tok_s']:,.0f} "
                        f"| {vs} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.2f} | {r['tpot_p99_s'] * 1e3:.0f} "
                        f"| {r['no_first_token']:,} | {r['vetoed_mean']:.1f} / {r['vetoed_max']} "
                        f"| {r['fallback_frac']:.1%} | {r['routed_min']:.2f} / {r['routed_max']:.2f} "
                        f"| {_modes(r['modes'])} |")
    return lines


def summary(results: dict[tuple, dict[str, Any]], sizes: tuple[int, ...]) -> list[str]:
    """One line per fleet size and load: least_load against round_robin (stock servers), how closely least_load's
    split followed the servers' reported gen_throughput, and the controller's largest change in output tok/s."""
    out = []
    for n in sizes:
        for load in LOADS:
            rr, ll = results[(n, "round_robin", "v0", load)], results[(n, "least_load", "v0", load)]
            ctl = max((abs(results[(n, r, "default", load)]["output_tok_s"] /
                           results[(n, r, "v0", load)]["output_tok_s"] - 1), r) for r in ROUTERS)
            out.append(f"- N = {n}, {load:.0%}: least_load against round_robin (stock servers): output "
                       f"{ll['output_tok_s'] / rr['output_tok_s'] - 1:+.1%}, TTFT p99 {ll['ttft_p99_s']:.2f} s against "
                       f"{rr['ttft_p99_s']:.2f} s, TPOT p99 {ll['tpot_p99_s'] * 1e3:.0f} ms against "
                       f"{rr['tpot_p99_s'] * 1e3:.0f} ms, requests per server {ll['routed_min']:.2f}-"
                       f"{ll['routed_max']:.2f}× the mean against {rr['routed_min']:.2f}-{rr['routed_max']:.2f}×; a "
                       f"server's share of least_load's requests between two polls against its share of the "
                       f"gen_throughput the first reported: r = {ll['tp_share_corr']:.2f}; the controller's largest "
                       f"change in output tok/s {ctl[0]:.1%} ({ctl[1]}).")
    return out


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=OUT.parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True,
                               cwd=OUT.parent).stdout.strip()
        return f"the working tree after commit {sha}" if dirty else f"commit {sha}"
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 and 4 servers, 15 s (a few seconds)")
    ap.add_argument("--write", action="store_true", help=f"also write {OUT.relative_to(OUT.parents[2])}")
    ap.add_argument("--horizon", type=float, default=0.0, help="simulated seconds per run (default 120; quick 15)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    if a.quick and a.write:
        ap.error("--write keeps the full run's table: not with --quick")
    sizes = (2, 4) if a.quick else (8, 32)
    horizon = a.horizon or (15.0 if a.quick else 120.0)
    cmd = "python tools/sim_fleet.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    cap = capacity(4000, a.seed)
    print(f"one stock server saturated: {cap['req_s']:.2f} req/s, {cap['tok_s']:,.0f} output tok/s "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    jobs = [(n, router, servers, load, load * n * cap["req_s"], horizon, a.seed)
            for n in sorted(sizes, reverse=True) for load in sorted(LOADS, reverse=True)
            for servers in sorted(SERVERS) for router in ROUTERS]
    results: dict[tuple, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        for r in ex.map(job, *zip(*jobs, strict=True)):
            results[(r["instances"], r["policy"], r["servers"], r["load"])] = r
            print(f"  N={r['instances']:3} {r['policy']:12} {r['servers']:8} {r['load']:4.0%}  "
                  f"{r['output_tok_s']:10,.0f} tok/s  TTFT p99 {r['ttft_p99_s']:6.2f} s  ({r['wall_s']:.0f} s)",
                  flush=True)
    took = time.perf_counter() - t0
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    date = datetime.date.today().isoformat()
    head = [
        "# A fleet behind smg, in the simulator (`tools/sim_fleet.py`)",
        "",
        "N simulated sglang servers behind smg's gateway, each stock or running ebctl's default controller of its "
        "own (tracker issue 29). The gateway's rules and their sources in smg: `ebctl/sim/gateway.py`; the event "
        "loop and what a server answers to a poll: `ebctl/sim/fleet.py`.",
        "",
        f"Made by `{cmd.strip()}` on {date}, at {_commit()}, on this project's 2-core VM: {len(jobs)} runs in "
        f"{took:.0f} s of wall time, {cpu:.0f} s of CPU over {max(1, a.jobs)} processes (the simulator is "
        "deterministic: the figures do not depend on the machine's other load, the times do).",
        "",
        f"- **Servers**: {PROFILE} (the fitted GPU cost model), sglang 0.5.23's rules, 1,024 slots, B = 8,192, the "
        "GPU's KV capacity; `stock` = no policy (`v0`), `default` = `ebctl simulate --policies default`, one "
        "controller per server, cold at t = 0.",
        "- **Gateway**: smg 1.13.0's defaults: loads polled every 10 s from t = 0 (stale in between), the overload "
        "veto (a server whose last poll showed ≥ 8 waiting requests or KV usage ≥ 0.8 gets no request while "
        "another has neither; when all have, the one with the fewest requests in flight gets it: *all vetoed* is "
        "the share of requests routed so), least_load crediting p̄ = 1,024 tokens per request sent since the last "
        "poll (the HTTP path; no tokens known).",
        f"- **Capacity** (defined here): N × one stock server's saturated throughput, measured by the tool (closed "
        f"loop at c = 2,048, {WORKLOAD} lengths, requests/s between the 20th and 80th percentile finish times): "
        f"**{cap['req_s']:.2f} req/s ({cap['tok_s']:,.0f} output tok/s) per server**. Load = offered Poisson rate / "
        "capacity.",
        f"- **Arrivals**: Poisson, lengths drawn from the shipped Azure conversation trace "
        f"(`ebctl/data/traces/azure2023_conv.csv`), seed {a.seed}; the same arrivals and lengths for both routers "
        "and both server policies at one N and load. One seed.",
        f"- **Horizon**: a fixed {horizon:.0f} simulated seconds from an empty, cold fleet (no warm-up left out: "
        "the controller's learning and the fleet's ramp-up count). Output tok/s = output tokens made by iterations "
        "that ended by T, over T; completed = finished by T; TTFT over every request that arrived, one still "
        "without a first token at T counting its wait so far (a lower bound; *no first token* counts them); TPOT "
        "p99 over the completed requests with more than one output token; *vetoed per poll* = servers the "
        "overload veto flagged at a poll; *requests per server* = the fewest and the most requests one server got, "
        "over the mean; *modes at T* = the servers' policies at T (`off`: the controller leaves "
        "sglang stock).",
        "",
    ]
    body = table(results, sizes)
    lines = [*head, *body, "", *summary(results, sizes), ""]
    print("\n".join(lines))
    if a.write:
        OUT.write_text("\n".join(lines))
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
