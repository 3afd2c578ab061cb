"""When to release: Algorithm 1 (throughput-adaptive interval) and §4.1.2's dual trigger with its watchdog.

    I_opt = (T̄_fwd + L_net) / N_active                                   (§4.1.1, Algorithm 1 line 8)

T̄_fwd is the mean of the last ``window`` forward times (Algorithm 1 lines 15-19; T_default until the
first one). A release to the next target instance is due when both hold (Figure 5, §4.1.2):

* the interval: at least I_opt since the previous release (to any target);
* readiness of the target: it ended a forward since its last release (the EndForward fast path), or it
  reported zero tasks (the quiescence path), or it was never released to.

The liveness watchdog: a target that stays silent for ``watchdog_factor``·T̄_fwd after a release is taken
as ready anyway, and from then on it is *lost*: it gets a release every fixed interval without waiting
for its EndForward (the paper's graceful degradation to fixed-interval batching), until it reports again.

Choices the paper leaves open, made here:
* Targets are served in cyclic order of their ids (the paper says "the next target instance").
* A target that is ready but has no room (the shell's PBAA assigned it nothing) is skipped with
  :meth:`ReleaseClock.skip`: the pointer moves on without resetting the interval, so the next target may
  be served at once. A release that sends nothing is not a release.
* Under plain DP every rank is a target (N_active = ranks); under DP attention the ranks run in lockstep
  as one instance, so there is one target and one release per forward (PBAA spreads it over the ranks).
* T̄_fwd is the paper's windowed mean, not an EMA (Algorithm 1 line 19).

Pure: time comes in as ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from ebctl.sbs.types import SbsParams


class _Target:
    __slots__ = ("lost", "ready", "released_at")

    def __init__(self) -> None:
        self.ready = True  # never released to: ready
        self.released_at = -math.inf
        self.lost = False  # watchdog fired: fixed-interval mode until it reports again


class ReleaseClock:
    """The dispatcher's release timing. ``end_forward``/``mark_ready`` feed it; ``due(now)`` answers which
    target (if any) a release should go to now; ``release``/``skip`` record what the shell did."""

    def __init__(self, targets: Iterable[int], *, window: int = 64, t_default_s: float = 0.1, l_net_s: float = 0.0,
                 watchdog_factor: float = 5.0, fixed_interval_s: float = 0.0) -> None:
        if window < 1 or not t_default_s > 0 or l_net_s < 0 or not watchdog_factor > 0 or fixed_interval_s < 0:
            raise ValueError(f"ReleaseClock: window={window} (>= 1), t_default_s={t_default_s} (> 0), "
                             f"l_net_s={l_net_s} (>= 0), watchdog_factor={watchdog_factor} (> 0), "
                             f"fixed_interval_s={fixed_interval_s} (>= 0)")
        self._times: deque[float] = deque(maxlen=window)
        self.t_fwd = t_default_s
        self.l_net_s = l_net_s
        self.watchdog_factor = watchdog_factor
        self.fixed_interval_s = fixed_interval_s
        self._state: dict[int, _Target] = {}
        self._order: list[int] = []
        self._next = 0
        self.last_release = -math.inf
        self.releases = 0
        self.watchdog_fired = 0
        self.set_targets(targets)

    @classmethod
    def from_params(cls, targets: Iterable[int], p: SbsParams) -> ReleaseClock:
        return cls(targets, window=p.fwd_window, t_default_s=p.t_default_s, l_net_s=p.l_net_s,
                   watchdog_factor=p.watchdog_factor, fixed_interval_s=p.fixed_interval_s)

    # ---- Algorithm 1 ----------------------------------------------------------------------------------

    @property
    def n_active(self) -> int:
        return len(self._order)

    @property
    def interval(self) -> float:
        """I_opt = (T̄_fwd + L_net)/N_active (Algorithm 1 line 8); infinite with no active target."""
        return (self.t_fwd + self.l_net_s) / self.n_active if self._order else math.inf

    def end_forward(self, target: int, duration_s: float) -> None:
        """OnEndForward (Algorithm 1 lines 14-20): the target finished a forward of ``duration_s``."""
        if math.isfinite(duration_s) and duration_s > 0:
            self._times.append(duration_s)
            self.t_fwd = sum(self._times) / len(self._times)
        self.mark_ready(target)

    def mark_ready(self, target: int) -> None:
        """The target is ready (EndForward, or the quiescence path: it reported zero tasks)."""
        st = self._state.get(target)
        if st is not None:
            st.ready = True
            st.lost = False

    def set_targets(self, targets: Iterable[int]) -> None:
        """OnTopologyChange (Algorithm 1 lines 24-27): the live targets; known ones keep their state."""
        order = sorted(set(targets))
        self._state = {t: self._state.get(t) or _Target() for t in order}
        current = self._order[self._next % len(self._order)] if self._order else None
        self._order = order
        self._next = order.index(current) if current in self._state else 0

    # ---- the dual trigger -----------------------------------------------------------------------------

    @property
    def target(self) -> int | None:
        """The next target in cyclic order."""
        return self._order[self._next % len(self._order)] if self._order else None

    def _expired(self, st: _Target, now: float) -> bool:
        return not st.ready and now - st.released_at >= self.watchdog_factor * self.t_fwd

    def _gap(self, st: _Target, now: float) -> float:
        """The interval the target waits for: I_opt, or the fixed fallback once it is (being) lost."""
        if (st.lost or self._expired(st, now)) and self.fixed_interval_s > 0:
            return self.fixed_interval_s
        return self.interval

    def due(self, now: float) -> int | None:
        """The target a release should go to now, or None (interval not elapsed, or the target not ready
        and its watchdog not expired)."""
        t = self.target
        if t is None:
            return None
        st = self._state[t]
        if not (st.ready or st.lost or self._expired(st, now)):
            return None
        return t if now - self.last_release >= self._gap(st, now) else None

    def next_check(self, now: float) -> float:
        """The earliest time ``due`` can turn true without another event (infinite if only an event can)."""
        t = self.target
        if t is None:
            return math.inf
        st = self._state[t]
        if st.ready or st.lost:
            return max(now, self.last_release + self._gap(st, now))
        deadline = st.released_at + self.watchdog_factor * self.t_fwd  # then it is due on the fallback gap
        return max(now, deadline, self.last_release + (self.fixed_interval_s or self.interval))

    def release(self, target: int, now: float) -> None:
        """A batch was sent to ``target`` at ``now``: restart the interval, arm its watchdog, move on."""
        st = self._state[target]
        if self._expired(st, now):
            st.lost = True
            self.watchdog_fired += 1
        st.ready = False
        st.released_at = now
        self.last_release = now
        self.releases += 1
        self._advance(target)

    def skip(self, target: int) -> None:
        """The target was due but had no room: move on without counting a release."""
        self._advance(target)

    def _advance(self, target: int) -> None:
        if target in self._state:
            self._next = (self._order.index(target) + 1) % len(self._order)
