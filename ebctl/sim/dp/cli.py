"""``ebctl simulate --dp N``: dispatch policies over N data-parallel ranks, one table (or JSON).

Called by ``ebctl.sim.cli.simulate`` when ``--dp`` is given; raises ValueError (or ProfileError) on bad
input, which the caller turns into exit code 2 with the message.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ebctl.sim import workloads
from ebctl.sim.dp import costs as dpcosts
from ebctl.sim.dp import dispatch
from ebctl.sim.dp.run import DpConfig, poisson, run

DEFAULT_DISPATCH = ",".join(dispatch.POLICIES)


def arrivals_and_lengths(workload: str | None, trace: str | None, requests: int, *, rate: float, seed: int,
                         time_scale: float) -> tuple[np.ndarray, np.ndarray, str]:
    """Prompt lengths from the workload or trace; arrivals Poisson at ``rate`` (> 0) or, with rate 0, the
    trace's own timestamps × ``time_scale``."""
    if rate < 0:
        raise ValueError(f"--rate {rate}: must be >= 0 (0: the trace's timestamps)")
    open_loop = rate == 0
    if trace is not None:
        wl = workloads.from_trace(trace, requests, seed=seed, open_loop=open_loop, time_scale=time_scale)
    else:
        wl = workloads.load(workload or "azure-conv", requests, seed=seed, open_loop=open_loop,
                            time_scale=time_scale)
    if open_loop:
        return wl.arrival_s, wl.input_len, f"{wl.name}, its timestamps × {time_scale:g}"
    return poisson(rate, len(wl), seed=seed), wl.input_len, f"{wl.name}, Poisson {rate:g} req/s"


def simulate_dp(*, dp: int, instances: int = 1, dispatch_list: str, mode: str, rate: float, chunk: int, profile: str,
                workload: str | None, trace: str | None, requests: int, seed: int, time_scale: float,
                json_out: bool, command: str = "") -> None:
    names = [s.strip() for s in dispatch_list.split(",") if s.strip()]
    bad = [n for n in names if n not in dispatch.POLICIES]
    if not names or bad:
        raise ValueError(f"--dispatch {dispatch_list!r}: give one or more of {', '.join(dispatch.POLICIES)}")
    cfg = DpConfig(ranks=dp, mode=mode, chunk=chunk, costs=dpcosts.named(profile),  # type: ignore[arg-type]
                   instances=instances)
    arrival, tokens, what = arrivals_and_lengths(workload, trace, requests, rate=rate, seed=seed,
                                                 time_scale=time_scale)
    results = [run(arrival, tokens, name, cfg) for name in names]
    header = {"command": command, "ranks": dp, "instances": instances, "mode": mode, "chunk": chunk, "workload": what,
              "requests": int(tokens.size), "cost_model": dpcosts.describe(cfg.costs)}
    if json_out:
        print(json.dumps({**header, "results": results}))
        return
    out = Console()
    render(header, results, out if out.is_terminal else Console(width=200))


def _f(x: float, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * scale:,.{digits}f}"


def render(header: dict[str, Any], results: list[dict[str, Any]], console: Console) -> None:
    shape = (f"{header['instances']} instances × {header['ranks']} ranks" if header.get("instances", 1) > 1
             else f"{header['ranks']} ranks")
    t = Table(title=f"{shape} ({header['mode']}) · chunk {header['chunk']} · {header['workload']} · "
                    f"{header['requests']} requests", title_justify="left")
    for col in ("dispatch", "TTFT mean/p50/p99 s", "wait dispatcher/engine s", "req/s", "prompt tok/s",
                "chunk util", "load spread", "barrier wait", "forwards/s", "busy"):
        t.add_column(col, justify="left" if col == "dispatch" else "right", no_wrap=True)
    for r in results:
        ttft = r["ttft_s"]
        t.add_row(r["policy"], f"{_f(ttft['mean'])}/{_f(ttft['p50'])}/{_f(ttft['p99'])}",
                  f"{_f(r['dispatch_wait_s']['mean'])}/{_f(r['engine_wait_s']['mean'])}", _f(r["req_per_s"], digits=1),
                  _f(r["prompt_tok_per_s"], digits=0), f"{r['chunk_util']:.0%}", f"{r['load_spread']:.2f}",
                  f"{r['barrier_wait']:.0%}", _f(r["forwards_per_s"], digits=2), f"{r['busy_share']:.0%}")
    console.print(t)
    console.print(f"cost model: {header['cost_model']}", highlight=False)
