"""The measured search's ledger (``ebctl.tuner``): the engine seconds exploring has given up, what the exploration
budget leaves, and the incumbent's gain against stock with its variance.

Pure: window figures in, sums and ratios out; no clock (elapsed times come from the caller), no I/O.
"""

from __future__ import annotations

import math

from ebctl.arms import STOCK
from ebctl.refs import MIN_REF

GAIN_WINDOWS = 128  # windows of the incumbent and of stock the gain shown in status is measured over (``vs_stock``)
MAX_RHO = 0.9  # the lag-1 autocorrelation ``mean_var`` allows for


def mean_var(xs: list[float]) -> tuple[float, float]:
    """The mean of a series of window ln-rates and its variance, allowing for their lag-1 autocorrelation ρ
    (the AR(1) effective sample size: var = s²/n · (1 + ρ)/(1 − ρ), ρ clipped to [0, ``MAX_RHO``]): windows of
    one arm in a row share the batch that carries over between them, so s²/n alone reads too sure."""
    n = len(xs)
    m = math.fsum(xs) / n
    if n < 2:
        return m, math.nan
    d = [x - m for x in xs]
    ss = math.fsum(v * v for v in d)
    if ss == 0:
        return m, 0.0
    rho = min(max(math.fsum(d[i] * d[i + 1] for i in range(n - 1)) / ss, 0.0), MAX_RHO) if n >= 4 else 0.0
    return m, ss / (n - 1) / n * (1 + rho) / (1 - rho)


def carried(gain: tuple[float, float], incumbent: str, challenger: str, decision: str, effect: float,
            var: float) -> tuple[float, float]:
    """The incumbent's gain against stock, (ln ratio, variance), after a decided trial of ``challenger`` against
    ``incumbent`` that measured ``effect`` (the challenger's ln ratio to the incumbent) with variance ``var``:
    measured directly when one of the two arms was stock; after a win of EB over EB, the chain of the two
    measured steps (ln ratios add, variances too)."""
    ln, v = gain
    if decision == "win":
        if challenger == STOCK:
            return 0.0, 0.0
        if incumbent == STOCK:
            return effect, var
        return ln + effect, v + var
    if challenger == STOCK:  # stock lost to the incumbent: the incumbent's gain, measured again
        return -effect, var
    return ln, v


class Ledger:
    """Exploring's cost and the incumbent's gain against stock, kept window by window.

    ``explore_s``: engine seconds given up to exploring, slower windows only (the budget's bound);
    ``explore_net_s``: the same with the faster windows counted against it (the estimate shown);
    ``explore_run_s``: seconds the engine ran a challenger (settling windows included). ``gain_inc``: ln rates of
    the incumbent's steady windows since it won; ``gain_stock``: of stock's since the last reset; ``gain_ln``,
    ``gain_var``: the incumbent against stock as the trials carried it (``carried``)."""

    def __init__(self) -> None:
        self.explore_s = 0.0
        self.explore_net_s = 0.0
        self.explore_run_s = 0.0
        self.gain_inc: list[float] = []
        self.gain_stock: list[float] = []
        self.gain_ln, self.gain_var = 0.0, 0.0

    def charge(self, seconds: float, d: float, *, challenger: bool) -> None:
        """A window of exploring, a challenger's or the incumbent's way back from it, of ``seconds``, ``d`` its ln
        rate over the incumbent's reference (NaN: it counts for nothing). It costs seconds × (1 − e^d): in the
        bound only where slower; in the net figure a faster window gains at most its own seconds (with latency
        targets a challenger's goodput can be many times the incumbent's, and the share shown would read as
        exploring gaining more than the run)."""
        if challenger:
            self.explore_run_s += seconds
        if math.isfinite(d):
            self.explore_s -= seconds * min(math.expm1(d), 0.0)
            self.explore_net_s -= seconds * min(math.expm1(d), 1.0)

    def add_incumbent(self, ln: float) -> None:
        """A steady window of the incumbent (the last ``GAIN_WINDOWS`` are kept)."""
        self.gain_inc = [*self.gain_inc[-(GAIN_WINDOWS - 1):], ln]

    def add_stock(self, ln: float) -> None:
        """A steady window of stock (the last ``GAIN_WINDOWS`` are kept)."""
        self.gain_stock = [*self.gain_stock[-(GAIN_WINDOWS - 1):], ln]

    def budget_left(self, budget: float, elapsed: float) -> float:
        """Engine seconds the search may still give up: ``budget`` of the ``elapsed`` time since the first report,
        less what exploring has cost (0 while nothing has elapsed)."""
        return budget * elapsed - self.explore_s if math.isfinite(elapsed) else 0.0

    def trial_cost(self, trials: int, window_s: float) -> float:
        """Engine seconds a trial is expected to give up: the mean of the ``trials`` so far, never less than one
        window's ``window_s``."""
        return max(self.explore_s / trials if trials else 0.0, window_s)

    def carry(self, incumbent: str, challenger: str, decision: str, effect: float, var: float) -> None:
        """The gain against stock after a decided trial (``carried``)."""
        self.gain_ln, self.gain_var = carried((self.gain_ln, self.gain_var), incumbent, challenger, decision,
                                              effect, var)

    def vs_stock(self, at_stock: bool) -> tuple[float, float]:
        """(ln ratio, variance) of the incumbent against stock (``at_stock``: the incumbent is stock). Once the
        incumbent has run ``MIN_REF`` steady windows since it won and stock's last ones are known: the mean of the
        one against the mean of the other, windows that decided nothing. A trial stops where the challenger's
        windows ran high, so the trials' own figure (``carry``, used before) reads high. Every window of each since
        then counts (up to ``GAIN_WINDOWS``), so the figure converges on the long-run ratio; consecutive windows of
        one arm are correlated (the batch carries over), so each mean's variance is ``mean_var``'s."""
        a, b = self.gain_inc, self.gain_stock
        if at_stock or len(a) < MIN_REF or len(b) < MIN_REF:
            return self.gain_ln, self.gain_var
        (ma, va), (mb, vb) = mean_var(a), mean_var(b)
        return ma - mb, va + vb

    def gain(self, at_stock: bool, elapsed: float, budget_left: float) -> dict[str, float]:
        """What the incumbent buys against stock (``vs_stock``): the ratio − 1 with its 95% interval (0 at stock),
        and the share of the ``elapsed`` time given up to exploring so far (``explore_net_s`` over it, negative
        where the trials ran ahead; ``explore_bound_s``: the budget's one-sided sum, ``explore_s``;
        ``explore_run_s``: the time challengers ran). A gain carried from a win on two windows against a single
        reference window has no interval (NaN): one window has no spread."""
        ln, var = self.vs_stock(at_stock)
        half = 1.96 * math.sqrt(var)
        share = self.explore_net_s / elapsed if math.isfinite(elapsed) and elapsed > 0 else 0.0
        return {"vs_stock": math.expm1(ln), "low": math.expm1(ln - half),
                "high": math.expm1(ln + half), "explore_cost_s": self.explore_net_s,
                "explore_bound_s": self.explore_s, "explore_share": share, "explore_run_s": self.explore_run_s,
                "elapsed_s": elapsed if math.isfinite(elapsed) else 0.0, "budget_left_s": budget_left}
