"""Algorithm 1 (appendix D.7) with the EB+ mode rule (Eq. 8), as one pure decision.

``decide(snapshot, carry, params) -> Decision``: what the controller's windows, cost fits and engine state say
(:class:`Snapshot`) and what the previous recompute left (:class:`Carry`: N̂* and when it last changed, eb+'s
mode, its cooldown and band) in; the estimates, the closed-form policy, Eq. 8's sides and the reasons
(:class:`~ebctl.params.Fit`) and the next carry out. Like ``gate.py`` and sglang's ``prefill_delayer.py``: frozen
records, no clock (``now`` is in the snapshot), no I/O; a failure raises, and the controller keeps its last policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ebctl import model
from ebctl.estimate import fit_hazard
from ebctl.params import ControllerParams, Fit
from ebctl.protocol import Estimates, Mode

MODE_Z = 2.0  # eb+ switches only when Eq. 8's margin clears its band by this many standard errors as well
COLD_DEFER_S = 5.0  # the auto anti-starvation bound before the controller can compute one (s)
MIN_DEFER_S, MAX_DEFER_S = 0.1, 3600.0  # the auto bound stays within these (s)


class Snapshot(NamedTuple):
    """What one recompute sees: the window's lengths, the costs (Eq. 3-6's and eb+'s Eq. 8's, each from one
    source, ``ebctl.costfit``), and the engine."""

    now: float
    inputs: np.ndarray  # the window's input lengths, oldest first
    outputs: np.ndarray  # its output lengths
    costs: model.Costs  # α/β of Eq. 3, 5 and 6
    cost_source: str
    eq8_costs: model.Costs | None  # eb+: α/β of Eq. 8 (both sides from one source); None in other modes
    n_limit: int  # the cap on N̂* (configured, else the engine's limit)
    kv_total: int  # KV tokens the engine reported (``kv_capacity_tokens`` overrides it); 0: unknown
    n_obs: float  # Eq. 8's N_obs: the batch the engine could run (running + waiting, EMA)
    mixed_unavailable: bool  # the engine cannot mix (eb+ stays in EB)


class Carry(NamedTuple):
    """What one recompute hands the next."""

    n_star: int  # N̂* as published (it changes at most every ``n_min_interval_s``)
    n_changed_at: float = -math.inf
    eb_mode: bool = True  # eb+: in EB (else MB)
    updates_since_switch: int = 0  # eb+: recomputes since the mode last switched (the cooldown)
    eq8_band: float = math.nan  # eb+: how far Eq. 8's margin must clear 0 to switch (s/token)

    @classmethod
    def initial(cls, params: ControllerParams, n_limit: int) -> Carry:
        """Before any recompute: N̂* at the limit, the operator's mode, nothing cooling down."""
        return cls(n_star=n_limit, eb_mode=params.mode != "mb", updates_since_switch=params.mode_cooldown + 1)


class Decision(NamedTuple):
    fit: Fit
    carry: Carry
    vbar: float | None  # Eq. 6's v̄ from the window's variances (``n_variance = "measured"``), else None


def pinned(params: ControllerParams, n_limit: int, n: int, k: int) -> tuple[int, int]:
    """The operator's overrides applied: 1 ≤ k ≤ n ≤ ``n_limit``."""
    n = min(params.n_override or n, n_limit)
    k = params.k_override or k
    return n, min(max(1, k), n)


def theta0(params: ControllerParams, costs: model.Costs, p0: float) -> float:
    """Eq. 3's θ0 at γ = p0·α_p/α_d (θ_min when α_p is 0: no cycle cost to spread)."""
    return model.theta0(p0 * costs.alpha_p / costs.alpha_d) if costs.alpha_p > 0 else params.theta_min


def kv_reserve(params: ControllerParams, kv_total: int, n: int, mu_o: float) -> float:
    """Eq. 23's KV reserve at batch size n (0 while the KV capacity is unknown)."""
    cap = params.kv_capacity_tokens or kv_total
    if cap <= 0:
        return 0.0
    return model.kv_reserve_fraction(n=n, mu_o=mu_o, block_size=1, total_blocks=cap, s_kv=params.kv_s, f0=params.kv_f0)


