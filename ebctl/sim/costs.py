"""Iteration-time models: what one engine iteration costs, given what it holds.

A cost model is anything with ``step_time(batch) -> seconds`` (:class:`CostModel`). Two ship:

* :class:`ProfileCostModel` (the default), built from a measured profile; its assumptions are in its
  docstring.
* :class:`LinearCostModel`, the paper's model as written (section 3.1): prefill α_p + β_p·tokens,
  decode α_d + β_d·n whatever the context. The theory checks use it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Protocol

import msgspec
import numpy as np

from ebctl import model
from ebctl.costmodel import IterationCosts
from ebctl.profiles import Profile
from ebctl.sim import hardware

# Prefill calibration sizes of measured_profiles.json (calibration_grid.prefill_sizes): the linear β_p
# fitted on them absorbs the attention cost of positions up to about P_BAR (see _absorbed_position).
PREFILL_CALIBRATION_SIZES = (256, 512, 1024, 2048, 4096)
# The engine the β_MB^e(r) fit points were measured on: vLLM v1's API-server defaults on GPUs with
# >= 70 GB (max_num_seqs, max_num_batched_tokens), at concurrency 2,048.
REF_MAX_RUNNING = 1024
REF_TOKEN_BUDGET = 8192


@dataclass(slots=True)
class Batch:
    """One iteration as the cost model sees it: prefill chunks (offset in their prompt, length), the
    context length (tokens attended, the new one included) of every decode row, and whether the previous
    non-idle iteration was of another kind (``switched``: prefill after decode, decode after prefill, ...)."""

    chunk_starts: list[int] = field(default_factory=list)
    chunk_lens: list[int] = field(default_factory=list)
    decode_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefill_tokens: int = 0
    switched: bool = False

    @property
    def decode_reqs(self) -> int:
        return int(self.decode_ctx.size)

    @property
    def prefill_reqs(self) -> int:
        return len(self.chunk_lens)


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
    tokens, switched). A calibrated profile carries it (``ebctl.sim.calibrate``). A kind the profile lacks:
    a mixed iteration is priced as its prefill part plus its decode part, less the smaller intercept (one
    iteration pays the fixed cost once); a missing prefill or decode cost is an error when built."""

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
        if p and n:
            if c.mixed is not None:
                return c.mixed.predict(p, batch.prefill_reqs, n, ctx, sw)
            pre, dec = c.prefill, c.decode
            return (pre.predict(p, batch.prefill_reqs, 0, 0, sw) + dec.predict(0, 0, n, ctx, 0)
                    - min(pre.intercept_s, dec.intercept_s))
        if p:
            return c.prefill.predict(p, batch.prefill_reqs, 0, 0, sw)
        return c.decode.predict(0, 0, n, ctx, sw)


@dataclass(frozen=True, slots=True)
class Interference:
    """φ(r), piecewise linear through ``knots`` (flat outside them), never below −1: in a mixed iteration
    whose decode share of tokens is r, each decode row's memory cost (its attention) is multiplied by
    1 + φ(r)."""

    knots: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.knots) != len(self.values) or not self.knots:
            raise ValueError("knots and values must be non-empty and of one length")
        if any(b <= a for a, b in zip(self.knots, self.knots[1:], strict=False)):
            raise ValueError(f"knots must increase: {self.knots}")

    def __call__(self, r: float) -> float:
        k, v = self.knots, self.values
        if r <= k[0]:
            return max(-1.0, v[0])
        for i in range(1, len(k)):
            if r <= k[i]:
                w = (r - k[i - 1]) / (k[i] - k[i - 1])
                return max(-1.0, v[i - 1] + w * (v[i] - v[i - 1]))
        return max(-1.0, v[-1])


