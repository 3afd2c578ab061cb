"""A fleet: N simulated sglang engines behind smg's gateway, on one simulated clock.

Each instance is the engine ``ebctl simulate`` runs (``ebctl.sim.rules.make_engine``) under a policy source of its
own (``ebctl.sim.policies.make``: ``v0`` is stock sglang, ``default`` ebctl's controller exactly as a default install
configures it, one controller per server), driven as ``ebctl.sim.runner`` drives one: the source gives the policy,
the engine steps, the source observes the report. The gateway's rules are ``ebctl.sim.gateway``'s; this module
is the event loop around them and what each server answers to a poll.

Events, in time order (at one instant: a poll, then arrivals, then iterations): a gateway poll every
``poll_interval_s`` from t = 0, reading every server's state as it stands (a server mid-iteration answers with
its state at that iteration's end: sglang answers a load inquiry between iterations); an arrival, routed at
once and queued at its server, which starts an iteration then if it was idle; an iteration, which runs whole
(``Engine.step``) and schedules the server's next one at its end while it has work. Requests routed to a server
during an iteration wait for the next one, as they do in sglang's receive loop. Deterministic: the same inputs
and seed give the same run.

The run stops at ``horizon_s``: no arrival, poll or iteration starts at or after it; what finished by then
counts (:func:`summarize`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from ebctl.protocol import BatchKind, IterationReport
from ebctl.sim import gateway as gw
from ebctl.sim import policies
from ebctl.sim.costs import CostModel
from ebctl.sim.engine import Engine, EngineConfig
from ebctl.sim.rules import make_engine

# sglang 0.5.23's metrics reporter (srt/managers/scheduler_components/metrics_reporter.py)
DECODE_LOG_INTERVAL = 40  # decode_log_interval (srt/arg_groups/fields/observability.py:136-139)
GEN_THROUGHPUT_STALE_S = 30.0  # GEN_THROUGHPUT_STALENESS_SECONDS (metrics_reporter.py:70-74)

Progress = Callable[[float, float], None]


class Meter(NamedTuple):
    """sglang's ``gen_throughput``: at every ``decode_log_interval``-th decode batch, the tokens those decode
    batches made over the time since the previous such tick (``report_decode_stats``, metrics_reporter.py:933-946;
    its counters move in ``process_batch_result_decode``, batch_result_processor.py:983-984 and :1102-1104).
    Prefill and mixed batches (``is_extend``, scheduler.py:5091-5099) neither count nor tick; the window's time
    includes them. Exported as 0 once no tick came for 30 s (``_current_gen_throughput``, :266-274)."""

    decodes: int = 0  # decode batches since the engine started
    tokens: int = 0  # tokens of the decode batches since the last tick
    tic: float = 0.0  # the last tick (the engine's start before the first)
    value: float = 0.0  # last_gen_throughput


def meter_step(m: Meter, report: IterationReport) -> Meter:
    """The meter after one iteration (its report: kind, decode rows, end time)."""
    if report.kind is not BatchKind.DECODE:
        return m
    decodes, tokens = m.decodes + 1, m.tokens + report.decode_reqs
    if decodes % DECODE_LOG_INTERVAL:
        return m._replace(decodes=decodes, tokens=tokens)
    gap = report.wall_time - m.tic
    return Meter(decodes, 0, report.wall_time, tokens / gap if gap > 0 else m.value)


def meter_read(m: Meter, now: float) -> float:
    """``gen_throughput`` as ``/v1/loads`` reports it at ``now`` (rounded to 0.01, load_inquirer.py:244)."""
    return 0.0 if now - m.tic > GEN_THROUGHPUT_STALE_S else round(m.value, 2)


def load_report(eng: Engine, meter: Meter, now: float) -> gw.WorkerLoad:
    """What sglang 0.5.23 answers to ``GET /v1/loads`` (``LoadInquirer.get_loads``, load_inquirer.py:109-260)
    for the simulated engine: its waiting queue; the prompt tokens still to prefill, each waiting request's
    ``seqlen`` (prompt plus tokens made before a retraction) and the rest of the chunked request
    (``get_num_waiting_uncached_tokens``, :82-107; the simulator has no prefix cache, so none is cached); KV
    used over KV capacity (``token_usage``, :142-144, rounded to 4 places, :243); ``gen_throughput``."""
    req = eng.req
    waiting = sum(req.input_len[r] + req.generated[r] for r in eng.queue) + sum(eng.pf_left)
    return gw.WorkerLoad(waiting_reqs=len(eng.queue), waiting_uncached_tokens=int(waiting),
                         token_usage=round(eng.kv_used / (eng.total_blocks * eng.page), 4),
                         gen_throughput=meter_read(meter, now))


@dataclass(frozen=True)
class FleetConfig:
    instances: int = 8
    servers: str = "v0"  # every server's policy (ebctl.sim.policies names): "v0" stock, "default" ebctl's own
    gateway: gw.GatewayParams = field(default_factory=gw.GatewayParams)
    engine: EngineConfig = field(default_factory=EngineConfig)
    horizon_s: float = 300.0  # simulated wall time
    seed: int = 0  # the gateway's tie-breaking draws

    def __post_init__(self) -> None:
        if self.instances < 1 or not self.horizon_s > 0:
            raise ValueError(f"FleetConfig: instances={self.instances} (>= 1), horizon_s={self.horizon_s} (> 0)")


class Instance:
    """One server: its engine, its policy source, its ``gen_throughput`` meter, and the gateway's counts of it."""

    def __init__(self, i: int, cfg: FleetConfig, cost_model: CostModel) -> None:
        e = replace(cfg.engine, engine_id=f"sim{i}")
        self.source = policies.make(cfg.servers, max_running=e.max_running, kv_tokens=e.kv_tokens,
                                    engine_id=e.engine_id)
        self.engine = make_engine(replace(e, **self.source.engine) if self.source.engine else e, cost_model)
        self.meter = Meter()
        self.routed = 0  # requests the gateway sent here
        self.answered = 0  # of them, finished (the gateway's live in-flight: routed − answered)
        self.scheduled = False  # an iteration is due (in the event heap)
        self.tokens_by_horizon = 0  # output tokens made by iterations that ended by the horizon
        self.idle_steps = 0

    def step(self, now: float, horizon: float) -> IterationReport:
        eng, src = self.engine, self.source
        eng.policy = src.policy(now)
        rep = eng.step(now)
        src.observe(rep)
        self.meter = meter_step(self.meter, rep)
        self.answered += len(eng.last_finished)
        if rep.wall_time <= horizon:
            self.tokens_by_horizon = eng.tokens_out
        return rep