def decide(s: Snapshot, carry: Carry, p: ControllerParams) -> Decision:
    """One recompute of Algorithm 1: the hazard fit and moments of the window (Section 3.4), θ̂* = θ0 + Δθ
    (Eq. 3 + 5; θ0 alone for ``cfr``; the exact fluid optimum for ``exact-fluid``), clipped to [θ_min, θ_max];
    N̂* of Eq. 6 at θ̂* (clipped to [floor, limit], changed at most every ``n_min_interval_s``); k = ⌊θ̂*·N̂*⌋ and
    the overrides; Eq. 23's KV reserve; in eb+ the mode of Eq. 8 with its band and cooldown. Δθ uses the N̂*
    published before this recompute (``carry.n_star``)."""
    hz = fit_hazard(s.outputs, discrete_correction=p.discrete_correction)
    mu_l, mu_o = float(s.inputs.mean()), hz.mu_o
    var_l, var_o = float(s.inputs.var()), float(s.outputs.var())
    vbar = model.vbar_moments(mu_l, var_l, float(s.outputs.mean()), var_o) if p.n_variance == "measured" else None
    p0 = min(hz.p0 if hz.p0 > 0 else 1.0 / max(mu_o, 1.0), 1.0)
    reasons = [] if hz.ok else [f"hazard fit: {hz.reason}"]
    costs = s.costs

    th0 = theta0(p, costs, p0)
    d_theta = 0.0
    paper = p.theta_method in ("paper", "measured")  # the measured method's prior is the paper's form
    if paper and hz.ok and hz.eta > 0 and hz.eta >= p.min_eta_t * hz.eta_se:
        d_theta = model.delta_theta(th0, p0, hz.eta, costs.alpha_d, costs.beta_d, carry.n_star)
    elif paper and hz.eta <= 0:
        reasons.append("hazard not increasing: CFR threshold")
    elif paper:
        reasons.append(f"IFR not significant (eta/se={hz.eta / hz.eta_se:.1f}): CFR threshold")
    if p.theta_method == "exact-fluid":
        raw = model.theta_exact_fluid(p0, hz.eta if hz.ok else 0.0, costs.alpha_p, costs.beta_p,
                                      costs.alpha_d, costs.beta_d, mu_l, carry.n_star)
    else:
        raw = th0 + d_theta
    theta_star = min(max(raw, p.theta_min), p.theta_max)
    if not math.isfinite(theta_star):
        raise ValueError(f"theta* not finite (theta0={th0}, dtheta={d_theta})")

    n_star, n_changed_at = _batch_size(s, carry, p, theta_star, p0, mu_l, vbar, reasons)
    n_max, k = pinned(p, s.n_limit, n_star, math.floor(theta_star * n_star))
    if p.k_override or p.n_override:
        reasons.append(f"pinned by operator: k={k}, n_max={n_max}")
    se = (math.sqrt(var_l / len(s.inputs)), math.sqrt(var_o / len(s.outputs)))
    carry = carry._replace(n_star=n_star, n_changed_at=n_changed_at)
    mode, lhs, rhs, carry = _mode(s, carry, p, th0, p0, mu_l, mu_o, n_star, se, reasons)
    fit = Fit(p0, hz, mu_l, mu_o, th0, d_theta, theta_star, n_max, k, mode, kv_reserve(p, s.kv_total, n_star, mu_o),
              lhs, rhs, costs, s.cost_source, tuple(reasons))
    return Decision(fit, carry, vbar)


def defer_clock(p: ControllerParams, decode_step_s: float, k: int, n: int, p0: float) -> float:
    """The gate's anti-starvation bound: ``max_defer_s`` when set, else ``defer_factor`` times the expected time
    to free k of n slots. With a constant hazard p0 a decode phase that frees k slots lasts ζ(k/n)/p0 steps
    (Eq. 4's α_d·ζ·μ_O term, appendix B.2), each ``decode_step_s`` (the measured decode iteration time)."""
    if p.max_defer_s > 0:
        return p.max_defer_s
    if not (math.isfinite(decode_step_s) and decode_step_s > 0 and p0 > 0 and k < n):
        return COLD_DEFER_S
    expected = model.zeta(k / n) / p0 * decode_step_s
    return min(max(p.defer_factor * expected, MIN_DEFER_S), MAX_DEFER_S)


def estimates(fit: Fit, theta: float, n: int, n_obs: float, n_window: int) -> Estimates:
    """What a policy reports of the recompute behind it, at the θ and N it publishes (the fit's, or an arm's)."""
    c = fit.costs
    return Estimates(p0=fit.p0, eta=fit.hz.eta, fit_r2=fit.hz.r2, mu_l=fit.mu_l, mu_o=fit.mu_o, n_window=n_window,
                     theta0=fit.theta0, delta_theta=fit.d_theta, theta_star=theta, n_star=n, n_obs=n_obs,
                     eb_lhs=fit.lhs, eb_rhs=fit.rhs, alpha_p=c.alpha_p, beta_p=c.beta_p, alpha_d=c.alpha_d,
                     beta_d=c.beta_d, cost_source=fit.cost_source)


