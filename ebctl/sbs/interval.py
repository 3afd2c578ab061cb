"""When to release: Algorithm 1 (throughput-adaptive interval) and §4.1.2's dual trigger with its watchdog.

    I_opt = (T̄_fwd + L_net) / N_active                                   (§4.1.1, Algorithm 1 line 8)

T̄_fwd is the mean of the last ``window`` forward times (Algorithm 1 lines 15-19; T_default until the
first one). A release is due when both hold (Figure 5, §4.1.2):

* the interval: I_opt has passed since the previous release's slot;
* readiness of the target: it ended a forward since its last release (the EndForward fast path), or it
  was never released to.

A target that reports zero tasks (the quiescence path) is due at once, interval or not: §4.1.2 calls
that state "an immediate trigger", for cold starts and "rapid recovery following the completion of a
batch". Held to the interval, an idle instance waits for nothing at low load; the price of releasing at
once is near saturation, where it starts smaller batches (docs/sbs.md).

The liveness watchdog: a target that stays silent for ``watchdog_factor``·T̄_fwd after a release is taken
as ready anyway, and from then on it is *lost*: it gets a release every fixed interval without waiting
for its EndForward (the paper's graceful degradation to fixed-interval batching), until it reports again.

Choices the paper leaves open, made here:
* The target is the first *ready* one in cyclic order of ids, not strictly the next one: Figure 2(b)
  sends a batch to "an engine that is ready or will soon be ready", and waiting for a busy one while
  another is idle stalls every release behind the slowest instance (plain DP would fall far behind
  sglang's total_tokens).
* The interval counts from the previous release's *slot*, with at most one interval of credit: a release
  that had to wait for its target's EndForward does not push the next one back by the same wait. Counted
  from the actual release, every forward shorter than T̄ made the next release miss a forward (under DP
  attention, forward times vary around T̄ with the batch, so about half of them did).
* A target that is ready but has no room (the shell's PBAA assigned it nothing) is passed over with
  :meth:`ReleaseClock.skip`; a release that sends nothing is not a release.
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

_SLACK_S = 1e-9  # rounding in sums of times must not make a release miss the instant it is due


class _Target:
    __slots__ = ("idle", "lost", "ready", "released_at")

    def __init__(self) -> None:
        self.ready = True  # never released to: ready
        self.idle = False  # reported zero tasks since its last release: due at once
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
        self._since = -math.inf  # the interval to the next release counts from here
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

    def end_forward(self, target: int, duration_s: float, *, quiescent: bool = False) -> None:
        """OnEndForward (Algorithm 1 lines 14-20): the target finished a forward of ``duration_s``;
        ``quiescent``: it has nothing left to do (no running, waiting or queued tokens)."""
        if math.isfinite(duration_s) and duration_s > 0:
            self._times.append(duration_s)
            self.t_fwd = sum(self._times) / len(self._times)
        self.mark_ready(target, quiescent=quiescent)

    def set_forward_time(self, t_fwd_s: float) -> None:
        """T̄_fwd measured elsewhere (the plugin: the daemon's windowed mean of the ranks' reported forward
        times, which the DP controller cannot see); ignored unless finite and > 0."""
        if math.isfinite(t_fwd_s) and t_fwd_s > 0:
            self.t_fwd = t_fwd_s

    def mark_ready(self, target: int, *, quiescent: bool = False) -> None:
        """The target is ready (EndForward); ``quiescent``: it reported zero tasks, so it is due at once."""
        st = self._state.get(target)
        if st is not None:
            st.ready = True
            st.lost = False
            st.idle = st.idle or quiescent

    def set_targets(self, targets: Iterable[int]) -> None:
        """OnTopologyChange (Algorithm 1 lines 24-27): the live targets; known ones keep their state."""
        order = sorted(set(targets))
        self._state = {t: self._state.get(t) or _Target() for t in order}
        current = self._order[self._next % len(self._order)] if self._order else None
        self._order = order
        self._next = order.index(current) if current in self._state else 0

    # ---- the dual trigger -----------------------------------------------------------------------------

    @property
    def lost(self) -> list[int]:
        """Targets in the watchdog's fixed-interval mode (silent since a release, not reported again)."""
        return [t for t in self._order if self._state[t].lost]

    def released_at(self, target: int) -> float:
        """When ``target`` was last released to (−inf: never)."""
        st = self._state.get(target)
        return -math.inf if st is None else st.released_at

    @property
    def target(self) -> int | None:
        """The next target in cyclic order (ready or not)."""
        return self._order[self._next % len(self._order)] if self._order else None

    def _cyclic(self) -> list[int]:
        n = len(self._order)
        return [self._order[(self._next + i) % n] for i in range(n)]

    def _expired(self, st: _Target, now: float) -> bool:
        # compared as sums, the way next_check computes the deadline, so a wake-up at it finds it due
        return not st.ready and now >= st.released_at + self.watchdog_factor * self.t_fwd

    def _opens(self, st: _Target, now: float) -> float:
        """When this target's release is allowed by the interval (−inf: already)."""
        if st.ready:
            return -math.inf if st.idle else self._since + self.interval
        fallback = self.last_release + (self.fixed_interval_s or self.interval)
        if st.lost:
            return fallback
        return max(fallback, st.released_at + self.watchdog_factor * self.t_fwd)  # the watchdog's deadline

    def due(self, now: float) -> int | None:
        """The target a release should go to now, or None. The first target in cyclic order that is ready
        (or lost, or whose watchdog expired) and whose interval has elapsed."""
        for t in self._cyclic():
            if now + _SLACK_S >= self._opens(self._state[t], now):
                return t
        return None

    def next_check(self, now: float) -> float:
        """The earliest time ``due`` can turn true without another event (infinite with no target)."""
        return max(now, min((self._opens(self._state[t], now) for t in self._order), default=math.inf))

    def release(self, target: int, now: float) -> None:
        """A batch was sent to ``target`` at ``now``: count the interval on, arm its watchdog, move on."""
        st = self._state[target]
        if self._expired(st, now):
            st.lost = True
            self.watchdog_fired += 1
        st.ready = st.idle = False
        st.released_at = now
        self.last_release = now
        # the next interval counts from this release's slot, with at most one interval of credit (none for
        # the very first release: back-to-back first releases would bunch the targets' phases together)
        self._since = now if self._since == -math.inf else max(self._since + self.interval, now - self.interval)
        self.releases += 1
        self._advance(target)

    def skip(self, target: int) -> None:
        """The target was due but had no room: move on without counting a release."""
        self._advance(target)

    def _advance(self, target: int) -> None:
        if target in self._state:
            self._next = (self._order.index(target) + 1) % len(self._order)
