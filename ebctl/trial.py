"""What the measured threshold measures (``ebctl.tuner``): windows of one arm, trials of two, and the test.

**A window** is a run of whole cycles of one arm holding at least ``window`` completions. Under EB a cycle runs
from the first decode step after a refill the threshold started to the next one (the batch at its fullest;
``Tuner._boundary``); stock and mb have no cycle of their own. What it measures is a served-token rate for the
request mix the controller sees (mean prompt μ_L, mean output μ_O):

    rate = (μ_L + μ_O) / (μ_L·τ_p + (μ_O − 1)·τ_d)

with τ_p and τ_d the wall seconds per prefill and per decode token the window measured. A mixed iteration
charges its decode rows what a decode row cost in the window's decode-only iterations (at most the iteration's
time) and its prefill tokens the rest: what a prefill costs when it rides on a decode step. Split by their
numbers instead, an engine whose decode row costs many prefill tokens (a CPU one) would charge the decode rows
almost nothing. Only a window with no decode-only iteration splits by numbers. In a steady state this is the
engine's total token throughput; unlike tokens over time it does not move when a window holds more or less
prefill than the steady mix (a burst of admissions after a switch, a cohort of young requests that finishes
late), so it is less noisy than processed tokens over time, and counting finished requests'
tokens (heavy-tailed lengths) is noisier still.
A window counts only when saturated: requests waited on at least ``SATURATED_SHARE`` of its time and, under EB,
more than N were in the engine (the gate's own deferral is not load).

With latency targets set (``ebctl.slo``), a window's worth is its **value**, rate × the share of the output tokens
of its judged requests that met every target (its attainment): the ratio of two values is the ratio of the two
windows' goodputs. A window judges the requests that finished in it whose first token came after its arm's run
began and at most ``window`` completions before its own start (``since``; the module docstring of ``ebctl.slo``).
A window that judged no request says nothing of goodput.

**A trial** (incumbent A, challenger B) measures windows in the order A0 B1 A1 B2 A2 ...; pair i compares B_i
with the mean of the incumbent's windows on both sides, so a linear drift cancels: d_i = ln B_i −
(ln A_{i−1} + ln A_i)/2. After at least ``min_pairs`` pairs, B wins if mean(d) ≥ ln(1 + ``min_effect``) and
the 95% interval lies above 0; it loses if the interval lies below ln(1 + min_effect), if mean(d) ≤ 0, or
after ``max_pairs`` pairs. The standard deviation is shrunk towards the one pooled over earlier trials (a
scaled inverse-χ² prior worth ``PRIOR_PAIRS`` pairs), so two pairs do not make a confident verdict of chance.
It also loses where it is futile (stochastic curtailment under the current trend): were mean(d) and the shrunk
sd to hold, the interval of ``max_pairs`` pairs, t·sd/√max_pairs with the degrees of freedom those pairs would
have, would still reach 0, and the remaining pairs would not make it win. After one pair the sd is the prior's
alone, and the rule is a cut at t(max_pairs + 1 df)/√max_pairs ≈ 1.09 prior sd (max_pairs = 5). It cuts
short what a challenger level with the incumbent costs, at the price of some wins of small gains where a pair's
noise is as large as the gain: there the default stays where it is (docs/controller.md).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ebctl import slo
from ebctl.protocol import IterationReport, Mode

SATURATED_SHARE = 0.9  # a window counts when requests waited on at least this share of its time
PRIOR_PAIRS = 2.0  # weight (pseudo-pairs) of the pooled sd in a trial's own sd


@functools.cache
def _t975() -> np.ndarray:
    """Two-sided 95% Student t by degrees of freedom (index df − 1); scipy is imported at the first verdict."""
    from scipy import stats

    return stats.t.ppf(0.975, np.arange(1, 200))


def _t(df: int) -> float:
    """The two-sided 95% Student t at ``df`` degrees of freedom (those beyond the table at its last)."""
    return float(_t975()[min(df, len(_t975())) - 1])


class Applied(NamedTuple):
    """What the controller published for an arm under one policy version."""

    arm: str
    mode: Mode
    k: int
    n_max: int
    pd_interval: int = 0  # the policy's (0: the engine's launch value)


@dataclass(slots=True)
class Window:
    """One arm's run of whole cycles: its time and tokens split by phase, its completions, how much of it was
    saturated. Mixed iterations are kept apart and split when the rate is asked for (module docstring)."""

    arm: str
    start: float  # wall time at which its first iteration began
    end: float = math.nan
    completions: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    idle_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    saturated_s: float = 0.0
    mixed: list[tuple[float, int, int]] = field(default_factory=list)  # (dt, prefill tokens, decode rows) each
    ttfts: list[float] = field(default_factory=list)  # the finished requests' TTFTs the engine measured (s)
    tpots: list[float] = field(default_factory=list)  # ... and TPOTs (requests of more than one output token)
    room: int = -1  # EB: N − k, the most requests the engine holds with the gate open (-1: not EB)
    since: float = -math.inf  # with latency targets: it judges the requests whose first token came at or after this
    peak: int = 0  # the most requests in the engine (running + waiting) in any of its iterations
    judged_tokens: int = 0  # with latency targets: output tokens of the requests judged against them
    good_tokens: int = 0  # ... of those that met every target
    ttft_ok_tokens: int = 0  # ... of those within the TTFT target (met if not set)
    tpot_ok_tokens: int = 0  # ... of those within the TPOT target (met if not set)

    def add(self, r: IterationReport, dt: float, targets: slo.Targets | None = None) -> None:
        """One iteration of ``dt`` seconds; with ``targets``, its finished requests judged against them (those
        whose first token came at or after ``since``)."""
        p, d = r.prefill_tokens, r.decode_reqs
        self.completions += len(r.finished)
        self.ttfts.extend(f.ttft_s for f in r.finished if f.ttft_s >= 0.0)  # NaN: not measured
        self.tpots.extend(f.tpot_s for f in r.finished if f.tpot_s >= 0.0)
        self.peak = max(self.peak, r.running + r.waiting)
        if targets is not None and r.finished:
            got = slo.tally(r.finished, targets, finish=r.wall_time, since=self.since)
            self.judged_tokens += got.judged
            self.good_tokens += got.good
            self.ttft_ok_tokens += got.ttft_ok
            self.tpot_ok_tokens += got.tpot_ok
        self.prefill_tokens += p
        self.decode_tokens += d
        if p + d == 0:
            self.idle_s += dt
        elif p and d:
            self.mixed.append((dt, p, d))
        elif p:
            self.prefill_s += dt
        else:
            self.decode_s += dt

    def split(self) -> tuple[float, float]:
        """(prefill seconds, decode seconds), the mixed iterations split as the module docstring says."""
        pure_rows = self.decode_tokens - sum(d for _, _, d in self.mixed)
        row_s = self.decode_s / pure_rows if pure_rows > 0 else math.nan
        prefill_s, decode_s = self.prefill_s, self.decode_s
        for dt, p, d in self.mixed:
            on_rows = min(d * row_s, dt) if math.isfinite(row_s) else dt * d / (p + d)
            prefill_s += dt - on_rows
            decode_s += on_rows
        return prefill_s, decode_s

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def rate(self, mu_l: float, mu_o: float) -> float:
        """Served tokens per second of a request mix with mean prompt μ_L and output μ_O: (μ_L + μ_O) over
        μ_L·τ_p + (μ_O − 1)·τ_d, with τ_p, τ_d the seconds per prefill and decode token the window measured
        (idle time spread over both). Without both kinds of token, or without μ: tokens over time."""
        prefill_s, decode_s = self.split()
        busy = prefill_s + decode_s
        if busy <= 0:
            return math.nan
        if not (self.prefill_tokens and self.decode_tokens and mu_l > 0 and mu_o >= 1):
            return (self.prefill_tokens + self.decode_tokens + self.completions) / (busy + self.idle_s)
        t_req = mu_l * prefill_s / self.prefill_tokens + (mu_o - 1) * decode_s / self.decode_tokens
        return (mu_l + mu_o) / t_req * busy / (busy + self.idle_s)

    def attainment(self) -> float:
        """The share of the judged output tokens that met every target (``ebctl.slo``); NaN with none judged."""
        return slo.attainment(self.good_tokens, self.judged_tokens)

    @property
    def binds(self) -> bool:
        """Could the EB gate have held a request back? Not while the engine never held more than N − k requests:
        a refill of k then starts whenever one arrives, and EB runs as the engine's own rule. True for stock/mb."""
        return self.room < 0 or self.peak > self.room

    @property
    def saturated(self) -> bool:
        return self.seconds > 0 and self.saturated_s >= SATURATED_SHARE * self.seconds


