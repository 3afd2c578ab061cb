"""Iteration-time models: what one engine iteration costs, given what it holds.

A cost model is anything with ``step_time(batch) -> seconds`` (:class:`CostModel`). Three ship, and
:func:`build` picks one for a profile:

* :class:`ebctl.sim.gpucost.EngineCostModel` (the default for a GPU profile): the measured kernels plus
  the engine overheads every iteration pays, one formula for every kind (its module says which);
* :class:`IterationCostModel`: the project's shared per-kind model (``ebctl.costmodel.IterationCosts``),
  what a profile calibrated on a real engine carries (``ebctl.calibrate``);
* :class:`LinearCostModel`, the paper's model as written (section 3.1): prefill α_p + β_p·tokens,
  decode α_d + β_d·n whatever the context. The theory checks use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np

from ebctl import model
from ebctl.costmodel import IterationCosts
from ebctl.profiles import Profile
from ebctl.sim import gpucost
from ebctl.sim.batch import Batch

__all__ = ["Batch", "CostModel", "IterationCostModel", "LinearCostModel", "build", "describe"]


class CostModel(Protocol):
    name: str

    def step_time(self, batch: Batch) -> float:
        """Seconds one iteration with this batch takes (0 for an empty batch)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearCostModel:
    """The paper's linear model (section 3.1), context-blind: prefill α_p + β_p·Σ tokens, decode α_d + β_d·n.
    A mixed iteration streams the weights once: α_d + β_p·tokens + β_d·n (the sum of the two exclusive
    costs minus α_p), with no interference."""

    costs: model.Costs
    name: str = "linear"

    def step_time(self, batch: Batch) -> float:
        c, p, d = self.costs, batch.prefill_tokens, batch.decode_ctx.size
        if p and d:
            return c.alpha_d + c.beta_p * p + c.beta_d * d
        if p:
            return c.alpha_p + c.beta_p * p
        if d:
            return c.alpha_d + c.beta_d * d
        return 0.0


@dataclass(frozen=True)
class IterationCostModel:
    """Prices an iteration with the project's shared cost model (:class:`ebctl.costmodel.IterationCosts`):
    per kind, intercept + coefficients · (prefill tokens, prefill requests, decode requests, decode context
    tokens, switched, prefill context tokens). A calibrated profile carries it (``ebctl.calibrate``). A kind
    the profile lacks: a mixed iteration is priced as its prefill part plus its decode part, less the smaller
    intercept (one iteration pays the fixed cost once); a missing prefill or decode cost is an error when
    built."""

    costs: IterationCosts
    name: str = "iteration-costs"

    def __post_init__(self) -> None:
        missing = [k for k in ("prefill", "decode") if getattr(self.costs, k) is None]
        if missing:
            raise ValueError(f"iteration costs without {' and '.join(missing)} costs cannot price an iteration")

    def step_time(self, batch: Batch) -> float:
        p, n = batch.prefill_tokens, batch.decode_ctx.size
        if not p and not n:
            return 0.0
        c = self.costs
        sw = float(batch.switched)
        ctx = float(batch.decode_ctx.sum()) if n else 0.0
        pctx = float(batch.prefill_ctx_tokens) if p else 0.0
        if p and n:
            if c.mixed is not None:
                return c.mixed.predict(p, batch.prefill_reqs, n, ctx, sw, pctx)
            pre, dec = c.prefill, c.decode
            return (pre.predict(p, batch.prefill_reqs, 0, 0, sw, pctx) + dec.predict(0, 0, n, ctx, 0)
                    - min(pre.intercept_s, dec.intercept_s))
        if p:
            return c.prefill.predict(p, batch.prefill_reqs, 0, 0, sw, pctx)
        return c.decode.predict(0, 0, n, ctx, sw)


class NoisyCostModel:
    """Another cost model on a machine whose speed wanders, as a shared CPU host's does: every iteration's
    time × exp(x(t)), x a path fixed by ``seed`` on a grid of ``grid_s`` seconds: white noise of sd ``white`` per
    cell (averaging to white·√(grid_s / T) over a window of T s) plus an AR(1) drift of sd ``drift`` and
    correlation time ``tau_s``. t is the sum of the times it priced (the engine's busy time: in a saturated closed
    loop, its clock). The same seed gives every policy the same path. Stateful (its clock): one per run.

    The defaults are sized to the bin-to-bin spread ``tools/ab_real.py`` records on a real CPU host, with no
    correlation from one bin to the next (docs/results/sim_cold.md)."""

    def __init__(self, base: CostModel, *, white: float = 0.3, drift: float = 0.05, tau_s: float = 300.0,
                 grid_s: float = 1.0, seed: int = 0) -> None:
        if min(white, drift) < 0 or tau_s <= 0 or grid_s <= 0:
            raise ValueError("white and drift must be >= 0, tau_s and grid_s > 0")
        self.base, self.white, self.drift, self.tau_s, self.grid_s, self.seed = base, white, drift, tau_s, grid_s, seed
        self.name = f"{base.name}+noise"
        self.clock = 0.0
        self._x = np.zeros(0)

    def log_speed(self, t: float) -> float:
        """x(t): the ln of the factor on iteration times at busy time t."""
        i = int(t / self.grid_s)
        if i >= self._x.size:  # extend the path in blocks; the same seed draws the same path
            self._x = self._path(max(2 * self._x.size, i + 1, 4096))
        return float(self._x[i])

    def _path(self, n: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)  # draws in sequence: a longer path keeps the shorter one's start
        a = np.exp(-self.grid_s / self.tau_s)
        ar = np.empty(n)
        ar[0] = rng.standard_normal() * self.drift
        shocks = rng.standard_normal(n) * self.drift * np.sqrt(1.0 - a * a)
        for i in range(1, n):
            ar[i] = a * ar[i - 1] + shocks[i]
        return ar + np.random.default_rng([self.seed, 1]).standard_normal(n) * self.white

    def step_time(self, batch: Batch) -> float:
        dt = self.base.step_time(batch)
        if dt <= 0:
            return dt
        dt *= float(np.exp(self.log_speed(self.clock)))
        self.clock += dt
        return dt


