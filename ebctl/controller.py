"""Algorithm 1 (appendix D.7) with the EB+ mode rule (Eq. 8): iteration reports in, a ``Policy`` out.

Algorithm 1 itself is a pure decision (``ebctl.decide``); this object keeps the windows and fits it reads
(``observe``), hands it a snapshot, and issues the policy (``update``). The threshold comes from a closed form
(``theta_method`` paper = θ0 + Δθ, Eq. 3 + 5; cfr = θ0; exact-fluid) or, with ``measured``, from the engine's
own throughput (``ebctl.tuner``: the closed forms are its prior; it starts at the stock engine and moves only on
a measured gain). In eb+ mode, short probes of the other mode keep the cost fits Eq. 8 compares current
(``ebctl.probe``).

Pure: the caller passes every report and the current time; nothing here reads a clock, a file or the
environment. ``update`` never raises and never publishes a NaN: whatever fails keeps the last good value
and says so in ``Policy.reason``.
"""

from __future__ import annotations

import math

from ebctl import model
from ebctl.costfit import CostChoice, OnlineCosts
from ebctl.decide import Carry, Snapshot, decide, pinned
from ebctl.estimate import Ema, LengthWindow, RecentRate
from ebctl.params import ControllerParams, Fit, OperatorMode, ThetaMethod
from ebctl.probe import ModeProbe
from ebctl.protocol import BatchKind, Estimates, IterationReport, Mode, Policy
from ebctl.steer import Steering, View
from ebctl.trial import Applied
from ebctl.tuner import PROBE, Tuner

__all__ = ["DEFAULT_COSTS", "Controller", "ControllerParams", "Fit", "OperatorMode", "ThetaMethod"]

COLD_DEFER_S = 5.0  # the auto anti-starvation bound before the controller can compute one (s)
MIN_DEFER_S, MAX_DEFER_S = 0.1, 3600.0  # the auto bound stays within these (s)
DECODE_STEP_ALPHA = 0.05  # EMA weight of the measured decode iteration time
N_OBS_SHIFT = 1.5  # eb+ updates at once when N_obs moved by this factor since the last update
WAITING_ALPHA = 0.01  # EMA weight of "requests waited" per non-idle iteration (eb+ probes only when saturated)
RATE_HORIZON_S = 60.0  # status: the engine's output tokens/s over this many seconds

# Qwen3-8B on H200 (measured_profiles.json): used until a profile or the online fit says otherwise.
DEFAULT_COSTS = model.Costs(alpha_p=1.28e-3, beta_p=2.49e-5, alpha_d=8.92e-3, beta_d=4.59e-5)


