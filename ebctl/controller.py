"""Algorithm 1 (appendix D.7) with the EB+ mode rule (Eq. 8): iteration reports in, a ``Policy`` out.

The threshold comes from a closed form (``theta_method`` paper = θ0 + Δθ, Eq. 3 + 5; cfr = θ0; exact-fluid) or,
with ``measured``, from the engine's own throughput (``ebctl.tuner``: the closed forms are its prior; it starts
at the stock engine and moves only on a measured gain). In eb+ mode, short probes of the other mode keep the
cost fits Eq. 8 compares current (``ebctl.probe``).

Pure: the caller passes every report and the current time; nothing here reads a clock, a file or the
environment. ``update`` never raises and never publishes a NaN: whatever fails keeps the last good value
and says so in ``Policy.reason``.
"""

from __future__ import annotations

import math

from ebctl import model
from ebctl.costfit import CostChoice, OnlineCosts
from ebctl.estimate import Ema, HazardFit, LengthWindow, RecentRate, fit_hazard
from ebctl.params import ControllerParams, Fit, OperatorMode, ThetaMethod
from ebctl.probe import ModeProbe
from ebctl.protocol import BatchKind, Estimates, IterationReport, Mode, Policy
from ebctl.steer import Steering
from ebctl.trial import Applied
from ebctl.tuner import PROBE, Tuner

__all__ = ["DEFAULT_COSTS", "Controller", "ControllerParams", "Fit", "OperatorMode", "ThetaMethod"]

COLD_DEFER_S = 5.0  # the auto anti-starvation bound before the controller can compute one (s)
MIN_DEFER_S, MAX_DEFER_S = 0.1, 3600.0  # the auto bound stays within these (s)
DECODE_STEP_ALPHA = 0.05  # EMA weight of the measured decode iteration time
MODE_Z = 2.0  # eb+ switches only when Eq. 8's margin clears its band by this many standard errors as well
N_OBS_SHIFT = 1.5  # eb+ updates at once when N_obs moved by this factor since the last update
WAITING_ALPHA = 0.01  # EMA weight of "requests waited" per non-idle iteration (eb+ probes only when saturated)
RATE_HORIZON_S = 60.0  # status: the engine's output tokens/s over this many seconds

# Qwen3-8B on H200 (measured_profiles.json): used until a profile or the online fit says otherwise.
DEFAULT_COSTS = model.Costs(alpha_p=1.28e-3, beta_p=2.49e-5, alpha_d=8.92e-3, beta_d=4.59e-5)