def eq6(p: ControllerParams, n_limit: int, kv_total: int, theta: float, p0: float, mu_l: float,
        vbar: float | None, reasons: list[str] | None = None) -> int:
    """Eq. 6's N̂* at θ, clipped to [floor, ``n_limit``] (the limit while the KV capacity is unknown); why it
    was clipped goes to ``reasons``."""
    cap = p.kv_capacity_tokens or kv_total
    floor = max(1, math.ceil(p.n_floor_frac * n_limit))
    if cap <= 0:
        if reasons is not None:
            reasons.append("KV capacity unknown: N = engine limit")
        return n_limit
    raw = model.n_star(cap, p.eps, theta, p0, mu_l, bound=p.n_bound, vbar_=vbar)
    if raw < floor and reasons is not None:
        reasons.append(f"N*={raw} below floor {floor}")
    return min(max(raw, floor), n_limit)


def _batch_size(s: Snapshot, carry: Carry, p: ControllerParams, theta: float, p0: float, mu_l: float,
                vbar: float | None, reasons: list[str]) -> tuple[int, float]:
    """(N̂*, when it last changed): :func:`eq6` at θ, changed at most every ``n_min_interval_s``."""
    target = eq6(p, s.n_limit, s.kv_total, theta, p0, mu_l, vbar, reasons)
    if target != carry.n_star and s.now - carry.n_changed_at >= p.n_min_interval_s:
        return target, s.now
    return carry.n_star, carry.n_changed_at


def _mode(s: Snapshot, carry: Carry, p: ControllerParams, th0_costs: float, p0: float, mu_l: float, mu_o: float,
          n: int, se: tuple[float, float], reasons: list[str]) -> tuple[Mode, float, float, Carry]:
    """The operator's mode, or for eb+ the Eq. 8 rule with hysteresis and a cooldown, on its own costs
    (``s.eq8_costs``). ``th0_costs``: Eq. 3's θ0 at ``p0`` on Eq. 3-6's costs; ``se``: the standard errors of
    μ̂_L and μ̂_O (σ/√W)."""
    if p.mode != "eb+":
        return Mode(p.mode), math.nan, math.nan, carry
    costs = s.eq8_costs
    if costs is None:
        raise ValueError("eb+ needs Eq. 8's costs in the snapshot")
    th0 = th0_costs if costs == s.costs else theta0(p, costs, p0)  # the profile's until the mixed fit passes
    n_obs = s.n_obs if math.isfinite(s.n_obs) and s.n_obs >= 1 else float(n)
    if not costs.has_mixed:
        reasons.append("mixed cost unknown: eb")
        return Mode.EB, math.nan, math.nan, carry

    def criterion(ml: float, mo: float) -> tuple[float, float]:
        # θ0 (Eq. 3) with p0 scaled by μ_O/mo, to first order: Ψ(θ0) = γ, dθ0/dγ = 1/Ψ'(θ0) = (1−θ0)²/θ0
        th = th0
        if mo != mu_o and costs.alpha_p > 0:
            gamma = p0 * costs.alpha_p / costs.alpha_d
            th = min(max(th0 + (1 - th0) ** 2 / th0 * gamma * (mu_o / mo - 1), 1e-9), 1 - 1e-9)
        lhs, rhs = model.eb_criterion(theta=th, n=n_obs, alpha_p=costs.alpha_p, beta_p=costs.beta_p,
                                      alpha_d=costs.alpha_d, beta_d=costs.beta_d, alpha_mb=costs.alpha_mb,
                                      beta_mb=model.beta_mb_e(mo / (ml + mo), costs.c0, costs.c1, costs.c2),
                                      mu_l=ml, mu_o=mo)
        return lhs, rhs + p.delta

    lhs, rhs = criterion(mu_l, mu_o)
    band = p.mode_hysteresis * model.beta_eb_w(beta_p=costs.beta_p, beta_d=costs.beta_d, mu_l=mu_l, mu_o=mu_o)
    band = max(band, MODE_Z * margin_se(criterion, mu_l, mu_o, se))
    eb_mode, since = carry.eb_mode, carry.updates_since_switch + 1
    want_eb = lhs > rhs + band if not eb_mode else lhs > rhs - band
    if want_eb != eb_mode and since > p.mode_cooldown:
        eb_mode, since = want_eb, 0
    carry = carry._replace(eb_mode=eb_mode, updates_since_switch=since, eq8_band=band)
    if s.mixed_unavailable and not eb_mode:
        reasons.append("mb unavailable on this engine: eb")
        return Mode.EB, lhs, rhs, carry
    return (Mode.EB if eb_mode else Mode.MB), lhs, rhs, carry


def margin_se(criterion: Callable[[float, float], tuple[float, float]], mu_l: float, mu_o: float,
              se: tuple[float, float]) -> float:
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
