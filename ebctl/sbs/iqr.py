"""Where decodes go: Algorithm 3, IQR-aware lexicographic decode scheduling (§4.3).

For a batch of decode requests, longest total sequence first (the "fill-the-valley" pre-sort), each
request r:

1. masks the units whose KV load is an outlier: Th = Q3 + k·(Q3 − Q1) over the KV loads K of all units,
   safe = {n : K_n ≤ Th} (all units if that were empty);
2. picks the safe unit with the lexicographically smallest (B_n, K_n): fewest requests, then least KV;
3. assigns r there: B += 1, K += Length(r).

Choices the paper leaves open, made here:
* Percentile is numpy's default (linear interpolation between order statistics); :func:`quartiles`
  computes it without numpy because it runs once per request on the dispatch path.
* Equal (B, K) go to the lowest unit index; equal lengths keep their input order (stable sort).
* The fallback of lines 13-15 can never trigger: Th ≥ Q3 ≥ min K, so the least-loaded unit is always
  safe. It is kept, as in the paper, for inputs with NaN.

Pure: lists of numbers in, the placement out.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def quartiles(sorted_k: Sequence[float]) -> tuple[float, float]:
    """(Q1, Q3) of ascending values, numpy's ``percentile(..., method="linear")``."""
    n = len(sorted_k)

    def pct(q: float) -> float:
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return sorted_k[lo] + (sorted_k[hi] - sorted_k[lo]) * (pos - lo)

    return pct(0.25), pct(0.75)


def threshold(sorted_k: Sequence[float], k: float) -> float:
    """Th_outlier = Q3 + k·(Q3 − Q1) (Algorithm 3 line 11)."""
    q1, q3 = quartiles(sorted_k)
    return q3 + k * (q3 - q1)


def place_decode(lengths: Sequence[int], batch: Sequence[int], kv: Sequence[int], *, k: float = 1.5
                 ) -> tuple[list[int], list[int], list[int]]:
    """Algorithm 3 for requests of total sequence ``lengths`` on units with batch sizes ``batch`` (B) and
    KV loads ``kv`` (K). Returns (unit index per request in input order, final B, final K)."""
    if len(batch) != len(kv) or not batch:
        raise ValueError(f"place_decode: need one batch size and one KV load per unit (got {len(batch)} "
                         f"and {len(kv)}, at least one unit)")
    b, kvl = list(batch), list(kv)
    sorted_k = sorted(kvl)
    unit_of = [0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    units = range(len(b))
    for i in order:
        th = threshold(sorted_k, k)
        safe = [n for n in units if kvl[n] <= th] or list(units)
        best = min(safe, key=lambda n: (b[n], kvl[n]))  # min() keeps the first of equals: lowest index
        unit_of[i] = best
        old = kvl[best]
        b[best] += 1
        kvl[best] = old + lengths[i]
        del sorted_k[bisect.bisect_left(sorted_k, old)]
        bisect.insort(sorted_k, kvl[best])
    return unit_of, b, kvl
