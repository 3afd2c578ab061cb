"""EB+ probes: short runs of the mode EB+ is not in, so that Eq. 8 compares two measured costs.

Eq. 8 weighs the cost of mixed batches (α_MB, β_MB^e(r)) against the exclusive ones (α_p, β_p, α_d, β_d). The
online fits learn a kind's cost only from iterations of that kind, and an engine in EB runs no mixed batch (an
engine in MB runs few prefill-only ones): without help, the fit of the other mode is missing, or stale from
long ago. A probe runs the other mode for ``probe_s`` seconds, only when

* the fit that mode would feed is missing (not passed) or stale (no iteration of its kind for ``stale_s``),
  and, for the mixed fit, Eq. 8 could use it: the online decode fit's intercept is identified
  (``OnlineCosts.intercept_identified``; Eq. 8 takes the three online fits or none),
* no mode switch is cooling down (the controller's ``mode_cooldown``), the engine is saturated, and no
  measured-θ trial runs unless the fit never passed (the controller's ``Steering._probe``), and
* the probes so far stay within ``share`` of the time: the next one starts at least ``probe_s / share`` after
  the previous one started.

Pure: times come in as arguments.
"""

from __future__ import annotations

import math
from typing import Any

from ebctl.protocol import Mode


class ModeProbe:
    """When to run the other mode for a moment, and what was run (counts and time, for status and metrics)."""

    def __init__(self, probe_s: float = 3.0, share: float = 0.03) -> None:
        self.probe_s, self.share = float(probe_s), float(share)
        self.mode: Mode | None = None  # the mode being probed, None when no probe runs
        self.started = -math.inf
        self.count = 0
        self.seconds = 0.0  # probed time, probes in progress included up to their end
        self.last_kind = ""  # what the last probe was for ("mixed" or "prefill")
        self.first_seen = math.nan  # the first time the probe was asked: the share is counted from it

    def set_params(self, probe_s: float, share: float) -> None:
        self.probe_s, self.share = float(probe_s), float(share)

    def decide(self, now: float, target: Mode | None, need: str, cooling: bool) -> Mode | None:
        """The mode to run now instead of the one running (a probe in progress, or one that starts), else None.
        ``target``: the mode that would feed the fit ``need`` names (``"mixed"``: mb; ``"prefill"``,
        ``"decode"``: eb), ``need`` empty when no fit is missing or stale; ``cooling``: a mode switch is cooling
        down. A probe in progress runs to its end."""
        if math.isnan(self.first_seen):
            self.first_seen = now
        if self.mode is not None:
            if now < self.started + self.probe_s:
                return self.mode
            self.seconds += min(max(now - self.started, 0.0), self.probe_s)
            self.mode = None
        other = target
        if other is None or not need or cooling or self.probe_s <= 0 or self.share <= 0:
            return None
        if now < self.started + self.probe_s / self.share:
            return None
        self.mode, self.started, self.last_kind = other, now, need
        self.count += 1
        return other

    def stop(self, now: float) -> None:
        """End a probe in progress (eb+ or the online costs were switched off under it)."""
        if self.mode is not None:
            self.seconds += min(max(now - self.started, 0.0), self.probe_s)
            self.mode = None

    def status(self, now: float) -> dict[str, Any]:
        """``active`` (the mode probed now, or ""), ``count``, ``seconds`` and ``share`` of the time since the
        first ask, ``last_for`` (the fit the last probe fed)."""
        span = now - self.first_seen if math.isfinite(self.first_seen) else 0.0
        run = min(max(now - self.started, 0.0), self.probe_s) if self.mode is not None else 0.0
        return {"active": "" if self.mode is None else str(self.mode), "count": self.count,
                "seconds": self.seconds + run, "share": (self.seconds + run) / span if span > 0 else 0.0,
                "last_for": self.last_kind}
