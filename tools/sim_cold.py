"""The default controller from a cold start over a fixed wall time, against static settings, in the simulator.

    .venv/bin/python tools/sim_cold.py [--quick] [--cases cpu,cpu-mixed,cpu-noisy,cpu-mixed-noisy,h200,rtx-pro-6000]
                                       [--seed 0]

What a user measures first is the same server with and without ebctl over the minutes they watch it: the
learning period counts. Each case runs the simulated engine (sglang's rules) in a closed loop, with every
policy starting cold, and counts the output tokens of the requests that finished by the wall time T, over T.
Printed per case: each policy's output tok/s, the best static setting, and the default's ratio to it; the same
over the second half of T alone ("after start-up"), which tells a setting's lead in the steady state from its
lead in the start-up (the first c requests arrive at once).

Cases:

* ``cpu``: an engine as slow as the real CPU server of tools/ab_real.py: 16 slots, chunks of 256 tokens, a
  KV of 16,384 tokens, c = 24, linear costs with iterations of 10-30 ms (α_p 8 ms + 40 µs/token, α_d 12 ms +
  0.4 ms/request: about 17 completions/s, 700 output tok/s, as that server measures); inputs 10-240 tokens,
  outputs geometric with mean 42 (at most 160); T = 480 s. ``cpu-mixed``: the same engine launched with mixed
  chunks. Statics: stock (v0), mb, EB k = 2, 3, 4, 6, 8, 12. ``cpu-noisy``, ``cpu-mixed-noisy``: the same on a
  machine whose speed wanders as the real CPU server's does (``costs.NoisyCostModel``: 10-s windows of one
  setting vary by about 10%, where the noiseless cases' vary by well under 1%); every policy sees the same path.
* ``h200``, ``rtx-pro-6000``: Qwen3-8B's profiles (the fitted GPU model), 1,024 slots, c = 2,048, Azure
  conversations; T = 600 s. Statics: v0, mb, and θ pinned at 0.05-0.8 (the controller's N̂* at that θ).

``--quick``: T a quarter as long, fewer statics (CI-sized; figures printed, not asserted).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ebctl import model, profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

CPU_COSTS = model.Costs(alpha_p=8e-3, beta_p=4e-5, alpha_d=12e-3, beta_d=4e-4)
CASES = ("cpu", "cpu-mixed", "cpu-noisy", "cpu-mixed-noisy", "h200", "rtx-pro-6000")


def cpu_workload(n: int, seed: int) -> workloads.Workload:
    """Inputs uniform on 10-240 tokens (mean 125), outputs geometric with mean 42, at most 160."""
    rng = np.random.default_rng(seed)
    out = np.minimum(rng.geometric(1 / 42, n), 160)
    return workloads.Workload("cpu-480", rng.integers(10, 241, n), out)


def setup(case: str, quick: bool, seed: int) -> tuple[EngineConfig, costs.CostModel, workloads.Workload, int, float,
                                                       list[str]]:
    """(engine, cost model, workload, concurrency, wall time T, static policies) of a case."""
    if case.startswith("cpu"):
        cfg = EngineConfig(max_running=16, token_budget=256, kv_tokens=16384, mixed_chunk=case.startswith("cpu-mixed"))
        ks = (2, 4, 8) if quick else (2, 3, 4, 6, 8, 12)
        horizon = 120.0 if quick else 480.0
        cm: costs.CostModel = costs.LinearCostModel(CPU_COSTS)
        if case.endswith("-noisy"):
            cm = costs.NoisyCostModel(cm, seed=seed)
        return (cfg, cm, cpu_workload(int(30 * horizon), seed), 24, horizon,
                ["v0", "mb", *(f"eb:k={k}" for k in ks)])
    prof = profiles.load(f"qwen3-8b/{case}")
    kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
    thetas = (0.05, 0.2, 0.7) if quick else (0.05, 0.1, 0.2, 0.4, 0.6, 0.8)
    horizon = 150.0 if quick else 600.0  # the workload: twice what the faster GPU finishes in that time
    return (EngineConfig(kv_tokens=kv), costs.build(prof), workloads.load("azure-conv", int(40 * horizon), seed=seed),
            2048, horizon, ["v0", "mb", *(f"eb-auto:theta={t}" for t in thetas)])


def output_rate(case: str, spec: str, quick: bool, seed: int) -> tuple[float, float, str, float]:
    """Output tokens/s of the requests finished by T, from a cold start; the TTFT p99 (s) of the requests whose
    first token came by T; the controller's end state; output tokens/s of the requests finished in (T/2, T]."""
    cfg, cm, wl, conc, horizon, _ = setup(case, quick, seed)
    prof_costs = None if case.startswith("cpu") else profiles.load(f"qwen3-8b/{case}").costs
    src = policies.make(spec, max_running=cfg.max_running, kv_tokens=cfg.kv_tokens, costs=prof_costs)
    res = runner.run(wl, src, cm, cfg, concurrency=conc, keep_engine=True)
    req = res.pop("_engine").req.arrays()
    finish = req["finish"]
    if np.nanmax(finish) < horizon:
        raise RuntimeError(f"{case} {spec}: the workload ran out at {np.nanmax(finish):.0f} s, before T = {horizon}")
    tokens = float(req["output_len"][finish <= horizon].sum())
    late = float(req["output_len"][(finish > horizon / 2) & (finish <= horizon)].sum()) / (horizon / 2)
    first = req["first_token"]
    started = np.isfinite(first) & (first <= horizon)
    ttft99 = float(np.percentile((first - req["arrival"])[started], 99))
    ctl = getattr(src, "controller", None)
    end = ""
    if ctl is not None:
        tu = ctl.status()["tuner"] or {}
        g = tu.get("gain") or {}
        end = (f"{tu.get('incumbent')} (k {ctl.policy.k}), {tu.get('trials', 0)} trials, gain "
               f"{g.get('vs_stock', 0):+.1%}, exploring cost {g.get('explore_share', 0):.2%}")
    return tokens / horizon, ttft99, end, late


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    worst = np.inf
    for case in a.cases.split(","):
        if case not in CASES:
            ap.error(f"--cases: unknown case {case!r} (known: {', '.join(CASES)})")
        *_, horizon, statics = setup(case, a.quick, a.seed)
        t0 = time.monotonic()
        rates, ttfts, lates = {}, {}, {}
        for spec in ["default", *statics]:
            rates[spec], ttfts[spec], end, lates[spec] = output_rate(case, spec, a.quick, a.seed)
            print(f"  {case:13} {spec:22} {rates[spec]:10,.1f} output tok/s  after start-up {lates[spec]:10,.1f}  "
                  f"TTFT p99 {ttfts[spec]:6.2f} s  {end}", flush=True)
        best = max(statics, key=lambda s: rates[s])
        ratio = rates["default"] / rates[best]
        worst = min(worst, ratio)
        late_best = max(statics, key=lambda s: lates[s])
        print(f"{case}: T = {horizon:.0f} s from a cold start; best static {best} {rates[best]:,.1f}; default "
              f"{rates['default']:,.1f} = {ratio:.1%} of it; stock {rates['v0']:,.1f}; TTFT p99 default / stock "
              f"{ttfts['default'] / ttfts['v0']:.2f}; after start-up (T/2 to T): best static {late_best} "
              f"{lates[late_best]:,.1f} ({lates[late_best] / lates['v0'] - 1:+.1%} on stock), {best} "
              f"{lates[best] / lates['v0'] - 1:+.1%} on stock, default {lates['default'] / lates[late_best]:.1%} "
              f"of the best ({time.monotonic() - t0:.0f} s)\n", flush=True)
    print(f"worst default / best static: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