@dataclass(frozen=True)
class ProfileCostModel:
    """The default cost model, built from a measured profile (``ebctl.profiles``).

    Assumptions, each a modelling choice:

    1. **Prefill** of chunks (offset s, length l): α_p + β_p·Σ l + (long-prompt attention). β_p was fitted
       on single prompts of 256-4,096 tokens, so it already holds the attention of those positions; a
       prompt token at position p also pays layers·2q·max(0, p − p̄), where q is the quadratic coefficient
       of the measured one-layer prefill attention kernel (``pure_prefill``) and p̄ ≈ 2,208 the position
       the linear fit absorbed (``prefill_attention=False`` drops the term).
    2. **Decode** of n rows at contexts ctx_i: α_d + n·(β_d − a(512)) + Σ a(ctx_i). a(ctx) is one request's
       attention over all layers, the measured kernel time of 512 decode queries at that context
       (``decode_attention_ms``) × layers × (KV heads·head dim)/(8·128) / 512, linear between the
       measured contexts (128-2,048) and extrapolated linearly beyond them (attention streams the KV).
       β_d was measured at context 512, so at context 512 this is exactly α_d + β_d·n. Without an
       attention table: α_d + β_d·n.
    3. **Mixed** iteration (P prefill tokens, n decode rows, r = n/(P + n)): α_d (the weights are streamed
       once; α_p, fitted near zero, is not added) + the prefill and decode terms above + the interference
       φ(r)·Σ a(ctx_i): decode attention slowed by co-scheduled prefill (the paper's Figure 2). φ ≥ 0 is
       piecewise linear and nondecreasing in r, three knots, calibrated by replaying the runs β_MB^e(r) was
       fitted on (saturated mixed batching at concurrency 2,048, vLLM v1 defaults: 1,024 running,
       8,192-token budget, this GPU's KV capacity, lengths uniform 0.5x-1.5x at μ_L/μ_O = 1024/128,
       512/512, 128/1024) and solving for the φ whose replays' steady throughputs are 1/β_MB^e(r)
       (``ebctl.sim.calibrate``). So β_MB^e, an end-to-end cost with the fixed costs inside, is reproduced
       at saturation without adding α_MB a second time, and at low load a mixed iteration still pays α_d.
       φ absorbs everything the kernel-level terms miss in those runs (scheduler time per request,
       kernel-path changes, bandwidth contention); without an attention table the decode memory cost is
       n·β_d. Achieved: qwen3-8b/h200 within 2% of its three measured points; qwen3-8b/rtx-pro-6000
       +25%, −17%, +12% (its KV-bound replays mix in few iterations, so no φ of this form fits all three;
       its φ reaches ≈ 15 at r ≥ 0.5, which makes mixed batching very slow on decode-rich work). A profile
       without β_MB^e (c0 NaN): no interference, i.e. the sum of the exclusive costs minus one α (α_p).
    """

    costs: model.Costs
    layers: int = 36
    attn_scale: float = 1.0
    decode_attention_ms: tuple[tuple[int, float], ...] = ()
    prefill_q: float = 0.0  # s per token² per layer (one-layer prefill attention ≈ u·L + q·L²)
    p_bar: float = 0.0
    interference: Interference | None = None
    name: str = "profile"
    _x: np.ndarray = field(init=False, repr=False, compare=False)
    _y: np.ndarray = field(init=False, repr=False, compare=False)
    _a512: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        x, y = _attention_curve(self.decode_attention_ms, self.layers * self.attn_scale)
        a512 = float(np.interp(512.0, x, y)) if x.size else 0.0
        if a512 > self.costs.beta_d > 0:  # the kernel alone above the measured per-request cost: scale it down
            y, a512 = y * (self.costs.beta_d / a512), self.costs.beta_d
        object.__setattr__(self, "_x", x)
        object.__setattr__(self, "_y", y)
        object.__setattr__(self, "_a512", a512)

    @classmethod
    def from_profile(cls, profile: Profile, *, layers: int | None = None, prefill_attention: bool = True,
                     calibrate: bool = True, ref_kv_tokens: int | None = None) -> ProfileCostModel:
        spec = hardware.model_spec(profile.model)
        n_layers = layers if layers is not None else spec.layers
        q = p_bar = 0.0
        attn = _prefill_table(profile.gpu)
        if prefill_attention and attn:
            q = _prefill_quadratic(attn)
            p_bar = _absorbed_position(PREFILL_CALIBRATION_SIZES)
        base = cls(costs=profile.costs, layers=n_layers, attn_scale=spec.attention_scale,
                   decode_attention_ms=tuple(profile.decode_attention_ms), prefill_q=q, p_bar=p_bar)
        if not (calibrate and profile.costs.has_mixed):
            return base
        from ebctl.sim.interference import interference_for  # the calibration runs the engine, which needs Batch

        kv = ref_kv_tokens or hardware.kv_capacity_tokens(profile.model, profile.gpu)
        return base.with_interference(interference_for(base, kv_tokens=kv))

    def with_interference(self, interference: Interference | None) -> ProfileCostModel:
        return ProfileCostModel(costs=self.costs, layers=self.layers, attn_scale=self.attn_scale,
                                decode_attention_ms=self.decode_attention_ms, prefill_q=self.prefill_q,
                                p_bar=self.p_bar, interference=interference, name=self.name)

    # --- the pieces ---------------------------------------------------------------------------------
    def attention(self, ctx: np.ndarray | float) -> np.ndarray:
        """a(ctx): one decode request's attention time (s) at context ctx, all layers."""
        if not self._x.size:
            return np.zeros(np.shape(ctx))
        return np.interp(ctx, self._x, self._y)

    def decode_row_base(self) -> float:
        """Per-row decode cost without attention: β_d − a(512)."""
        return self.costs.beta_d - self._a512

    def prefill_extra(self, starts: list[int], lens: list[int]) -> float:
        """Attention beyond the linear fit: layers·2q·Σ_{p in chunk} max(0, p − p̄)."""
        if self.prefill_q <= 0:
            return 0.0
        pb, total = self.p_bar, 0.0
        for s, n in zip(starts, lens, strict=True):
            e = s + n
            if e > pb:
                a = max(s, pb)
                total += (e - a) * ((e + a) / 2.0 - pb)
        return self.layers * 2.0 * self.prefill_q * total

    def decode_memory(self, ctx: np.ndarray) -> float:
        """The decode rows' memory-bound cost the interference scales: Σ a(ctx_i), or n·β_d without a table."""
        if self._x.size:
            return float(np.interp(ctx, self._x, self._y).sum())
        return ctx.size * self.costs.beta_d

    def step_time(self, batch: Batch) -> float:
        c = self.costs
        p, ctx = batch.prefill_tokens, batch.decode_ctx
        n = ctx.size
        t = 0.0
        if p:
            t += c.beta_p * p
            if self.prefill_q > 0 and batch.chunk_lens:
                t += self.prefill_extra(batch.chunk_starts, batch.chunk_lens)
        if n:
            mem = self.decode_memory(ctx)
            t += mem + (n * (c.beta_d - self._a512) if self._x.size else 0.0)
            if p and self.interference is not None:
                t += self.interference(n / (n + p)) * mem
            return t + c.alpha_d
        return t + c.alpha_p if p else 0.0


