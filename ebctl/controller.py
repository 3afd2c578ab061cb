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

import numpy as np

from ebctl import model, predict
from ebctl.costfit import CostChoice, OnlineCosts
from ebctl.decide import COLD_DEFER_S, Carry, Snapshot, decide, defer_clock, estimates, pinned
from ebctl.observed import Observed, n_limit
from ebctl.params import ControllerParams, Fit, OperatorMode, ThetaMethod
from ebctl.probe import ModeProbe
from ebctl.protocol import BatchKind, IterationReport, Mode, Policy
from ebctl.steer import Steering, View
from ebctl.trial import Applied
from ebctl.tuner import MB, PDI, PROBE, QUARTERS, STOCK, Tuner

__all__ = ["DEFAULT_COSTS", "Controller", "ControllerParams", "Fit", "OperatorMode", "ThetaMethod"]

N_OBS_SHIFT = 1.5  # eb+ updates at once when N_obs moved by this factor since the last update
PREDICT_EVERY = 2000  # completions between two rankings by the model (``prediction_request``)
PD_INTERVALS = (1, 2, 4, 8, 16, 32)  # the pdi arms the model ranks

# Qwen3-8B on H200 (measured_profiles.json): used until a profile or the online fit says otherwise.
DEFAULT_COSTS = model.Costs(alpha_p=1.28e-3, beta_p=2.49e-5, alpha_d=8.92e-3, beta_d=4.59e-5)


