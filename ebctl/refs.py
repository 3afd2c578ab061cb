"""The measured search's references (``ebctl.tuner``): the incumbent's and stock's last steady windows, and what
they set for a challenger's windows: the incumbent's reference rate and window-to-window sd, the early-stop and
early-win bars, the pooled sd of a pair's ln ratio over the trials, and the latency guard's p99 ratio (``excess``).

Pure: window figures in, references and bars out; no clock, no I/O.
"""

from __future__ import annotations

import math

import numpy as np

from ebctl.trial import PRIOR_PAIRS

# sd of a pair's ln-ratio before a trial measured one (a prior, of the order of a simulated pair's spread)
PRIOR_SD = 0.01
# A challenger window (its settling windows included) this far below the incumbent's reference (the mean of its
# last steady windows), in ln-rate, ends the trial at once: at least EARLY_STOP_MIN, and EARLY_STOP_Z sd of the
# difference, σ·√(1 + 1/n) for n reference windows of sd σ. EARLY_STOP_Z = 3/√2 keeps the false-stop rate of a
# 3-σ bar against one reference window (a difference of sd σ√2). On a slow server waiting for a whole pair
# doubles what a bad arm costs.
EARLY_STOP_MIN, EARLY_STOP_Z = 0.03, 3.0 / math.sqrt(2.0)
# A settling window carries what the switch left behind, in either direction: it ends a trial only this far below.
EARLY_STOP_SETTLING = 0.15
REF_WINDOWS = 8  # the incumbent's last windows kept for its window-to-window sd
MIN_TTFTS = 100  # TTFTs (TPOTs) of each side before the latency guard compares p99s (``excess``)
MIN_REF = 3  # steady windows of the incumbent before a trial: their sd sets the bars (one low reference window
# alone would let a challenger "win")
# Until the incumbent has MIN_REF steady windows (a trial begun under the one-window rule) the spread of its windows
# is unknown: a challenger wins early only at twice its worth, stops early only beyond EARLY_STOP_SETTLING, and the
# pairs' test waits for the MIN_REF-th window (``thin``)
THIN_WIN = math.log(2.0)


def excess(values: list[float], stock: list[list[float]]) -> float:
    """p99 of ``values`` (a challenger's TTFTs or TPOTs) over the p99 of ``stock``'s (stock's last steady
    windows'), − 1; NaN with fewer than ``MIN_TTFTS`` on either side (the p99 of fewer is one request's)."""
    ref = [x for ts in stock for x in ts]
    if len(values) < MIN_TTFTS or len(ref) < MIN_TTFTS:
        return math.nan
    return float(np.percentile(values, 99) / max(np.percentile(ref, 99), 1e-9)) - 1.0


