"""The driver: a client (closed or open loop) and a policy source around an :class:`Engine`, on simulated time.

Each turn: the source gives the policy for ``now``, the engine steps, the source observes the report (the
controller's ``observe``), the clock moves to the end of the iteration and the client issues what is due
(closed loop: one new request per finished one, up to the concurrency of the current phase; open loop:
every arrival up to ``now``; an idle engine jumps to the next arrival).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ebctl.protocol import BatchKind, IterationReport
from ebctl.sim import metrics
from ebctl.sim.costs import CostModel
from ebctl.sim.engine import Engine, EngineConfig
from ebctl.sim.policies import Auto, PolicySource
from ebctl.sim.rules import make_engine
from ebctl.sim.workloads import Workload

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 2.0  # MLPerf Inference's server-scenario limits for Llama-3.1-8B (loadgen/mlperf.conf)
    tpot_s: float = 0.1


def run(workload: Workload, source: PolicySource, cost_model: CostModel, config: EngineConfig, *,
        concurrency: int = 2048, slo: Slo = Slo(), progress: Progress | None = None,
        keep_engine: bool = False, on_step: Callable[[float, IterationReport], None] | None = None,
        on_start: Callable[[Engine], None] | None = None) -> dict[str, Any]:
    """Simulate the whole workload; returns the metrics (``metrics.summarize``) plus run details.
    ``on_step(now, report)`` runs after every iteration (the live engine paces itself there); ``on_start(engine)``
    once before the first (the live engine reads its exact output-token count)."""
    if concurrency < 1 and not workload.open_loop:
        raise ValueError(f"concurrency={concurrency}: must be >= 1")
    wall0 = time.perf_counter()
    eng = make_engine(replace(config, **source.engine) if source.engine else config, cost_model)
    if on_start is not None:
        on_start(eng)
    n = len(workload)
    inputs, outputs = workload.input_len.tolist(), workload.output_len.tolist()
    arrivals = workload.arrival_s.tolist() if workload.arrival_s is not None else None
    issued = outstanding = done = idle = 0
    now = 0.0

    def issue(now: float) -> None:
        nonlocal issued, outstanding
        if arrivals is not None:
            while issued < n and arrivals[issued] <= now:
                eng.add(inputs[issued], outputs[issued], arrivals[issued])
                issued += 1
            return
        while issued < n and outstanding < workload.concurrency_at(issued, concurrency):
            eng.add(inputs[issued], outputs[issued], now)
            issued += 1
            outstanding += 1

    issue(now)
    while done < n:
        eng.policy = source.policy(now)
        rep = eng.step(now)
        source.observe(rep)
        if on_step is not None:
            on_step(now, rep)
        k = len(eng.last_finished)
        done += k
        outstanding -= k
        now = rep.wall_time
        if rep.kind is BatchKind.IDLE and not k:
            idle += 1
            if arrivals is not None and issued < n:
                now = max(now, arrivals[issued])
            elif idle > 2:
                raise RuntimeError(f"simulation stalled at t={now:.3f}s: {eng.running} running, "
                                   f"{len(eng.queue)} waiting, {done}/{n} done")
        else:
            idle = 0
        issue(now)
        if progress is not None and k:
            progress(done, n)

    itl = np.concatenate(eng.itl) if eng.itl else np.zeros(0)
    res = metrics.summarize(eng.req.arrays(), itl, slo_ttft=slo.ttft_s, slo_tpot=slo.tpot_s)
    res.update({
        "policy": source.name, "workload": workload.name,
        "concurrency": workload.concurrency_label(concurrency),
        "preemptions": eng.preemptions, "kv_refusals": eng.kv_refusals, "truncated": eng.truncated,
        "peak_kv_tokens": eng.peak_kv_blocks * config.block_size,
        "peak_kv_frac": eng.peak_kv_blocks / eng.total_blocks, "kv_tokens": eng.total_blocks * config.block_size,
        "steps": {str(k): v for k, v in eng.steps.items() if v},
        "mean_running": eng.running_area / eng.busy_s if eng.busy_s > 0 else 0.0,
        "tokens_out": eng.tokens_out, "tokens_prefilled": eng.tokens_prefilled,
        "mode_timeline": [[c.t, c.mode, c.k, c.n_max] for c in source.timeline],
        "mode_share": metrics.mode_shares(source.timeline, now),
        "sim_wall_s": time.perf_counter() - wall0,
    })
    if isinstance(source, Auto):
        p = source.controller.policy
        est = p.estimates
        res["final_policy"] = {"mode": str(p.mode), "k": p.k, "n_max": p.n_max, "reason": p.reason,
                               "theta_star": est.theta_star if est else None,
                               "theta0": est.theta0 if est else None}
    if keep_engine:
        res["_engine"] = eng
    return res
