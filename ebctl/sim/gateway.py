"""smg's routing of one request over N sglang workers: ``round_robin`` and ``least_load``, behind smg's overload veto.

smg (Shepherd Model Gateway, SGLang's gateway; ``tools/smg_env.sh`` installs 1.13.0) routes each request as it
arrives, from what it polled last; this module is that decision and nothing else. Pure: the polled loads, the
gateway's live in-flight counts and a uniform draw for ties come in as arguments, a frozen :class:`Gateway`
record is the whole state, and :func:`poll` and :func:`route` return a new one. No I/O, no clock.

Sources. Line numbers are smg-project/smg's main branch before the 1.13.0 release; a later ``least_load.rs`` scores
exactly as below and differs only for a worker that has no report while others do, which never happens here (every
poll reaches every worker). The 1.13.0 wheel is newer than that source; its Python launcher (``smg/router_args.py``
of the wheel: ``load_monitor_interval`` :88, ``least_load_*`` :97-99 and :254, ``worker_overload_*`` :269-275 and
:316, their help :739-804) gives the defaults used here (those of least_load.rs:13-25 and config/types.rs:329-331
among them) and describes the overload veto that 1.13.0 turns on by default (off by default in that source, where a
fleet with every worker over the thresholds was refused, not steered).

* **Polling** (``model_gateway/src/worker/monitor.rs``): one ``tokio::time::interval`` per worker group, whose
  first tick fires at once (:886-889), every ``--load-monitor-interval`` seconds (``RouterArgs.load_monitor_interval
  = 10``; ``config/types.rs:329-331``; floored at 1 s, ``monitor.rs:274``), fetches every Ready worker's
  ``GET /v1/loads`` and hands them to the load-aware policies (``policy.update_loads``, :1021-1023). Between
  polls a policy sees the last answer: the loads are stale by up to one interval. Modelled: polls at t = 0,
  P, 2P, ..., each answer taken at the poll time (the fetch's round trip, milliseconds, is not modelled).
* **What a worker reports** (``crates/protocols/src/worker.rs:1259-1345``, ``SchedulerLoadSnapshot`` and
  ``WorkerLoadResponse``): per DP rank ``num_waiting_reqs``, ``num_waiting_uncached_tokens``, ``token_usage``
  (KV used / KV capacity), ``gen_throughput``; a worker's figure is the sum over its ranks, the token usage
  their mean (:1303-1345). One rank per worker here: :class:`WorkerLoad` holds those four numbers.
* **The overload veto** (on by default in 1.13.0: ``router_args.py`` ``worker_overload_waiting_requests = 8``,
  ``worker_overload_token_usage = 0.8``, ``worker_overload_protection = True``): at each poll a worker whose
  report has ``waiting_reqs ≥ 8`` or ``token_usage ≥ 0.8`` is flagged overloaded (``worker/overload.rs:83-95``
  ``is_overloaded``, evaluated once per report in ``monitor.rs:972-978``) until the next poll. A flagged worker
  is not ``is_available()`` (``worker/worker.rs:462-464``), and the HTTP router filters on that before asking
  the policy (``routers/http/router.rs:248-252``): the policy chooses among the others. When every worker is
  flagged, 1.13.0 sends the request to the least-loaded one by the gateway's own live in-flight count
  (``worker.load()``, requests dispatched and not yet answered), ties drawn uniformly, without asking the policy
  (``routers/common/overload.rs`` ``fallback_if_all_vetoed`` and ``least_loaded_uniform``, newer than that source;
  the 1.13.0 help text of ``--worker-overload-waiting-requests`` says the same:
  "when every worker is over them the request goes to the least-loaded one"). Turn the veto off
  with ``overload_waiting_reqs = overload_token_usage = None`` (``--disable-worker-overload-protection``).
* **round_robin** (``model_gateway/src/policies/round_robin.rs:27-44``): an atomic counter, the
  ``counter % len``-th of the available workers; the counter moves once per request the policy is asked about.
* **least_load** (``model_gateway/src/policies/least_load.rs``): the argmin over the available workers of

      score_i = (queued_tokens_i + inflight_tokens_i) / throughput_i + kv_pressure_weight · k_i / (1 − k_i)

  (:181-214). ``queued_tokens`` is the report's ``num_waiting_uncached_tokens``, or ``waiting_reqs × p̄`` when
  that is 0 (:225-231); ``throughput`` its ``gen_throughput``, or ``default_throughput`` (2,000 tok/s) when that
  is 0 (:194-199); ``k`` the token usage clamped to [0, 0.999] (:200); ``kv_pressure_weight`` 0.15 s and
  ``p̄ = mean_prefill_tokens`` 1,024 (:13-25; ``router_args.py`` ``least_load_*``). ``inflight_tokens`` is the
  token-work this gateway has sent the worker since its last poll: each selection credits the winner with the
  request's prompt length when the router knows its tokens (gRPC, or ``input_ids`` over HTTP), else with p̄
  (:235-239, :352-357); a poll resets the credit of every worker it covers (:388-399). Equal scores are drawn
  uniformly (reservoir sampling, :317-350). With a single available worker the policy returns it at once,
  crediting nothing (:377-380). Before any poll (the whole fleet dark) the score is the live in-flight count,
  join-shortest-queue (:210-212); the first poll comes at t = 0, so a fleet is dark only in a test.

Not modelled: the per-worker waiting-queue cap of ``least_load`` (``max_waiting_requests``, default 0 = off),
shedding (``--worker-overload-shed``, off by default), the liveness vetoes (a worker silent or without tokens for
seconds: a simulated engine never is), health checks and circuit breakers (every worker healthy), retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

POLICIES = ("round_robin", "least_load")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's answer to ``GET /v1/loads``, the fields smg's routing reads (one DP rank)."""

    waiting_reqs: int = 0  # num_waiting_reqs
    waiting_uncached_tokens: int = 0  # num_waiting_uncached_tokens: prompt tokens still to prefill
    token_usage: float = 0.0  # KV tokens used / KV capacity
    gen_throughput: float = 0.0  # output tokens/s over sglang's last decode-stats window


