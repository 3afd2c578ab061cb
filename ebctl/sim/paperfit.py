"""Fit the engine overheads of :class:`~ebctl.sim.gpucost.EngineCostModel` to the paper's GPU measurements.

One procedure, per GPU (``python -m ebctl.sim.paperfit [--write]``):

1. **Cells fitted** (:func:`cells`): vLLM v1's three saturation points (steady total tokens/s at μ_L/μ_O =
   1024/128, 512/512, 128/1024; N = 1,024, B = 8,192, concurrency 2,048); Table 2's v1 requests/s and EB/v1
   ratio on its three workloads; the v1 TPOT section 4.3.3 quotes (RTX PRO 6000 ShareGPT and NuminaMath, H200
   NuminaMath). Never fitted: the EB TPOT of section 4.3.3, Table 13, Figure 3, v0 (vLLM's V0 engine, with
   overheads of its own). Table 2's EB/v1 cells are judged leave-one-out (:func:`fit_gpu` ``leave_out``).
2. **Like the paper ran it**: each scheduler at the (B, N) the paper reports as its best (Tables 14-15,
   ``paperdata.BEST_CONFIG``); NuminaMath with the outputs it served (``paperdata.served``: at the 4,000-token
   cap, not Table 9's 1,039). EB(k̂*) runs at min(N̂*, N) (section 4.3): here the best fixed θ ∈
   ``FIT_THETAS`` at a batch cap N' ≤ N from the paper's N values (the controller aims at that optimum and is
   run out of sample by tools/sim_vs_paper.py).
3. **One simulation per configuration**, vLLM's rules, kernel-only model. In a saturated closed loop with a
   fixed policy every scheduling decision depends on token counts, never on time, so the batches do not
   depend on the costs and each run's time, and each request's TPOT, is linear in the overheads: T = K +
   Σ_j o_j·F_j over the recorded sums F of :meth:`EngineCostModel.parts`.
4. **Bounded least squares** on log(predicted/measured), each parameter within a physical bound
   (:data:`UPPER`, :func:`upper`): iter_s ≤ 5 ms (an iteration's CPU work that does not overlap the GPU:
   scheduling, input preparation, output processing, a few ms in vLLM); req_s ≤ β_d (per request and
   iteration: more would make the engine's bookkeeping of a request dearer than running the 8B model for it,
   the measured eager per-request forward); φ ≤ φ_max (the measured kernels' worst mixing slowdown);
   switch_s ≤ α_p (a change of batch kind re-plans attention metadata and re-warms caches: no more than
   launching a whole forward afresh, the measured eager prefill fixed cost); ω ≤ 1 (no more than all of the
   smaller part can hide). All ≥ 0. Five parameters per GPU; :func:`at_bound` says which bounds bind.

The result is stored in ``ebctl/data/sim_overheads.json``, which ``ebctl.sim.costs.build`` reads for the
built-in Qwen3-8B profiles.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import resources

import numpy as np
from scipy.optimize import least_squares

from ebctl import profiles
from ebctl.protocol import BatchKind
from ebctl.sim import gpucost, hardware, paperdata, policies, runner, workloads
from ebctl.sim.costs import Batch
from ebctl.sim.engine import EngineConfig

GPUS = gpucost.PAPER_GPUS
PAPER_N = (256, 512, 1024, 1536, 2048)  # the batch caps of the paper's grid (Tables 14-16)
TABLE2 = {"ShareGPT": "sharegpt-like", "LongBench": "longbench-like", "NuminaMath": "numinamath-served"}
SERVED = {"numinamath-served": "NuminaMath"}  # workloads as the paper served them (paperdata.served)
FIT_THETAS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8)
CONCURRENCY = 2048  # the paper's saturated regime
SAT_REQUESTS = 6000
TABLE2_REQUESTS = 4000
SEED = 0
UPPER = {"iter_s": 0.005, "req_s": None, "interference": None, "switch_s": None, "overlap": 1.0}  # None: upper()
OVERHEADS_FILE = gpucost.OVERHEADS_FILE


@functools.cache
def kernel_model(gpu: str) -> gpucost.EngineCostModel:
    prof = profiles.load(GPUS[gpu])
    return gpucost.EngineCostModel.kernels(prof.costs, model_name=prof.model, gpu=prof.gpu,
                                           decode_attention_ms=prof.decode_attention_ms)


def engine(gpu: str, n: int, b: int) -> EngineConfig:
    prof = profiles.load(GPUS[gpu])
    return EngineConfig(rules="vllm", max_running=n, token_budget=b,
                        kv_tokens=hardware.kv_capacity_tokens(prof.model, prof.gpu))


def workload(name: str, n: int) -> workloads.Workload:
    """A workload by name; ``numinamath-served`` is NuminaMath as the paper served it (``paperdata.served``)."""
    if name in SERVED:
        return workloads.Workload(name, *paperdata.served(SERVED[name], n, seed=SEED))
    return workloads.load(name, n, seed=SEED)


class Recorder:
    """Prices with the kernel model and keeps each iteration's :meth:`EngineCostModel.parts`."""

    name = "recorder"

    def __init__(self, base: gpucost.EngineCostModel) -> None:
        self.base = base
        self.rows: list[tuple[float, ...]] = []

    def step_time(self, batch: Batch) -> float:
        row = self.base.parts(batch)
        self.rows.append(row)
        return row[0]


