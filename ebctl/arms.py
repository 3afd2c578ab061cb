"""The measured search's arms (``ebctl.tuner``) and the grid they lie on: what each arm is and which arms neighbour
which, as pure functions over a frozen record.

An arm is a string: ``stock`` (the engine's own prefill-first rule, k = 1), ``mb`` (mixed batches), ``eb@i``
(EB at θ = θ_max·2^(−i/4), i = 0..top, a quarter octave apart down to θ_min) and ``pdi@N`` (stock with sglang's
``--prefill-decode-interval`` at N). On an engine of N slots an EB arm runs k = ⌊θ·N⌋; below ``MIN_K`` it is
the engine's own rule.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ebctl.protocol import Mode

STOCK, MB = "stock", "mb"
PDI = "pdi@"  # pdi@N: stock with sglang's --prefill-decode-interval at N (policy ``pd_interval``); targets only
PD_FIRST, PD_MAX = 8, 32  # the interval tried first, and the largest (sglang_patch: any N; the sim sweeps 1-32)
PROBE = "probe"  # what policy versions of an eb+ probe are bound to: no arm's, but their mode is known
QUARTERS = 4  # grid points per octave of θ
MIN_K = 2  # an EB arm needs k >= 2 at the engine's N: EB(k = 1) is the engine's own prefill-first rule
# Windows dropped after a switch. The engine's own admission (stock, mb) carries state across a switch: under
# EB no decode ran out of KV, so sglang's new_token_ratio has decayed to its floor, and stock then admits more
# than it can keep until a retraction backs the ratio off: stock runs fast for about two windows. EB's batch
# settles within one.
SETTLE_OWN, SETTLE_EB = 2, 1


def mode(arm: str) -> Mode:
    """The gate mode an arm runs: MB for mb, EB for ``eb@i``, OFF (the engine's own rule) for stock and pdi."""
    return Mode.MB if arm == MB else Mode.EB if arm.startswith("eb@") else Mode.OFF


def pd_interval(arm: str) -> int:
    """N of a ``pdi@N`` arm (the policy's ``pd_interval``); 0 for the others: the engine's launch value."""
    return int(arm[len(PDI):]) if arm.startswith(PDI) else 0


def settle(arm: str) -> int:
    """Windows dropped after a switch to ``arm`` (``SETTLE_OWN``, ``SETTLE_EB``): a pdi arm runs the engine's own
    admission, as stock does."""
    return SETTLE_OWN if arm in (STOCK, MB) or arm.startswith(PDI) else SETTLE_EB


def pdi_steps(inc: str, direction: int, tpot_binds: bool) -> list[str]:
    """From ``pdi@N``: N doubled (at most ``PD_MAX``) and halved (below 1: stock), in the direction of the last
    win between intervals (``direction`` > 0: longer), else doubled first only where TPOT binds (a longer interval
    holds prefills back longer: TTFT grows)."""
    n = pd_interval(inc)
    up = f"{PDI}{2 * n}" if 2 * n <= PD_MAX else None
    down = f"{PDI}{n // 2}" if n > 1 else STOCK
    longer = direction > 0 if direction else tpot_binds
    return [a for a in ([up, down] if longer else [down, up]) if a is not None]


@dataclass(frozen=True)
class Grid:
    """The log grid of θ from ``theta_max`` down to ``theta_min``, and the engine's slots ``n`` the EB arms map θ
    to k on (0: unknown)."""

    theta_max: float
    theta_min: float
    n: int = 0

    @property
    def top(self) -> int:
        """The largest grid index: θ_max·2^(−top/4) is the smallest grid θ at or above θ_min."""
        return math.floor(QUARTERS * math.log2(self.theta_max / self.theta_min) + 1e-9)

    def theta(self, arm: str) -> float:
        """θ of an EB arm (``eb@i``: θ_max · 2^(−i/4)); NaN for stock and mb."""
        if not arm.startswith("eb@"):
            return math.nan
        return self.theta_max * 2.0 ** (-int(arm[3:]) / QUARTERS)

    def eb_arm(self, theta: float) -> str:
        """The grid arm nearest to θ (clipped to θ_min..θ_max)."""
        if not (math.isfinite(theta) and theta > 0):
            return f"eb@{self.top}"
        i = round(QUARTERS * math.log2(self.theta_max / theta))
        return f"eb@{min(max(i, 0), self.top)}"

    def k(self, arm: str) -> int:
        """k = ⌊θ·N⌋ of an EB arm at the engine's N (1 for stock and mb, and while N is unknown)."""
        return max(1, math.floor(self.theta(arm) * self.n + 1e-9)) if arm.startswith("eb@") and self.n else 1

    def lowest(self) -> str:
        """The smallest grid θ whose k reaches MIN_K at the engine's N ("" if none does)."""
        for i in range(self.top, -1, -1):
            if self.k(f"eb@{i}") >= MIN_K:
                return f"eb@{i}"
        return ""

    def entries(self, thetas: list[float], theta_entry: float) -> list[str]:
        """The EB arms a search enters at from stock or mb, the smallest k first: the grid arm of each closed-form θ,
        at most ``theta_entry``; one whose k would be below ``MIN_K`` at the engine's N enters at ``lowest``."""
        arms = [self.eb_arm(min(t, theta_entry)) for t in thetas]
        if self.n:
            arms = [a if self.k(a) >= MIN_K else self.lowest() for a in arms]
        return sorted((a for a in dict.fromkeys(arms) if a), key=self.theta)

    def ladder(self, entries: list[str]) -> list[str]:
        """EB an octave above the largest of ``entries`` (else above ``lowest``), then another, up to θ_max."""
        low = entries[-1] if entries else self.lowest()
        if not low:
            return []
        return [f"eb@{j}" for j in range(int(low[3:]) - QUARTERS, -1, -QUARTERS)]  # k grows with θ: all ≥ MIN_K

    def eb_steps(self, inc: str, step: int, direction: int) -> list[str]:
        """From EB(θ), ``inc``: a step of ``step`` grid points up and down, going on past points whose k equals the
        incumbent's (at N = 16 a quarter octave often maps to the same k); a k below MIN_K, or below the grid, is
        stock. Down first where the last move that won went down (``direction`` < 0)."""
        i, k = int(inc[3:]), self.k(inc)

        def other(js: range) -> str | None:  # the first grid point of js whose k differs from the incumbent's
            return next((f"eb@{j}" for j in js if not self.n or self.k(f"eb@{j}") != k), None)

        up = other(range(max(i - step, 0), -1, -1)) if i > 0 else None
        down = other(range(i + step, self.top + 1)) if i + step <= self.top else None
        if down is None or (self.n and self.k(down) < MIN_K):
            down = STOCK
        order = [down, up] if direction < 0 else [up, down]
        return [a for a in order if a is not None]
