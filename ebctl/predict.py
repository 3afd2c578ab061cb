"""The model's ranking of the tuner's arms: each arm run on the project's engine simulator over the requests the
engine actually served, with the costs in use, every arm on the same requests.

The controller asks (:class:`Sample`: the recent requests' lengths, the engine's slots, KV cache, prefill chunk and
whether it mixes on its own, the concurrency it saw, the arms with their numbers); whoever runs it (the daemon's
worker process, the simulator's policy source) calls :func:`predict` with a cost model
(``ebctl.sim.costs.build`` of the profile, or the online fits as an ``IterationCostModel``) and hands the
:class:`Prediction` s back. Each arm is a closed loop at the sample's concurrency over the sample's requests in
their order, repeated to ``Sample.requests``, on sglang's rules (``ebctl.sim.rules_sglang``); what is read is
the steady state (requests finishing between the 20th and 80th percentile finish times,
``ebctl.sim.metrics``), and the TTFT and TPOT p99 over the requests of that steady span.

Pure and deterministic: the same sample and costs give the same predictions; no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ebctl import slo
from ebctl.protocol import Mode, Policy

MAX_REQUESTS = 4000  # requests simulated per arm at most (the daemon's budget: docs/benchmarks.md)
STEPS_PER_ARM = 20_000  # ... and about this many decode steps per arm: a small batch runs many steps per request


def requests_for(concurrency: int, slots: int, mean_output: float) -> int:
    """Requests to simulate per arm: about ``STEPS_PER_ARM`` decode steps of min(concurrency, slots) rows, at least
    three batches' turnover, at most ``MAX_REQUESTS`` (and at least twice the concurrency, up to twice that)."""
    batch = max(min(concurrency, slots), 1)
    by_steps = int(STEPS_PER_ARM * batch / max(mean_output, 1.0))
    return max(min(by_steps, MAX_REQUESTS), min(2 * concurrency, 2 * MAX_REQUESTS), 3 * batch, 50)


@dataclass(frozen=True, slots=True)
class ArmSpec:
    """One arm as the engine would run it: the tuner's name and the policy's numbers."""

    name: str  # the tuner's arm ("stock", "mb", "eb@7", "pdi@8")
    mode: Mode  # OFF: the engine's own rule (stock, pdi)
    k: int = 1
    n: int = 0  # EB's batch cap N (0: the engine's limit)
    kv: float = 0.0  # EB's KV reserve share
    pd_interval: int = 0  # sglang's --prefill-decode-interval under this arm (0: none)

    def policy(self, limit: int) -> Policy | None:
        """The policy the engine applies for this arm (None: stock, no policy)."""
        if self.mode is Mode.OFF and not self.pd_interval:
            return None
        return Policy(engine_id="predict", version=1, mode=self.mode, k=self.k, n_max=self.n or limit,
                      kv_reserve_frac=self.kv, max_defer_s=math.inf, pd_interval=self.pd_interval)


@dataclass(frozen=True, slots=True)
class Sample:
    """What the controller hands the model: the requests to run and the engine to run them on."""

    inputs: tuple[int, ...]  # the recent completions' prompt lengths, in the order they finished
    outputs: tuple[int, ...]  # ... and their output lengths
    concurrency: int  # requests in the engine and its queue (a closed loop of this many)
    slots: int  # the engine's limit on running requests
    kv_tokens: int
    token_budget: int  # the largest prefill batch the engine was seen to run (its chunk)
    mixed_chunk: bool  # the engine mixes on its own (launched with --enable-mixed-chunk)
    arms: tuple[ArmSpec, ...]
    requests: int = MAX_REQUESTS  # per arm
    slo_ttft_s: float = 0.0  # the operator's targets (0: none): goodput is predicted too
    slo_tpot_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.inputs or len(self.inputs) != len(self.outputs):
            raise ValueError(f"a sample needs as many inputs as outputs, at least one "
                             f"({len(self.inputs)}, {len(self.outputs)})")
        if min(self.concurrency, self.slots, self.kv_tokens, self.token_budget, self.requests) < 1:
            raise ValueError(f"concurrency, slots, kv_tokens, token_budget and requests must be >= 1: {self}")


@dataclass(frozen=True, slots=True)
class Prediction:
    """An arm's predicted steady state on the sample."""

    arm: str
    tok_s: float  # output tokens/s
    ttft_p99_s: float
    tpot_p99_s: float
    goodput_tok_s: float  # output tokens/s of the requests within every target (= tok_s without targets)
    sim_s: float  # the simulated seconds it took (the sample's span under this arm)


