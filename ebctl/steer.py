"""What the controller runs between two recomputes, beyond the closed forms: the measured threshold's arm
(``ebctl.tuner``) and eb+'s probes of the other mode (``ebctl.probe``). An object the controller owns; it
reads the controller's state only through what each call passes (:class:`View`, the window, the cost fits)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ebctl.costfit import OnlineCosts
from ebctl.decide import eq6, kv_reserve, pinned
from ebctl.estimate import LengthWindow
from ebctl.params import ControllerParams, Fit
from ebctl.probe import ModeProbe
from ebctl.protocol import BatchKind, Mode
from ebctl.trial import SATURATED_SHARE
from ebctl.tuner import Tuner

REACH_SHARE = 0.97  # measured EB arms: N at most this share of the batch the engine's own admission reaches
REACH_FULL = 0.9  # ... where that batch stays below this share of the engine's limit (else it fills the limit)


class View(NamedTuple):
    """What steering reads of the controller at one moment."""

    params: ControllerParams
    fit: Fit | None  # the last recompute's
    measured: bool  # θ (and in eb+ the mode) from the tuner
    n_limit: int
    kv_total: int
    vbar: float | None  # the last recompute's Eq. 6 v̄
    mixed_unavailable: bool
    waiting_share: float  # share of recent non-idle iterations with requests waiting
    updates_since_switch: int  # eb+'s cooldown (``decide.Carry``)
    pd_interval_available: bool = False  # the engine applies a policy's pd_interval (tuner's pdi arms)
    n_obs: float = math.nan  # Eq. 8's N_obs: requests in the engine (running + waiting), up to its limit


class Steering:
    """The tuner's arms and the probes."""

    def __init__(self, tuner: Tuner, probe: ModeProbe) -> None:
        self.tuner = tuner
        self.probe = probe
        self._drift_ref: tuple[float, float] | None = None  # (μ̂_L, μ̂_O) at the tuner's last (re)start
        self._started = False  # the start-up is over (``context``): once, though N_obs and the batch it waits for grow
        self._arms: dict[str, tuple[Mode, float, int, int, float]] = {}  # frozen for the trial in progress
        self._arms_trial = -1

    def restart(self, tuner: Tuner) -> None:
        """A new search (a new θ range or method): the tuner replaced, the drift reference dropped."""
        self.tuner, self._drift_ref = tuner, None

    def context(self, v: View, window: LengthWindow, completions: int, mu_l: float, mu_o: float,
                entries: list[float], eq8: Mode) -> None:
        """Hand the tuner its prior (the closed forms, Eq. 8's mode) and the request mix, and restart its search
        when the workload moved: the window's geometric mean input length changed by more than a factor
        e^``tune_drift`` since the search last started, or its output length by e^(2·``tune_drift``). Geometric
        means, because the arithmetic mean of a heavy-tailed trace's window wanders widely. The outputs' bar is
        twice the inputs': which requests finish within a window depends on the policy (EB's long cycles hold
        the long ones back), so a switch of arm alone moves the outputs' mean. Compared once the window is full
        and the engine has turned its batch over twice: until then the requests that finished first, the short
        ones, weigh too much. The tuner starts no trial before then either (a server that has just started
        measures its start, not its steady state); with latency targets it waits for the two turnovers only,
        which carry the first burst's queue: the filling window moves the mean lengths a window's rate is weighed
        with far less than the arms' goodputs differ, and on a slow server filling it would leave an incumbent
        that misses the targets running for long. The batch is the engine's N; with latency targets, what the
        engine held (N_obs, running + waiting up to N), if less: with targets the search runs below saturation
        too, and c clients on N > c slots turn their batch over in c completions, not N."""
        p = v.params
        batch = v.n_limit
        targets = p.targets.set
        if targets and v.n_obs >= 1:
            batch = min(batch, math.ceil(v.n_obs))
        full = len(window) >= p.window and completions >= p.window + 2 * batch
        steady = self._started = self._started or full or (targets and completions >= 2 * batch)
        if full:
            now = tuple(float(np.log(np.maximum(x, 1)).mean()) for x in (window.inputs(), window.outputs()))
            ref = self._drift_ref
            if ref is None:
                self._drift_ref = now
            else:
                moved = [f"{name} ×{math.exp(b - a):.2f}" for name, a, b, bar in
                         zip(("L", "O"), ref, now, (p.tune_drift, 2 * p.tune_drift), strict=True) if abs(b - a) > bar]
                if moved:
                    self.tuner.reset("drift of the geometric mean " + ", ".join(moved))
                    self._drift_ref = now
        self.tuner.set_context(entries=entries, allow_mb=p.mode == "eb+" and not v.mixed_unavailable,
                               prefer_mb=eq8 is Mode.MB, mu_l=mu_l, mu_o=mu_o, steady=steady, n=v.n_limit,
                               allow_pdi=v.pd_interval_available)

    def want(self, now: float, v: View, costs: OnlineCosts) -> tuple[str, Mode | None]:
        """(the tuner's arm, or "" without the tuner; the mode a probe runs now, or None)."""
        fit = v.fit
        arm = self.tuner.arm if v.measured else ""
        if fit is None:
            return arm, None
        running = fit.mode if not arm else self.tuner.mode(arm)
        return arm, self._probe(now, running, v, costs)

    def _probe(self, now: float, running: Mode, v: View, oc: OnlineCosts) -> Mode | None:
        """eb+ only: the other mode while its cost fit is missing or stale (``ebctl.probe``): mb for the mixed
        fit (where the engine can mix), eb for the prefill or decode fit; never during a mode switch's cooldown,
        and only once the engine's timings are being learned at all (the other fits passed). During a tuner
        trial only for a fit that has not passed, once per trial (the trial pauses, ``Tuner.interrupt``, and
        drops windows: a fit that keeps failing would otherwise keep a trial from ever closing one; a stale fit
        waits for the trial's end): trials can outlast the load on a slow server, and a fit that never passed
        keeps the closed forms on the default costs. The stock engine (the tuner's first arm) may need either: a
        server launched with mixed chunks mixes every prefill into the decode batch and runs few prefill-only
        iterations. A probe starts only while the engine is saturated (``SATURATED_SHARE`` of the recent
        iterations had requests waiting): below saturation the mode does not change throughput, and a probe
        would only cost latency. No mb probe while the decode fit's intercept is not identified
        (``OnlineCosts.intercept_identified``): Eq. 8 stays on the profile's costs then, whatever the mixed fit
        says, so the probe would buy nothing. Nor before the measured search's first trial: from stock that trial
        is mb's (``Tuner.neighbours``), which measures the mixed batches a probe would, and a probe drops the
        incumbent's next two whole windows (``Tuner.interrupt``), putting the first trial off.

        With latency targets and the measured search, no probe at all. Not eb: the fit it would feed only sets
        EB's entry θ, which the search then moves on measured goodput, and an EB challenger's refills feed it
        anyway, while each EB refill of the probe stalls every running request's decoding; before the first
        trial the windows a probe drops stay whole (``Tuner._full``), and the incumbent that runs through them is
        the one not yet checked against the targets. Nor mb: the mixed fit only sets whether Eq. 8 has the search
        try mb first, and in a trial the probe pauses it and drops its windows."""
        p = v.params
        if p.mode != "eb+" or not p.cost_online or (v.measured and p.targets.set):
            self.probe.stop(now)
            return None
        trial = v.measured and self.tuner.trial is not None
        if trial and self.tuner.trial.probed and self.probe.mode is None:  # one pause per trial, or it may never end
            return None
        stale = math.inf if trial else p.cost_stale_s  # in a trial: a fit that never passed only
        need, target = "", None
        if not v.waiting_share >= SATURATED_SHARE:  # NaN (nothing seen yet) included
            return self.probe.decide(now, None, "", False)  # a probe in progress runs to its end
        first = v.measured and self.tuner.counts["trials"] == 0  # before the measured search's first trial
        if (running is not Mode.MB and not v.mixed_unavailable and oc.intercept_identified()
                and not first):
            need, target = oc.missing(BatchKind.MIXED, now, stale), Mode.MB
        if (not need and running is not Mode.EB
                and (oc.passed(BatchKind.MIXED) or oc.passed(BatchKind.DECODE))):
            need = oc.missing(BatchKind.PREFILL, now, stale) or oc.missing(BatchKind.DECODE, now, stale)
            target = Mode.EB
        cooling = not v.measured and v.updates_since_switch <= p.mode_cooldown
        return self.probe.decide(now, target, need.split(" ", 1)[0], cooling)

    def arm(self, arm: str, v: View) -> tuple[Mode, float, int, int, float]:
        """(mode, θ, N, k, KV reserve) of a tuner arm: stock runs the engine's own rule at its limit, mb mixes at its
        limit, pdi@N is stock with its prefill-decode interval (the policy's ``pd_interval``), EB(θ) takes N from Eq. 6
        at that θ, but at most ``REACH_SHARE`` of the batch the engine's own admission was seen to stop at
        (``Tuner.reach``): sglang reserves each running request's remaining output in its admission, so it can stop
        below Eq. 6's N, and the gate, which ends a refill only at N or at the KV reserve, would then never end it (EB
        would run as stock). Frozen while a trial runs: the two arms it compares keep the numbers they started with."""
        if self._arms_trial != self.tuner.trial_id or self.tuner.trial is None:
            self._arms.clear()
            self._arms_trial = self.tuner.trial_id
        if arm in self._arms:
            return self._arms[arm]
        fit, p, limit = v.fit, v.params, v.n_limit
        assert fit is not None
        if not arm.startswith("eb@"):  # stock, mb, pdi@N: the engine's own rule at its limit
            out = (self.tuner.mode(arm), math.nan, limit, 1, 0.0)
        else:
            theta = self.tuner.theta(arm)
            n = eq6(p, limit, v.kv_total, theta, fit.p0, fit.mu_l, v.vbar)
            reach = self.tuner.reach
            # A batch the engine cannot hold never fills: the refill would never end. An engine that fills its
            # limit (the EMA sits a little below it: requests finish between its prefills) needs no cap: on a
            # small engine it would cost a slot (floor(REACH_SHARE · reach) falls one below the limit).
            if math.isfinite(reach) and reach < REACH_FULL * limit:
                n = min(n, max(math.floor(REACH_SHARE * reach), math.ceil(p.n_floor_frac * limit), 1))
            n, _ = pinned(p, limit, n, 1)
            out = (Mode.EB, theta, n, max(1, min(math.floor(theta * n), n)), kv_reserve(p, v.kv_total, n, fit.mu_o))
        self._arms[arm] = out
        return out

    def reason(self) -> str:
        t = self.tuner

        def name(arm: str) -> str:
            return (f"theta={t.theta(arm):.3g}" if arm.startswith("eb@") else
                    f"pd-interval={t.pd_interval(arm)}" if t.pd_interval(arm) else arm)

        where = name(t.incumbent)
        if t.trial is not None:
            return f"measured: trial of {name(t.trial.challenger)} against {where} ({len(t.trial.rates)} windows)"
        return f"measured: {t.state()} at {where}"