def poisson(rate: float, horizon_s: float, *, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second on [0, horizon_s) (seeded)."""
    if not rate > 0 or not horizon_s > 0:
        raise ValueError(f"poisson: rate={rate} (> 0), horizon_s={horizon_s} (> 0)")
    rng = np.random.default_rng(seed)
    n = int(rate * horizon_s + 10 * math.sqrt(rate * horizon_s) + 10)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while t[-1] < horizon_s:  # not reached in practice: ten standard deviations of room
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
    return t[t < horizon_s]


def run(arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, cfg: FleetConfig,
        cost_model: CostModel, *, progress: Progress | None = None) -> dict[str, Any]:
    """Every request through the gateway onto the fleet until ``cfg.horizon_s``; :func:`summarize`'s metrics.
    ``progress(now, horizon)`` is called about once per simulated second."""
    if not (arrival_s.shape == input_len.shape == output_len.shape) or arrival_s.ndim != 1:
        raise ValueError("arrival_s, input_len, output_len: 1-d arrays of one length")
    if arrival_s.size and (np.any(np.diff(arrival_s) < 0) or arrival_s[0] < 0):
        raise ValueError("arrival times must be sorted and >= 0")
    wall0 = time.perf_counter()
    horizon, params = cfg.horizon_s, cfg.gateway
    insts = [Instance(i, cfg, cost_model) for i in range(cfg.instances)]
    state = gw.start(cfg.instances)
    rng = np.random.default_rng(cfg.seed)
    arrivals, ins, outs = arrival_s.tolist(), input_len.tolist(), output_len.tolist()
    n = sum(1 for a in arrivals if a < horizon)
    draws = rng.random(n).tolist()
    where = [-1] * n  # the worker each request went to
    fallbacks = 0
    polled: list[tuple[list[float], list[int], int]] = []  # per poll: each server's gen_throughput, the requests
    # each got until the next poll, and how many the poll vetoed
    steps: list[tuple[float, int]] = []  # (start of a server's next iteration, server)
    next_poll, j, tick = 0.0, 0, 1.0

    while True:
        t_step = steps[0][0] if steps else math.inf
        t_arr = arrivals[j] if j < n else math.inf
        t_poll = next_poll if next_poll < horizon else math.inf
        now = min(t_step, t_arr, t_poll)
        if now >= horizon:
            break
        if progress is not None and now >= tick:
            progress(now, horizon)
            tick = math.floor(now) + 1.0
        if t_poll <= now:
            loads = [load_report(x.engine, x.meter, now) for x in insts]
            state = gw.poll(params, state, loads)
            polled.append(([x.gen_throughput for x in loads], [0] * cfg.instances, sum(state.overloaded)))
            next_poll += params.poll_interval_s
        elif t_arr <= now:
            r, state = gw.route(params, state, prompt_tokens=ins[j], live=[x.routed - x.answered for x in insts],
                                u=draws[j])
            inst = insts[r.worker]
            inst.engine.add(ins[j], outs[j], now)
            inst.routed += 1
            where[j], fallbacks = r.worker, fallbacks + r.fallback
            polled[-1][1][r.worker] += 1
            if not inst.scheduled:
                inst.scheduled = True
                heapq.heappush(steps, (now, r.worker))
            j += 1
        else:
            _, i = heapq.heappop(steps)
            inst = insts[i]
            rep = inst.step(now, horizon)
            idle = rep.kind is BatchKind.IDLE and not inst.engine.last_finished
            inst.idle_steps = inst.idle_steps + 1 if idle else 0
            if inst.engine.busy and inst.idle_steps <= 2:
                heapq.heappush(steps, (rep.wall_time, i))
            else:
                inst.scheduled = False  # idle, or stalled (counted in summarize): the next arrival wakes it
    return summarize(insts, cfg, where=where, fallbacks=fallbacks, polled=polled,
                     sim_wall_s=time.perf_counter() - wall0)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else math.nan


def _tp_share_corr(polled: list[tuple[list[float], list[int], int]]) -> float:
    """Pearson's r, over (poll, server) pairs after the first poll, between a server's share of the fleet's
    reported ``gen_throughput`` at a poll and its share of the requests routed until the next poll (nan when
    either does not vary)."""
    xs, ys = [], []
    for tp, got, _ in polled[1:]:
        if sum(tp) > 0 and sum(got) > 0:
            xs += [x / sum(tp) for x in tp]
            ys += [y / sum(got) for y in got]
    if len(xs) < 3 or np.std(xs) == 0 or np.std(ys) == 0:
        return math.nan
    return float(np.corrcoef(xs, ys)[0, 1])


def summarize(insts: list[Instance], cfg: FleetConfig, *, where: list[int], fallbacks: int,
              polled: list[tuple[list[float], list[int], int]], sim_wall_s: float) -> dict[str, Any]:
    """The fleet's figures over [0, horizon): output tokens/s (tokens made by iterations ending by the horizon,
    over it), completed requests (finished by it), TTFT p50/p99 over every request that arrived (one still
    without a first token at the horizon counts its wait so far: a lower bound, and the count of such is
    ``no_first_token``), TPOT p99 over the completed requests with more than one output token, the share of
    requests routed by the all-vetoed fallback, the servers the overload veto flagged per poll (mean, most),
    the fewest and the most requests one server got over the mean, how closely each server's share of the
    requests followed its share of the reported ``gen_throughput`` (:func:`_tp_share_corr`), and the
    controllers' modes at the horizon."""
    horizon = cfg.horizon_s
    req = [x.engine.req.arrays() for x in insts]
    arrival = np.concatenate([r["arrival"] for r in req])
    first = np.concatenate([r["first_token"] for r in req])
    finish = np.concatenate([r["finish"] for r in req])
    out = np.concatenate([r["output_len"] for r in req])
    started = np.isfinite(first) & (first <= horizon)
    ttft = np.where(started, first - arrival, horizon - arrival)
    done = np.isfinite(finish) & (finish <= horizon)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = (finish - first) / (out - 1)
    tpot = tpot[done & (out > 1)]
    routed = np.array([x.routed for x in insts], dtype=np.float64)
    modes: dict[str, int] = {}
    for x in insts:
        ctl = getattr(x.source, "controller", None)
        mode = str(ctl.policy.mode) if ctl is not None else x.source.name
        modes[mode] = modes.get(mode, 0) + 1
    tokens = sum(x.tokens_by_horizon for x in insts)
    return {
        "instances": cfg.instances, "servers": cfg.servers, "policy": cfg.gateway.policy, "horizon_s": horizon,
        "arrived": len(where), "routed": int(routed.sum()), "completed": int(done.sum()),
        "no_first_token": int((~started).sum()), "output_tok_s": tokens / horizon,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99), "tpot_p99_s": _pct(tpot, 99),
        "fallback_frac": fallbacks / len(where) if where else 0.0,
        "routed_max": float(routed.max() / routed.mean()) if routed.sum() else 1.0,
        "routed_min": float(routed.min() / routed.mean()) if routed.sum() else 1.0,
        "vetoed_mean": float(np.mean([v for *_, v in polled])) if polled else 0.0,
        "vetoed_max": max((v for *_, v in polled), default=0), "polls": len(polled),
        "tp_share_corr": _tp_share_corr(polled),
        "stalled": sum(1 for x in insts if x.engine.busy and not x.scheduled),
        "modes": modes, "where": where, "sim_wall_s": sim_wall_s,
    }
