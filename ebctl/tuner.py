"""The measured threshold (``controller.theta_method = "measured"``): θ, and in eb+ the mode, chosen by the
throughput the engine itself delivers while it is saturated.

The closed forms (Eq. 3, Eq. 5) are only as good as the cost model behind them, and the best θ of a real engine
can sit far from them (the paper's Table 13 peaks at θ = 0.6-0.7 where Eq. 3 gives 0.02-0.05). So the tuner
compares operating points, *arms*, on one axis of exclusivity, by what the engine measures (``ebctl.trial``):

    mb (mixed batches, eb+ only, where the engine can mix) — stock (the engine's own prefill-first rule,
    k = 1: the server the operator had) — EB(θ) for θ on a log grid θ_max·2^(−i/4) down to θ_min

It starts at stock and moves only on a measured gain. From stock or mb it tries mb or stock (the cheapest
trial: neither has cycles), then the closed forms (θ0 and θ0 + Δθ, the prior, each at most ``theta_entry``, the
smaller first); from EB(θ) it tries θ·2^±s
(a step of s octaves, at most ``step_max``, halved when both directions lose, down to a quarter octave; below
θ_min lies stock), going on in the direction of the last win. Once nothing is left to try it settles, and
re-checks its neighbours and stock in turn after ``recheck`` completions, then twice as long each time.

**Objective**: with latency targets set (``controller.slo_ttft_s``, ``slo_tpot_s``), every window is judged by
its goodput instead of its throughput: its rate × the share of the output tokens of its requests that met every
target (``ebctl.slo``). The trials, the ledger, the early stops and the gain against stock then all compare
goodput; the TTFT and TPOT guards are off (the targets replace them); status carries each window's and each
arm's attainment.
A window judges only the requests whose first token came after its arm's run began (and after the window
before it): a request finishing in it may have been admitted under the arm before a switch, and a batch turns over
more slowly than the settling windows run. With targets, windows count at any load (latency depends on the arm
below saturation too); from stock or mb the search goes on past the closed forms up an octave ladder of θ
(``_ladder``); and a challenger EB arm whose engine never held more than N − k requests loses at once (it runs as
the engine's own rule, and so does any smaller θ at that load). An incumbent that met them for less than half
its output tokens in its last window is challenged after one steady window (``_refs_needed``). New targets drop
what was measured under the old ones and restart the search from the incumbent.

Trials run only while the engine is saturated, so below saturation θ does not move (without latency targets:
with them, windows count at any load). After every switch of arm
windows are run and dropped: one for an EB arm, two for stock and mb (``SETTLE_EB``, ``SETTLE_OWN``). The batch
the previous arm left (its size, its requests' ages) takes about one window to wash out; the engine's own
admission state takes longer (sglang's new_token_ratio, decayed to its floor under EB, lets stock admit more
than it can keep until a retraction backs it off). The iterations between a switch and the new arm's first
cycle belong to neither arm.

**Ledger**: exploring costs throughput, and on a slow server a trial runs for minutes. Every window a challenger runs,
and every settling window, costs its seconds × (1 − its rate / the incumbent's reference rate); the reference is the
geometric mean of the incumbent's last ``REF_WINDOWS`` steady windows, not its last one. Two sums: ``explore_net_s``,
the estimate ``ebctl status`` shows, counts the windows that ran ahead as negative costs (each at most its own seconds),
so that noise cancels; ``explore_s``, the bound the budget holds, counts the slower windows only, so that it cannot be
paid for by a lucky window (a challenger as fast as the incumbent still adds window-to-window noise to it: the net
figure is the one to read). A trial starts only while the bound is under ``explore_budget`` of the time since the first
report (``budget_left``): the share given up stays within the budget plus one trial. With latency targets, from an
incumbent that meets them for at least half its tokens, only once the budget left covers a trial's expected cost
(``trial_cost``): there a losing challenger's queue outlives its trial. One window clearly off the incumbent's reference
(``early_stop_bar``) decides a trial at once: a slower challenger loses, even in its settling window (looked at every
``window_s``, ``_peek``; in the first settling window only beyond ``EARLY_STOP_SETTLING``, what a switch leaves behind);
a faster one runs one more window and wins if the two windows' mean clears the bar for two (``_closed``), else the two
are the pair's B. A faster challenger other than stock whose requests' TTFT p99 exceeds stock's by more than
``ttft_slack``, or whose TPOT p99 exceeds it by more than ``tpot_slack``, loses (``_win``): throughput does not see what
EB's refills cost latency (without latency targets only). The incumbent's gain against stock (``gain``), what
``ebctl status`` shows as "is it helping": its windows since it won against stock's last ones, or, until it has run
three, the figure carried along the trials that led to it.

**The model** (with a profile; ``set_predictions``): the controller hands in the engine simulator's ranking of the
arms on the served requests (``ebctl.predict``). Before the first trial the model's pick becomes the incumbent at
once, and its first trial is against stock (``unverified``); after it the pick is tried first (``neighbours``); a
trial the model predicted is judged with the prediction as its prior, weighed by the model's record on this engine
(``ebctl.prior``), and its outcome adds to that record.

**Drift**: the controller calls :meth:`Tuner.reset` when the request mix moved; the trial in progress is dropped, the
search starts again from the incumbent with its largest step.

Pure: reports and policy versions in, the arm to run out; no clock (time comes in the reports), no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ebctl import arms, prior, slo
from ebctl.arms import MB, MIN_K, PD_FIRST, PDI, QUARTERS, STOCK, Grid, settle
from ebctl.arms import PROBE as PROBE  # the arms are ebctl.arms'; their names importable from here too
from ebctl.ledger import Ledger
from ebctl.params import TunerParams  # defined with ControllerParams; importable from here too
from ebctl.protocol import BatchKind, IterationReport, Mode
from ebctl.refs import EARLY_STOP_Z, MIN_REF, Refs, excess
from ebctl.trial import SATURATED_SHARE, Applied, Trial, Verdict, Window, verdict

MAX_INVALID = 3  # unsaturated windows in a row that end a trial
LONG_WINDOW = 2  # an EB arm whose cycle does not end within this many windows' completions has none (see _boundary)
RECHECK_GROWTH, RECHECK_MAX = 2, 8  # re-checks of a settled arm: each gap twice the last, at most 8× the first
HISTORY = 16  # trials kept for status
REACH_ALPHA = 0.01  # EMA weight of the batch the engine's own admission reaches
MIN_WINDOW_SHARE = 4  # a window closed by its time holds at least 1/4 of ``window`` completions
# With latency targets, an incumbent whose last steady window met them for less than this share of its output tokens
# needs one steady window before a trial, not MIN_REF (``_refs_needed``); a window that judged none (NaN) needs MIN_REF
MISSING = 0.5
# ... and the incumbent's window closes early where its requests' share within the TPOT target is this many standard
# errors below MISSING (``clearly_missing``; ``_full``)
MISSING_Z = 2.0


class _Part:
    """An attribute of one of the tuner's parts, read and written through the tuner too (``Tuner.explore_s`` is
    ``Tuner.ledger.explore_s``)."""

    def __init__(self, part: str) -> None:
        self.part, self.name = part, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class Tuner:
    """One engine's measured search. ``bind`` each published policy, ``observe`` each report, run ``arm``."""

    # the ledger's figures, read and written through the tuner too (the status tests, tools/daemon_memory.py)
    explore_s, explore_net_s, explore_run_s = _Part("ledger"), _Part("ledger"), _Part("ledger")
    gain_ln, gain_var, gain_inc, gain_stock = _Part("ledger"), _Part("ledger"), _Part("ledger"), _Part("ledger")
    # the references' windows too (the status and probe tests, tools/daemon_memory.py)
    ref_lns, ref_att, stock_lns = _Part("refs"), _Part("refs"), _Part("refs")
    stock_ttfts, stock_tpots = _Part("refs"), _Part("refs")

    def __init__(self, params: TunerParams) -> None:
        self.p = params
        self.grid = Grid(params.theta_max, params.theta_min)  # the arms' grid at the engine's N (``n``)
        self.incumbent = STOCK
        self.arm = STOCK  # what should run now
        self.allow_mb = False
        self.prefer_mb = False
        self.allow_pdi = False  # the engine applies a policy's pd_interval (``set_context``)
        self.tpot_binds = False  # with targets: the incumbent's last steady window missed TPOT more than TTFT
        self.entries: list[str] = []  # EB arms tried first from stock or mb (the closed forms)
        self.mu_l = self.mu_o = math.nan  # the request mix a window's rate is computed for
        self.steady = False  # the controller's word that the start-up is over (no trial before)
        self.step = params.step_max
        self.tried: set[str] = set()  # challengers that lost against the incumbent at the current step
        self.direction = 0  # +1: θ up, −1: θ down (the last move that won)
        self.trial: Trial | None = None
        self.trial_id = 0
        self.window: Window | None = None
        self.settled = False
        self.rechecks = 0  # re-check trials started since settling (they take the candidates in turn)
        self.gap = 0  # completions to wait before the next trial
        self.recheck_gap = params.recheck
        self.saturated = False  # the last closed window of the running arm was saturated
        self.counts = {"trials": 0, "won": 0, "lost": 0, "aborted": 0, "resets": 0}
        self.history: list[dict[str, Any]] = []
        self.reset_reason = ""
        self._versions: dict[int, Applied] = {}
        self._last: IterationReport | None = None
        self._last_wall = math.nan
        self._refill = False  # an EB refill the threshold started is under way
        self._since = 0  # completions since the last cycle boundary of the running arm
        self.reach = math.nan  # EMA of the batch the engine itself stops admitting at (stock or mb, requests waiting)
        self.settling = 0  # windows of the running arm still to drop (it follows a switch)
        self._peeked = -math.inf  # when a settling window was last looked at (``_peek``)
        self.stock_mixes = False  # the engine mixes on its own (launched with mixed chunks): mb is stock
        self.first_wall = math.nan  # the wall time of the first report (the exploration budget accrues from it)
        self.ledger = Ledger()  # what exploring cost, and the incumbent's gain against stock (``ebctl.ledger``)
        self.refs = Refs()  # the incumbent's and stock's last steady windows, and the bars (``ebctl.refs``)
        self.targets = params.targets  # the objective's (``ebctl.slo``)
        self.attained: dict[str, float] = {}  # with targets: each arm's attainment in its last measured window
        self._run_since = math.nan  # when the running arm's current run began, its completions since, and its
        self._run_done = 0  # windows' starts (wall time, completions then): with targets, which requests a window
        self._starts: list[tuple[float, int]] = []  # judges (``_judge_since``)
        self.predicted: dict[str, float] = {}  # the model's ln ratio of each arm to stock (``set_predictions``)
        self.eligible: set[str] = set()  # ... the arms whose predicted latency the guard or the targets allow
        self.record = prior.Record()  # the model's predicted and measured ratios, trial by trial
        self.unverified = False  # the incumbent is the model's start-up pick, not yet measured against stock

    # --- arms (``ebctl.arms``) -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """The engine's slots N (EB arms map θ to k = ⌊θ·N⌋ on it); 0: unknown."""
        return self.grid.n

    @n.setter
    def n(self, n: int) -> None:
        if n != self.grid.n:
            self.grid = dataclasses.replace(self.grid, n=n)

    @property
    def top(self) -> int:
        return self.grid.top

    def theta(self, arm: str) -> float:
        return self.grid.theta(arm)

    def eb_arm(self, theta: float) -> str:
        return self.grid.eb_arm(theta)

    def k(self, arm: str) -> int:
        return self.grid.k(arm)

    mode = staticmethod(arms.mode)
    pd_interval = staticmethod(arms.pd_interval)

    def set_context(self, *, entries: list[float], allow_mb: bool, prefer_mb: bool, mu_l: float = math.nan,
                    mu_o: float = math.nan, steady: bool = True, n: int = 0, allow_pdi: bool = False) -> None:
        """From each controller update: the closed-form θs (tried first from stock or mb), whether mb may run,
        whether Eq. 8 prefers it (then mb is tried first), the mean prompt and output lengths the windows'
        rates are weighed with, and the engine's N. A closed-form θ whose k would be below ``MIN_K`` enters at
        the smallest grid θ that reaches it (on 16 slots a θ0 under 0.125 is k = 1: stock); one above
        ``theta_entry`` enters there, and the search climbs from it on wins. Each refill of EB(k) admits k
        prompts at once and stalls decoding while they prefill, so a large k costs TTFT and TPOT before its
        first window is measured: the smallest k is tried first. ``allow_pdi``: the engine applies a policy's
        ``pd_interval`` (its reports say so): with latency targets, the ``pdi@N`` arms may run."""
        if steady and not self.steady and self.targets.set:
            # With targets the windows before the start-up's end judged the first burst's latencies (c requests arriving
            # at once): their goodput is far off the incumbent's steady state, and one of them in the reference would
            # widen the bars until a losing trial runs on. The trials then wait for windows of the steady state
            # (``_refs_needed``), and the window open now and the next ones judge only requests whose first token comes
            # after this point.
            r = self.refs
            r.ref_lns, r.ref_att, r.stock_lns, r.stock_ttfts, r.stock_tpots = [], [], [], [], []
            self.ledger.gain_inc, self.ledger.gain_stock = [], []
            self._new_run()
        self.mu_l, self.mu_o, self.steady = mu_l, mu_o, steady
        self.n = n
        self.entries = self.grid.entries(entries, self.p.theta_entry)  # the smallest k first
        self.prefer_mb = prefer_mb
        if allow_pdi != self.allow_pdi:
            self.allow_pdi = allow_pdi
            if not allow_pdi:
                self._drop_pdi("the engine no longer applies pd_interval")
        if allow_mb != self.allow_mb:
            self.allow_mb = allow_mb
            t = self.trial
            if not allow_mb and (self.incumbent == MB or (t is not None and MB in (t.incumbent, t.challenger))):
                if self.incumbent == MB:
                    self._to_stock()
                self._end_trial("aborted", "mb no longer available")

    def set_predictions(self, gains: dict[str, float], eligible: set[str]) -> None:
        """The model's ranking (``ebctl.predict``): each arm's predicted ln ratio to stock (goodput with latency
        targets), and the arms whose predicted TTFT and TPOT p99 are within the latency slack of stock's (with
        targets: every arm; the targets judge). Before the search's first trial, with the engine still starting,
        the model's pick (``model_pick``) becomes the incumbent at once: the start-up runs at it, and its first
        trial is against stock (``unverified``)."""
        self.predicted, self.eligible = dict(gains), set(eligible)
        if self.counts["trials"] or self.trial is not None or self.incumbent != STOCK or self.steady:
            return
        pick = self.model_pick()
        if pick:
            lead = self._lead(pick)
            self._log_move(pick, f"the model's pick at start-up: predicted {math.expm1(lead):+.1%}", lead)
            self.incumbent, self.unverified = pick, True
            self.ledger.gain_ln, self.ledger.gain_var = lead, self.record.sd() ** 2
            self._run(pick)

    def _lead(self, arm: str) -> float:
        """The model's predicted ln ratio of ``arm`` to the incumbent (NaN where it predicted either not)."""
        a, b = self.predicted.get(arm, math.nan), self.predicted.get(self.incumbent, math.nan)
        return a - b

    def model_pick(self) -> str:
        """The arm the model ranks first among those that may run here (mb where it differs from stock, pdi
        where the engine applies it, EB with k ≥ MIN_K), within the latency slack, not lost at this step, if its
        predicted lead on the incumbent reaches ln(1 + ``min_effect``); "" otherwise."""
        bar = math.log1p(self.p.min_effect)
        best, lead = "", bar
        for arm in self.eligible:
            if arm == self.incumbent or arm in self.tried or not self.may_run(arm):
                continue
            x = self._lead(arm)
            if x >= lead:
                best, lead = arm, x
        return best

    def may_run(self, arm: str) -> bool:
        """May ``arm`` run on this engine: mb where it differs from stock, pdi where the engine applies it, EB with
        k ≥ MIN_K at the engine's N."""
        if arm == MB:
            return self.allow_mb and not self.stock_mixes
        if arm.startswith(PDI):
            return self.allow_pdi
        if arm.startswith("eb@"):
            return not self.n or self.k(arm) >= MIN_K
        return arm == STOCK

    def _log_move(self, arm: str, why: str, lead: float) -> None:
        """A move the model made without a trial, in the history."""
        self.history = [*self.history[-(HISTORY - 1):], {
            "incumbent": self.incumbent, "challenger": arm, "theta_incumbent": self.theta(self.incumbent),
            "theta_challenger": self.theta(arm), "started": self._last_wall, "pairs": 0, "rates": [],
            "effect": math.nan, "predicted": math.expm1(lead), "half_width": math.nan, "decision": "model",
            "why": why, "attainment": []}]

    def _ladder(self) -> list[str]:
        """With latency targets, what stock and mb try after the closed forms: EB an octave above the largest of
        them, then another, up to θ_max. The closed forms model throughput; where latency binds the best θ is set
        by the latency each refill costs, which none of them gives, and below it EB may not bind at all (with
        fewer requests than N − k in the engine EB is the engine's own rule), a plateau from which no step gains."""
        return self.grid.ladder(self.entries) if self.targets.set else []

    def _drop_pdi(self, why: str) -> None:
        """pdi arms may no longer run: a pdi incumbent gives way to stock, a trial with one is aborted."""
        t = self.trial
        if self.incumbent.startswith(PDI) or (t is not None and t.challenger.startswith(PDI)):
            if self.incumbent.startswith(PDI):
                self._to_stock()
            self._end_trial("aborted", why)

    def _to_stock(self) -> None:
        """The incumbent's arm can no longer run: stock becomes the incumbent, with nothing of the old one's
        measurements (its windows' reference, its gain, the search's position around it)."""
        self.incumbent = STOCK
        self.refs.ref_lns, self.refs.ref_att, self.tried, self.direction, self.settled = [], [], set(), 0, False
        self.ledger.gain_ln, self.ledger.gain_var, self.ledger.gain_inc = 0.0, 0.0, []

    def neighbours(self) -> list[str]:
        """The challengers of the incumbent, in the order they are tried. mb only where it differs from stock
        (the engine can mix, and does not mix on its own already). From EB(θ), a step of ``step`` grid points up
        and down, going on past points whose k equals the incumbent's (at N = 16 a quarter octave often maps
        to the same k); a k below MIN_K is stock.

        With latency targets, on an engine that applies it, sglang's own prefill-decode interval is an arm too
        (``pdi@N``, stock's admission with N decode-only steps after each batch that prefilled): it trades TTFT
        for TPOT, each prefill waiting for up to N decode steps and no decode step stalled by one, which no EB
        arm does (EB's refills stall every running request at once). From stock or mb, ``pdi@PD_FIRST`` comes
        first where the incumbent's requests missed TPOT more often than TTFT (``tpot_binds``), last otherwise;
        from pdi@N, N doubled and halved (below 1: stock), in the direction of the last win between intervals, else
        doubled first only where TPOT binds (a longer interval holds prefills back longer: TTFT grows)."""
        pick = self.model_pick()
        base = self._neighbours()
        return [pick, *(a for a in base if a != pick)] if pick else base

    def _neighbours(self) -> list[str]:
        """The challengers of ``neighbours`` without the model's pick."""
        inc = self.incumbent
        mb = [MB] if self.may_run(MB) else []
        if inc in (STOCK, MB):  # mb first: its trials are the cheapest (no cycles, the least to wash out)
            own, eb = [STOCK] if inc == MB else mb, [*self.entries, *self._ladder()]
            if not (self.targets.set and self.allow_pdi):
                return [*own, *eb]
            pdi = [f"{PDI}{PD_FIRST}"]
            return [*pdi, *own, *eb] if self.tpot_binds else [*own, *eb, *pdi]
        if inc.startswith(PDI):
            return arms.pdi_steps(inc, self.direction, self.tpot_binds)
        return self.grid.eb_steps(inc, self.step, self.direction)

    # --- input ----------------------------------------------------------------------------------------
    def bind(self, version: int, applied: Applied) -> None:
        """The controller published ``version`` for ``applied.arm``."""
        self._versions[version] = applied
        if len(self._versions) > 512:
            for v in sorted(self._versions)[:256]:
                del self._versions[v]

    def observe(self, r: IterationReport) -> None:
        """One iteration: attribute it to the arm whose policy the engine applied, extend or close windows."""
        if (self.p.slo_ttft_s, self.p.slo_tpot_s) != self.targets:
            self._retarget()
        last, self._last = self._last, r
        start, self._last_wall = self._last_wall, r.wall_time
        if math.isnan(self.first_wall):
            self.first_wall = r.wall_time
        applied = self._versions.get(r.policy_version)
        if r.kind is BatchKind.MIXED and (applied is None or applied.mode is Mode.OFF):
            self.stock_mixes = True  # no policy asked for it: the engine was launched mixing
        if r.kind is BatchKind.DECODE and r.waiting > 0 and (applied is None or (
                applied.mode is not Mode.EB and not applied.pd_interval)):
            # no gate held anyone back, nor sglang's prefill-decode interval: the engine's own admission stopped at
            # this batch (slots or KV)
            self.reach = r.running if math.isnan(self.reach) else self.reach + REACH_ALPHA * (r.running - self.reach)
        w = self.window
        if applied is None or applied.arm != self.arm:  # another arm's (a transition, a probe, an expiry)
            self._new_run()
            return
        if math.isnan(self._run_since):
            self._run_since = start
        self._run_done += len(r.finished)
        self._since += len(r.finished)
        if self._boundary(r, last, applied) or self._since >= LONG_WINDOW * self.p.window:
            self._since = 0
            if w is not None and self._full(w, r.wall_time):
                w.end = start
                self.window = None
                self._closed(w)
                if self.arm != applied.arm:  # switched: this report belongs to the transition
                    return
            if self.window is None and math.isfinite(start):
                self.window = Window(applied.arm, start, room=applied.n_max - applied.k if applied.mode is Mode.EB
                                     else -1, since=self._judge_since())
                self._starts.append((start, self._run_done))
        w = self.window
        if w is None or not math.isfinite(start):
            return
        dt = max(r.wall_time - start, 0.0)
        if self.targets.set:
            w.add(r, dt, self.targets)
        else:
            w.add(r, dt)
        if r.waiting > 0 and (applied.mode is not Mode.EB or r.running + r.waiting > applied.n_max):
            w.saturated_s += dt
        if self.settling and self.trial is not None and w.arm == self.trial.challenger:
            self._peek(w, r.wall_time)

    def _new_run(self) -> None:
        """The window in progress is dropped and a new run begins at the next report: its windows judge only the
        requests whose first token comes after it (``_judge_since``)."""
        self.window, self._since = None, 0
        self._run_since, self._run_done, self._starts = math.nan, 0, []

    def _judge_since(self) -> float:
        """With latency targets, the first-token time from which a window opening now judges requests: the start
        of the latest window of this run that opened at least ``window`` completions ago, else the run's start.
        Every window judges the requests that began at most about ``window`` completions before it, whether the
        window follows a switch (the settling windows hold them) or not, and whether windows close on their
        completions or on their time (at a high concurrency a time-bounded window may hold no request that began
        after the window before it)."""
        bar, since = self._run_done - self.p.window, self._run_since
        keep = 0
        for i, (wall, done) in enumerate(self._starts):
            if done <= bar:
                since, keep = max(since, wall), i
        del self._starts[:keep]
        return since

    def _peek(self, w: Window, now: float) -> None:
        """A challenger's settling window stays whole (``_full``), but one that holds a quarter of ``window`` is
        looked at every ``window_s`` seconds: clearly slower already, it ends the trial there, and a bad arm costs
        ``window_s`` instead of a whole window. Not once only: with latency targets a challenger that builds a
        queue misses them more the longer it runs."""
        last = self._peeked if self._peeked >= w.start else w.start
        if not (now - last >= self.p.window_s > 0 and w.completions >= self.p.window // MIN_WINDOW_SHARE):
            return
        self._peeked = now
        rate, ref = self._value(w), self.refs.ref()
        saturated = (w.saturated_s >= SATURATED_SHARE * (now - w.start) if not self.targets.set
                     else w.judged_tokens > 0)
        if saturated and rate > 0 and math.log(rate) - ref < -self._stop_bar():
            w.end = now
            self.window = None
            self._closed(w)  # counts its cost and ends the trial

    def _full(self, w: Window, now: float) -> bool:
        """A window closes at ``window`` completions, or, once settled, after ``window_s`` seconds if it holds a
        quarter of them: on a slow server ``window`` completions take long, and a trial's pairs would run for
        minutes. Settling windows stay whole: what a switch leaves behind washes out over the engine's
        iterations, not seconds.

        With latency targets, the incumbent's steady window between trials closes as soon as it holds a quarter of them
        if its judged requests met the TPOT target for less than ``MISSING`` of their tokens by ``MISSING_Z`` standard
        errors (``clearly_missing``): the window meets the targets for less still, it is challenged after it
        (``_refs_needed``), and each further second of it costs most of its goodput. TPOT alone: a request's TPOT comes
        from the batches it ran in, steady once the batch has turned over (the start-up's end, ``Steering.context``),
        where its TTFT holds its wait in the queue, which grows until every request of a closed loop larger than the
        batch has passed through it: an early close on TTFT would judge that start-up queue, not the arm."""
        if w.completions < self.p.window // MIN_WINDOW_SHARE:
            return False
        if w.completions >= self.p.window or (not self.settling and now - w.start >= self.p.window_s > 0):
            return True
        return (self.targets.set and self.trial is None and not self.settling and w.arm == self.incumbent
                and w.judged_tokens > 0 and clearly_missing(w.tpot_ok_tokens / w.judged_tokens,
                                                            w.judged_tokens / self.mu_o))

    def _boundary(self, r: IterationReport, last: IterationReport | None, a: Applied) -> bool:
        """Does ``r`` open a cycle? Under EB: the first decode step after a refill that the threshold started (a
        prefill after a decode step that left at most N − k requests running): the batch is at its fullest.
        Stock and mb have no cycle of their own: every iteration does. Nor has an EB arm whose refill never
        ends (the engine's own admission stops short of N and of the KV reserve: the gate stays in its refill,
        and EB runs as stock): after ``LONG_WINDOW`` windows' worth of completions without a boundary, the
        caller takes one anyway."""
        if a.mode is not Mode.EB:
            self._refill = False
            return True
        if (r.kind in (BatchKind.PREFILL, BatchKind.MIXED) and last is not None and last.kind is BatchKind.DECODE
                and last.decode_reqs - len(last.finished) <= a.n_max - a.k):
            self._refill = True
        elif r.kind is BatchKind.DECODE and self._refill:
            self._refill = False
            return True
        return False

    # --- the search -----------------------------------------------------------------------------------
    def _run(self, arm: str) -> None:
        """Switch to ``arm``; its first window will be dropped (the settling window)."""
        if arm != self.arm:
            self.arm, self.window = arm, None
            self.settling = settle(arm)

    def interrupt(self) -> None:
        """Another mode runs for a moment (an eb+ probe, ``ebctl.probe``): the window in progress is lost, and
        once the arm resumes its first windows are dropped as after a switch (the probe leaves its batch and,
        after EB, sglang's decayed new_token_ratio behind), between trials too: a trial's first window would
        carry that state. A trial in progress goes on after it; it takes one such pause at most
        (``Steering._probe``)."""
        if self.trial is not None:
            self.trial.probed = True
        self.window, self._since = None, 0
        self.settling = max(self.settling, settle(self.arm))

    def _closed(self, w: Window) -> None:
        """A window of the running arm closed: count what it cost, drop it (settling), end a trial whose challenger
        is clearly slower, file it in the trial and decide, or start a trial."""
        self.saturated = w.saturated
        t = self.trial
        if t is None:
            self.gap -= w.completions
        rate = self._value(w)
        ln = math.log(rate) if rate > 0 else math.nan  # NaN: no busy time
        ref = self.refs.ref()
        if w.arm != self.incumbent or self.settling:  # exploring, or the way back from it (Ledger)
            self.ledger.charge(w.seconds, ln - ref if self._counts(w) else math.nan,
                               challenger=w.arm != self.incumbent)
        elif math.isfinite(ln) and self._counts(w):
            self.refs.add_incumbent(ln, w.attainment())
            self.ledger.add_incumbent(ln)
        if t is not None and w.arm == t.challenger and self._counts(w) and ln - ref < -self._stop_bar():
            sd = self.refs.early_stop_bar / EARLY_STOP_Z
            self._end_trial("lose", f"clearly slower: {math.expm1(ln - ref):+.1%} in one window",
                            measured=(ln - ref, sd * sd))
            return
        if self.targets.set and t is not None and w.arm == t.challenger and not w.binds:
            # it runs as the engine's own rule, and so would any smaller θ (a smaller k, a larger N − k) at this load
            self._end_trial("lose", f"EB does not bind: at most {w.peak} requests in the engine, the gate holds "
                                    f"back beyond N − k = {w.room}")
            self.tried.update(f"eb@{j}" for j in range(int(w.arm[3:]), self.top + 1))
            if self.gap <= 0 and self.trial is None:
                self._start_trial(w)
            return
        if self.settling:
            self.settling -= 1
            return
        if self.targets.set:
            self.attained[w.arm] = w.attainment()
            if w.arm == self.incumbent and w.judged_tokens:
                self.tpot_binds = w.tpot_ok_tokens < w.ttft_ok_tokens
        if w.arm == STOCK and self._counts(w) and math.isfinite(ln):  # what the gain and the latency guard compare with
            self.refs.add_stock(ln, w.ttfts, w.tpots)
            self.ledger.add_stock(ln)
        if t is None:
            if self._counts(w) and self.gap <= 0 and self.steady:
                self._start_trial(w)
            return
        if not self._counts(w):
            t.invalid += 1
            if t.invalid >= MAX_INVALID:
                self._end_trial("aborted", "not saturated")
            return
        t.invalid = 0
        if self.targets.set:
            t.attained.append((w.arm, w.attainment()))
        if w.arm == t.challenger:
            t.ttfts.extend(w.ttfts)
            t.tpots.extend(w.tpots)
            bar = math.log1p(self.p.min_effect)
            if math.isfinite(t.lead):  # the window after a clearly faster one: the two confirm it, or are B
                lead, t.lead = t.lead, math.nan
                mean = (lead + ln) / 2
                two, var = self.refs.two_windows()
                if mean - ref > two + bar:
                    self._win(t, w, f"clearly faster: {math.expm1(mean - ref):+.1%} in two windows",
                              measured=(mean - ref, var if len(self.refs.ref_lns) >= MIN_REF else math.nan))
                    return
                rate = math.exp(mean)
            elif ln - ref > self.refs.early_win_bar() + bar:
                t.lead = ln  # one more window of the challenger before it may win
                return
        t.rates.append((w.arm, rate))
        if len(t.rates) >= 3 and len(t.rates) % 2 == 1:  # a pair is complete
            d = t.diffs()
            v = self._judge(t, d)
            if v.decision and not self.refs.thin:
                measured = (float(d.mean()), self.refs.effect_var(d))
                self.refs.pool(d)
                if v.decision == "win":
                    self._win(t, w, "", verdict_=v, measured=measured)
                    return
                self._end_trial(v.decision, v.why, verdict_=v, measured=measured)
                if self.gap <= 0 and self.trial is None:  # still searching: the next trial starts at once
                    self._start_trial(w)
                return
        self._run(t.arm())

    def _judge(self, t: Trial, d: np.ndarray) -> Verdict:
        """The pairs' test: with the model's prediction as its prior where the model predicted this trial
        (``prior.judge``, the prior's sd the model's record here), else ``trial.verdict``."""
        p = self.p
        if math.isfinite(t.predicted):
            return prior.judge(d, predicted=t.predicted, model_sd=self.record.sd(), prior_sd=self.refs.prior_sd,
                               min_pairs=p.min_pairs, max_pairs=p.max_pairs, min_effect=p.min_effect)
        return verdict(d, prior_sd=self.refs.prior_sd, min_pairs=p.min_pairs, max_pairs=p.max_pairs,
                       min_effect=p.min_effect)

    def _win(self, t: Trial, w: Window, why: str, *, measured: tuple[float, float],
             verdict_: Verdict | None = None) -> None:
        """The challenger is faster: it wins, unless it is not stock and its TTFT p99 exceeds stock's by more
        than ``ttft_slack`` or its TPOT p99 exceeds stock's by more than ``tpot_slack`` (``excess``; without
        latency targets only: they replace it); then it loses. Throughput alone would not see what EB's refills
        cost latency: each refill stalls every running decode. The next trial starts at once while searching."""
        over = []
        if t.challenger != STOCK and not self.targets.set:
            over = [f"{what} p99 {x:+.0%} against stock's (at most {slack:+.0%})"
                    for what, x, slack in (("TTFT", excess(t.ttfts, self.refs.stock_ttfts), self.p.ttft_slack),
                                           ("TPOT", excess(t.tpots, self.refs.stock_tpots), self.p.tpot_slack))
                    if x > slack]
        if over:
            self._end_trial("lose", "; ".join(over), verdict_=verdict_, measured=measured)
        else:
            self._end_trial("win", why, verdict_=verdict_, measured=measured)
        if self.gap <= 0 and self.trial is None:
            self._start_trial(w)

    def _counts(self, w: Window) -> bool:
        """Does a window count? Without latency targets only when saturated: below saturation the arm does not
        change throughput. With them at any load (the arm changes latency at any load, and goodput with it), once
        it judged a request: one that judged none says nothing of goodput."""
        return w.judged_tokens > 0 if self.targets.set else w.saturated

    def _value(self, w: Window) -> float:
        """A window's worth: its rate; with latency targets, × its attainment (``ebctl.slo``)."""
        rate = w.rate(self.mu_l, self.mu_o)
        return slo.value(rate, w.attainment()) if self.targets.set else rate

    def _retarget(self) -> None:
        """The latency targets changed (``tune set``): what was measured was judged by another objective. The
        trial and the window are dropped, the incumbent's and stock's windows and the gain forgotten, and the
        search starts again from the incumbent."""
        old, self.targets = self.targets, self.p.targets
        self.reset(f"latency targets: {old.describe()} → {self.targets.describe()}")
        if not self.targets.set and self.incumbent.startswith(PDI):  # pdi arms serve targets only
            self._to_stock()
            self._run(STOCK)
        self.refs.ref_lns, self.refs.ref_att, self.attained, self.ledger.gain_inc = [], [], {}, []
        self.ledger.gain_ln, self.ledger.gain_var = (0.0, 0.0) if self.incumbent == STOCK else (math.nan, math.nan)

    def _stop_bar(self) -> float:
        """The early-stop bar for the window closing now (``Refs.stop_bar``): wider for the first settling window
        after a switch, which carries what the switch left behind; the usual one from the second on (stock and mb
        settle for two whole windows: a slower arm would otherwise run both before any bar stops it)."""
        return self.refs.stop_bar(bool(self.settling and self.settling == settle(self.arm)))

    def budget_left(self) -> float:
        """Engine seconds the search may still give up: ``explore_budget`` of the time since the first report,
        less what exploring has cost. A trial starts only while this is positive, so the share given up
        stays within the budget plus one trial."""
        return self.ledger.budget_left(self.p.explore_budget, self._last_wall - self.first_wall)

    def trial_cost(self) -> float:
        """Engine seconds a trial is expected to give up: the mean of the trials so far (the bound's sum over the
        trials started), never less than one window's seconds: a trial that won gave up nothing, which says nothing
        of what a losing one costs. With latency targets a trial starts from an incumbent that met them for at
        least ``MISSING`` of its tokens (the mean over its last steady windows: a single window can dip) only once
        the budget left covers it: a challenger that misses them leaves a queue behind that the incumbent drains
        for windows after the trial. An incumbent that misses them for most tokens is challenged at once:
        each of its windows costs more than a trial."""
        return self.ledger.trial_cost(self.counts["trials"], self.p.window_s)

    def _start_trial(self, last: Window) -> None:
        """The next challenger of the incumbent; ``last``, the window just measured, is the trial's A0 when it
        is the incumbent's."""
        if self.budget_left() <= 0:  # the exploration budget is spent: stay until it has accrued again
            return
        if self.targets.set and self.refs.ref_att and np.mean(self.refs.ref_att) >= MISSING \
                and self.budget_left() < self.trial_cost():
            return
        if len(self.refs.ref_lns) < self._refs_needed():  # the incumbent's noise is not known yet
            return
        # an EB arm whose k (at the engine's N) is a lost arm's runs the same batches: at N = 16, θ = 0.14 and
        # 0.17 are both k = 2, and the closed forms move between trials
        lost_k = {self.k(a) for a in self.tried if a.startswith("eb@")} if self.n else set()
        options = [a for a in self.neighbours() if a not in self.tried and a != self.incumbent
                   and not (a.startswith("eb@") and self.k(a) in lost_k)]
        if self.settled:  # a re-check: the neighbours and stock in turn
            every = list(dict.fromkeys(a for a in [*self.neighbours(), STOCK] if a != self.incumbent))
            options = [every[self.rechecks % len(every)]] if every else []
            self.rechecks += 1
        if self.unverified and STOCK not in self.tried:  # the model's start-up pick is measured against stock first
            options = [STOCK, *(a for a in options if a != STOCK)]
        lead = self._lead(options[0]) if options else math.nan
        if options and options[0] == self.model_pick() and prior.at_once(lead, self.record, self.p.min_effect):
            self._log_move(options[0], f"the model's pick: predicted {math.expm1(lead):+.1%}, beyond its record "
                                       f"(±{self.record.sd():.1%} over {self.record.n} trials)", lead)
            self.ledger.carry(self.incumbent, options[0], "win", lead, self.record.sd() ** 2)
            self._promote(self.incumbent, options[0])
            self._run(self.incumbent)
            return
        if not options:
            if self.step > 1 and self.incumbent.startswith("eb@"):
                self.step = max(self.step // 2, 1)
                self.tried.clear()
                self._start_trial(last)
                return
            self._rest()
            return
        self.trial_id += 1
        self.counts["trials"] += 1
        t = self.trial = Trial(self.incumbent, options[0], last.end, predicted=lead)
        if last.arm == self.incumbent == self.arm and self._counts(last):
            t.rates.append((last.arm, self._value(last)))
            if self.targets.set:
                t.attained.append((last.arm, last.attainment()))
        self._run(t.arm())

    def _refs_needed(self) -> int:
        """Steady windows of the incumbent before a trial: MIN_REF, whose sd sets the bars; one, with latency targets,
        where the incumbent's last one met them for less than ``MISSING`` of its output tokens. Then a challenger
        that meets them replaces it by a margin no window-to-window noise reaches, and one that misses them as
        often is worth about as little, whichever of the two the bars keep: each further window of such an
        incumbent costs most of its goodput."""
        if self.targets.set and self.attained.get(self.incumbent, 1.0) < MISSING:
            return 1
        return MIN_REF

    def _rest(self) -> None:
        """Nothing left to try: stay, and re-check after ``recheck_gap`` completions (then a longer gap)."""
        if not self.settled:
            self.settled, self.gap, self.rechecks = True, self.recheck_gap, 0
        else:
            self.recheck_gap = min(self.recheck_gap * RECHECK_GROWTH, self.p.recheck * RECHECK_MAX)
            self.gap = self.recheck_gap
        self.tried.clear()

    def _end_trial(self, decision: str, why: str, *, verdict_: Verdict | None = None, record: bool = True,
                   measured: tuple[float, float] | None = None) -> None:
        """End the trial in progress. ``measured``: the challenger's ln ratio to the incumbent and its variance,
        which carry the incumbent's gain against stock (``gain``)."""
        t = self.trial
        self.trial = None
        if t is None:
            self._run(self.incumbent)
            return
        if measured is not None and decision in ("win", "lose"):
            self.ledger.carry(t.incumbent, t.challenger, decision, *measured)
            self.record = self.record.add(t.predicted, measured[0])
        self.unverified = False
        self.counts["won" if decision == "win" else "lost" if decision == "lose" else "aborted"] += 1
        if record:
            d = t.diffs()
            effect = measured[0] if measured is not None else math.nan
            self.history = [*self.history[-(HISTORY - 1):], {
                "incumbent": t.incumbent, "challenger": t.challenger, "theta_incumbent": self.theta(t.incumbent),
                "theta_challenger": self.theta(t.challenger), "started": t.started, "pairs": len(d),
                "rates": [round(r, 3) for _, r in t.rates], "effect": math.expm1(effect),
                "half_width": verdict_.half_width if verdict_ else math.nan, "decision": decision, "why": why,
                "attainment": _attained(t), "predicted": math.expm1(t.predicted)}]
        if decision == "win":
            self._promote(t.incumbent, t.challenger)
        elif decision == "lose":
            self.tried.add(t.challenger)
            if self.settled:
                self._rest()
        self._run(self.incumbent)

    def _promote(self, old: str, new: str) -> None:
        """``new`` replaces the incumbent ``old``: the direction of the move, nothing of the old one's windows."""
        if old.startswith("eb@") and new.startswith("eb@"):
            self.direction = 1 if int(new[3:]) < int(old[3:]) else -1
        elif old.startswith(PDI) and new.startswith(PDI):  # +1: a longer interval
            self.direction = 1 if self.pd_interval(new) > self.pd_interval(old) else -1
        else:
            self.direction = -1 if new == STOCK else 0
        self.incumbent = new
        self.refs.ref_lns, self.refs.ref_att = [], []  # the old one's windows say nothing of the new one's spread
        self.ledger.gain_inc = []
        self.tried = {old}
        self.settled = False
        self.recheck_gap = self.p.recheck

    def gain(self) -> dict[str, float]:
        """What the incumbent buys against stock by the tuner's measurements, and the share of the time given up to
        exploring so far (``Ledger.gain``)."""
        return self.ledger.gain(self.incumbent == STOCK, self._last_wall - self.first_wall, self.budget_left())

    def reset(self, reason: str) -> None:
        """The workload moved: drop the trial and the window, search again from the incumbent."""
        self.counts["resets"] += 1
        self.reset_reason = reason
        if self.trial is not None:
            self._end_trial("aborted", f"reset: {reason}")
        self.window = None
        self.step, self.tried, self.direction = self.p.step_max, set(), 0
        self.settled, self.gap, self.recheck_gap = False, 0, self.p.recheck
        self.refs.pooled_ss = self.refs.pooled_df = 0.0
        self.refs.stock_lns, self.refs.stock_ttfts, self.refs.stock_tpots = [], [], []  # of the old mix
        self.ledger.gain_inc, self.ledger.gain_stock = [], []

    # --- output ---------------------------------------------------------------------------------------
    def state(self) -> str:
        if self.trial is not None:
            return "trial"
        if not self.steady:
            return "warming up"
        if not self.saturated and not self.targets.set:
            return "waiting for saturation"
        if self.settled:
            return "settled"
        return "searching" if self.budget_left() > 0 else "exploration budget spent"

    def status(self) -> dict[str, Any]:
        """For ``ebctl status`` and the metrics: the search's state, the arm running, the trial in progress,
        every recent trial with its windows' rates, effect, interval and decision, and the counters."""
        t = self.trial
        w = self.window
        return {
            "state": self.state(), "incumbent": self.incumbent, "theta_incumbent": self.theta(self.incumbent),
            "arm": self.arm, "theta_arm": self.theta(self.arm), "step_octaves": self.step / QUARTERS,
            "trial": None if t is None else {"incumbent": t.incumbent, "challenger": t.challenger,
                                             "windows": len(t.rates), "rates": [round(r, 3) for _, r in t.rates],
                                             "attainment": _attained(t)},
            "window": None if w is None else {"arm": w.arm, "completions": w.completions,
                                              "need": self.p.window},
            "saturated": self.saturated, "gap": max(self.gap, 0), "pair_sd": self.refs.prior_sd,
            "reset_reason": self.reset_reason, **self.counts, "history": list(self.history), "gain": self.gain(),
            "stock_mixes": self.stock_mixes, "slo": self.slo_status(), "model": self.model_status(),
        }

    def model_status(self) -> dict[str, Any] | None:
        """The model's ranking and its record here (``ebctl.prior``): the incumbent's predicted gain against stock
        (beside ``gain``'s measured one), the arm it would try next, each arm's predicted gain, and its record over
        the decided trials it predicted; None before any ranking."""
        if not self.predicted:
            return None
        r = self.record
        return {"predicted_vs_stock": math.expm1(self.predicted.get(self.incumbent, math.nan)),
                "pick": self.model_pick(), "arms": {a: math.expm1(g) for a, g in sorted(self.predicted.items())},
                "eligible": sorted(self.eligible), "trials": r.n, "mean_abs_error": r.mean_abs(),
                "error_sd": r.sd(), "unverified": self.unverified}

    def slo_status(self) -> dict[str, Any] | None:
        """With latency targets: the targets, the objective, each arm's attainment in its last measured window and
        the attainment of the window in progress so far (``ebctl.slo``); None without."""
        if not self.targets.set:
            return None
        w = self.window
        return {"ttft_s": self.targets.ttft_s, "tpot_s": self.targets.tpot_s, "objective": "goodput",
                "arms": dict(self.attained), "window": w.attainment() if w is not None else math.nan}


def clearly_missing(attained: float, n: float) -> bool:
    """Is a share ``attained`` of ``n`` requests below ``MISSING`` by ``MISSING_Z`` standard errors of a share,
    √(a(1 − a)/n)? False where either is unknown (NaN) or nothing was judged. ``n``: the window's judged output
    tokens over the mean output length (the tokens of one request are judged together)."""
    if not (n > 0 and attained >= 0.0):
        return False
    return attained + MISSING_Z * math.sqrt(attained * (1.0 - attained) / n) < MISSING


def _attained(t: Trial) -> list[list[Any]]:
    """A trial's windows' attainments, [arm, share] each (empty without latency targets)."""
    return [[arm, round(a, 4)] for arm, a in t.attained]