def predict(sample: Sample, cost_model: object) -> tuple[Prediction, ...]:
    """Every arm of ``sample`` on the simulator with ``cost_model`` (an ``ebctl.sim.costs.CostModel``)."""
    from ebctl.sim.engine import EngineConfig
    from ebctl.sim.policies import Fixed, Stock
    from ebctl.sim.runner import Slo, run
    from ebctl.sim.workloads import Workload

    reps = math.ceil(sample.requests / len(sample.inputs))
    inputs = np.tile(np.asarray(sample.inputs, dtype=np.int64), reps)[:sample.requests]
    outputs = np.tile(np.asarray(sample.outputs, dtype=np.int64), reps)[:sample.requests]
    work = Workload("sample", np.maximum(inputs, 1), np.maximum(outputs, 1))
    kv = max(sample.kv_tokens, int(inputs.max() + outputs.max()) + 1)  # the engine held these requests
    base = EngineConfig(max_running=sample.slots, kv_tokens=kv, token_budget=sample.token_budget,
                        max_prefill_tokens=max(sample.token_budget, 16384), mixed_chunk=sample.mixed_chunk,
                        engine_id="predict")
    targets = sample.slo_ttft_s > 0 or sample.slo_tpot_s > 0
    slo = Slo(ttft_s=sample.slo_ttft_s or math.inf, tpot_s=sample.slo_tpot_s or math.inf)
    out = []
    for arm in sample.arms:
        pol = arm.policy(sample.slots)
        src = Stock(name=arm.name) if pol is None else Fixed(arm.name, pol)
        res = run(work, src, cost_model, base, concurrency=sample.concurrency, slo=slo, keep_engine=True)
        req = res["_engine"].req.arrays()
        ttft, tpot, share = _steady(req, slo)
        tok = float(res["steady_tok_per_s"])
        good = tok * share if targets else tok
        out.append(Prediction(arm.name, tok, ttft, tpot, good, float(res["makespan_s"])))
    return tuple(out)


def _steady(req: dict[str, np.ndarray], slo: object) -> tuple[float, float, float]:
    """Of the requests finishing in the steady span (20th-80th percentile finish times, as ``ebctl.sim.metrics``
    reads the steady throughput): TTFT p99, TPOT p99 (outputs of more than one token), and the share of their
    output tokens whose request met every target (``ebctl.slo``'s rule: a one-token output meets TPOT)."""
    finish, first, arrival, out = req["finish"], req["first_token"], req["arrival"], req["output_len"]
    ok = np.isfinite(finish)
    if np.count_nonzero(ok) < 10:
        return math.nan, math.nan, 0.0
    ta, tb = np.percentile(finish[ok], [20, 80])
    sel = ok & (finish > ta) & (finish <= tb)
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft = first - arrival
        tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0)
    within = sel & (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
    share = float(out[within].sum() / max(out[sel].sum(), 1))
    return _p99(ttft[sel]), _p99(tpot[sel & (out > 1)]), share


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99)) if x.size else math.nan


def cost_model(profile_model: object | None, iteration_costs: object | None) -> object:
    """The cost model a request names: the online fits' (an ``IterationCosts``) where given, else the profile's
    (``ebctl.sim.costs.build``); ValueError where neither is."""
    if iteration_costs is not None:
        from ebctl.sim.costs import IterationCostModel
        return IterationCostModel(iteration_costs)  # type: ignore[arg-type]
    if profile_model is None:
        raise ValueError("no costs to predict with: neither a profile nor online fits that passed")
    return profile_model


def gains(preds: tuple[Prediction, ...], *, against: str, goodput: bool = False) -> dict[str, float]:
    """Each arm's predicted ln ratio to the arm ``against``: of throughput, or with ``goodput`` of what the tuner
    compares windows by under targets (``slo.value``: the rate × the share within them, at least ``slo.FLOOR``, so
    that an arm meeting none does not make every ratio to it unbounded); NaN where either is not positive."""
    by = {p.arm: (slo.value(p.tok_s, p.goodput_tok_s / p.tok_s if p.tok_s > 0 else math.nan) if goodput else p.tok_s)
          for p in preds}
    ref = by.get(against, math.nan)
    return {a: math.log(v / ref) if v > 0 and ref > 0 else math.nan for a, v in by.items()}
