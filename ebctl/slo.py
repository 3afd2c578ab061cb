"""The operator's latency targets (``controller.slo_ttft_s``, ``controller.slo_tpot_s``) and what they make the
measured search maximize: goodput.

**Meeting the targets.** A finished request meets them when it was not aborted, its TTFT (first token − arrival,
as the engine measured it) is at most ``ttft_s`` and its TPOT ((last token − first token) / (output − 1)) at most
``tpot_s``. A target of 0 is not set. A one-token output has no TPOT: its TTFT alone decides (the simulator's
``sim/metrics.py`` and ``tools/ab_real.py`` count the same). A request whose timing for a set target was not
measured (NaN) is not judged: it counts neither for nor against. An aborted request is judged and misses.

**Goodput** is the output tokens per second of the requests that met every set target; **attainment** the share
of the judged requests' output tokens that did (tokens, not requests, because goodput counts tokens).

**A window's value** (``ebctl.tuner``): its served-token rate (``trial.Window.rate``) times its attainment,

    value = rate × max(attained, FLOOR)

The rate is the one of the controller's request mix (μ_L, μ_O), whose output part is rate × μ_O / (μ_L + μ_O)
whatever the arm: the ratio of two windows' values is the ratio of their goodputs, and a trial's ln-ratios compare
goodput. FLOOR keeps the log of a window where almost nothing met the targets finite; two arms both below it
compare by throughput, which is what the operator gets from either. (``value`` of a window that judged nothing,
attainment NaN, is its rate; the tuner does not count such a window.)

**Which requests judge a window.** A request finishing in a window got its first token up to a lifetime earlier,
maybe under the arm before a switch: its TTFT, and part of its TPOT, are that arm's. With N requests running the
batch turns over every N completions, more than the settling windows the tuner drops after a switch cover (one
window of ``tune_window`` = 400 completions for EB, two for stock and mb) wherever N ≳ 400-800: they cover the
rate, not the latencies. So a window judges only the requests whose first token came after its arm's current
run began, and at most ``tune_window`` completions before the window's own start (``since``; the first token's
time is the finish − TPOT·(output − 1); a request whose first token cannot be placed, one token or no TPOT, by its
finish). The second bound holds every window to the same rule, a steady one as one just after a switch (whose
settling windows hold those completions): the requests that lived through at most about two windows' worth of
completions, not the longest ones only in steady windows. It leaves out requests that lived longer. A window that
judged no request says nothing of goodput and does not count.

What it does not remove: a switch changes the batch and the queue the next arm starts from, and latency shows
that for longer than throughput does: a queue built under a challenger can keep the incumbent's first measured
windows after the trial missing the targets, past its settling windows.

**Why TPOT and not an inter-token latency.** The paper's SLO (its Table 18) and the simulator's goodput are on
TPOT, and the reports carry TTFT and TPOT per request, no per-token gaps. EB's refills stall every running
request's stream while k prompts prefill: TPOT averages that stall over the request's tokens, a per-token bound
would not. Where the stall itself matters (a streamed chat's longest pause), that is a target on the longest gap,
which the reports would have to carry first.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from ebctl.protocol import FinishedRequest

FLOOR = 0.01  # a window's attainment counts as at least this (its log stays finite)


class Targets(NamedTuple):
    """The latency targets; 0: not set."""

    ttft_s: float = 0.0
    tpot_s: float = 0.0

    @property
    def set(self) -> bool:
        return self.ttft_s > 0 or self.tpot_s > 0

    def describe(self) -> str:
        parts = ([f"TTFT ≤ {self.ttft_s:g} s"] if self.ttft_s > 0 else []) + (
            [f"TPOT ≤ {self.tpot_s * 1e3:g} ms"] if self.tpot_s > 0 else [])
        return " and ".join(parts) or "none"


class Tally(NamedTuple):
    """Output tokens of the judged requests: all of them, those that met every target, those within each."""

    judged: int = 0
    good: int = 0
    ttft_ok: int = 0
    tpot_ok: int = 0


def judge(f: FinishedRequest, t: Targets) -> tuple[bool, bool] | None:
    """(met the TTFT target, met the TPOT target) of one finished request, an unset target counting as met; None
    when a set target's timing was not measured (module docstring)."""
    if f.finish_reason == "abort":
        return False, False
    ttft_ok = tpot_ok = True
    if t.ttft_s > 0:
        if not f.ttft_s >= 0.0:  # NaN: not measured
            return None
        ttft_ok = f.ttft_s <= t.ttft_s
    if t.tpot_s > 0 and f.output_len > 1:
        if not f.tpot_s >= 0.0:
            return None
        tpot_ok = f.tpot_s <= t.tpot_s
    return ttft_ok, tpot_ok


def first_token_at(f: FinishedRequest, finish: float) -> float:
    """When ``f``'s first token came, from its finish time and TPOT; its finish where that cannot be told."""
    if f.output_len > 1 and f.tpot_s >= 0.0:
        return finish - f.tpot_s * (f.output_len - 1)
    return finish


def tally(finished: Iterable[FinishedRequest], t: Targets, *, finish: float = math.nan,
          since: float = -math.inf) -> Tally:
    """The output tokens of ``finished`` (requests that finished at ``finish``) judged against ``t``; with
    ``since``, only those whose first token came at or after it."""
    judged = good = ttft = tpot = 0
    for f in finished:
        if since > -math.inf and first_token_at(f, finish) < since:
            continue
        ok = judge(f, t)
        if ok is None:
            continue
        n = f.output_len
        judged += n
        ttft += n if ok[0] else 0
        tpot += n if ok[1] else 0
        good += n if ok[0] and ok[1] else 0
    return Tally(judged, good, ttft, tpot)


def attainment(good: float, judged: float) -> float:
    """The share of judged output tokens that met the targets; NaN with none judged."""
    return good / judged if judged > 0 else math.nan


def value(rate: float, attained: float) -> float:
    """A window's worth under the targets: its rate × max(attainment, FLOOR); its rate where nothing was judged."""
    return rate * max(attained, FLOOR) if math.isfinite(attained) else rate