def build(profile: Profile, kind: str = "profile", *, layers: int | None = None,
          prefill_attention: bool = True) -> CostModel:
    """The named cost model for a profile.

    ``profile`` (default): what the profile carries for the simulator, in this order: ``sim.iteration_costs``
    (whole-iteration periods calibrated on a real engine, ``ebctl.calibrate``); the end-to-end GPU model
    (``ebctl.sim.gpucost``) of its kernel coefficients with the engine overheads of ``sim.overheads`` or, for
    the built-in Qwen3-8B profiles, those fitted to the paper's measurements (``ebctl/data/sim_overheads.json``,
    ``ebctl.sim.paperfit``); the profile's ``iteration_costs`` (``ebctl tune calibrate``'s forward-pass fit);
    else the GPU model without overheads (kernels only, said in :func:`describe`). ``kernels``: that model
    without overheads. ``iteration``: the profile's ``iteration_costs`` (the daemon's fit of forward passes:
    the engine's overheads outside the forward are missing, so it predicts too fast). ``linear``: the paper's
    α/β as written."""
    if kind == "linear":
        return LinearCostModel(profile.costs)
    if kind == "iteration":
        ic = getattr(profile, "iteration_costs", None)
        if ic is None:
            raise ValueError(f"profile {profile.name!r} has no iteration_costs")
        return IterationCostModel(ic, name="iteration-costs (forward)")
    if kind not in ("profile", "kernels"):
        raise ValueError(f"cost model {kind!r}: must be 'profile', 'kernels', 'iteration' or 'linear'")
    sim = getattr(profile, "sim", None) or {}
    if kind == "profile" and sim.get("iteration_costs"):
        try:
            ic = msgspec.convert(sim["iteration_costs"], IterationCosts)
        except msgspec.ValidationError as e:
            raise ValueError(f"profile {profile.name!r}: sim.iteration_costs: {e}") from None
        return IterationCostModel(ic, name="iteration-costs (period)")
    fitted = gpucost.stored_overheads().get(profile.gpu) if profile.name in gpucost.PAPER_GPUS.values() else None
    ic = getattr(profile, "iteration_costs", None)
    if kind == "profile" and not sim.get("overheads") and fitted is None and ic is not None:
        return IterationCostModel(ic, name="iteration-costs (forward: the time outside the forward is missing)")
    overheads, name = gpucost.Overheads(), "kernels only"
    if kind == "profile" and sim.get("overheads"):
        try:
            overheads, name = gpucost.Overheads(**sim["overheads"]), "engine (profile's overheads)"
        except (TypeError, ValueError) as e:
            raise ValueError(f"profile {profile.name!r}: sim.overheads: {e}") from None
    elif kind == "profile" and fitted is not None:
        overheads, name = fitted, "engine (overheads fitted to the paper)"
    cm = gpucost.EngineCostModel.kernels(profile.costs, model_name=profile.model, gpu=profile.gpu,
                                         decode_attention_ms=tuple(profile.decode_attention_ms),
                                         overheads=overheads, layers=layers, prefill_attention=prefill_attention)
    return dataclasses.replace(cm, name=name)


def describe(cm: CostModel) -> dict:
    """A JSON-able summary for results (what was assumed)."""
    if isinstance(cm, IterationCostModel):
        return {"name": cm.name, "iteration_costs": msgspec.to_builtins(cm.costs)}
    if isinstance(cm, gpucost.EngineCostModel):
        return {"name": cm.name, "layers": cm.layers, "attention_table": bool(cm.decode_attention_ms),
                "prefill_q": cm.prefill_q, "p_bar": cm.p_bar,
                "overheads": {k: getattr(cm.overheads, k) for k in gpucost.FIELDS}}
    return {"name": getattr(cm, "name", type(cm).__name__)}
