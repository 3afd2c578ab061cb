"""The A/B's figures from what the client recorded: percentiles, a stream's TTFT and TPOT, token histograms and
windows, a run's summary, goodput at targets, and the bootstrap of a ratio. Plain functions of lists: no I/O, no
clock (tests/unit/test_ab_stats.py, hand-worked numbers)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

BIN_S = 30.0  # the record's throughput bins (the learning curve)
HIST_S = 1.0  # the client's token histogram resolution


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between order statistics (numpy's default); nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def tpot(t_first: float, t_last: float, tokens: int) -> float | None:
    """Time per output token after the first: (last token time - first token time) / (tokens - 1)."""
    return (t_last - t_first) / (tokens - 1) if tokens >= 2 else None


def stream_summary(t_send: float, events: Sequence[tuple[float, int]]) -> dict[str, Any]:
    """One streamed request: ``events`` are (arrival time, cumulative output tokens) of the chunks that brought
    tokens. Its TTFT, TPOT, tokens and first/last token times (None where there were no tokens)."""
    if not events:
        return {"ttft": None, "tpot": None, "tokens": 0, "first": None, "last": None}
    (t1, _), (tn, n) = events[0], events[-1]
    return {"ttft": t1 - t_send, "tpot": tpot(t1, tn, n), "tokens": n, "first": t1, "last": tn}


def add_tokens(hist: list[float], events: Sequence[tuple[float, int]], res: float = HIST_S) -> None:
    """Add each chunk's new tokens to ``hist`` (tokens per bin of ``res`` seconds, bin i = [i res, (i+1) res))."""
    prev = 0
    for t, n in events:
        i = max(0, int(t // res))
        if i >= len(hist):
            hist.extend([0.0] * (i + 1 - len(hist)))
        hist[i] += n - prev
        prev = n


def window_rate(hist: Sequence[float], res: float, a: float, b: float) -> float:
    """Tokens per second in [a, b) from a histogram of bins of ``res`` seconds (a bin cut by the window counts in
    proportion to its overlap); nan for an empty window."""
    if not b > a:
        return math.nan
    total = 0.0
    for i in range(max(0, int(a // res)), min(len(hist), math.ceil(b / res))):
        lo, hi = i * res, (i + 1) * res
        overlap = min(hi, b) - max(lo, a)
        if overlap > 0:
            total += hist[i] * overlap / res
    return total / (b - a)


def bins(hist: Sequence[float], res: float, width: float, end: float) -> list[float]:
    """Tokens per second in consecutive bins of ``width`` seconds over [0, end) (the last may be shorter)."""
    out, a = [], 0.0
    while a < end - 1e-9:
        out.append(window_rate(hist, res, a, min(a + width, end)))
        a += width
    return out


def ttft_p99_bins(records: Sequence[dict[str, Any]], width: float, end: float) -> list[float]:
    """The p99 TTFT of the completed requests sent in each consecutive bin of ``width`` seconds over [0, end)
    (nan for a bin where none was)."""
    n = max(1, math.ceil(end / width - 1e-9))
    per: list[list[float]] = [[] for _ in range(n)]
    for r in records:
        if r["status"] == "ok" and r["ttft"] is not None and 0 <= r["t"] < end:
            per[min(n - 1, int(r["t"] // width))].append(r["ttft"])
    return [percentile(xs, 99) for xs in per]


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, draws: int = 10_000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of mean(num*) / mean(den*) over ``draws`` bootstrap resamples (each list resampled with
    replacement, on its own); the interval is the central ``level`` of those ratios. Draws whose baseline mean is
    0 have no ratio and are left out; NaN throughout when more than half are.

    Not ``scipy.stats.bootstrap``: its percentile interval of two independent samples is this, but its draws
    differ, and the pooled records (docs/results/ab_real.md) were computed with these."""
    if not num or not den:
        return (math.nan, math.nan, math.nan)
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        d = statistics.fmean(rng.choices(den, k=len(den)))
        n = statistics.fmean(rng.choices(num, k=len(num)))
        if d:  # a draw whose baseline mean is 0 (no goodput at tight targets) has no ratio: left out
            ratios.append(n / d)
    if len(ratios) < draws / 2:
        return (math.nan, math.nan, math.nan)
    tail = (1 - level) / 2 * 100
    return (percentile(ratios, 50), percentile(ratios, tail), percentile(ratios, 100 - tail))


def summarize(records: Sequence[dict[str, Any]], hist: Sequence[float], res: float, duration: float,
              last: float) -> dict[str, Any]:
    """One run's figures from the client's records (``t`` send time, ``end`` time it ended or None, ``status``
    ok/failed/unfinished, ``ttft``, ``tpot``) and token histogram; times relative to the start of the load."""
    ok = [r for r in records if r["status"] == "ok"]
    at_end = [r for r in records if r["t"] < duration and (r["end"] is None or r["end"] >= duration)]
    last = min(last, duration)
    return {
        "tok_s": window_rate(hist, res, 0.0, duration),
        "tok_s_last": window_rate(hist, res, duration - last, duration),
        "ttft_p50": percentile([r["ttft"] for r in ok], 50), "ttft_p99": percentile([r["ttft"] for r in ok], 99),
        "tpot_p50": percentile([r["tpot"] for r in ok if r["tpot"] is not None], 50),
        "tpot_p99": percentile([r["tpot"] for r in ok if r["tpot"] is not None], 99),
        "sent": len(records), "completed": len(ok),
        "failed": sum(r["status"] == "failed" for r in records),
        "unfinished": sum(r["status"] == "unfinished" for r in records),
        "in_flight_at_end": len(at_end), "completed_in_drain": sum(r["status"] == "ok" for r in at_end),
        "output_tokens": sum(hist), "bins_30s": bins(hist, res, BIN_S, duration),
    }


def goodput(records: Sequence[dict[str, Any]], duration: float, slo: tuple[float, float],
            last: float = math.nan) -> dict[str, float]:
    """Goodput at the operator's targets ``slo`` = (TTFT s, TPOT s): the output tokens of the requests that
    completed with TTFT ≤ the first and TPOT ≤ the second (a one-token request has no TPOT: its TTFT alone),
    per second of load (``duration``; requests in flight at its end count when they completed in the drain),
    and ``attained``: their share of the requests sent (a failed or unfinished request misses). With ``last``,
    also ``goodput_last_tok_s``: the same over the last ``last`` seconds, the requests that ended from then on
    (a run's learning is over by then, as for its last part's throughput)."""
    ttft_s, tpot_s = slo
    good = [r for r in records if r["status"] == "ok" and r["ttft"] is not None and r["ttft"] <= ttft_s
            and (r["tpot"] is None or math.isnan(r["tpot"]) or r["tpot"] <= tpot_s)]  # NaN: None read back
    out = {"goodput_tok_s": sum(r["tokens"] for r in good) / duration,
           "attained": len(good) / len(records) if records else math.nan}
    if last > 0:
        since = duration - min(last, duration)
        out["goodput_last_tok_s"] = sum(r["tokens"] for r in good if r["end"] >= since) / (duration - since)
    return out


def parse_slo(text: str) -> tuple[float, float]:
    """``--slo TTFT,TPOT`` (seconds, both > 0); ValueError naming the text otherwise."""
    try:
        ttft_s, tpot_s = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--slo {text!r}: give TTFT,TPOT in seconds, e.g. 1.0,0.05") from None
    if not (ttft_s > 0 and tpot_s > 0 and math.isfinite(ttft_s + tpot_s)):
        raise ValueError(f"--slo {text!r}: both targets must be positive seconds")
    return ttft_s, tpot_s


def finite(x: Any) -> Any:
    """nan → None, so that the JSON is strict."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def nan(x: Any) -> Any:
    """None (a NaN written to the strict JSON) → NaN again."""
    if x is None:
        return math.nan
    if isinstance(x, dict):
        return {k: nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [nan(v) for v in x]
    return x