class Controller(Steering):
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
        self.tuner = Tuner(params.tuner())
        self.probe = ModeProbe(params.probe_s, params.probe_share)
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
        self.hazard: HazardFit | None = None
        self.fit: Fit | None = None
        self.theta_star = params.theta_default
        self.n_star = self.n_limit
        self.vbar: float | None = None  # Eq. 6's v̄ from the window's variances (n_variance = "measured")
        self.n_changed_at = -math.inf
        self.eb_mode = params.mode != "mb"  # EB+ state
        self.updates_since_switch = params.mode_cooldown + 1  # no switch yet: nothing is cooling down
        self.eq8_band = math.nan  # eb+: how far Eq. 8's margin must clear 0 to switch (s/token)
        self._drift_ref: tuple[float, float] | None = None  # (μ̂_L, μ̂_O) at the tuner's last (re)start
        self._arms: dict[str, tuple[Mode, float, int, int, float]] = {}  # frozen for the trial in progress
        self._arms_trial = -1
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
        p = self.params
        n = min(p.n_override or n, self.n_limit)
        k = p.k_override or k
        return n, min(max(1, k), n)

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
            self.tuner, self._drift_ref = Tuner(params.tuner()), None
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
            if not due and (self.fit is None or self._want(now) == self._published):
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
        """The estimates and the closed-form policy (Algorithm 1); with ``measured``, the tuner's context."""
        p = self.params
        costs, cost_source = self.costs()
        self.n_obs_at_update = self.n_obs.value
        hz = fit_hazard(self.window.outputs(), discrete_correction=p.discrete_correction)
        self.hazard = hz
        ins, outs = self.window.inputs(), self.window.outputs()
        mu_l = float(ins.mean())
        mu_o = hz.mu_o
        var_l, var_o = float(ins.var()), float(outs.var())
        self.vbar = model.vbar_moments(mu_l, var_l, float(outs.mean()), var_o) if p.n_variance == "measured" else None
        p0 = hz.p0 if hz.p0 > 0 else 1.0 / max(mu_o, 1.0)
        p0 = min(p0, 1.0)
        reasons = [] if hz.ok else [f"hazard fit: {hz.reason}"]

        theta0 = self._theta0(costs, p0)
        d_theta = 0.0
        paper = p.theta_method in ("paper", "measured")  # the measured method's prior is the paper's form
        if paper and hz.ok and hz.eta > 0 and hz.eta >= p.min_eta_t * hz.eta_se:
            d_theta = model.delta_theta(theta0, p0, hz.eta, costs.alpha_d, costs.beta_d, self.n_star)
        elif paper and hz.eta <= 0:
            reasons.append("hazard not increasing: CFR threshold")
        elif paper:
            reasons.append(f"IFR not significant (eta/se={hz.eta / hz.eta_se:.1f}): CFR threshold")
        if p.theta_method == "exact-fluid":
            raw = model.theta_exact_fluid(p0, hz.eta if hz.ok else 0.0, costs.alpha_p, costs.beta_p,
                                          costs.alpha_d, costs.beta_d, mu_l, self.n_star)
        else:
            raw = theta0 + d_theta
        theta_star = min(max(raw, p.theta_min), p.theta_max)
        if not math.isfinite(theta_star):
            raise ValueError(f"theta* not finite (theta0={theta0}, dtheta={d_theta})")
        self.theta_star = theta_star

        n_star = self._batch_size(now, theta_star, p0, mu_l, reasons)
        n_max, k = self._pinned(n_star, math.floor(theta_star * n_star))
        if p.k_override or p.n_override:
            reasons.append(f"pinned by operator: k={k}, n_max={n_max}")
        se = (math.sqrt(var_l / len(ins)), math.sqrt(var_o / len(outs)))
        mode, lhs, rhs = self._mode(theta0, costs, p0, mu_l, mu_o, n_star, se, reasons)
        if self.measured:
            self._tuner_context(mu_l, mu_o, [theta_star, min(max(theta0, p.theta_min), p.theta_max)], mode)
        return Fit(p0, hz, mu_l, mu_o, theta0, d_theta, theta_star, n_max, k, mode, self._kv_reserve(n_star, mu_o),
                   lhs, rhs, costs, cost_source, tuple(reasons))

    def _issue(self, now: float) -> Policy:
        """The policy of the last fit: the closed form's, or the tuner's arm; a probe's mode on top."""
        p, fit = self.params, self.fit
        assert fit is not None
        reasons = list(fit.reasons)
        arm, probe = self._want(now)
        if arm:
            mode, theta, n, k, kv = self._arm(arm, fit)
            reasons.append(self._tuner_reason())
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

    def _kv_reserve(self, n: int, mu_o: float) -> float:
        """Eq. 23's KV reserve at batch size n (0 while the KV capacity is unknown)."""
        p = self.params
        kv_total = p.kv_capacity_tokens or self.kv_total
        if kv_total <= 0:
            return 0.0
        return model.kv_reserve_fraction(n=n, mu_o=mu_o, block_size=1, total_blocks=kv_total, s_kv=p.kv_s,
                                         f0=p.kv_f0)

    def _eq6(self, theta: float, p0: float, mu_l: float) -> int:
        """Eq. 6 at θ, clipped to [floor, the engine's limit] (the limit while the KV capacity is unknown)."""
        p = self.params
        limit = self.n_limit
        floor = max(1, math.ceil(p.n_floor_frac * limit))
        cap = p.kv_capacity_tokens or self.kv_total
        target = limit if cap <= 0 else model.n_star(cap, p.eps, theta, p0, mu_l, bound=p.n_bound, vbar_=self.vbar)
        return min(max(target, floor), limit)

    def _batch_size(self, now: float, theta: float, p0: float, mu_l: float, reasons: list[str]) -> int:
        """Eq. 6 clipped to [floor, the engine's limit], changed at most every n_min_interval_s."""
        p = self.params
        cap = p.kv_capacity_tokens or self.kv_total
        if cap <= 0:
            reasons.append("KV capacity unknown: N = engine limit")
        else:
            floor = max(1, math.ceil(p.n_floor_frac * self.n_limit))
            raw = model.n_star(cap, p.eps, theta, p0, mu_l, bound=p.n_bound, vbar_=self.vbar)
            if raw < floor:
                reasons.append(f"N*={raw} below floor {floor}")
        target = self._eq6(theta, p0, mu_l)
        if target != self.n_star and now - self.n_changed_at >= p.n_min_interval_s:
            self.n_star, self.n_changed_at = target, now
        return self.n_star

    def _theta0(self, costs: model.Costs, p0: float) -> float:
        """Eq. 3's θ0 at γ = p0·α_p/α_d (θ_min when α_p is 0: no cycle cost to spread)."""
        return model.theta0(p0 * costs.alpha_p / costs.alpha_d) if costs.alpha_p > 0 else self.params.theta_min

    def _mode(self, theta0: float, theta_costs: model.Costs, p0: float, mu_l: float, mu_o: float, n: int,
              se: tuple[float, float], reasons: list[str]) -> tuple[Mode, float, float]:
        """The operator's mode, or for eb+ the Eq. 8 rule with hysteresis and a cooldown, on its own costs
        (``eq8_cost_choice``). ``theta0``: Eq. 3's at ``p0`` on ``theta_costs``; ``se``: the standard errors of
        μ̂_L and μ̂_O (σ/√W)."""
        p = self.params
        if p.mode != "eb+":
            return Mode(p.mode), math.nan, math.nan
        costs = self.eq8_cost_choice().costs
        if costs != theta_costs:  # the profile's until the mixed fit passes: θ0 on the same costs as the rest
            theta0 = self._theta0(costs, p0)
        n_obs = self.n_obs.value if math.isfinite(self.n_obs.value) and self.n_obs.value >= 1 else float(n)
        if not costs.has_mixed:
            reasons.append("mixed cost unknown: eb")
            return Mode.EB, math.nan, math.nan

        def criterion(ml: float, mo: float) -> tuple[float, float]:
            # θ0 (Eq. 3) with p0 scaled by μ_O/mo, to first order: Ψ(θ0) = γ, dθ0/dγ = 1/Ψ'(θ0) = (1−θ0)²/θ0
            th0 = theta0
            if mo != mu_o and costs.alpha_p > 0:
                gamma = p0 * costs.alpha_p / costs.alpha_d
                th0 = min(max(theta0 + (1 - theta0) ** 2 / theta0 * gamma * (mu_o / mo - 1), 1e-9), 1 - 1e-9)
            lhs, rhs = model.eb_criterion(theta=th0, n=n_obs, alpha_p=costs.alpha_p, beta_p=costs.beta_p,
                                          alpha_d=costs.alpha_d, beta_d=costs.beta_d, alpha_mb=costs.alpha_mb,
                                          beta_mb=model.beta_mb_e(mo / (ml + mo), costs.c0, costs.c1, costs.c2),
                                          mu_l=ml, mu_o=mo)
            return lhs, rhs + p.delta

        lhs, rhs = criterion(mu_l, mu_o)
        band = p.mode_hysteresis * model.beta_eb_w(beta_p=costs.beta_p, beta_d=costs.beta_d, mu_l=mu_l, mu_o=mu_o)
        band = max(band, MODE_Z * self._margin_se(criterion, mu_l, mu_o, se))
        self.eq8_band = band
        self.updates_since_switch += 1
        want_eb = lhs > rhs + band if not self.eb_mode else lhs > rhs - band
        if want_eb != self.eb_mode and self.updates_since_switch > p.mode_cooldown:
            self.eb_mode, self.updates_since_switch = want_eb, 0
        if self.mixed_unavailable and not self.eb_mode:
            reasons.append("mb unavailable on this engine: eb")
            return Mode.EB, lhs, rhs
        return (Mode.EB if self.eb_mode else Mode.MB), lhs, rhs

    @staticmethod
    def _margin_se(criterion, mu_l: float, mu_o: float, se: tuple[float, float]) -> float:
        """The standard error of Eq. 8's margin (lhs − rhs) from the window's sampling noise in μ̂_L and μ̂_O
        (delta method, central differences of ±1 se; L and O taken as independent)."""
        def margin(ml: float, mo: float) -> float:
            lhs, rhs = criterion(ml, mo)
            return lhs - rhs

        var = 0.0
        if math.isfinite(se[0]) and 0 < se[0] < mu_l:
            var += ((margin(mu_l + se[0], mu_o) - margin(mu_l - se[0], mu_o)) / 2) ** 2
        if math.isfinite(se[1]) and 0 < se[1] < mu_o:
            var += ((margin(mu_l, mu_o + se[1]) - margin(mu_l, mu_o - se[1])) / 2) ** 2
        return math.sqrt(var)

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
                "n_obs": self.n_obs.value, "eq8_band": self.eq8_band, "kv_total": self.kv_total,
                "n_limit": self.n_limit,
                "mixed_unavailable": self.mixed_unavailable, "cost_reason": f"{choice.source}: {choice.reason}",
                "eq8_cost_reason": None if eq8 is None else f"{eq8.source}: {eq8.reason}",
                "cost_fits": self.online_costs.status(*choices), "theta_method": self.params.theta_method,
                "tuner": self.tuner.status() if self.measured else None,
                "output_tok_s": self.output_rate.value, "gain": self.tuner.gain() if self.measured else None,
                "probes": self.probe.status(self.last_wall if math.isfinite(self.last_wall) else 0.0)}