class Refs:
    """The last ``REF_WINDOWS`` steady windows of the incumbent (``ref_lns``: ln rates; ``ref_att``: with latency
    targets, their attainments) and of stock (``stock_lns``, and the TTFTs and TPOTs of each, the latency guard's),
    and the pairs' squared deviations pooled over decided trials (``pooled_ss`` over ``pooled_df``)."""

    def __init__(self) -> None:
        self.ref_lns: list[float] = []
        self.ref_att: list[float] = []
        self.stock_lns: list[float] = []
        self.stock_ttfts: list[list[float]] = []
        self.stock_tpots: list[list[float]] = []
        self.pooled_ss, self.pooled_df = 0.0, 0.0

    def add_incumbent(self, ln: float, attainment: float) -> None:
        """A steady window of the incumbent: its ln rate and attainment."""
        self.ref_lns = [*self.ref_lns[-(REF_WINDOWS - 1):], ln]
        self.ref_att = [*self.ref_att[-(REF_WINDOWS - 1):], attainment]

    def add_stock(self, ln: float, ttfts: list[float], tpots: list[float]) -> None:
        """A steady window of stock: its ln rate, its requests' TTFTs and TPOTs."""
        self.stock_lns = [*self.stock_lns[-(REF_WINDOWS - 1):], ln]
        self.stock_ttfts = [*self.stock_ttfts[-(REF_WINDOWS - 1):], ttfts]
        self.stock_tpots = [*self.stock_tpots[-(REF_WINDOWS - 1):], tpots]

    def ref(self) -> float:
        """The incumbent's reference ln rate: the mean of its last steady windows (NaN before the first)."""
        return math.fsum(self.ref_lns) / len(self.ref_lns) if self.ref_lns else math.nan

    @property
    def window_sd(self) -> float:
        """The sd of the incumbent's recent steady windows' ln rates (0 under MIN_REF of them)."""
        return float(np.std(self.ref_lns, ddof=1)) if len(self.ref_lns) >= MIN_REF else 0.0

    @property
    def early_stop_bar(self) -> float:
        """How far (ln-rate) one challenger window must fall below the incumbent's reference to end a trial at
        once: EARLY_STOP_MIN, or EARLY_STOP_Z sd of a window's difference from the mean of n reference windows,
        σ·√(1 + 1/n), if that is more."""
        n = len(self.ref_lns)
        return max(EARLY_STOP_MIN, EARLY_STOP_Z * self.window_sd * math.sqrt(1.0 + 1.0 / n)) if n else EARLY_STOP_MIN

    def stop_bar(self, settling_first: bool) -> float:
        """The early-stop bar for the window closing now: at least ``EARLY_STOP_SETTLING`` for the first settling
        window after a switch (``settling_first``), which carries what the switch left behind, and while ``thin``;
        else ``early_stop_bar``."""
        wide = settling_first or self.thin
        return max(self.early_stop_bar, EARLY_STOP_SETTLING) if wide else self.early_stop_bar

    @property
    def thin(self) -> bool:
        """Has the incumbent fewer than MIN_REF steady windows? Only in a trial begun under the one-window rule
        (``Tuner._refs_needed``): its windows' spread, which sets the bars, is unknown (``THIN_WIN``)."""
        return len(self.ref_lns) < MIN_REF

    @property
    def thin_win(self) -> float:
        """The least ln ratio of an early win while ``thin`` (0 otherwise): a challenger that meets the targets
        against an incumbent that met them for less than half its tokens is worth more than twice as much."""
        return THIN_WIN if self.thin else 0.0

    def early_win_bar(self) -> float:
        """How far (ln-rate) one challenger window must run above the reference (plus the least effect) for one
        more window to decide it: ``early_stop_bar``, at least ``thin_win``."""
        return max(self.early_stop_bar, self.thin_win)

    def two_windows(self) -> tuple[float, float]:
        """(bar, variance) of the mean of two challenger windows against the reference: its variance
        σ²·(1/2 + 1/n) for n reference windows of sd σ, the bar EARLY_STOP_Z sd of it, at least EARLY_STOP_MIN and
        ``thin_win``."""
        var = self.window_sd**2 * (0.5 + 1.0 / max(len(self.ref_lns), 1))
        return max(EARLY_STOP_MIN, EARLY_STOP_Z * math.sqrt(var), self.thin_win), var

    @property
    def prior_sd(self) -> float:
        """The pooled sd of a pair's ln-ratio over earlier trials (PRIOR_SD before any), shrunk the same way; at
        least what the incumbent's own windows imply for a pair (var(B − (A0 + A1)/2) = 1.5 σ²)."""
        pooled = math.sqrt((self.pooled_ss + PRIOR_PAIRS * PRIOR_SD**2) / (self.pooled_df + PRIOR_PAIRS))
        return max(pooled, math.sqrt(1.5) * self.window_sd)

    def effect_var(self, d: np.ndarray) -> float:
        """The variance of mean(d), with the sd shrunk towards the pooled one as in ``trial.verdict``."""
        n = len(d)
        ss = float(((d - d.mean()) ** 2).sum())
        return (ss + PRIOR_PAIRS * self.prior_sd**2) / (n - 1 + PRIOR_PAIRS) / n

    def pool(self, d: np.ndarray) -> None:
        """A decided trial's pairs ``d`` join the pooled sd."""
        if len(d) > 1:
            self.pooled_ss += float(((d - d.mean()) ** 2).sum())
            self.pooled_df += len(d) - 1