class Controller:
    """One engine's controller. ``observe`` each report; ``update(now)`` returns the current Policy."""

    def __init__(self, params: ControllerParams, costs: model.Costs | None = None, *, engine_id: str = "",
                 cost_source: str = "") -> None:
        self.engine_id = engine_id
        self.params = params
        self.base_costs = costs or DEFAULT_COSTS
        self.base_cost_source = cost_source or ("profile" if costs else "default")
        self.window = LengthWindow(params.window)
        self.n_obs = Ema(params.n_obs_alpha)
        self.n_obs_at_update = math.nan  # N_obs when the last update ran
        self.decode_step_s = Ema(DECODE_STEP_ALPHA)  # measured seconds per decode iteration
        self.waiting_share = Ema(WAITING_ALPHA)  # share of recent non-idle iterations with requests waiting
        self.output_rate = RecentRate(RATE_HORIZON_S)  # output tokens/s of the finished requests, now
        self.gate_reasons: dict[str, int] = {}  # the engine's gate decisions by reason (cumulative, as reported)
        self.group_size = 1
        self.mixed_reason = ""
        self.online_costs = OnlineCosts(params.cost_window, params.cost_max_rel_err)
        self.steer = Steering(Tuner(params.tuner()), ModeProbe(params.probe_s, params.probe_share))
        self.kv_total = 0
        self.engine_limit = 0
        self.mixed_unavailable = False
        self.reports = 0
        self.completions = 0
        self.since_update = 0
        self._cost_refitted = False  # this recompute's one cost fit ran, in the update before it
        self.updates = 0
        self.errors = 0
        self.last_error = ""
        self.last_wall = math.nan  # the newest report's wall time (status has no clock of its own)
        self.fit: Fit | None = None
        self.carry = Carry.initial(params, self.n_limit)  # what one decision hands the next (``ebctl.decide``)
        self.vbar: float | None = None  # Eq. 6's v̄ of the last decision (n_variance = "measured"): the arms' N
        self._published: tuple[str, Mode | None] = ("", None)  # (arm, probe) of the current policy
        self.policy = self._cold_policy(version=0)

    def _cold_policy(self, version: int) -> Policy:
        """Before W_min completions: cold_mode with θ_default (or the overrides), no estimates."""
        p = self.params
        n, k = self._pinned(self.n_limit, math.floor(p.theta_default * self.n_limit))
        return Policy(engine_id=self.engine_id, version=version, ttl_s=p.ttl_s, mode=Mode(p.cold_mode), k=k,
                      n_max=n, max_defer_s=p.max_defer_s or COLD_DEFER_S, reason="cold start: waiting for data")

    def _pinned(self, n: int, k: int) -> tuple[int, int]:
        """Apply the operator's overrides; 1 <= k <= n <= the engine's limit."""
        return pinned(self.params, self.n_limit, n, k)

    @property
    def tuner(self) -> Tuner:
        """The measured search (``ebctl.tuner``), owned by :attr:`steer`."""
        return self.steer.tuner

    @property
    def probe(self) -> ModeProbe:
        """eb+'s probes of the other mode (``ebctl.probe``), owned by :attr:`steer`."""
        return self.steer.probe

    def _view(self) -> View:
        return View(self.params, self.fit, self.measured, self.n_limit, self.kv_total, self.vbar,
                    self.mixed_unavailable, self.waiting_share.value, self.carry.updates_since_switch)

    @property
    def measured(self) -> bool:
        """θ (and in eb+ the mode) from the tuner: theta_method measured, eb or eb+, k not pinned."""
        p = self.params
        return p.theta_method == "measured" and p.mode in ("eb", "eb+") and not p.k_override

    # --- input --------------------------------------------------------------------------------------
    def observe(self, r: IterationReport) -> None:
        """Ingest one iteration: its finished requests, its running batch, and its cost sample."""
        self.reports += 1
        self.last_wall = r.wall_time
        self.output_rate.add(r.wall_time, sum(f.output_len for f in r.finished))
        for f in r.finished:
            if self.window.append(f.input_len, f.output_len):
                self.completions += 1
                self.since_update += 1
        if r.kv_total > 0:
            self.kv_total = r.kv_total
        if r.max_running > 0 and r.max_running != self.engine_limit:
            self.engine_limit = r.max_running
            if self.updates == 0:  # still cold: re-issue the cold policy against the engine's real limit
                self.policy = self._cold_policy(version=self.policy.version + 1)
        if r.running > 0:
            # Eq. 8's N_obs: the paper's Proposition 3.4 takes N as EB's maximum batch and MB's average one,
            # i.e. what the engine could batch: running plus waiting, up to its limit. Not the running batch
            # alone: EB drains it by design, so under EB(θ = 0.8) at c = 1,024 an EMA of it swung from 287 to
            # 1,017 between two updates, and Eq. 8's right side with it (simulated H200, conc-shift).
            self.n_obs.update(float(min(r.running + r.waiting, max(self.n_limit, r.running))))
        self.mixed_unavailable = r.mixed_unavailable
        self.mixed_reason = r.mixed_unavailable_reason
        self.group_size = r.group_size
        if r.gate_reasons:
            self.gate_reasons = r.gate_reasons
        if r.kind is BatchKind.DECODE and r.forward_s > 0:
            self.decode_step_s.update(r.forward_s)
        if r.kind is not BatchKind.IDLE:
            self.waiting_share.update(1.0 if r.waiting > 0 else 0.0)
        self.online_costs.observe(r)
        if self.measured:
            self.tuner.observe(r)

    @property
    def n_limit(self) -> int:
        """The cap on N̂*: configured, else what the engine reports, else 256; never above the engine's own
        limit once it reported one (a policy beyond it is refused at the daemon's and the engine's door)."""
        limit = self.params.n_max_limit or self.engine_limit or 256
        return min(limit, self.engine_limit) if self.engine_limit else limit

    def set_params(self, params: ControllerParams) -> None:
        """Live reconfiguration (tune / reload); keeps the data, refits at the next update. A new θ range
        gives the tuner a new grid (it starts again at stock); its other settings apply at once."""
        if params.window != self.params.window:
            self.window.resize(params.window)
        if params.n_obs_alpha != self.params.n_obs_alpha:
            self.n_obs = Ema(params.n_obs_alpha)
        self.online_costs.set_params(params.cost_window, params.cost_max_rel_err)
        self.vbar = None  # Eq. 6's margin: recomputed at the next update under the new settings
        self.probe.set_params(params.probe_s, params.probe_share)
        old = self.params
        if (params.theta_min, params.theta_max, params.theta_method) != (old.theta_min, old.theta_max,
                                                                          old.theta_method):
            self.steer.restart(Tuner(params.tuner()))
        else:
            self.tuner.p = params.tuner()
        self.params = params
        self.since_update = max(self.since_update, params.update_every)  # recompute at the next update
        if self.updates == 0:  # still cold: the new settings (mode, overrides) apply at once
            self.policy = self._cold_policy(version=self.policy.version + 1)

    # --- output -------------------------------------------------------------------------------------
    def update(self, now: float, *, at_once: bool = False) -> Policy:
        """Recompute when T_upd completions arrived and the window holds W_min (Algorithm 1, line 6); in
        between, re-issue the policy when the tuner switched arms or a probe starts or ends.

        A recompute refreshes one cost fit at most (the kind ``OnlineCosts.due`` names), in an update of its
        own just before it (which still re-issues for the tuner or a probe); the recompute follows at the next
        update, i.e. the engine's next report. No update pays for both: ~1 ms and ~0.7 ms at 2,000 rows,
        against a 2 ms budget (bench_core). ``at_once`` (an operator's ``tune`` or ``reload``, off the
        per-report path): every fit due, then the recompute, in this call."""
        p = self.params
        due = len(self.window) >= p.min_window and (self.since_update >= p.update_every or self._n_obs_moved())
        try:
            if due and at_once:
                while self.online_costs.refit():
                    pass
            elif due and not self._cost_refitted:
                self._cost_refitted = self.online_costs.refit()
                due = not self._cost_refitted  # if it refitted: still due at the next update
            if not due and (self.fit is None or self.steer.want(now, self._view(), self.online_costs)
                            == self._published):
                return self.policy
            if due:
                self._cost_refitted = False
                self.since_update = 0
                self.fit = self._refit(now)
            self.policy = self._issue(now)
            if due:
                self.updates += 1
        except Exception as e:  # a bug must not take the daemon down or publish garbage: keep the last policy
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
        return self.policy

    def _n_obs_moved(self) -> bool:
        """eb+: N_obs moved by N_OBS_SHIFT× since the last update (the concurrency shifted). Eq. 8 turns on N:
        at a jump from c = 32 to 512 on simulated RTX PRO 6000, waiting for T_upd completions at mb's slow
        pace left mb running 29 s into a phase where EB is 14% faster."""
        if self.params.mode != "eb+" or self.fit is None:
            return False
        v, ref = self.n_obs.value, self.n_obs_at_update
        return v > 0 and ref > 0 and max(v / ref, ref / v) >= N_OBS_SHIFT

    def cost_choice(self) -> CostChoice:
        """The α/β of Eq. 3, 5 and 6 (θ, N and the clock) from one source: the profile's (or the defaults)
        until the online prefill and decode fits have passed, then both online fits. eb+ takes the same θ as
        eb: waiting for the mixed fit here kept it on the profile's θ (0.38 where the online costs give 0.8,
        1.5% slower on simulated H200, dist-shift phase 1) while Eq. 8 could not use the online costs yet."""
        return self.online_costs.choose(self.base_costs, self.base_cost_source, needs_mixed=False,
                                        enabled=self.params.cost_online)

    def eq8_cost_choice(self) -> CostChoice:
        """The α/β of eb+'s Eq. 8 from one source for both sides, EB's and MB's: the profile's until the online
        prefill, decode and mixed fits have all passed (mixed only on an engine that can mix: elsewhere no
        mixed iteration can come), then all online. Never an online β_EB against a profile's β_MB."""
        needs_mixed = not self.mixed_unavailable
        return self.online_costs.choose(self.base_costs, self.base_cost_source, needs_mixed=needs_mixed,
                                        enabled=self.params.cost_online)

    def _choices(self) -> list[CostChoice]:
        """The costs of Eq. 3-6, and in eb+ those of Eq. 8."""
        return [self.cost_choice()] + ([self.eq8_cost_choice()] if self.params.mode == "eb+" else [])

    def cost_fits(self) -> dict:
        """Per kind, the online fit and whether Eq. 3-6 or eb+'s Eq. 8 use it (``OnlineCosts.status``)."""
        return self.online_costs.status(*self._choices())

    def costs(self) -> tuple[model.Costs, str]:
        """(the costs of Eq. 3-6, their source: ``online``, ``profile:NAME`` or ``default``)."""
        c = self.cost_choice()
        return c.costs, c.source

    def _refit(self, now: float) -> Fit:
        """Algorithm 1 on a snapshot of the windows, the costs and the engine (``ebctl.decide``); with
        ``measured``, the tuner's context."""
        p = self.params
        costs, cost_source = self.costs()
        self.n_obs_at_update = self.n_obs.value
        snap = Snapshot(now=now, inputs=self.window.inputs(), outputs=self.window.outputs(), costs=costs,
                        cost_source=cost_source,
                        eq8_costs=self.eq8_cost_choice().costs if p.mode == "eb+" else None, n_limit=self.n_limit,
                        kv_total=self.kv_total, n_obs=self.n_obs.value, mixed_unavailable=self.mixed_unavailable)
        d = decide(snap, self.carry, p)
        self.carry, self.vbar, fit = d.carry, d.vbar, d.fit
        if self.measured:
            self.steer.context(self._view(), self.window, self.completions, fit.mu_l, fit.mu_o,
                               [fit.theta, min(max(fit.theta0, p.theta_min), p.theta_max)], fit.mode)
        return fit

    def _issue(self, now: float) -> Policy:
        """The policy of the last fit: the closed form's, or the tuner's arm; a probe's mode on top."""
        p, fit = self.params, self.fit
        assert fit is not None
        reasons = list(fit.reasons)
        view = self._view()
        arm, probe = self.steer.want(now, view, self.online_costs)
        if arm:
            mode, theta, n, k, kv = self.steer.arm(arm, view)
            reasons.append(self.steer.reason())
        else:
            mode, theta, n, k, kv = fit.mode, fit.theta, fit.n, fit.k, fit.kv
        if probe is not None:
            if arm and self._published[1] is None:
                self.tuner.interrupt()
            reasons.append(f"probe: {probe} for the {self.probe.last_kind} cost fit")
            if probe is Mode.EB and mode is not Mode.EB:
                theta, n, k, kv = fit.theta, fit.n, fit.k, fit.kv
            mode = probe
        version = self.policy.version + 1
        if arm:  # a probe's version is bound too, so that the tuner knows its mode (``Tuner.reach``)
            self.tuner.bind(version, Applied(arm if probe is None else PROBE, mode, k, n))
        self._published = (arm, probe)
        est = Estimates(p0=fit.p0, eta=fit.hz.eta, fit_r2=fit.hz.r2, mu_l=fit.mu_l, mu_o=fit.mu_o,
                        n_window=len(self.window), theta0=fit.theta0, delta_theta=fit.d_theta, theta_star=theta,
                        n_star=n, n_obs=self.n_obs.value, eb_lhs=fit.lhs, eb_rhs=fit.rhs, alpha_p=fit.costs.alpha_p,
                        beta_p=fit.costs.beta_p, alpha_d=fit.costs.alpha_d, beta_d=fit.costs.beta_d,
                        cost_source=fit.cost_source)
        return Policy(engine_id=self.engine_id, version=version, issued_at=now, ttl_s=p.ttl_s, mode=mode, k=k,
                      n_max=n, kv_reserve_frac=kv, max_defer_s=self._defer_clock(k, n, fit.p0),
                      reason="; ".join(reasons) or "ok", estimates=est)

    def _defer_clock(self, k: int, n: int, p0: float) -> float:
        """The gate's anti-starvation bound: ``max_defer_s`` when set, else ``defer_factor`` times the expected
        time to free k of n slots. With a constant hazard p0 a decode phase that frees k slots lasts
        ζ(k/n)/p0 steps (Eq. 4's α_d·ζ·μ_O term, appendix B.2), each the measured decode iteration time."""
        p = self.params
        if p.max_defer_s > 0:
            return p.max_defer_s
        step = self.decode_step_s.value
        if not (math.isfinite(step) and step > 0 and p0 > 0 and k < n):
            return COLD_DEFER_S
        expected = model.zeta(k / n) / p0 * step
        return min(max(p.defer_factor * expected, MIN_DEFER_S), MAX_DEFER_S)

    def gate_status(self) -> dict:
        """Why the engine's refills happened: its gate decisions by reason, the decode → refill switches among
        them (threshold k, the anti-starvation clock, an idle engine), and the share of the switches of a
        busy engine that the threshold caused (the clock is a safety net: this should be near 1)."""
        refills = {r: self.gate_reasons.get(r, 0) for r in ("threshold", "starvation", "idle")}
        busy = refills["threshold"] + refills["starvation"]
        return {"gate_reasons": dict(self.gate_reasons), "refills": refills,
                "threshold_share": refills["threshold"] / busy if busy else math.nan,
                "decode_step_s": self.decode_step_s.value, "group_size": self.group_size,
                "mixed_unavailable_reason": self.mixed_reason}

    def status(self) -> dict:
        """Counters and fits for `ebctl status` and the metrics exporter (the policy carries the rest):
        ``cost_fits`` per kind (state, why, held-out error, features kept, coefficients) and
        ``cost_reason``, why the costs of Eq. 3-6 come from where they do, ``eq8_cost_reason`` the same for
        eb+'s Eq. 8 (None in other modes); ``theta_method``; ``tuner`` (the
        measured search: state, arm, every recent trial, ``ebctl.tuner``) and ``probes`` (eb+'s runs of the
        other mode: count, seconds, share, ``ebctl.probe``); ``output_tok_s``, the engine's output tokens/s over the
        last minute; ``gain``, what the measured search's incumbent buys against stock with its 95% interval and
        what exploring has cost (``Tuner.gain``; None without the measured search)."""
        choices = self._choices()
        choice, eq8 = choices[0], choices[1] if len(choices) > 1 else None
        return {"reports": self.reports, "completions": self.completions, "updates": self.updates,
                "errors": self.errors, "last_error": self.last_error, "window": len(self.window),
                "n_obs": self.n_obs.value, "eq8_band": self.carry.eq8_band, "kv_total": self.kv_total,
                "n_limit": self.n_limit,
                "mixed_unavailable": self.mixed_unavailable, "cost_reason": f"{choice.source}: {choice.reason}",
                "eq8_cost_reason": None if eq8 is None else f"{eq8.source}: {eq8.reason}",
                "cost_fits": self.online_costs.status(*choices), "theta_method": self.params.theta_method,
                "tuner": self.tuner.status() if self.measured else None,
                "output_tok_s": self.output_rate.value, "gain": self.tuner.gain() if self.measured else None,
                "probes": self.probe.status(self.last_wall if math.isfinite(self.last_wall) else 0.0)}