class Controller:
    """One engine's controller. ``observe`` each report; ``update(now)`` returns the current Policy."""

    def __init__(self, params: ControllerParams, costs: model.Costs | None = None, *, engine_id: str = "",
                 cost_source: str = "", predictive: bool = False) -> None:
        self.engine_id = engine_id
        self.params = params
        self.base_costs = costs or DEFAULT_COSTS
        self.base_cost_source = cost_source or ("profile" if costs else "default")
        self.seen = Observed(params)  # the windows and the engine's facts (``ebctl.observed``)
        self.online_costs = OnlineCosts(params.cost_window, params.cost_max_rel_err)
        self.steer = Steering(Tuner(params.tuner()), ModeProbe(params.probe_s, params.probe_share))
        self.n_obs_at_update = math.nan  # N_obs when the last update ran
        self.since_update = 0  # completions since the last recompute
        self._cost_refitted = False  # this recompute's one cost fit ran, in the update before it
        self.updates, self.errors, self.last_error = 0, 0, ""
        self.fit: Fit | None = None
        self.carry = Carry.initial(params, self.n_limit)  # what one decision hands the next (``ebctl.decide``)
        self.vbar: float | None = None  # Eq. 6's v̄ of the last decision (n_variance = "measured"): the arms' N
        self._published: tuple[str, Mode | None] = ("", None)  # (arm, probe) of the current policy
        self.policy = self._cold_policy(version=0)
        self.predictive = predictive  # a profile the model can price iterations with (``prediction_request``)
        self._predict_at, self._predict_asked = 0, False
        self.predictions: tuple[predict.Prediction, ...] = ()
        self.predict_error = ""

    def _cold_policy(self, version: int) -> Policy:
        """Before W_min completions: cold_mode with θ_default (or the overrides), no estimates."""
        p = self.params
        n, k = pinned(p, self.n_limit, self.n_limit, math.floor(p.theta_default * self.n_limit))
        return Policy(engine_id=self.engine_id, version=version, ttl_s=p.ttl_s, mode=Mode(p.cold_mode), k=k,
                      n_max=n, max_defer_s=p.max_defer_s or COLD_DEFER_S, pd_interval=p.pd_interval_override,
                      reason="cold start: waiting for data")

    @property
    def tuner(self) -> Tuner:
        """The measured search (``ebctl.tuner``), owned by :attr:`steer`."""
        return self.steer.tuner

    @property
    def probe(self) -> ModeProbe:
        """eb+'s probes of the other mode (``ebctl.probe``), owned by :attr:`steer`."""
        return self.steer.probe

    @property
    def n_limit(self) -> int:
        """The cap on N̂* (``observed.n_limit``)."""
        return n_limit(self.params.n_max_limit, self.seen.engine_limit)

    @property
    def measured(self) -> bool:
        """θ (and in eb+ the mode) from the tuner: theta_method measured, eb or eb+, k not pinned."""
        p = self.params
        return p.theta_method == "measured" and p.mode in ("eb", "eb+") and not p.k_override

    def _view(self) -> View:
        o = self.seen
        return View(self.params, self.fit, self.measured, self.n_limit, o.kv_total, self.vbar, o.mixed_unavailable,
                    o.waiting_share.value, self.carry.updates_since_switch,
                    o.pd_interval_available and not self.params.pd_interval_override,  # pinned: no pdi arms
                    o.n_obs.value)

    # --- input --------------------------------------------------------------------------------------
    def observe(self, r: IterationReport) -> None:
        """Ingest one iteration: its finished requests, its running batch, and its cost sample."""
        added, limit_changed = self.seen.add(r, self.params.n_max_limit)
        self.since_update += added
        if limit_changed and self.updates == 0:  # still cold: re-issue the cold policy against the real limit
            self.policy = self._cold_policy(version=self.policy.version + 1)
        self.online_costs.observe(r)
        if self.measured:
            self.tuner.observe(r)

    def set_params(self, params: ControllerParams) -> None:
        """Live reconfiguration (tune / reload); keeps the data, refits at the next update. A new θ range
        gives the tuner a new grid (it starts again at stock); its other settings apply at once."""
        old = self.params
        self.seen.set_params(old, params)
        self.online_costs.set_params(params.cost_window, params.cost_max_rel_err)
        self.vbar = None  # Eq. 6's margin: recomputed at the next update under the new settings
        self.probe.set_params(params.probe_s, params.probe_share)
        if (params.theta_min, params.theta_max, params.theta_method) != (old.theta_min, old.theta_max,
                                                                          old.theta_method):
            self.steer.restart(Tuner(params.tuner()))
        else:
            self.tuner.p = params.tuner()
            if params.pd_interval_override != old.pd_interval_override:  # every arm runs differently now
                self.tuner.reset(f"pd_interval_override {old.pd_interval_override} → {params.pd_interval_override}")
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
        update, i.e. the engine's next report. No update pays for both: together they would overrun the
        per-report time budget (``tools/bench_core.py``). ``at_once`` (an operator's ``tune`` or ``reload``, off the
        per-report path): every fit due, then the recompute, in this call."""
        p = self.params
        due = len(self.seen.window) >= p.min_window and (self.since_update >= p.update_every or self._n_obs_moved())
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
        """eb+: N_obs moved by N_OBS_SHIFT× since the last update (the concurrency shifted): Eq. 8 turns on N,
        and waiting for T_upd completions at mb's pace would leave the old mode running through the shift."""
        if self.params.mode != "eb+" or self.fit is None:
            return False
        v, ref = self.seen.n_obs.value, self.n_obs_at_update
        return v > 0 and ref > 0 and max(v / ref, ref / v) >= N_OBS_SHIFT

    def cost_choice(self, *, eq8: bool = False) -> CostChoice:
        """The α/β of Eq. 3, 5 and 6 (θ, N and the clock), or with ``eq8`` those of eb+'s Eq. 8, each from one
        source: the profile's (or the defaults) until the online fits they need have passed (prefill and decode;
        for Eq. 8 mixed too, on an engine that can mix), then all online. Never an online β_EB against a
        profile's β_MB; θ does not wait for the mixed fit that only Eq. 8 needs."""
        return self.online_costs.choose(self.base_costs, self.base_cost_source, enabled=self.params.cost_online,
                                        needs_mixed=eq8 and not self.seen.mixed_unavailable)

    def _choices(self) -> list[CostChoice]:
        """The costs of Eq. 3-6, and in eb+ those of Eq. 8."""
        return [self.cost_choice()] + ([self.cost_choice(eq8=True)] if self.params.mode == "eb+" else [])

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
        p, o = self.params, self.seen
        costs, cost_source = self.costs()
        self.n_obs_at_update = o.n_obs.value
        eq8 = self.cost_choice(eq8=True).costs if p.mode == "eb+" else None
        snap = Snapshot(now=now, inputs=o.window.inputs(), outputs=o.window.outputs(), costs=costs,
                        cost_source=cost_source, eq8_costs=eq8, n_limit=self.n_limit, kv_total=o.kv_total,
                        n_obs=o.n_obs.value, mixed_unavailable=o.mixed_unavailable)
        d = decide(snap, self.carry, p)
        self.carry, self.vbar, fit = d.carry, d.vbar, d.fit
        if self.measured:
            self.steer.context(self._view(), o.window, o.completions, fit.mu_l, fit.mu_o,
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
        pdi = p.pd_interval_override or (self.tuner.pd_interval(arm) if arm and probe is None else 0)
        if arm:  # a probe's version is bound too, so that the tuner knows its mode (``Tuner.reach``)
            self.tuner.bind(version, Applied(arm if probe is None else PROBE, mode, k, n, pdi))
        self._published = (arm, probe)
        est = estimates(fit, theta, n, self.seen.n_obs.value, len(self.seen.window))
        return Policy(engine_id=self.engine_id, version=version, issued_at=now, ttl_s=p.ttl_s, mode=mode, k=k,
                      n_max=n, kv_reserve_frac=kv, max_defer_s=defer_clock(p, self.seen.decode_step_s.value, k, n,
                                                                           fit.p0),
                      pd_interval=pdi, reason="; ".join(reasons) or "ok", estimates=est)

    # --- the model's ranking (``ebctl.predict``) -----------------------------------------------------------
    def prediction_request(self) -> tuple[predict.Sample, object] | None:
        """What the model should rank now, or None: (the sample, the online fits' ``IterationCosts`` or None for
        the profile's costs). Asked by whoever runs the model (the daemon's worker, the simulator's source) off the
        per-report path; one at a time (``take_predictions`` or ``prediction_failed`` ends it), every
        ``PREDICT_EVERY`` completions, from the first recompute on. The costs in use: the online fits once the
        prefill and decode fits (and the mixed one, on an engine that can mix) have passed, the profile's before.
        Only where a profile was given (``predictive``): without one the search runs as it did, unranked."""
        if not self.measured or self.fit is None or self._predict_asked or self.seen.completions < self._predict_at:
            return None
        oc, o = self.online_costs, self.seen
        kinds = [BatchKind.PREFILL, BatchKind.DECODE] + ([] if o.mixed_unavailable else [BatchKind.MIXED])
        online = self.params.cost_online and all(oc.passed(k) for k in kinds)
        if not (self.predictive and self.params.predict) or o.kv_total <= 0 or len(o.window) < self.params.min_window:
            return None
        view, t = self._view(), self.tuner
        running = [t.incumbent, *((t.trial.incumbent, t.trial.challenger) if t.trial is not None else ())]
        names = [STOCK, *running, MB, *(f"eb@{j}" for j in range(0, t.top + 1, QUARTERS)), *t.entries,
                 *(f"{PDI}{n}" for n in PD_INTERVALS)]
        arms, seen = [], set()
        for name in dict.fromkeys(names):  # the arms running now first: their trials are judged with the ranking
            if not (t.may_run(name) or name in running):
                continue
            mode, _, n, k, kv = self.steer.arm(name, view)
            key = (mode, n, k, t.pd_interval(name))
            if key not in seen:
                seen.add(key)
                arms.append(predict.ArmSpec(name, mode, k, n, kv, t.pd_interval(name)))
        c = max(1, round(o.in_engine.value)) if o.in_engine.value > 0 else self.n_limit
        tg = self.params.targets
        sample = predict.Sample(tuple(int(x) for x in o.window.inputs()), tuple(int(x) for x in o.window.outputs()),
                                concurrency=c, slots=self.n_limit, kv_tokens=o.kv_total,
                                token_budget=max(o.max_prefill, 1), mixed_chunk=t.stock_mixes, arms=tuple(arms),
                                requests=predict.requests_for(c, self.n_limit, float(np.mean(o.window.outputs()))),
                                slo_ttft_s=tg.ttft_s, slo_tpot_s=tg.tpot_s)
        self._predict_asked = True
        return sample, (oc.iteration_costs() if online else None)

    def take_predictions(self, preds: tuple[predict.Prediction, ...]) -> None:
        """The model's ranking of the request's arms: each arm's predicted gain on stock goes to the tuner, with the
        arms whose predicted TTFT and TPOT p99 are within the latency slack of stock's (with targets, every arm:
        the goodput predicted judges them)."""
        p = self.params
        self._predict_asked, self._predict_at = False, self.seen.completions + PREDICT_EVERY
        self.predictions, self.predict_error = tuple(preds), ""
        targets = p.targets.set
        gains = predict.gains(self.predictions, against=STOCK, goodput=targets)
        ref = next((x for x in self.predictions if x.arm == STOCK), None)
        eligible = {x.arm for x in self.predictions if targets or ref is None or (
            x.ttft_p99_s <= ref.ttft_p99_s * (1 + p.tune_ttft_slack)
            and x.tpot_p99_s <= ref.tpot_p99_s * (1 + p.tune_tpot_slack))}
        self.tuner.set_predictions({a: g for a, g in gains.items() if math.isfinite(g)}, eligible)

    def prediction_failed(self, why: str) -> None:
        """The model could not rank (its runner says why): the search goes on without, and asks again later."""
        self._predict_asked, self._predict_at = False, self.seen.completions + PREDICT_EVERY
        self.predict_error = why

    def gate_status(self) -> dict:
        """The engine's gate decisions and refills (``Observed.gate_status``)."""
        return self.seen.gate_status()

    def status(self) -> dict:
        """Counters and fits for `ebctl status` and the exporter (the policy carries the rest): why the costs of
        Eq. 3-6 and eb+'s Eq. 8 come from where they do; the tuner, eb+'s probes; output tok/s over the last
        minute; ``gain``, the tuner's incumbent against stock with its 95% interval (``Tuner.gain``)."""
        choices, o = self._choices(), self.seen
        choice, eq8 = choices[0], choices[1] if len(choices) > 1 else None
        return {"reports": o.reports, "completions": o.completions, "updates": self.updates,
                "errors": self.errors, "last_error": self.last_error, "window": len(o.window),
                "n_obs": o.n_obs.value, "eq8_band": self.carry.eq8_band, "kv_total": o.kv_total,
                "n_limit": self.n_limit, "mixed_unavailable": o.mixed_unavailable,
                "cost_reason": f"{choice.source}: {choice.reason}",
                "eq8_cost_reason": None if eq8 is None else f"{eq8.source}: {eq8.reason}",
                "cost_fits": self.online_costs.status(*choices), "theta_method": self.params.theta_method,
                "tuner": self.tuner.status() if self.measured else None,
                "output_tok_s": o.output_rate.value, "gain": self.tuner.gain() if self.measured else None,
                "probes": self.probe.status(o.last_wall if math.isfinite(o.last_wall) else 0.0), "slo": o.slo_status()}
