"""Run metrics from the engine's request table: throughput, latency percentiles, goodput, KV, modes.

Conventions: throughput = tokens (or requests) of the run over its makespan (first arrival to last
finish); ``steady_*`` counts only requests finishing between the 20th and 80th percentile finish times
(no ramp-up, no drain). TTFT = first token − arrival; TPOT = (finish − first token)/(output − 1) for
outputs > 1; ITL = every gap between two tokens of one request. Goodput: requests meeting both SLOs
(TPOT counts as met for one-token outputs) per second of makespan. Aborted requests count as finished
but produce no tokens and miss the SLOs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ebctl.sim.policies import ModeChange

QUANTILES = {"p50": 50, "p90": 90, "p99": 99}


def percentiles(x: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {k: math.nan for k in (*QUANTILES, "mean")}
    q = np.percentile(x, list(QUANTILES.values()))
    return {**{k: float(v) for k, v in zip(QUANTILES, q, strict=True)}, "mean": float(x.mean())}


def mode_shares(timeline: list[ModeChange], t_end: float) -> dict[str, float]:
    """Share of [first change, t_end] spent in each mode."""
    if not timeline or t_end <= timeline[0].t:
        return {timeline[-1].mode: 1.0} if timeline else {}
    out: dict[str, float] = {}
    for a, b in zip(timeline, [*timeline[1:], None], strict=True):
        end = t_end if b is None else min(b.t, t_end)
        out[a.mode] = out.get(a.mode, 0.0) + max(0.0, end - a.t)
    span = t_end - timeline[0].t
    return {k: v / span for k, v in out.items()}


def summarize(req: dict[str, np.ndarray], itl: np.ndarray, *, slo_ttft: float, slo_tpot: float) -> dict[str, Any]:
    arrival, first, finish = req["arrival"], req["first_token"], req["finish"]
    inp, out = req["input_len"], req["output_len"]
    ok = req["reason"] != "abort"
    n = int(arrival.size)
    t0 = float(arrival.min()) if n else 0.0
    t1 = float(np.nanmax(finish)) if n and np.isfinite(finish).any() else t0
    span = max(t1 - t0, 1e-12)
    out_tok = float(out[ok].sum())
    in_tok = float(inp[ok].sum())
    ttft = first - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    ttft_ok = ok & (ttft <= slo_ttft)
    tpot_ok = ok & ((out <= 1) | (tpot <= slo_tpot))
    good = int(np.count_nonzero(ttft_ok & tpot_ok))
    res: dict[str, Any] = {
        "requests": n, "completed": int(np.count_nonzero(ok)), "aborted": int(n - np.count_nonzero(ok)),
        "makespan_s": span, "tok_per_s": out_tok / span, "total_tok_per_s": (in_tok + out_tok) / span,
        "req_per_s": float(np.count_nonzero(ok)) / span,
        "ttft_s": percentiles(ttft[ok]), "tpot_s": percentiles(tpot[ok]), "itl_s": percentiles(itl),
        # per request, the longest its stream stalled: what a user sees as a freeze (sglang #31395)
        "max_gap_s": percentiles(req["max_gap"][ok & (out > 1)]) if "max_gap" in req else percentiles(np.array([])),
        "goodput_req_per_s": good / span, "goodput_frac": good / n if n else math.nan,
        "goodput_tok_per_s": float(out[ttft_ok & tpot_ok].sum()) / span,  # output tokens of those requests
        "ttft_slo_frac": float(np.mean(ttft_ok)) if n else math.nan,
        "tpot_slo_frac": float(np.mean(tpot_ok)) if n else math.nan,
    }
    res.update(_steady(finish, inp, out, ok))
    return res


def _steady(finish: np.ndarray, inp: np.ndarray, out: np.ndarray, ok: np.ndarray) -> dict[str, float]:
    f = finish[ok]
    if f.size < 10:
        return {"steady_tok_per_s": math.nan, "steady_total_tok_per_s": math.nan, "steady_req_per_s": math.nan}
    ta, tb = np.percentile(f, [20, 80])
    sel = ok & (finish > ta) & (finish <= tb)
    span = max(float(tb - ta), 1e-12)
    return {"steady_tok_per_s": float(out[sel].sum()) / span,
            "steady_total_tok_per_s": float((inp[sel] + out[sel]).sum()) / span,
            "steady_req_per_s": float(np.count_nonzero(sel)) / span}


def jsonable(x: Any) -> Any:
    """NaN/inf → None, numpy scalars → Python: strict JSON."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