@dataclass(frozen=True)
class Sums:
    """A run's (or window's) sums of the parts, what it served, and the mean over requests of the parts
    between a request's first token and its finish over its output tokens − 1 (its TPOT, metrics.summarize)."""

    parts: tuple[float, ...]
    requests: int
    tokens: float
    tpot: tuple[float, ...] = ()

    def seconds(self, o: np.ndarray) -> float:
        return self.parts[0] + float(np.dot(self.parts[1:], o))

    def rate(self, unit: str, o: np.ndarray) -> float:
        return (self.tokens if unit == "tok/s" else self.requests) / self.seconds(o)

    def tpot_s(self, o: np.ndarray) -> float:
        return self.tpot[0] + float(np.dot(self.tpot[1:], o))


def record(gpu: str, workload_name: str, spec: str, n: int, b: int, requests: int, steady: bool = False) -> Sums:
    """One run's sums (vLLM's rules, closed loop at ``CONCURRENCY``); ``steady``: only the saturated window
    (from a quarter of the requests done to the last one issued), its tokens those of the requests finished in it."""
    cfg = engine(gpu, n, b)
    wl = workload(workload_name, requests)
    rec = Recorder(kernel_model(gpu))
    tokens: list[float] = []  # per busy iteration: tokens of the requests it finished
    finished: list[int] = []
    ends: list[float] = []  # per busy iteration: its end time under the kernel model

    def on_step(now, rep) -> None:
        if rep.kind is not BatchKind.IDLE:  # the recorder priced it (an idle step costs nothing)
            tokens.append(sum(f.input_len + f.output_len for f in rep.finished))
            finished.append(len(rep.finished))
            ends.append(rep.wall_time)

    src = policies.make(spec, max_running=n, kv_tokens=cfg.kv_tokens)
    res = runner.run(wl, src, rec, cfg, concurrency=CONCURRENCY, on_step=on_step, keep_engine=True)
    rows = np.array(rec.rows)
    tpot = _tpot_sums(res["_engine"].req.arrays(), np.array(ends), rows)
    if not steady:
        return Sums(tuple(rows.sum(axis=0)), len(wl), float(wl.input_len.sum() + wl.output_len.sum()), tpot)
    cum = np.cumsum(finished)
    start = int(np.searchsorted(cum, requests // 4))
    end = int(np.searchsorted(cum, requests - CONCURRENCY))  # the client issues its last request here
    return Sums(tuple(rows[start:end].sum(axis=0)), int(sum(finished[start:end])), float(sum(tokens[start:end])),
                tpot)


def _tpot_sums(req: dict[str, np.ndarray], ends: np.ndarray, rows: np.ndarray) -> tuple[float, ...]:
    """Mean over finished requests with ≥ 2 output tokens of (parts of the iterations after the one that made
    the first token, up to the one that finished it) / (output − 1); the iterations found by their end time."""
    ok = (req["reason"] == "stop") & (req["output_len"] > 1)
    if not ok.any():
        return ()
    first = np.searchsorted(ends, req["first_token"][ok])  # times are the recorded end times themselves
    last = np.searchsorted(ends, req["finish"][ok])
    cum = np.vstack([np.zeros(rows.shape[1]), np.cumsum(rows, axis=0)])
    per = (cum[last + 1] - cum[first + 1]) / (req["output_len"][ok] - 1)[:, None]
    return tuple(per.mean(axis=0))


def _job(key: tuple) -> tuple[tuple, Sums]:
    return key, record(*key)


def eb_keys(gpu: str, w: str) -> list[tuple]:
    """The EB stand-ins of a Table 2 cell: fixed θ at the paper's B and every paper N' ≤ its N."""
    b, n = paperdata.BEST_CONFIG[gpu][w]["eb"]
    return [(gpu, TABLE2[w], f"eb:theta={t}", m, b, TABLE2_REQUESTS, False) for m in PAPER_N if m <= n
            for t in FIT_THETAS]


def table2_key(gpu: str, w: str, scheduler: str) -> tuple:
    """The run of scheduler v0 or v1 at the paper's best configuration."""
    b, n = paperdata.BEST_CONFIG[gpu][w][scheduler]
    return gpu, TABLE2[w], {"v0": "v0", "v1": "mb"}[scheduler], n, b, TABLE2_REQUESTS, False


def sat_key(gpu: str, mu_l: int, mu_o: int) -> tuple:
    return gpu, f"uniform:L={mu_l},O={mu_o}", "mb", 1024, 8192, SAT_REQUESTS, True


def configurations(gpus=tuple(GPUS), *, v0: bool = False) -> list[tuple]:
    """Every run the fit needs (and, with ``v0``, vLLM V0 at its configuration, reported beside it)."""
    out = []
    for gpu in gpus:
        out += [sat_key(gpu, p["mu_L"], p["mu_O"]) for p in paperdata.data()["v1_saturation_tok_per_s"][gpu]]
        for w in TABLE2:
            out += [table2_key(gpu, w, "v1"), *eb_keys(gpu, w)] + ([table2_key(gpu, w, "v0")] if v0 else [])
    return out


def collect(keys: list[tuple], jobs: int = 2) -> dict[tuple, Sums]:
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        return dict(ex.map(_job, keys, chunksize=1))


def best_eb(runs: dict[tuple, Sums], gpu: str, w: str, o: np.ndarray) -> tuple[float, tuple]:
    """EB's best requests/s over its stand-ins, and that run's key."""
    return max((runs[k].rate("req/s", o), k) for k in eb_keys(gpu, w))


def cells(gpu: str) -> list[tuple[str, float]]:
    """The cells fitted for a GPU: (name, measured). Names: 'sat L/O', 'v1 W', 'eb/v1 W', 'tpot v1 W' (ms)."""
    d = paperdata.data()
    out = [(f"sat {p['mu_L']}/{p['mu_O']}", p["tok_per_s"]) for p in d["v1_saturation_tok_per_s"][gpu]]
    t2 = d["table2_rps"][gpu]
    out += [(f"v1 {w}", t2[w]["v1"]) for w in TABLE2]
    out += [(f"eb/v1 {w}", 1 + t2[w]["eb_vs_v1_pct"] / 100) for w in TABLE2]
    out += [(f"tpot v1 {w}", ms["v1"]) for w, ms in paperdata.TPOT_MS.get(gpu, {}).items()]
    return out


def judged(gpu: str) -> list[tuple[str, float]]:
    """Measurements never fitted that the fitted runs also predict: 'tpot eb W' (ms)."""
    return [(f"tpot eb {w}", ms["eb"]) for w, ms in paperdata.TPOT_MS.get(gpu, {}).items()]


def predict_cell(runs: dict[tuple, Sums], gpu: str, name: str, o: np.ndarray) -> float:
    kind, _, rest = name.partition(" ")
    if kind == "sat":
        mu_l, mu_o = rest.split("/")
        return runs[sat_key(gpu, int(mu_l), int(mu_o))].rate("tok/s", o)
    if kind == "v1":
        return runs[table2_key(gpu, rest, "v1")].rate("req/s", o)
    if kind == "v0":
        return runs[table2_key(gpu, rest, "v0")].rate("req/s", o)
    if kind == "eb/v1":
        return best_eb(runs, gpu, rest, o)[0] / runs[table2_key(gpu, rest, "v1")].rate("req/s", o)
    sched, _, w = rest.partition(" ")
    key = table2_key(gpu, w, "v1") if sched == "v1" else best_eb(runs, gpu, w, o)[1]
    return runs[key].tpot_s(o) * 1e3


def upper(gpu: str) -> np.ndarray:
    c = kernel_model(gpu).costs
    fixed = {"req_s": c.beta_d, "interference": gpucost.interference_bound(gpu), "switch_s": c.alpha_p}
    return np.array([fixed.get(k, v) for k, v in UPPER.items()])


def fit_gpu(gpu: str, runs: dict[tuple, Sums], leave_out: str | None = None,
            weights: dict[str, float] | None = None) -> gpucost.Overheads:
    """The bounded fit on a GPU's cells (all of them, or all but ``leave_out``); ``weights`` (cell → factor on
    its residual, 1 by default) only to ask how far the bounds let one cell go (tools/sim_vs_paper.py)."""
    w = weights or {}
    use = [(name, m, w.get(name, 1.0)) for name, m in cells(gpu) if name != leave_out]
    hi = upper(gpu)
    sign = np.array([1, 1, 1, 1, -1.0])  # the overlap subtracts

    def resid(z: np.ndarray) -> np.ndarray:
        o = z * hi * sign
        return np.array([f * math.log(predict_cell(runs, gpu, name, o) / m) for name, m, f in use])

    sols = [least_squares(resid, np.full(len(hi), s), bounds=(0.0, 1.0), xtol=1e-10, ftol=1e-10)
            for s in (0.1, 0.5, 0.9)]
    z = min(sols, key=lambda s: s.cost).x  # the max over EB's stand-ins makes the surface piecewise: several starts
    return gpucost.Overheads(*(float(v) for v in z * hi))


def at_bound(gpu: str, o: gpucost.Overheads) -> list[str]:
    """The parameters the fit pushed to a bound (the lower bound 0 or the upper one)."""
    hi, v = upper(gpu), np.array([getattr(o, k) for k in gpucost.FIELDS])
    return [f"{k}={'max' if x >= 0.999 * h else '0'}" for k, x, h in zip(gpucost.FIELDS, v, hi, strict=True)
            if x >= 0.999 * h or x <= 1e-4 * h]


stored = gpucost.stored_overheads


def describe(o: gpucost.Overheads) -> str:
    return (f"iter_s {o.iter_s * 1e3:.2f} ms, req_s {o.req_s * 1e6:.1f} µs, φ {o.interference:.2f}, "
            f"switch_s {o.switch_s * 1e3:.1f} ms, overlap ω {o.overlap:.2f}")


def main() -> None:
    runs = collect(configurations())
    out = {"_source": "python -m ebctl.sim.paperfit --write: the simulator's GPU engine overheads, fitted to the "
                      "paper's vLLM measurements (ebctl/data/paper_measurements.json, ebctl/sim/paperdata.py) by "
                      "the procedure in ebctl/sim/paperfit.py", "gpus": {}}
    for gpu in GPUS:
        o = fit_gpu(gpu, runs)
        rows = [(name, m, predict_cell(runs, gpu, name, o.vector()), True) for name, m in cells(gpu)]
        rows += [(name, m, predict_cell(runs, gpu, name, o.vector()), False) for name, m in judged(gpu)]
        print(f"{gpu}: 5 parameters fitted on {len(cells(gpu))} cells: {describe(o)} (at a bound: "
              f"{', '.join(at_bound(gpu, o)) or 'none'})")
        for name, m, p, fitted in rows:
            print(f"  {name:<20} measured {m:>10,.3f}  {'fitted' if fitted else 'judged'} {p:>10,.3f}  "
                  f"residual {math.log(p / m):+.3f}")
        out["gpus"][gpu] = {"overheads": {k: getattr(o, k) for k in gpucost.FIELDS},
                            "cells": [{"cell": n, "measured": m, "fitted" if f else "judged": p}
                                      for n, m, p, f in rows]}
    if "--write" in sys.argv:
        path = resources.files("ebctl.data").joinpath(OVERHEADS_FILE)
        with open(str(path), "w") as f:
            json.dump(out, f, indent=1)
        print(f"written: {path}")


if __name__ == "__main__":
    main()
