"""What one engine's iteration reports say, accumulated for the controller: Algorithm 1's window of finished
requests (𝒲_L, 𝒲_O, Section 3.4), Eq. 8's N_obs, the decode iteration time the gate's clock scales with, and the
engine's own facts (KV capacity, running limit, whether it can mix, its gate's decision counts), and with
latency targets set how many of the finished requests' output tokens met them over the last minute (``ebctl.slo``).

``Observed.add(report, n_max_limit)`` is the only writer; time comes in with each report (its wall time).
"""

from __future__ import annotations

import math

from ebctl import slo
from ebctl.estimate import Ema, LengthWindow, RecentRate
from ebctl.params import ControllerParams
from ebctl.protocol import BatchKind, IterationReport

DECODE_STEP_ALPHA = 0.05  # EMA weight of the measured decode iteration time
WAITING_ALPHA = 0.01  # EMA weight of "requests waited" per non-idle iteration (eb+ probes only when saturated)
RATE_HORIZON_S = 60.0  # status: the engine's output tokens/s over this many seconds
DEFAULT_N_LIMIT = 256  # the cap on N̂* before the engine reported its own and none is configured


def n_limit(configured: int, engine_limit: int) -> int:
    """The cap on N̂*: configured, else what the engine reports, else 256; never above the engine's own limit
    once it reported one (a policy beyond it is refused at the daemon's and the engine's door)."""
    limit = configured or engine_limit or DEFAULT_N_LIMIT
    return min(limit, engine_limit) if engine_limit else limit


class Observed:
    """The windows and engine facts of one engine, as its reports arrive."""

    def __init__(self, params: ControllerParams) -> None:
        self.window = LengthWindow(params.window)
        self.n_obs = Ema(params.n_obs_alpha)
        self.in_engine = Ema(params.n_obs_alpha)  # running + waiting, uncapped: the model's closed loop (``predict``)
        self.max_prefill = 0  # the largest prefill batch seen, in tokens: the engine's chunk as far as it showed it
        self.decode_step_s = Ema(DECODE_STEP_ALPHA)  # measured seconds per decode iteration
        self.waiting_share = Ema(WAITING_ALPHA)  # share of recent non-idle iterations with requests waiting
        self.output_rate = RecentRate(RATE_HORIZON_S)  # output tokens/s of the finished requests, now
        self.gate_reasons: dict[str, int] = {}  # the engine's gate decisions by reason (cumulative, as reported)
        self.group_size = 1
        self.mixed_unavailable = False
        self.mixed_reason = ""
        self.pd_interval_available = False  # the engine applies a policy's pd_interval
        self.kv_total = 0
        self.engine_limit = 0
        self.reports = 0
        self.completions = 0
        self.last_wall = math.nan  # the newest report's wall time (status has no clock of its own)
        self.targets = params.targets
        self.slo_recent = _slo_rates()  # with targets: output tokens/s judged, within all, within TTFT, within TPOT

    def set_params(self, old: ControllerParams, new: ControllerParams) -> None:
        """Live reconfiguration: a new window size keeps the newest samples; a new N_obs weight starts afresh."""
        if new.window != old.window:
            self.window.resize(new.window)
        if new.n_obs_alpha != old.n_obs_alpha:
            self.n_obs = Ema(new.n_obs_alpha)
        targets = new.targets
        if targets != self.targets:  # the last minute was judged against the old ones
            self.targets, self.slo_recent = targets, _slo_rates()

    def add(self, r: IterationReport, n_max_limit: int) -> tuple[int, bool]:
        """Ingest one iteration; returns (completions it added to the window, whether the engine's running
        limit changed). ``n_max_limit``: the configured cap on N̂* (0: none)."""
        self.reports += 1
        self.last_wall = r.wall_time
        self.output_rate.add(r.wall_time, sum(f.output_len for f in r.finished))
        if self.targets.set:
            for recent, tokens in zip(self.slo_recent, slo.tally(r.finished, self.targets), strict=True):
                recent.add(r.wall_time, tokens)
        added = sum(1 for f in r.finished if self.window.append(f.input_len, f.output_len))
        self.completions += added
        if r.kv_total > 0:
            self.kv_total = r.kv_total
        limit_changed = r.max_running > 0 and r.max_running != self.engine_limit
        if limit_changed:
            self.engine_limit = r.max_running
        if r.running > 0:
            # Eq. 8's N_obs: the paper's Proposition 3.4 takes N as EB's maximum batch and MB's average one,
            # i.e. what the engine could batch: running plus waiting, up to its limit. Not the running batch
            # alone: EB drains it by design, so an EMA of it swings with EB's cycles between two updates, and
            # Eq. 8's right side with it.
            cap = n_limit(n_max_limit, self.engine_limit)
            self.n_obs.update(float(min(r.running + r.waiting, max(cap, r.running))))
            self.in_engine.update(float(r.running + r.waiting))
        self.max_prefill = max(self.max_prefill, r.prefill_tokens)
        self.mixed_unavailable = r.mixed_unavailable
        self.mixed_reason = r.mixed_unavailable_reason
        self.pd_interval_available = r.pd_interval_available
        self.group_size = r.group_size
        if r.gate_reasons:
            self.gate_reasons = r.gate_reasons
        if r.kind is BatchKind.DECODE and r.forward_s > 0:
            self.decode_step_s.update(r.forward_s)
        if r.kind is not BatchKind.IDLE:
            self.waiting_share.update(1.0 if r.waiting > 0 else 0.0)
        return added, limit_changed

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

    def slo_status(self) -> dict:
        """The latency targets (0: not set) and, over the last minute: the share of the judged requests' output
        tokens that met every target (``attainment``), each target alone, and goodput (output tokens/s of the
        requests that met every target). NaN without targets or before two reports."""
        judged, good, ttft, tpot = (x.value for x in self.slo_recent)

        def share(x: float) -> float:
            return x / judged if judged > 0 else math.nan

        return {"ttft_s": self.targets.ttft_s, "tpot_s": self.targets.tpot_s, "attainment": share(good),
                "ttft_attainment": share(ttft), "tpot_attainment": share(tpot), "goodput_tok_s": good}


def _slo_rates() -> tuple[RecentRate, ...]:
    """One rate per field of ``slo.Tally``, over the status horizon."""
    return tuple(RecentRate(RATE_HORIZON_S) for _ in slo.Tally._fields)
