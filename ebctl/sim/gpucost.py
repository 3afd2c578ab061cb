"""The simulator's end-to-end cost model of a GPU engine: one symmetric formula for every iteration kind.

    t = F + V − ω·min(F, V) + h_iter + h_req·(prefill requests + decode rows) + φ·A·[mixed] + s·[switched]

* **kernels**, from the measured profile (the paper's authors' vLLM calibration, kernel time only, eager): the
  fixed cost F = α_d for an iteration with decode rows (the weights are streamed once), α_p for a prefill-only
  one; the work that grows with the batch V = β_p·P (+ the attention of prompt positions beyond what the
  linear fit absorbed, from the measured one-layer prefill kernel) + n·(β_d − a(512)) + A, where A = Σ a(ctx_i)
  is the decode rows' attention at their own contexts (the measured kernel of 512 decode queries, × layers,
  per request; β_d was measured at context 512, so at 512 and ω = 0 this is α_d + β_d·n).
* **overlap** ω ∈ [0, 1]: the share of the smaller of F and V that runs concurrently with the other. The
  calibration timed each forward alone and eager, and its linear fit adds them (ω = 0); in a serving engine
  the weight streaming inside F overlaps the GEMMs' arithmetic (a roofline: time = max(bytes/bandwidth,
  flops/throughput)) and the launch overhead overlaps execution (CUDA graphs, asynchronous launches), up to
  t = max(F, V) (ω = 1). It cannot hide more than all of the smaller part: ω ≤ 1.
* **engine overheads**, the same for every kind (what the kernel timings leave out: scheduling, input
  preparation, sampling, output processing): ``iter_s`` per iteration and ``req_s`` per request in it.
* **interference** φ ∈ [0, φ_max]: in a mixed iteration the decode attention A costs (1 + φ)·A. φ_max is
  the largest slowdown the measured mixed attention kernels show against the same work run apart
  (``interference_bound``).
* **switch** s: an iteration whose kind differs from the previous one's (prefill after decode, decode after
  prefill, mixed after decode, ...) pays s.

The bounds the fit uses and why are in ``ebctl.sim.paperfit``. The five overheads are fitted to end-to-end
measurements (``ebctl.sim.paperfit``) and carried in a profile's ``sim.overheads``. With all five at 0 this is
the kernel-only model (the calibration's linear α + β form).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ebctl import model
from ebctl.sim import hardware
from ebctl.sim.batch import Batch

# Prefill calibration sizes of measured_profiles.json (calibration_grid.prefill_sizes): the linear β_p
# fitted on them absorbs the attention cost of positions up to about P_BAR (see _absorbed_position).
PREFILL_CALIBRATION_SIZES = (256, 512, 1024, 2048, 4096)
FIELDS = ("iter_s", "req_s", "interference", "switch_s", "overlap")


@dataclass(frozen=True, slots=True)
class Overheads:
    """What an end-to-end iteration costs beyond the kernels (module docstring); seconds, φ a ratio."""

    iter_s: float = 0.0
    req_s: float = 0.0
    interference: float = 0.0
    switch_s: float = 0.0
    overlap: float = 0.0

    def __post_init__(self) -> None:
        for name in FIELDS:
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"overheads {name}={v!r}: must be finite and >= 0")
        if self.overlap > 1:
            raise ValueError(f"overheads overlap={self.overlap!r}: must be <= 1 (no more than all of it hides)")

    def vector(self) -> np.ndarray:
        """Coefficients of :meth:`EngineCostModel.parts`' last five entries (the overlap subtracts)."""
        return np.array([self.iter_s, self.req_s, self.interference, self.switch_s, -self.overlap])


# The built-in profiles of the paper's GPUs, and the file of their overheads fitted to its measurements
# (written by ``python -m ebctl.sim.paperfit``)
PAPER_GPUS = {"H200": "qwen3-8b/h200", "RTX-PRO-6000": "qwen3-8b/rtx-pro-6000"}
OVERHEADS_FILE = "sim_overheads.json"


def stored_overheads() -> dict[str, Overheads]:
    """The fitted overheads shipped in ``ebctl/data/sim_overheads.json``, by GPU ({} if none)."""
    try:
        raw = json.loads(resources.files("ebctl.data").joinpath(OVERHEADS_FILE).read_text())
    except FileNotFoundError:
        return {}
    return {gpu: Overheads(**v["overheads"]) for gpu, v in raw.get("gpus", {}).items()}