@dataclass(slots=True)
class Trial:
    """Windows measured in the order A0 B1 A1 B2 A2 ... (A: the incumbent, B: the challenger)."""

    incumbent: str
    challenger: str
    started: float
    rates: list[tuple[str, float]] = field(default_factory=list)  # (arm, value) per measured window (module docstring)
    invalid: int = 0  # unsaturated windows in a row
    probed: bool = False  # an eb+ probe paused it (one per trial: each pause drops windows)
    lead: float = math.nan  # ln rate of a challenger window clearly above the incumbent, awaiting its confirmation
    ttfts: list[float] = field(default_factory=list)  # TTFTs of the challenger's measured windows
    tpots: list[float] = field(default_factory=list)  # ... and TPOTs
    attained: list[tuple[str, float]] = field(default_factory=list)  # (arm, attainment) per measured window (targets)
    predicted: float = math.nan  # the model's ln ratio of challenger to incumbent (``ebctl.prior``); NaN: none

    def arm(self) -> str:
        """The arm of the next measured window: the incumbent at even positions, the challenger at odd ones."""
        return self.incumbent if len(self.rates) % 2 == 0 else self.challenger

    def diffs(self) -> np.ndarray:
        """d_i = ln B_i − (ln A_{i−1} + ln A_i)/2 of each complete pair: the incumbent's windows on both sides
        of the challenger's cancel a linear drift."""
        ln = [math.log(r) for _, r in self.rates]
        return np.asarray([ln[i] - (ln[i - 1] + ln[i + 1]) / 2 for i in range(1, len(ln) - 1, 2)])


