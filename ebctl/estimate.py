"""Online estimators of the workload: length windows, the hazard fit and an EMA.

Pure (numpy only; no I/O, clock or mutable globals). Paper Section 3.4 "Online estimation" and
Algorithm 1 (appendix D.7). The iteration-cost fits, which replace the per-hardware calibration of
appendix A.4, are in ``costfit.py`` (on the model of ``costmodel.py``).
Garbage (NaN, inf, negatives, non-integers, absurd sizes) is rejected at the door, never fitted.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

MAX_LEN = 1 << 40  # token counts above this are garbage; it also keeps t³ sums finite in float64


def _as_len(x: object) -> int:
    """A token count as int, or -1 if ``x`` is not a finite integer in [0, MAX_LEN]."""
    if type(x) is int:  # fast path: the daemon passes plain ints
        return x if 0 <= x <= MAX_LEN else -1
    if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating):
        return -1  # strings, None, bools: never token counts
    if isinstance(x, int | np.integer):  # range first: float(10**400) would raise
        return int(x) if 0 <= x <= MAX_LEN else -1
    f = float(x)  # nan/inf fail is_integer()
    return int(f) if f.is_integer() and 0 <= f <= MAX_LEN else -1


def _lengths(values: object) -> np.ndarray:
    """Any array-like as float64, garbage (incl. strings, objects, huge ints) mapped to -1."""
    try:
        a = np.asarray(values)
    except (ValueError, TypeError):  # ragged nesting
        return np.empty(0)
    if a.dtype.kind == "O":  # e.g. Python ints beyond int64, None mixed in
        return np.fromiter((_as_len(v) for v in a.ravel()), dtype=np.float64, count=a.size)
    if a.dtype.kind not in "iuf":  # strings, bools, complex: never token counts
        return np.full(a.size, -1.0)
    a = a.ravel().astype(np.float64)
    bad = ~(np.isfinite(a) & (a >= 0) & (a <= MAX_LEN)) | (a != np.floor(a))
    a[bad] = -1.0
    return a


class LengthWindow:
    """The last ``capacity`` completed requests' (input_len, output_len): 𝒲_L and 𝒲_O of Section 3.4.

    Two int64 ring buffers; ``append`` is O(1). ``total_appended`` counts accepted samples ever
    (``clear``/``resize`` keep it) so the controller can refit every T_upd completions.
    """

    def __init__(self, capacity: int) -> None:
        self._alloc(capacity)
        self.total_appended = 0

    def _alloc(self, capacity: int) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._cap = int(capacity)
        self._in = np.zeros(self._cap, dtype=np.int64)
        self._out = np.zeros(self._cap, dtype=np.int64)
        self._head = 0  # next slot to write
        self._n = 0

    @property
    def capacity(self) -> int:
        return self._cap

    def __len__(self) -> int:
        return self._n

    def append(self, input_len: int, output_len: int) -> bool:
        """Add one completion; False (and nothing stored) unless input ≥ 0 and output ≥ 1 are integers."""
        i, o = _as_len(input_len), _as_len(output_len)
        if i < 0 or o < 1:
            return False
        h = self._head
        self._in[h] = i
        self._out[h] = o
        self._head = h + 1 if h + 1 < self._cap else 0
        if self._n < self._cap:
            self._n += 1
        self.total_appended += 1
        return True

    def extend(self, inputs: object, outputs: object) -> int:
        """Vectorised ``append`` of paired arrays; returns how many pairs were accepted."""
        i, o = _lengths(inputs), _lengths(outputs)
        if i.size != o.size:
            raise ValueError(f"inputs and outputs differ in length: {i.size} != {o.size}")
        good = (i >= 0) & (o >= 1)
        i, o = i[good].astype(np.int64), o[good].astype(np.int64)
        self.total_appended += i.size
        k = min(i.size, self._cap)  # only the newest `capacity` can survive
        slots = (self._head + np.arange(k)) % self._cap
        self._in[slots], self._out[slots] = i[i.size - k :], o[o.size - k :]
        self._head = (self._head + k) % self._cap
        self._n = min(self._cap, self._n + k)
        return int(i.size)

    def _ordered(self, buf: np.ndarray) -> np.ndarray:
        if self._n < self._cap:  # not yet wrapped: slots [0, n) hold oldest → newest
            return buf[: self._n].copy()
        return np.concatenate((buf[self._head :], buf[: self._head]))

    def inputs(self) -> np.ndarray:
        """Input lengths, oldest first (a copy)."""
        return self._ordered(self._in)

    def outputs(self) -> np.ndarray:
        """Output lengths, oldest first (a copy)."""
        return self._ordered(self._out)

    def resize(self, capacity: int) -> None:
        """Change W, keeping the newest min(len, capacity) samples."""
        ins, outs = self.inputs(), self.outputs()
        self._alloc(capacity)
        keep = min(ins.size, self._cap)
        self._in[:keep], self._out[:keep] = ins[ins.size - keep :], outs[outs.size - keep :]
        self._n = keep
        self._head = keep % self._cap

    def clear(self) -> None:
        self._head = self._n = 0


@dataclass(frozen=True, slots=True)
class HazardFit:
    """ĥ(t) ≈ p0 + eta·t over [1, t95] (Section 3.4); ``ok`` False means: do not use p0/eta."""

    p0: float
    eta: float
    r2: float  # weighted R² of the line; NaN when no line was fitted
    n: int  # samples used after cleaning
    t95: int
    mu_o: float
    sigma_o: float  # population std of the window (the window is the empirical distribution)
    ok: bool
    reason: str
    # standard error of eta under the binomial model Var ĥ(t) ≈ h(1−h)/#{O≥t} (the weights' premise);
    # the pointwise R² is low even for good fits (few events per t), so trust in eta is eta/eta_se
    eta_se: float = math.nan


def fit_hazard(output_lens: object, *, quantile: float = 0.95, discrete_correction: bool = False,
               min_points: int = 3) -> HazardFit:
    """Weighted least squares of ĥ(t) = #{O=t}/#{O≥t} on p0 + η·t, t ∈ [1, t95], weights #{O≥t}.

    Paper Section 3.4 "Online estimation". The weight #{O≥t} is the number at risk: Var ĥ(t) ∝ 1/#{O≥t},
    so this is the inverse-variance fit. The sums run over the distinct observed lengths only (closed
    forms for Σ_t w·t^k), so the cost is O(W log W) whatever the lengths' size, and equals the dense fit
    over every integer t exactly. t95 is the ``quantile`` (inverted CDF: an observed length).

    Cleaning: non-finite, non-integer, < 1 or > MAX_LEN lengths are dropped. Fallbacks never raise
    and never give NaN p0/eta: empty → ok=False, p0=eta=0, reason "empty" (the caller must ignore
    fits with ok=False); fewer than 2 samples or fewer than ``min_points`` distinct observed lengths
    in [1, t95] (a constant sample has one) → ok=False, p0 = 1/mean (geometric MLE), eta = 0. If the
    line crosses zero before t = 1 (strong IFR), p0 is replaced by the weighted mean ĥ over the first
    tenth of [1, t95] (or 1/mean if that is 0), reason "p0<=0 clipped"; eta keeps its sign (η < 0 is a
    falling hazard, e.g. the Azure code trace).

    ``discrete_correction``: the fluid model (appendix B.1) decays as exp(-p0·t) while the discrete
    survival is (1-p0)^t; reporting p0 → -ln(1-p0) removes that O(p0) bias (appendix B.3, Source 4).
    p0 is capped just below 1 first so the rate stays finite.
    """
    raw = _lengths(output_lens)
    o = raw[raw >= 1]
    n = int(o.size)
    if n == 0:
        return HazardFit(0.0, 0.0, math.nan, 0, 0, 0.0, 0.0, False, "empty")
    mu, sigma = float(o.mean()), float(o.std())
    vals, counts = np.unique(o, return_counts=True)
    cum = np.cumsum(counts)
    q = min(max(float(quantile), 0.0), 1.0) if math.isfinite(quantile) else 0.95
    t95 = int(vals[min(int(np.searchsorted(cum, q * n)), vals.size - 1)])
    at_risk = (n - cum + counts).astype(np.float64)  # #{O ≥ v} at each distinct v (reversed cumsum)

    def done(p0: float, eta: float, r2: float, ok: bool, reason: str, eta_se: float = math.nan) -> HazardFit:
        if discrete_correction:
            p0 = -math.log1p(-min(p0, 1.0 - 1e-12))
        return HazardFit(p0, eta, r2, n, t95, mu, sigma, ok, reason, eta_se)

    inside = vals <= t95
    points = int(inside.sum())
    if n < 2 or points < max(min_points, 2):
        why = "fewer than 2 samples" if n < 2 else f"{points} distinct lengths in [1, t95] < {min_points}"
        return done(1.0 / mu, 0.0, math.nan, False, why)
    # Each sample i contributes weight 1 to every t in [1, m_i], m_i = min(O_i, t95).
    m = np.minimum(vals, t95)
    s_w = float(counts @ m)
    s_wt = float(counts @ (m * (m + 1) / 2))
    s_wtt = float(counts @ (m * (m + 1) * (2 * m + 1) / 6))
    d, v, w = counts[inside].astype(np.float64), vals[inside], at_risk[inside]
    s_wy, s_wty, s_wyy = float(d.sum()), float(d @ v), float(d @ (d / w))  # w·ĥ = d
    sxx = s_wtt - s_wt * s_wt / s_w
    sxy = s_wty - s_wt * s_wy / s_w
    syy = max(s_wyy - s_wy * s_wy / s_w, 0.0)
    if not sxx > 1e-9 * s_wtt:  # zero (t95 = 1) or lost to cancellation: no slope to fit
        return done(1.0 / mu, 0.0, math.nan, False, "no spread in t")
    eta = sxy / sxx
    p0 = (s_wy - eta * s_wt) / s_w
    ss_res = max(syy - eta * sxy, 0.0)
    r2 = 1.0 if syy <= 1e-12 * max(s_wyy, 1e-300) else min(max(1.0 - ss_res / syy, 0.0), 1.0)
    h_bar = min(max(s_wy / s_w, 1e-12), 1.0)
    eta_se = math.sqrt(h_bar * (1.0 - h_bar) / sxx) if h_bar < 1.0 else math.inf
    if p0 > 0:
        return done(p0, eta, r2, True, "ok", eta_se)
    k = max(1, t95 // 10)  # ĥ over the first tenth of the range, weighted: #{O ≤ k} / Σ min(O, k)
    head = float(counts[vals <= k].sum()) / float(counts @ np.minimum(vals, k))
    return done(head if head > 0 else 1.0 / mu, eta, r2, True, "p0<=0 clipped", eta_se)


class Ema:
    """Exponential moving average; N_obs of Eq. 8 is the EMA of the running batch size."""

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self._v = math.nan

    @property
    def value(self) -> float:
        """NaN until the first valid sample."""
        return self._v

    def update(self, x: float) -> float:
        """Fold in ``x`` (NaN, inf and negatives are ignored); returns the current value."""
        try:
            f = float(x)
        except (TypeError, ValueError):
            return self._v
        if math.isfinite(f) and f >= 0.0:
            self._v = f if math.isnan(self._v) else self._v + self.alpha * (f - self._v)
        return self._v

    def reset(self) -> None:
        self._v = math.nan


class RecentRate:
    """Output tokens per second over the last ``horizon_s`` seconds of reports (what the engine delivers now):
    the tokens of the requests that finished in the reports after the horizon's first one, over the time
    between the horizon's first and last report. Time comes in with each sample."""

    def __init__(self, horizon_s: float = 60.0) -> None:
        self.horizon_s = horizon_s
        self._samples: deque[tuple[float, int]] = deque()
        self._tokens = 0  # tokens of every sample but the first one

    def add(self, wall: float, tokens: int) -> None:
        if not math.isfinite(wall) or (self._samples and wall < self._samples[-1][0]):
            return  # a clock that went back: skip the sample rather than distort the span
        if self._samples:
            self._tokens += tokens
        self._samples.append((wall, tokens))
        while len(self._samples) > 1 and wall - self._samples[1][0] >= self.horizon_s:
            self._samples.popleft()
            self._tokens -= self._samples[0][1]

    @property
    def value(self) -> float:
        """Tokens per second over the span held; NaN under two samples or a zero span."""
        if len(self._samples) < 2:
            return math.nan
        span = self._samples[-1][0] - self._samples[0][0]
        return self._tokens / span if span > 0 else math.nan