@dataclass(frozen=True)
class EngineCostModel:
    costs: model.Costs
    overheads: Overheads = Overheads()
    layers: int = 36
    attn_scale: float = 1.0
    decode_attention_ms: tuple[tuple[int, float], ...] = ()
    prefill_q: float = 0.0  # s per token² per layer (one-layer prefill attention ≈ u·L + q·L²)
    p_bar: float = 0.0
    name: str = "engine"
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
    def kernels(cls, costs: model.Costs, *, model_name: str, gpu: str,
                decode_attention_ms: tuple[tuple[int, float], ...] = (), overheads: Overheads = Overheads(),
                layers: int | None = None, prefill_attention: bool = True) -> EngineCostModel:
        """The model for a (model, GPU) profile: its layer count and attention tables, these overheads."""
        spec = hardware.model_spec(model_name)
        q = p_bar = 0.0
        table = _prefill_table(gpu)
        if prefill_attention and table:
            q = _prefill_quadratic(table)
            p_bar = _absorbed_position(PREFILL_CALIBRATION_SIZES)
        return cls(costs=costs, overheads=overheads, layers=layers if layers is not None else spec.layers,
                   attn_scale=spec.attention_scale, decode_attention_ms=tuple(decode_attention_ms), prefill_q=q,
                   p_bar=p_bar)

    def with_overheads(self, overheads: Overheads) -> EngineCostModel:
        return EngineCostModel(costs=self.costs, overheads=overheads, layers=self.layers,
                               attn_scale=self.attn_scale, decode_attention_ms=self.decode_attention_ms,
                               prefill_q=self.prefill_q, p_bar=self.p_bar, name=self.name)

    # --- the pieces ---------------------------------------------------------------------------------
    def attention(self, ctx: np.ndarray | float) -> np.ndarray:
        """a(ctx): one decode request's attention time (s) at context ctx, all layers."""
        if not self._x.size:
            return np.zeros(np.shape(ctx))
        return np.interp(ctx, self._x, self._y)

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

    def parts(self, batch: Batch) -> tuple[float, float, float, float, float, float]:
        """(kernel seconds F + V, 1, requests in the batch, A if mixed else 0, switched, min(F, V)): the time
        is the kernels + the dot product of the other five with :meth:`Overheads.vector`."""
        c = self.costs
        p, ctx = batch.prefill_tokens, batch.decode_ctx
        n = ctx.size
        k, att = 0.0, 0.0  # k: the work that grows with the batch; the fixed cost is added below
        if p:
            k += c.beta_p * p
            if self.prefill_q > 0 and batch.chunk_lens:
                k += self.prefill_extra(batch.chunk_starts, batch.chunk_lens)
        if n:
            if self._x.size:
                att = float(np.interp(ctx, self._x, self._y).sum())
                k += att + n * (c.beta_d - self._a512)
            else:
                att = n * c.beta_d
                k += att
        fixed = c.alpha_d if n else c.alpha_p
        return k + fixed, 1.0, float(batch.prefill_reqs + n), att if p and n else 0.0, float(batch.switched), \
            min(fixed, k)

    def step_time(self, batch: Batch) -> float:
        if not batch.prefill_tokens and not batch.decode_ctx.size:
            return 0.0
        k, one, reqs, att_mixed, sw, hidden = self.parts(batch)
        o = self.overheads
        return (k + o.iter_s * one + o.req_s * reqs + o.interference * att_mixed + o.switch_s * sw
                - o.overlap * hidden)


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
def _kernel_tables(gpu: str) -> dict:
    raw = json.loads(resources.files("ebctl.data").joinpath("measured_profiles.json").read_text())
    return raw.get("attention_kernel_ms", {}).get(gpu, {})


def _prefill_table(gpu: str) -> tuple[tuple[int, float], ...]:
    """The measured one-layer prefill attention kernel for this GPU (measured_profiles.json), if any."""
    t = _kernel_tables(gpu).get("pure_prefill")
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


def interference_bound(gpu: str) -> float:
    """φ_max: the largest slowdown of decode attention in the measured mixed kernels (512 requests, a share
    of them prompts of length L, the rest decodes at context L) against the same prompts and decodes run
    apart: (mixed − prompts alone − decodes alone) / decodes alone, over every measured case. 0 without a
    table (no evidence of interference)."""
    t = _kernel_tables(gpu)
    if not {"pure_prefill", "pure_decode_512q", "mixed_512req"} <= set(t):
        return 0.0
    pre = dict(zip(t["pure_prefill"]["seq_len"], t["pure_prefill"]["ms"], strict=True))
    dec = dict(zip(t["pure_decode_512q"]["context_len"], t["pure_decode_512q"]["ms"], strict=True))
    mixed = t["mixed_512req"]
    worst = 0.0
    for key, values in mixed.items():
        if not key.endswith("pct_prefill_ms"):
            continue
        n_pre = round(512 * int(key.split("pct")[0]) / 100)
        for length, ms in zip(mixed["prefill_len"], values, strict=True):
            alone = dec[length] * (512 - n_pre) / 512
            worst = max(worst, (ms - pre[length] * n_pre - alone) / alone)
    return worst