class Verdict(NamedTuple):
    decision: str  # "win", "lose" or "" (go on)
    effect: float  # mean ln-ratio (challenger over incumbent)
    half_width: float  # of its 95% interval
    why: str = ""  # what decided it where the interval alone does not say (futility)


def verdict(d: np.ndarray, *, prior_sd: float, min_pairs: int, max_pairs: int, min_effect: float) -> Verdict:
    """The trial's test on the pairs' ln-ratios ``d`` (module docstring)."""
    n = len(d)
    if n == 0:
        return Verdict("", math.nan, math.inf)
    mean = float(d.mean())
    ss = float(((d - mean) ** 2).sum())
    df = n - 1 + PRIOR_PAIRS
    sd = math.sqrt((ss + PRIOR_PAIRS * prior_sd**2) / df)
    half = _t(int(df)) * sd / math.sqrt(n)
    if n < min_pairs:
        return Verdict("", mean, half)
    bar = math.log1p(min_effect)
    if mean >= bar and mean - half > 0:
        return Verdict("win", mean, half)
    if mean + half < bar or mean <= 0 or n >= max_pairs:
        return Verdict("lose", mean, half)
    at_max = _t(int(df) + max_pairs - n) * sd / math.sqrt(max_pairs)
    if mean <= at_max:  # futile: at this mean, max_pairs pairs would not clear 0 either
        return Verdict("lose", mean, half, f"futile: {math.expm1(mean):+.1%} after {n} pair(s), within ±"
                                           f"{math.expm1(at_max):.1%} at {max_pairs}")
    return Verdict("", mean, half)
