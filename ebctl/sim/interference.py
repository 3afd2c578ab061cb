"""Calibrate the mixed-iteration interference φ(r) of :class:`~ebctl.sim.costs.ProfileCostModel` by simulation.

The profile's β_MB^e(r) is 1/throughput of saturated vLLM v1 runs (concurrency 2,048) at three decode
ratios. We replay those runs in the simulator: mixed batching, ``REF_MAX_RUNNING`` slots, a
``REF_TOKEN_BUDGET`` budget, the GPU's KV capacity, lengths uniform in 0.5x-1.5x of (μ_L, μ_O). In a
saturated closed loop the sequence of batches does not depend on iteration times (every decision is
token-driven), so one run per point, priced without interference, fixes the batches; the total time
of a steady window is then Σ T_linear + Σ_mixed φ(r_s)·mem_s, linear in φ's three knot values.
Three points give three equations in three unknowns; where a solution with φ ≥ 0 nondecreasing in r exists
each point's steady throughput (tokens of the requests finished in the window / the window's time) is
exactly 1/β_MB^e(r_i), else the closest such φ is taken.

Results are cached in-process and, for the shipped profiles, stored in ``CALIBRATED`` (a test recomputes
them): a fresh calibration costs a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from ebctl import model
from ebctl.protocol import Mode, Policy
from ebctl.sim.costs import REF_MAX_RUNNING, REF_TOKEN_BUDGET, Batch, Interference, ProfileCostModel
from ebctl.sim.engine import Engine, EngineConfig
from ebctl.sim.workloads import synthetic

MIX_POINTS = ((1024, 128), (512, 512), (128, 1024))  # (μ_L, μ_O) of the β_MB^e fit points: r = 0.111, 0.5, 0.889
CONCURRENCY = 2048
REQUESTS = 6000
SEED = 0

# fingerprint → (knots, values); regenerate with `python -m ebctl.sim.interference`
CALIBRATED: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # qwen3-8b/h200: -2.0%, +0.1%, -0.0%
    "c4c1d34419aecc07": (
        (0.12935084857278922, 0.40897318308419617, 0.8422636708918064),
        (0.0, 1.4004022657348638, 1.6691826001366572)),
    # qwen3-8b/rtx-pro-6000: +25.1%, -16.8%, +12.2%
    "d7b14a27d9d11f25": (
        (0.13632841749512173, 0.3676686875345091, 0.498242989237853),
        (0.12599351576319293, 0.12599351576319293, 14.895647361070177)),
}

_cache: dict[str, Interference] = {}


@dataclass
class _Recorder:
    """Prices with the base model (no interference) and keeps (T, r, mem) per iteration (mem 0: not mixed)."""

    base: ProfileCostModel
    rows: list[tuple[float, float, float]] = field(default_factory=list)
    name: str = "calibration"

    def step_time(self, batch: Batch) -> float:
        t = self.base.step_time(batch)
        n, p = batch.decode_ctx.size, batch.prefill_tokens
        if n and p:
            self.rows.append((t, n / (n + p), self.base.decode_memory(batch.decode_ctx)))
        else:
            self.rows.append((t, 0.0, 0.0))
        return t


def fingerprint(base: ProfileCostModel, kv_tokens: int) -> str:
    c = base.costs
    key = [c.alpha_p, c.beta_p, c.alpha_d, c.beta_d, c.c0, c.c1, c.c2, base.layers, base.attn_scale,
           [list(x) for x in base.decode_attention_ms], base.prefill_q, base.p_bar, kv_tokens,
           REF_MAX_RUNNING, REF_TOKEN_BUDGET, CONCURRENCY, REQUESTS, SEED]
    return hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]


def steady_window(base: ProfileCostModel, mu_l: int, mu_o: int, *, kv_tokens: int,
                  interference: Interference | None = None) -> dict[str, float | np.ndarray]:
    """Run the saturated mixed-batching replay; the steady window's tokens, times and mixed iterations.

    Window: from the iteration where a quarter of the requests have finished to the one after which the
    client has nothing left to issue (still saturated)."""
    rec = _Recorder(base.with_interference(interference))
    cfg = EngineConfig(rules="vllm", max_running=REF_MAX_RUNNING, token_budget=REF_TOKEN_BUDGET, kv_tokens=kv_tokens)
    eng = Engine(cfg, rec)
    eng.policy = Policy(mode=Mode.MB, k=1, n_max=REF_MAX_RUNNING, ttl_s=float("inf"))
    wl = synthetic(mu_l, mu_o, REQUESTS, seed=SEED)
    inp, out = wl.input_len.tolist(), wl.output_len.tolist()
    issued = outstanding = done = 0
    now = 0.0
    useful: list[int] = []  # tokens (input + output) of the requests finished in each iteration
    start = end = -1
    while issued < REQUESTS:
        while outstanding < CONCURRENCY and issued < REQUESTS:
            eng.add(inp[issued], out[issued], now)
            issued += 1
            outstanding += 1
        rep = eng.step(now)
        now = rep.wall_time
        fin = eng.last_finished
        useful.append(sum(inp[r] + out[r] for r in fin))
        done += len(fin)
        outstanding -= len(fin)
        if start < 0 and done >= REQUESTS // 4:
            start = len(useful)
    end = len(useful)
    rows = np.array(rec.rows[start:end])
    return {"tokens": float(sum(useful[start:end])), "t": rows[:, 0], "r": rows[:, 1], "mem": rows[:, 2]}


def calibrate_interference(base: ProfileCostModel, *, kv_tokens: int) -> Interference:
    """Solve φ at three knots so that each fit point's steady throughput is 1/β_MB^e(r) (module docstring).

    Knot i sits at the memory-weighted mean decode share of the mixed iterations of replay i (the r those
    iterations actually have: a KV-bound replay admits in bursts); φ between knots is linear, so each
    iteration's interference is linear in the three knot values. The 3×3 system is solved by nonnegative
    least squares under φ ≥ 0, nondecreasing in r: exact when that is feasible (H200), the closest fit
    otherwise (``steady_error`` says how close)."""
    c = base.costs
    windows = [steady_window(base, mu_l, mu_o, kv_tokens=kv_tokens) for mu_l, mu_o in MIX_POINTS]
    knots = []
    for w in windows:
        mem = w["mem"]
        knots.append(float(np.sum(mem * w["r"]) / np.sum(mem)) if np.sum(mem) > 0 else math.nan)
    if not all(math.isfinite(k) for k in knots) or len({round(k, 3) for k in knots}) < 3:
        raise ValueError(f"calibration replays gave no usable mixed iterations (knots {knots})")
    order = np.argsort(knots)
    knots_sorted = [knots[i] for i in order]
    a = np.zeros((3, 3))
    b = np.zeros(3)
    for i, ((mu_l, mu_o), w) in enumerate(zip(MIX_POINTS, windows, strict=True)):
        for j in range(3):  # hat function of knot j, flat beyond the end knots
            unit = [0.0, 0.0, 0.0]
            unit[j] = 1.0
            hat = np.interp(w["r"], knots_sorted, unit)
            a[i, j] = float(np.sum(w["mem"] * hat))
        r_w = mu_o / (mu_l + mu_o)
        b[i] = w["tokens"] * model.beta_mb_e(r_w, c.c0, c.c1, c.c2) - float(np.sum(w["t"]))
    # φ ≥ 0 and nondecreasing in r (values = cumulative sums of nonnegative steps): the exact 3×3 solve
    # oscillates when the replays' decode shares overlap (a KV-bound replay mixes at every r)
    steps, _ = nnls(a @ np.tril(np.ones((3, 3))), b)
    values = np.cumsum(steps)
    return Interference(tuple(knots_sorted), tuple(float(v) for v in values))


def interference_for(base: ProfileCostModel, *, kv_tokens: int) -> Interference:
    """The calibrated φ for this cost model and KV capacity: stored, cached, or computed now."""
    key = fingerprint(base, kv_tokens)
    if key not in _cache:
        if key in CALIBRATED:
            knots, values = CALIBRATED[key]
            _cache[key] = Interference(tuple(knots), tuple(values))
        else:
            _cache[key] = calibrate_interference(base, kv_tokens=kv_tokens)
    return _cache[key]


def steady_error(base: ProfileCostModel, interference: Interference, *, kv_tokens: int) -> list[float]:
    """Replayed steady throughput / (1/β_MB^e(r)) − 1 at each fit point, with this φ."""
    c = base.costs
    out = []
    for mu_l, mu_o in MIX_POINTS:
        w = steady_window(base, mu_l, mu_o, kv_tokens=kv_tokens, interference=interference)
        r_w = mu_o / (mu_l + mu_o)
        out.append(float(w["tokens"] / np.sum(w["t"]) * model.beta_mb_e(r_w, c.c0, c.c1, c.c2) - 1.0))
    return out


def _main() -> None:
    from ebctl import profiles
    from ebctl.sim import hardware

    for name, prof in sorted(profiles.builtin().items()):
        if not prof.costs.has_mixed:
            continue
        base = ProfileCostModel.from_profile(prof, calibrate=False)
        kv = hardware.kv_capacity_tokens(prof.model, prof.gpu)
        f = calibrate_interference(base, kv_tokens=kv)
        err = ", ".join(f"{e:+.1%}" for e in steady_error(base, f, kv_tokens=kv))
        print(f'    "{fingerprint(base, kv)}": ({f.knots!r}, {f.values!r}),  # {name}: {err}')


if __name__ == "__main__":
    _main()
