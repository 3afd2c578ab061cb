"""What the controller is told (``ControllerParams``, built by ``ebctl.config`` from the file and flags; its
``TunerParams``) and what one recompute finds (``Fit``). Pure data: the modules named in ``Fit``'s types are
imported for type checking only, so ``ebctl.config`` (and the command line) loads no numpy or scipy through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from ebctl import model
    from ebctl.estimate import HazardFit
    from ebctl.protocol import Mode
    from ebctl.slo import Targets

ThetaMethod = Literal["paper", "cfr", "exact-fluid", "measured"]
OperatorMode = Literal["eb", "eb+", "mb", "off"]


def _targets(p: TunerParams | ControllerParams) -> Targets:
    """The latency targets the params set (``ebctl.slo.Targets``; either 0: not set): their ``targets``."""
    from ebctl.slo import Targets  # here, not at the top: ``ebctl.config`` loads this module for the CLI

    return Targets(p.slo_ttft_s, p.slo_tpot_s)


@dataclass(frozen=True, slots=True)
class TunerParams:
    """What ``ebctl.tuner.Tuner`` is told (``ControllerParams.tuner`` builds it from the ``tune_*`` keys)."""

    theta_min: float = 0.01
    theta_max: float = 0.8
    window: int = 200  # completions per window (and at least one whole EB cycle)
    min_pairs: int = 1
    max_pairs: int = 5
    min_effect: float = 0.01  # a challenger must be this much faster (ratio − 1) to win
    step_max: int = 4  # the largest step, in quarter octaves of θ (4: ×2)
    recheck: int = 4000  # completions between settling and the first re-check
    window_s: float = 10.0  # ... or this many seconds, once it holds window / 4 (0: completions only)
    explore_budget: float = 0.01  # share of the time the search may give up to trying arms (``Tuner.budget_left``)
    theta_entry: float = 0.2  # the largest θ a search enters EB at from stock or mb; larger θ is reached by climbing
    ttft_slack: float = 0.1  # a challenger whose TTFT p99 exceeds stock's by more than this share does not win
    tpot_slack: float = 0.1  # ... nor one whose TPOT p99 does
    slo_ttft_s: float = 0.0  # latency targets (``ebctl.slo``); either set: windows are judged by goodput under them,
    slo_tpot_s: float = 0.0  # and the latency guards (the slacks) are off. 0: not set
    targets = property(_targets)


@dataclass(frozen=True, slots=True)
class ControllerParams:
    """Everything the controller is told (config.py builds this from file and flags)."""

    mode: OperatorMode = "eb+"  # eb: EB(k̂*, N̂*); eb+: eb or mb (Eq. 8, or measured); mb; off: stock engine
    cold_mode: Literal["off", "eb", "mb"] = "off"  # before W_min completions: stock engine by default
    theta_method: ThetaMethod = "measured"  # measured: ebctl.tuner; paper: θ0 + Δθ; cfr: θ0; exact-fluid: numeric
    window: int = 500  # W
    update_every: int = 100  # T_upd completions between updates
    min_window: int = 30  # W_min
    theta_default: float = 0.70
    theta_min: float = 0.01
    theta_max: float = 0.80
    eps: float = 0.01  # allowed OOM probability (Eq. 6)
    n_bound: Literal["probabilistic", "expected", "static"] = "probabilistic"
    # Eq. 6's margin v̄: "measured" from the window's input and output variances (model.vbar_moments), or the
    # paper's "geometric" 1/(p0²μ_L)
    n_variance: Literal["measured", "geometric"] = "measured"
    n_max_limit: int = 0  # cap on N̂*; 0: the engine's own max running requests (reported), else 256
    n_floor_frac: float = 0.1  # N̂* ≥ this share of n_max_limit
    n_min_interval_s: float = 2.0  # N changes at most this often
    kv_capacity_tokens: int = 0  # C; 0: take kv_total from the engine's reports
    discrete_correction: bool = False  # p0 → −ln(1−p0) (appendix B.3, source 4)
    min_eta_t: float = 2.0  # Eq. 5 only when η̂ is this many standard errors above 0 (else CFR θ0)
    delta: float = 0.0  # Eq. 8 bias, s/token: > 0 favours MB (latency), < 0 favours EB (throughput)
    mode_hysteresis: float = 0.05  # switch only when Eq. 8 clears its bound by this share of β_EB^w, and by
    # 2 standard errors of its margin (the controller's MODE_Z): the share is sized above the margin's noise
    # (docs/results/learn_table.md, "Shifts"), and a wider one can hold an engine in the slower mode
    mode_cooldown: int = 3  # updates between two mode switches
    n_obs_alpha: float = 0.05  # EMA weight of N_obs (running + waiting, up to the engine's limit)
    kv_s: float = 0.5  # Eq. 23 s_KV
    kv_f0: float = 0.0  # Eq. 23 f0
    max_defer_s: float = 0.0  # anti-starvation bound handed to the gate (s); 0: auto (defer_factor, below)
    defer_factor: float = 4.0  # auto bound: this many times the expected time to free k slots
    ttl_s: float = 10.0  # policy lifetime at the engine
    cost_online: bool = True  # fit α/β from iteration reports, replacing the profile once the fits pass
    predict: bool = True  # with a profile, the model ranks the arms (``ebctl.predict``; the daemon's worker process)
    cost_max_rel_err: float = 0.20  # a cost fit passes at this held-out median relative error (costmodel.judge)
    cost_window: int = 2000  # iterations kept per batch kind
    cost_stale_s: float = 1800.0  # a fit with no iteration of its kind for this long is stale (eb+ probes it)
    probe_s: float = 3.0  # eb+: one probe of the other mode lasts this long (s); 0: no probes
    probe_share: float = 0.03  # eb+: probes take at most this share of the time
    tune_window: int = 400  # measured: completions per window (and at least one whole EB cycle)
    tune_window_s: float = 10.0  # measured: ... or this many seconds, once it holds a quarter of tune_window
    tune_min_pairs: int = 1  # measured: window pairs before a trial may decide
    tune_max_pairs: int = 5  # measured: a trial undecided after this many pairs keeps the incumbent
    tune_min_effect: float = 0.005  # measured: a challenger must be this much faster to replace the incumbent
    tune_step: float = 1.0  # measured: the largest step of θ, in octaves (1: ×2)
    tune_recheck: int = 4000  # measured: completions between settling and re-checking the neighbours
    tune_explore_budget: float = 0.01  # measured: share of the time the search may give up to trying arms
    tune_theta_entry: float = 0.2  # measured: the largest θ a search enters EB at from stock or mb
    tune_ttft_slack: float = 0.1  # measured: a challenger whose TTFT p99 exceeds stock's by more does not win
    tune_tpot_slack: float = 0.1  # measured: ... nor one whose TPOT p99 does
    tune_drift: float = 0.3  # measured: |ln| change of the geometric mean input length (output: 2×) that restarts
    slo_ttft_s: float = 0.0  # latency target, time to first token (s); 0: none (``ebctl.slo``)
    slo_tpot_s: float = 0.0  # latency target, time per output token after the first (s); 0: none
    k_override: int = 0  # > 0: pin k (operator override; the estimates are still computed and shown)
    n_override: int = 0  # > 0: pin N (never above the engine's limit)
    pd_interval_override: int = 0  # > 0: pin sglang's prefill-decode interval under every policy (``Policy``)
    targets = property(_targets)

    def tuner(self) -> TunerParams:
        return TunerParams(theta_min=self.theta_min, theta_max=self.theta_max, window=self.tune_window,
                           window_s=self.tune_window_s,
                           min_pairs=self.tune_min_pairs, max_pairs=self.tune_max_pairs,
                           min_effect=self.tune_min_effect, step_max=max(1, round(4 * self.tune_step)),
                           recheck=self.tune_recheck, explore_budget=self.tune_explore_budget,
                           theta_entry=self.tune_theta_entry, ttft_slack=self.tune_ttft_slack,
                           tpot_slack=self.tune_tpot_slack,
                           slo_ttft_s=self.slo_ttft_s, slo_tpot_s=self.slo_tpot_s)


class Fit(NamedTuple):
    """What one recompute found: the estimates, the closed-form policy, Eq. 8, and why."""

    p0: float
    hz: HazardFit
    mu_l: float
    mu_o: float
    theta0: float
    d_theta: float
    theta: float  # the closed form's θ̂* (clipped)
    n: int  # N̂* at θ̂* (Eq. 6, clipped, changed at most every n_min_interval_s)
    k: int
    mode: Mode  # the operator's mode, or Eq. 8's choice in eb+
    kv: float  # Eq. 23 at N̂*
    lhs: float
    rhs: float
    costs: model.Costs
    cost_source: str
    reasons: tuple[str, ...]