@dataclass(frozen=True, slots=True)
class GatewayParams:
    """smg 1.13.0's launch settings that routing reads, at its defaults (``smg/router_args.py``)."""

    policy: str = "least_load"  # --policy
    poll_interval_s: int = 10  # --load-monitor-interval (whole seconds, >= 1)
    kv_pressure_weight: float = 0.15  # --least-load-kv-pressure-weight (s)
    default_throughput: float = 2000.0  # --least-load-default-throughput (tok/s)
    mean_prefill_tokens: int = 1024  # --least-load-mean-prefill-tokens (p̄)
    tokens_known: bool = False  # the router sees the prompt's tokens (gRPC; input_ids): credit its length, not p̄
    overload_waiting_reqs: int | None = 8  # --worker-overload-waiting-requests (None: that signal off)
    overload_token_usage: float | None = 0.8  # --worker-overload-token-usage (None: that signal off)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: must be one of {', '.join(POLICIES)}")
        if int(self.poll_interval_s) != self.poll_interval_s or self.poll_interval_s < 1:
            raise ValueError(f"poll_interval_s={self.poll_interval_s}: whole seconds, >= 1 (smg's u64 seconds)")
        if not self.kv_pressure_weight >= 0 or not self.default_throughput > 0 or self.mean_prefill_tokens < 1:
            raise ValueError("kv_pressure_weight >= 0, default_throughput > 0 and mean_prefill_tokens >= 1")
        if self.overload_waiting_reqs is not None and self.overload_waiting_reqs < 1:
            raise ValueError(f"overload_waiting_reqs={self.overload_waiting_reqs}: >= 1 (0 would veto every worker)")
        if self.overload_token_usage is not None and not 0.0 < self.overload_token_usage <= 1.0:
            raise ValueError(f"overload_token_usage={self.overload_token_usage}: in (0, 1]")

    @property
    def protection(self) -> bool:
        """Whether the overload veto is on (either signal set)."""
        return self.overload_waiting_reqs is not None or self.overload_token_usage is not None


class Terms(NamedTuple):
    """A worker's score terms from its last report: score = (queued + credit) / throughput + kv."""

    queued: float
    throughput: float
    kv: float


@dataclass(frozen=True, slots=True)
class Gateway:
    """The gateway's routing state over ``n`` workers (index = the worker's place in the registry)."""

    credit: tuple[int, ...]  # least_load: token-work sent to each worker since its last poll
    overloaded: tuple[bool, ...]  # the veto from each worker's last report
    terms: tuple[Terms, ...] | None = None  # least_load: each worker's score terms; None before the first poll
    counter: int = 0  # round_robin's counter
    polls: int = 0

    @property
    def n(self) -> int:
        return len(self.credit)