# --- building blocks -----------------------------------------------------------------------------------

def _attention_curve(table: tuple[tuple[int, float], ...], layers_scaled: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) for np.interp: per-request seconds at context x, with linear extensions to 0 and to 2^40."""
    if not table:
        return np.zeros(0), np.zeros(0)
    pts = sorted(table)
    x = np.array([p[0] for p in pts], dtype=np.float64)
    y = np.array([p[1] for p in pts], dtype=np.float64) * 1e-3 * layers_scaled / 512.0
    if x.size == 1:
        return np.array([0.0, x[0], 2.0**40]), np.array([0.0, y[0], y[0] / x[0] * 2.0**40])
    lo = (y[1] - y[0]) / (x[1] - x[0])
    hi = (y[-1] - y[-2]) / (x[-1] - x[-2])
    y0 = max(0.0, y[0] - lo * x[0])
    far = 2.0**40
    return np.concatenate(([0.0], x, [far])), np.concatenate(([y0], y, [y[-1] + hi * (far - x[-1])]))


@functools.cache
def _prefill_table(gpu: str) -> tuple[tuple[int, float], ...]:
    """The measured one-layer prefill attention kernel for this GPU (measured_profiles.json), if any."""
    raw = json.loads(resources.files("ebctl.data").joinpath("measured_profiles.json").read_text())
    t = raw.get("attention_kernel_ms", {}).get(gpu, {}).get("pure_prefill")
    return tuple(zip(t["seq_len"], t["ms"], strict=True)) if t else ()


def _prefill_quadratic(table: tuple[tuple[int, float], ...]) -> float:
    """q (s/token²) of the least-squares fit ms(L) = u·L + q·L² of a one-layer prefill attention kernel."""
    L = np.array([p[0] for p in table], dtype=np.float64)
    ms = np.array([p[1] for p in table], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(np.column_stack([L, L * L]), ms, rcond=None)
    return max(float(coef[1]), 0.0) * 1e-3


def _absorbed_position(sizes: tuple[int, ...]) -> float:
    """p̄ = cov(L, L²)/(2 var L): a line fitted to q·L² over these prompt sizes has slope 2q·p̄."""
    s = np.asarray(sizes, dtype=np.float64)
    return float(np.cov(s, s * s)[0, 1] / (2.0 * np.var(s, ddof=1)))


def build(profile: Profile, kind: str = "profile", *, layers: int | None = None,
          prefill_attention: bool = True) -> CostModel:
    """The named cost model for a profile.

    ``profile`` (default): what the profile carries for the simulator, in this order: ``sim.iteration_costs``
    (whole-iteration periods calibrated on a real engine, ``ebctl.sim.calibrate``), else the end-to-end model
    of its measured coefficients. ``iteration``: the profile's ``iteration_costs`` (the daemon's fit of forward
    passes: the engine's overheads outside the forward are missing, so it predicts too fast). ``linear``: the
    paper's α/β as written."""
    if kind == "linear":
        return LinearCostModel(profile.costs)
    if kind == "iteration":
        ic = getattr(profile, "iteration_costs", None)
        if ic is None:
            raise ValueError(f"profile {profile.name!r} has no iteration_costs")
        return IterationCostModel(ic, name="iteration-costs (forward)")
    if kind == "profile":
        sim = getattr(profile, "sim", None) or {}
        if sim.get("iteration_costs"):
            try:
                ic = msgspec.convert(sim["iteration_costs"], IterationCosts)
            except msgspec.ValidationError as e:
                raise ValueError(f"profile {profile.name!r}: sim.iteration_costs: {e}") from None
            return IterationCostModel(ic, name="iteration-costs (period)")
        return ProfileCostModel.from_profile(profile, layers=layers, prefill_attention=prefill_attention)
    raise ValueError(f"cost model {kind!r}: must be 'profile', 'iteration' or 'linear'")


def describe(cm: CostModel) -> dict:
    """A JSON-able summary for results (what was assumed)."""
    if isinstance(cm, IterationCostModel):
        return {"name": cm.name, "iteration_costs": msgspec.to_builtins(cm.costs)}
    if isinstance(cm, ProfileCostModel):
        f = cm.interference
        return {"name": cm.name, "layers": cm.layers, "attention_table": bool(cm.decode_attention_ms),
                "a512_s": cm._a512, "prefill_q": cm.prefill_q, "p_bar": cm.p_bar,
                "interference": None if f is None else {"knots": list(f.knots), "phi": list(f.values)}}
    return {"name": getattr(cm, "name", type(cm).__name__)}