class Route(NamedTuple):
    worker: int
    fallback: bool  # every worker was vetoed: the least live in-flight took it, the policy was not asked


def start(n: int) -> Gateway:
    """A gateway over ``n`` workers that has polled none of them yet."""
    if n < 1:
        raise ValueError(f"n={n}: a gateway needs at least one worker")
    return Gateway(credit=(0,) * n, overloaded=(False,) * n)


def overloaded(params: GatewayParams, load: WorkerLoad) -> bool:
    """``OverloadThresholds::is_overloaded`` (worker/overload.rs:83-95): either signal at or above its threshold."""
    if params.overload_waiting_reqs is not None and load.waiting_reqs >= params.overload_waiting_reqs:
        return True
    return params.overload_token_usage is not None and load.token_usage >= params.overload_token_usage


def terms(params: GatewayParams, load: WorkerLoad) -> Terms:
    """least_load's score terms of one report (least_load.rs:191-203, :225-231)."""
    queued = (float(load.waiting_uncached_tokens) if load.waiting_uncached_tokens > 0
              else max(load.waiting_reqs, 0) * float(params.mean_prefill_tokens))
    tp = load.gen_throughput if load.gen_throughput > 0 else params.default_throughput
    k = min(max(load.token_usage, 0.0), 0.999)
    return Terms(queued, tp, params.kv_pressure_weight * k / (1.0 - k))


def score(params: GatewayParams, load: WorkerLoad, credit: int) -> float:
    """least_load's expected wait of a worker that reported ``load`` and was sent ``credit`` tokens since."""
    t = terms(params, load)
    return (t.queued + credit) / t.throughput + t.kv


def poll(params: GatewayParams, gw: Gateway, loads: Sequence[WorkerLoad]) -> Gateway:
    """A poll answered by every worker: the new loads (least_load's terms), the veto flags, the since-poll
    credits reset (least_load.rs:388-399; monitor.rs:972-978, :1021-1023)."""
    if len(loads) != gw.n:
        raise ValueError(f"{len(loads)} loads for {gw.n} workers")
    flags = tuple(overloaded(params, x) for x in loads) if params.protection else (False,) * gw.n
    return replace(gw, credit=(0,) * gw.n, overloaded=flags, terms=tuple(terms(params, x) for x in loads),
                   polls=gw.polls + 1)


def _pick(ties: Sequence[int], u: float) -> int:
    """One of ``ties`` drawn uniformly by ``u`` in [0, 1)."""
    return ties[min(int(u * len(ties)), len(ties) - 1)]


def least_loaded(live: Sequence[int], candidates: Sequence[int], u: float) -> int:
    """The candidate with the fewest live in-flight requests, ties drawn by ``u`` (``least_loaded_uniform``)."""
    low = min(live[i] for i in candidates)
    return _pick([i for i in candidates if live[i] == low], u)


def route(params: GatewayParams, gw: Gateway, *, prompt_tokens: int, live: Sequence[int],
          u: float) -> tuple[Route, Gateway]:
    """Where one request goes and the gateway after it. ``prompt_tokens``: its prompt's length (credited only when
    ``params.tokens_known``); ``live``: each worker's requests in flight (sent, not yet answered); ``u``: a uniform
    draw in [0, 1) that breaks ties."""
    available = [i for i, flag in enumerate(gw.overloaded) if not flag]
    if not available:
        return Route(least_loaded(live, range(gw.n), u), True), gw
    if params.policy == "round_robin":
        return Route(available[gw.counter % len(available)], False), replace(gw, counter=gw.counter + 1)
    if len(available) == 1:
        return Route(available[0], False), gw
    if gw.terms is None:
        scores = [float(live[i]) for i in available]
    else:
        t, c = gw.terms, gw.credit
        scores = [(t[i].queued + c[i]) / t[i].throughput + t[i].kv for i in available]
    low = min(scores)
    best = _pick([i for i, s in zip(available, scores, strict=True) if s == low], u)
    credit = list(gw.credit)
    credit[best] += prompt_tokens if params.tokens_known else params.mean_prefill_tokens
    return Route(best, False), replace(gw, credit=tuple(credit))
