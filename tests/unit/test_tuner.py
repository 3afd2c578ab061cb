"""The measured threshold's pieces (ebctl/trial.py, ebctl/tuner.py), on hand-worked numbers and on a synthetic
engine whose arms run at speeds the test sets: the tuner must find the fastest, drop the window after a switch,
wait for saturation, and restart on drift."""

import math

import numpy as np
import pytest
from scipy import stats

from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode
from ebctl.trial import Applied, Trial, Window, verdict
from ebctl.tuner import MB, STOCK, Tuner, TunerParams


def test_verdict_on_hand_worked_pairs():
    d = np.array([0.03, 0.05])
    # sd shrunk to the prior: ((ss + 2·0.015²) / (n − 1 + 2))^½, Student t at n − 1 + 2 = 3 degrees of freedom
    sd = math.sqrt((2 * 0.01**2 + 2 * 0.015**2) / 3)
    half = stats.t.ppf(0.975, 3) * sd / math.sqrt(2)
    v = verdict(d, prior_sd=0.015, min_pairs=2, max_pairs=5, min_effect=0.01)
    assert v.decision == "win" and v.effect == pytest.approx(0.04) and v.half_width == pytest.approx(half)
    assert half == pytest.approx(0.03312, abs=1e-5)
    # the same pairs before min_pairs: no decision yet
    assert verdict(d, prior_sd=0.015, min_pairs=3, max_pairs=5, min_effect=0.01).decision == ""
    # a gain below the minimum effect, however sure, does not win; at max_pairs it loses
    small = np.full(5, 0.005)
    assert verdict(small[:3], prior_sd=0.001, min_pairs=2, max_pairs=5, min_effect=0.01).decision == "lose"
    # a negative mean loses at once; an uncertain positive one goes on while max_pairs pairs at its mean could win
    assert verdict(np.array([-0.01, 0.002]), prior_sd=0.015, min_pairs=2, max_pairs=5,
                   min_effect=0.01).decision == "lose"
    unsure = np.array([0.08, 0.0])
    assert verdict(unsure, prior_sd=0.015, min_pairs=2, max_pairs=5, min_effect=0.01).decision == ""
    # futile: the same sd ((2·0.04² + 2·0.015²) / 3)^½ = 0.0349 at a mean of 0.02; five pairs at that mean would
    # have t(6 df)·0.0349/√5 = 0.0382 ≥ 0.02, so the remaining three could not make it win (at 0.04 they could)
    sd = math.sqrt((2 * 0.04**2 + 2 * 0.015**2) / 3)
    assert stats.t.ppf(0.975, 6) * sd / math.sqrt(5) == pytest.approx(0.0382, abs=1e-4)
    futile = verdict(np.array([0.06, -0.02]), prior_sd=0.015, min_pairs=2, max_pairs=5, min_effect=0.01)
    assert futile.decision == "lose" and futile.why.startswith("futile: +2.0% after 2 pair(s)")
    assert verdict(np.array([0.06, -0.02, 0.06, -0.02, 0.06]), prior_sd=0.015, min_pairs=2, max_pairs=5,
                   min_effect=0.01).decision == "lose"


def _rep(kind, dt_end, *, prefill=0, decode=0, finished=0, running=100, waiting=50, version=1, ttft=math.nan,
         tpot=math.nan):
    return IterationReport(engine_id="e", seq=0, wall_time=dt_end, forward_s=0.0, kind=kind, prefill_tokens=prefill,
                           prefill_reqs=1 if prefill else 0, decode_reqs=decode, running=running, waiting=waiting,
                           policy_version=version,
                           finished=tuple(FinishedRequest(10, 5, "stop", ttft, tpot) for _ in range(finished)))


def test_window_rate_weighs_the_phases_by_the_request_mix():
    w = Window("stock", start=0.0)
    w.add(_rep(BatchKind.PREFILL, 1.0, prefill=1000), 1.0)
    w.add(_rep(BatchKind.DECODE, 3.0, decode=500), 2.0)
    w.end = 3.0
    # τ_p = 1 s / 1000 tokens, τ_d = 2 s / 500 tokens; a request of 100 + 51 tokens costs 100 τ_p + 50 τ_d = 0.3 s
    assert w.rate(100, 51) == pytest.approx(151 / 0.3)
    # the same window with a prefill-heavy mix: 400 + 11 tokens cost 0.4 + 0.04 s
    assert w.rate(400, 11) == pytest.approx(411 / 0.44)
    # idle time is lost time for both phases; a mixed iteration charges its 100 decode rows what a row cost in the
    # decode-only step (2 s / 500 = 4 ms: 0.4 s) and its 300 prefill tokens the other 0.6 s
    w.add(_rep(BatchKind.IDLE, 4.0), 1.0)
    w.add(_rep(BatchKind.MIXED, 5.0, prefill=300, decode=100), 1.0)
    w.end = 5.0
    tp, td = 1.6 / 1300, 2.4 / 600
    assert w.split() == pytest.approx((1.6, 2.4))
    assert w.rate(100, 51) == pytest.approx(151 / (100 * tp + 50 * td) * 4 / 5)
    # a mixed step shorter than its rows' decode cost: all of it on the rows
    w.add(_rep(BatchKind.MIXED, 5.2, prefill=50, decode=100), 0.2)
    assert w.split() == pytest.approx((1.6, 2.6))
    # no decode-only step to price a row: split by numbers
    m = Window("mb", start=0.0)
    m.add(_rep(BatchKind.MIXED, 1.0, prefill=300, decode=100), 1.0)
    assert m.split() == pytest.approx((0.75, 0.25))
    # without μ: tokens (first tokens included) over the time
    w.add(_rep(BatchKind.DECODE, 5.5, decode=10, finished=2), 0.5)
    w.end = 5.5
    assert w.rate(math.nan, math.nan) == pytest.approx((1350 + 710 + 2) / 5.7)


def test_trial_pairs_cancel_a_linear_drift():
    t = Trial("stock", "mb", 0.0, rates=[("stock", 100.0), ("mb", 105.0), ("stock", 110.0)])
    assert t.diffs() == pytest.approx([math.log(105) - (math.log(100) + math.log(110)) / 2])
    assert t.arm() == "mb" and Trial("a", "b", 0.0).arm() == "a"


# --- a synthetic engine: each arm runs the same cycle, at a speed the test sets ----------------------------
K, N = 10, 100  # every EB arm: k and N of the published policy


class Engine:
    """Publishes what the tuner asks for and runs cycles of one prefill (K prompts of 100 tokens) and K decode
    steps of about N rows (one request finishing per step), each step's time divided by the arm's speed."""

    def __init__(self, tuner: Tuner, speed, *, waiting=50, first_window_boost=1.0, stock_boost=1.0, ttft=None,
                 tpot=None):
        self.t, self.speed, self.waiting = tuner, speed, waiting
        self.ttft, self.tpot = ttft, tpot  # ttft(arm), tpot(arm): the TTFT, the TPOT of each of its requests
        self.now, self.version, self.arm, self.boost = 0.0, 0, None, first_window_boost
        self.stock_boost = stock_boost  # stock's speed-up over its first 100 completions after a switch
        self.since_switch = 0

    def publish(self):
        arm = self.t.arm
        if arm != self.arm:
            self.version += 1
            self.arm, self.since_switch = arm, 0
            self.t.bind(self.version, Applied(arm, self.t.mode(arm), K if arm.startswith("eb@") else 1, N))

    def cycle(self):
        self.publish()
        s = self.speed(self.arm) * (self.boost if self.since_switch < 50 and self.arm != STOCK else 1.0)
        s *= self.stock_boost if self.since_switch < 100 and self.arm == STOCK and self.version > 1 else 1.0
        steps = [(BatchKind.PREFILL, dict(prefill=100 * K))] + [
            (BatchKind.DECODE, dict(decode=N - i, finished=1)) for i in range(K)]
        for kind, kw in steps:
            self.now += (0.5 if kind is BatchKind.PREFILL else 0.1) / s
            if self.ttft is not None and kw.get("finished"):
                kw["ttft"] = self.ttft(self.arm)
            if self.tpot is not None and kw.get("finished"):
                kw["tpot"] = self.tpot(self.arm)
            self.t.observe(_rep(kind, self.now, running=N - kw.get("finished", 0), waiting=self.waiting,
                                version=self.version, **kw))
        self.since_switch += K

    def run(self, cycles):
        for _ in range(cycles):
            self.cycle()


def _tuner(**kw) -> Tuner:
    t = Tuner(TunerParams(window=50, **kw))
    t.set_context(entries=[0.4, 0.02], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    return t


def test_the_tuner_climbs_to_the_fastest_arm_and_settles():
    """The closed forms say θ 0.4 and 0.02: the search enters EB at θ_entry = 0.2 (the smaller k first), and
    climbs an octave to θ 0.4, the fastest."""
    t = _tuner()
    fastest = t.eb_arm(0.4)

    def speed(arm):  # EB faster than stock, mb slower; among θ, 0.4 is best and θ 0.2 next to it
        if arm == STOCK:
            return 1.0
        if arm == MB:
            return 0.97
        return 1.12 - 0.1 * abs(math.log2(t.theta(arm) / 0.4))

    assert t.entries == [t.eb_arm(0.02), t.eb_arm(0.2)]
    eng = Engine(t, speed)
    eng.run(4000)
    assert t.incumbent == fastest, t.history
    assert t.counts["won"] >= 2 and t.history[0]["challenger"] == MB and t.history[0]["decision"] == "lose"
    assert any(h["challenger"] == t.eb_arm(0.2) and h["decision"] == "win" for h in t.history)
    # the gain against stock, θ 0.4's windows since it won against stock's: the engine's speed ratio, 1.12
    g = t.gain()
    assert g["vs_stock"] == pytest.approx(0.12, abs=0.002) and g["low"] <= 0.12 + 1e-9 and g["high"] >= 0.12 - 1e-9


def test_stock_stays_when_nothing_beats_it_and_the_first_window_after_a_switch_is_dropped():
    t = _tuner()
    # every challenger runs 5% slower, except its first 50 completions after a switch, 40% faster: counted,
    # those would make it win
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.95, first_window_boost=1.4 / 0.95)
    eng.run(3000)
    assert t.incumbent == STOCK and t.counts["won"] == 0 and t.counts["lost"] >= 3
    assert all(h["effect"] < 0 for h in t.history if h["decision"] == "lose")


def test_stock_drops_two_windows_after_a_switch():
    """The engine's own admission carries state across a switch (sglang's new_token_ratio, decayed under EB):
    here stock runs 6% faster over its first two windows after one, then at its speed, 3% below every EB arm.
    Dropping one window would leave a +6% stock window in each pair, and EB (+3%) would lose; two are dropped."""
    t = Tuner(TunerParams(window=50))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11)
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 1.03, stock_boost=1.06)
    eng.run(1500)
    assert t.incumbent.startswith("eb@") and t.history[0]["decision"] == "win", t.history


def test_no_trial_below_saturation_or_while_warming_up():
    t = _tuner()
    Engine(t, lambda arm: 2.0 if arm != STOCK else 1.0, waiting=0).run(500)  # nobody waits
    assert t.counts["trials"] == 0 and t.arm == STOCK and t.state() == "waiting for saturation"
    t = _tuner()
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11, steady=False)
    Engine(t, lambda arm: 2.0 if arm != STOCK else 1.0).run(500)
    assert t.counts["trials"] == 0 and t.state() == "warming up"


def test_reset_drops_the_trial_and_keeps_the_incumbent():
    t = _tuner()
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 1.2)
    while t.trial is None:
        eng.cycle()
    t.reset("drift")
    assert t.trial is None and t.arm == STOCK and t.incumbent == STOCK
    assert t.counts["aborted"] == 1 and t.history[-1]["why"] == "reset: drift" and t.step == t.p.step_max


def test_eb_windows_hold_whole_cycles_and_stock_windows_any_iterations():
    t = Tuner(TunerParams(window=55))
    closed = []
    t._closed = lambda w: closed.append((w.arm, w.completions))  # record, never switch
    eng = Engine(t, lambda arm: 1.0)
    t._run("eb@4")
    eng.run(60)
    t._run(STOCK)
    eng.run(60)
    eb = [c for a, c in closed if a == "eb@4"]
    assert eb and all(c == 60 for c in eb)  # 6 whole cycles of 10: the first count past 55 completions
    assert [c for a, c in closed if a == STOCK][-1] == 55  # any iteration ends a stock window


def test_grid_and_neighbours():
    """The grid θ_i = θ_max·2^(−i/4), by hand for θ_max = 0.8, θ_min = 0.01: θ_4 = 0.4, θ_6 = 0.8/2^1.5 = 0.2828
    (the nearest to 0.3: θ_5 = 0.3364 is farther), θ_24 = 0.8/64 = 0.0125, θ_25 = 0.8/2^6.25 = 0.01051, and θ_26 =
    0.8/2^6.5 = 0.00884 is below θ_min: the last grid point is 25. With θ_min = 0.05 = 0.8/16, θ_min itself is the
    last point, 16. A step of 4 is an octave: from θ 0.4 up to 0.8 and down to 0.2; from θ 0.0125 down would be
    0.00625, below θ_min, so stock, and up 0.025 (θ_20)."""
    t = Tuner(TunerParams(theta_min=0.01, theta_max=0.8))
    assert t.theta("eb@0") == 0.8 and t.theta("eb@4") == pytest.approx(0.4)
    assert t.theta("eb@6") == pytest.approx(0.28284, rel=1e-4) and t.theta("eb@25") == pytest.approx(0.010511, rel=1e-4)
    assert t.top == 25
    assert t.eb_arm(0.4) == "eb@4" and t.eb_arm(0.3) == "eb@6" and t.eb_arm(0.0001) == "eb@25"
    assert t.eb_arm(5.0) == "eb@0"
    grid = [t.theta(f"eb@{i}") for i in range(t.top + 1)]  # every grid point within [θ_min, θ_max], a quarter
    assert all(0.01 <= th <= 0.8 for th in grid)  # octave apart
    assert all(grid[i] / grid[i + 1] == pytest.approx(2**0.25) for i in range(t.top))
    assert Tuner(TunerParams(theta_min=0.05, theta_max=0.8)).top == 16
    t.incumbent = "eb@4"
    assert t.neighbours() == ["eb@0", "eb@8"]
    t.incumbent, t.direction = "eb@24", -1
    assert t.neighbours() == [STOCK, "eb@20"]  # below θ_min lies stock
    assert t.mode(STOCK) is Mode.OFF and t.mode(MB) is Mode.MB and t.mode("eb@3") is Mode.EB


def test_a_clearly_slower_challenger_ends_its_trial_after_one_window_and_its_cost_is_counted():
    """mb runs at 0.8 of stock's speed: its first window (the settling one) ends the trial, and what it cost is
    that window's time × (1 − 0.8)."""
    t = _tuner()
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.8)
    while t.counts["trials"] == 0 or t.trial is not None:
        eng.cycle()
    h = t.history[-1]
    assert h["challenger"] == MB and h["decision"] == "lose" and h["why"].startswith("clearly slower")
    assert h["effect"] == pytest.approx(-0.2)
    # one window of mb: 5 cycles of 10 completions (the first count ≥ 50), each (0.5 + 10 × 0.1) / 0.8 s
    assert t.ledger.explore_run_s == pytest.approx(5 * 1.5 / 0.8)
    assert t.ledger.explore_s == pytest.approx(t.ledger.explore_run_s * 0.2)
    assert t.arm == STOCK and t.gain()["vs_stock"] == 0.0


def test_trials_start_only_within_the_exploration_budget():
    """Every challenger runs 20% slower. With no budget nothing is tried; with 1% the time given up stays
    within 1% of the run plus one trial, and the next trial waits until the budget has accrued again."""
    t = Tuner(TunerParams(window=50, explore_budget=0.0))
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    Engine(t, lambda arm: 1.0 if arm == STOCK else 0.8).run(1000)
    assert t.counts["trials"] == 0 and t.state() == "exploration budget spent" and t.arm == STOCK
    t = Tuner(TunerParams(window=50, explore_budget=0.01, recheck=100))
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.8)
    starts = []
    while eng.now < 3000:
        n = t.counts["trials"]
        cost_before = t.ledger.explore_s
        eng.cycle()
        if t.counts["trials"] > n:
            starts.append((eng.now, cost_before))
    one_trial = 5 * 1.5 / 0.8 * 0.2  # a window of a 20%-slower arm (test above)
    assert len(starts) >= 3 and t.incumbent == STOCK
    assert all(cost <= 0.01 * now for now, cost in starts)  # each trial began with budget left
    assert t.ledger.explore_s <= 0.01 * eng.now + one_trial + 1e-9
    assert starts[2][0] >= 2 * one_trial / 0.01  # the third waited for two trials' cost to accrue


def test_eb_arms_need_k_of_two_at_the_engines_n():
    """At N = 16, θ = 0.05 is k = 0 and enters at the smallest grid θ with k ≥ 2: 0.8·2^(−10/4) = 0.141, k = 2.
    Its neighbours an octave away: θ 0.283 (k = 4) above, and below θ 0.071 (k = 1), which is stock."""
    t = Tuner(TunerParams())
    t.set_context(entries=[0.05, 0.2], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11, n=16)
    assert t.entries == ["eb@10", "eb@8"] and t.k("eb@10") == 2 and t.k("eb@8") == 3  # θ 0.2: k = ⌊3.2⌋
    t.incumbent = "eb@10"
    assert t.neighbours() == ["eb@6", STOCK]
    # a quarter-octave step from θ 0.283 (k = 4): 0.336 is k = 5, 0.238 is k = 3; from θ 0.8 (k = 12) up: none
    t.incumbent, t.step = "eb@6", 1
    assert t.neighbours() == ["eb@5", "eb@7"] and (t.k("eb@5"), t.k("eb@7")) == (5, 3)
    # at N = 8 a quarter octave below θ 0.4 (k = 3) is θ 0.336, k = 2; θ 0.283 is k = 2 as well, skipped: 0.238 k = 1
    t.set_context(entries=[], allow_mb=False, prefer_mb=False, n=8)
    t.incumbent = "eb@5"
    assert t.k("eb@5") == 2 and t.neighbours() == ["eb@4", STOCK]


def test_mb_is_not_tried_where_the_engine_mixes_on_its_own():
    t = _tuner()
    assert MB in t.neighbours()
    t.observe(_rep(BatchKind.MIXED, 1.0, prefill=100, decode=10, version=-1))  # no policy: the engine's own mixing
    assert t.stock_mixes and MB not in t.neighbours()


def test_a_clearly_faster_challenger_wins_after_two_measured_windows():
    """EB runs 1.25× stock's speed: its first measured window is clearly faster, the next one confirms it, and it
    wins without a second stock window; the gain against stock is that ratio."""
    t = _tuner()
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11)
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 1.25)
    while t.counts["won"] == 0:
        eng.cycle()
    h = t.history[-1]
    assert h["decision"] == "win" and h["why"].startswith("clearly faster") and "two windows" in h["why"]
    assert len(h["rates"]) == 1  # A0 only
    assert t.incumbent == t.eb_arm(0.2) and t.gain()["vs_stock"] == pytest.approx(0.25)


def test_one_clearly_faster_window_does_not_win_alone():
    """The challenger's first measured window runs 30% fast (a burst of the machine, not the arm), its next one at
    stock's speed: the two windows' mean, +14%, is short of the two-window bar, so no win on them; they are the
    first pair's B (their geometric mean), and stock runs for the pair's A1."""
    t = Tuner(TunerParams(window=50))
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    # sd 0.107: one window decides beyond 0.240, two beyond 3/√2·0.107·√(1/2 + 1/8) = 0.179
    t.refs.ref_lns = [7.9, 8.1] * 4
    t.trial, t.arm, t.settling = Trial(STOCK, MB, 0.0, rates=[(STOCK, math.exp(8.0))]), MB, 0

    def window(arm: str, ln: float):
        return type("W", (), {"arm": arm, "seconds": 10.0, "saturated": True, "completions": 50,
                              "ttfts": [], "tpots": [],
                              "rate": lambda self, mu_l, mu_o: math.exp(ln)})()

    t._closed(window(MB, 8.0 + 0.26))
    assert t.trial is not None and t.arm == MB and t.trial.lead == pytest.approx(8.26)  # runs on
    t._closed(window(MB, 8.0))
    assert t.trial is not None and t.counts["won"] == 0 and t.arm == STOCK
    assert t.trial.rates[1][1] == pytest.approx(math.exp(8.13)) and len(t.trial.rates) == 2
    # the same first window followed by one at +20%: the mean, +23%, confirms it
    t.trial, t.arm, t.settling = Trial(STOCK, MB, 0.0, rates=[(STOCK, math.exp(8.0))]), MB, 0
    t._closed(window(MB, 8.26))
    t._closed(window(MB, 8.2))
    assert t.history[-1]["decision"] == "win" and t.incumbent == MB
    assert t.gain()["vs_stock"] == pytest.approx(math.expm1(0.23))


@pytest.mark.parametrize("what", ["TTFT", "TPOT"])
@pytest.mark.parametrize(("scale", "decision"), [(1.15, "lose"), (1.05, "win")])
def test_a_faster_challenger_whose_latency_p99_exceeds_stocks_by_more_than_the_slack_loses(what, scale, decision):
    """EB runs 1.25× stock's speed; its requests' TTFTs (TPOTs) are ``scale`` s, stock's 1 s, the other latency
    the same for both: with a slack of 10%, 15% longer loses the trial and 5% wins it."""
    t = _tuner()
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11)
    longer = lambda arm: 1.0 if arm == STOCK else scale  # noqa: E731
    same = lambda arm: 1.0  # noqa: E731
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 1.25, ttft=longer if what == "TTFT" else same,
                 tpot=longer if what == "TPOT" else same)
    while t.counts["won"] + t.counts["lost"] == 0:
        eng.cycle()
    h = t.history[-1]
    assert h["challenger"] == t.eb_arm(0.2) and h["decision"] == decision
    if decision == "lose":
        assert h["why"] == f"{what} p99 +15% against stock's (at most +10%)" and t.incumbent == STOCK


def test_the_gain_compares_the_incumbents_windows_since_it_won_with_stocks():
    """The trial carried +30% (ln 0.262); the incumbent's windows since, at ln 8.2, 8.3, 8.1, against stock's last
    at 8.0, 8.1, 7.9: ln 0.2 (+22.1%), variance 0.01/3 + 0.01/3, the interval e^(0.2 ± 1.96·0.0816) − 1. With two
    windows of the incumbent, the carried figure stands."""
    t = Tuner(TunerParams())
    t.incumbent, t.ledger.gain_ln, t.ledger.gain_var = "eb@8", math.log(1.3), 0.01
    t.ledger.gain_stock, t.ledger.gain_inc = [8.0, 8.1, 7.9], [8.2, 8.3]
    assert t.gain()["vs_stock"] == pytest.approx(0.3)
    t.ledger.gain_inc.append(8.1)  # three windows each: ρ is not estimated (``mean_var``)
    g, half = t.gain(), 1.96 * math.sqrt(0.02 / 3)
    assert g["vs_stock"] == pytest.approx(math.expm1(0.2)) and g["low"] == pytest.approx(math.expm1(0.2 - half))
    assert g["high"] == pytest.approx(math.expm1(0.2 + half)) and 0.1 < half < 0.17
    t.incumbent = STOCK
    t.ledger.gain_ln = t.ledger.gain_var = 0.0
    assert t.gain()["vs_stock"] == 0.0


def test_a_window_also_closes_on_time_once_it_holds_a_quarter():
    """window = 400 completions or 10 s once it holds 100: the engine finishes 10 requests every 1.5 s, so 10 s
    hold 70 and the window closes at 100 completions, 15 s; with window = 40 the count comes first (6 s)."""
    t = Tuner(TunerParams(window=400, window_s=10.0))
    closed = []
    t._closed = lambda w: closed.append((w.completions, w.seconds))
    eng = Engine(t, lambda arm: 1.0)
    eng.run(100)
    # stock windows close at any iteration: the first count of >= 100 completions once 10 s have passed
    assert closed[1][0] == 100 and closed[1][1] == pytest.approx(15.0)  # the first began after the first report
    t = Tuner(TunerParams(window=40, window_s=10.0))
    closed = []
    t._closed = lambda w: closed.append((w.completions, w.seconds))
    Engine(t, lambda arm: 1.0).run(100)
    assert closed[1][0] == 40 and closed[1][1] == pytest.approx(6.0)


def test_a_clearly_slower_challenger_is_stopped_inside_its_settling_window():
    """window = 400 completions, window_s = 10 s: mb at 0.8 of stock's speed is looked at once its settling window
    has run 10 s and holds 100 completions (10 cycles of 1.875 s: 18.75 s), not after the whole 400 (75 s)."""
    t = Tuner(TunerParams(window=400, window_s=10.0))
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.8)
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, steady=False)
    eng.run(100)
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    while t.counts["trials"] == 0 or t.trial is not None:
        eng.cycle()
    h = t.history[-1]
    assert h["challenger"] == MB and h["decision"] == "lose" and h["effect"] == pytest.approx(-0.2)
    assert t.ledger.explore_run_s == pytest.approx(10 * 1.5 / 0.8)


def test_the_first_settling_window_ends_a_trial_only_far_below():
    """mb at 0.9 of stock's speed (−10.5% in ln): within what a switch can leave behind, so its first settling
    window does not end the trial; its second, once the first has washed the switch out, does (against the
    usual bar): two windows, each 5 cycles of 1.5 / 0.9 s."""
    t = _tuner()
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.9)
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, steady=False)
    eng.run(10)
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    while t.counts["trials"] == 0 or t.trial is not None:
        eng.cycle()
    h = t.history[-1]
    assert h["challenger"] == MB and h["decision"] == "lose" and h["why"].startswith("clearly slower")
    assert h["effect"] == pytest.approx(-0.1) and t.ledger.explore_run_s == pytest.approx(2 * 5 * 1.5 / 0.9)


def test_noisy_windows_widen_the_bars_and_no_trial_starts_before_the_noise_is_known():
    """The incumbent's windows at ln rates 8.0, 8.1, 7.9 (sd 0.1, mean 8.0): one window's difference from their mean
    has sd 0.1·√(1 + 1/3); it decides only beyond 3/√2 of that, 0.3·√(2/3) = 0.245 (a 3-sd bar against one
    window, whose difference has sd 0.1·√2, has the same false-stop rate), and a pair's sd is at least
    √1.5 × 0.1. Under three steady windows, no trial starts."""
    t = Tuner(TunerParams(window=50))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=11)
    t.refs.ref_lns = [8.0, 8.1]
    t._start_trial(Window("stock", 0.0))
    assert t.trial is None and t.refs.window_sd == 0.0
    t.refs.ref_lns = [8.0, 8.1, 7.9]
    assert t.refs.window_sd == pytest.approx(0.1) and t.refs.early_stop_bar == pytest.approx(0.3 * math.sqrt(2 / 3))
    assert t.refs.ref() == pytest.approx(8.0)
    assert t.refs.prior_sd == pytest.approx(math.sqrt(1.5) * 0.1)


def test_a_challenger_is_judged_against_the_mean_of_the_incumbents_windows_not_its_last():
    """Stock's steady windows alternate at ln rates 7.9 and 8.1 (mean 8.0, the last 8.1; sd √(0.08/7) = 0.107).
    A challenger window at 8.0 for 10 s is as fast as stock: it costs nothing and decides nothing (against the
    last window it would have "cost" 10·(1 − e^−0.1) = 0.95 s of noise). One at 8.0 − 0.25 lies beyond the bar,
    3/√2 · 0.107 · √(1 + 1/8) = 0.240, and ends the trial as clearly slower, by e^−0.25 − 1."""
    t = Tuner(TunerParams(window=50))
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    t.refs.ref_lns = [7.9, 8.1] * 4
    sd = math.sqrt(8 * 0.1**2 / 7)
    assert t.refs.early_stop_bar == pytest.approx(3 / math.sqrt(2) * sd * math.sqrt(9 / 8))
    assert 0.239 < t.refs.early_stop_bar < 0.241
    t.trial, t.arm, t.settling = Trial(STOCK, MB, 0.0), MB, 0

    def window(ln: float):
        return type("W", (), {"arm": MB, "seconds": 10.0, "saturated": True, "completions": 50,
                              "ttfts": [], "tpots": [],
                              "rate": lambda self, mu_l, mu_o: math.exp(ln)})()

    t._closed(window(8.0))
    assert t.ledger.explore_s == pytest.approx(0.0, abs=1e-9) and t.trial is not None and t.counts["lost"] == 0
    t._closed(window(8.0 - 0.25))
    h = t.history[-1]
    assert h["decision"] == "lose" and h["why"].startswith("clearly slower")
    assert h["effect"] == pytest.approx(math.expm1(-0.25))
    assert t.ledger.explore_s == pytest.approx(10 * (1 - math.exp(-0.25)))


def test_the_ledger_shown_is_net_so_that_noise_cancels_and_the_budget_counts_slower_windows():
    """A challenger as fast as stock whose 10-s windows run 0.1 above and below stock's mean (ln) costs
    10·(1 − e^0.1) + 10·(1 − e^−0.1) = 20 − 20·cosh 0.1 = −0.1 s in all, the figure shown; the budget's bound
    counts the slower window only, 10·(1 − e^−0.1) = 0.95 s. A window 0.2 ahead gives back 10·(e^0.2 − 1) =
    2.21 s of the net figure and none of the bound."""
    t = Tuner(TunerParams(window=50))
    t.set_context(entries=[], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11)
    t.refs.ref_lns = [7.9, 8.1] * 4
    t.trial, t.arm, t.settling = Trial(STOCK, MB, 0.0), MB, 0

    def window(ln: float):
        return type("W", (), {"arm": MB, "seconds": 10.0, "saturated": True, "completions": 50,
                              "ttfts": [], "tpots": [],
                              "rate": lambda self, mu_l, mu_o: math.exp(ln)})()

    t._closed(window(8.1))
    t._closed(window(7.9))
    net = t.ledger.explore_net_s
    assert net == pytest.approx(20 - 20 * math.cosh(0.1)) and -0.101 < net < -0.0999
    assert t.ledger.explore_s == pytest.approx(10 * (1 - math.exp(-0.1)))
    net, bound = t.ledger.explore_net_s, t.ledger.explore_s
    t.trial, t.arm = Trial(STOCK, MB, 0.0), MB
    t._closed(window(8.2))
    assert t.ledger.explore_net_s - net == pytest.approx(-10 * math.expm1(0.2)) and t.ledger.explore_s == bound
    g = t.gain()
    assert g["explore_cost_s"] == t.ledger.explore_net_s and g["explore_bound_s"] == t.ledger.explore_s


def test_a_challengers_settling_window_is_looked_at_every_window_s():
    """EB(θ) on trial against stock's three reference windows at 100 tok/s (sd 0: the bar is 3%, 15% in the first
    settling window). Its settling window, 10 s in, runs at 95 (−5%: it goes on); at 15 s at 80 it is not looked
    at (5 s since the last look); at 20 s, still at 80 (−22%), it is, and the trial is lost there."""
    t = Tuner(TunerParams(window=400, window_s=10.0))
    t.refs.ref_lns = [math.log(100.0)] * 3
    t.trial = Trial(STOCK, "eb@3", 0.0)
    t._run("eb@3")
    w = t.window = Window("eb@3", 0.0)
    w.completions, w.saturated_s = 150, 20.0
    rate = {"now": 95.0}
    t._value = lambda _w: rate["now"]
    t._peek(w, 10.0)
    assert t.trial is not None and t.window is w
    rate["now"] = 80.0
    t._peek(w, 15.0)
    assert t.trial is not None
    t._peek(w, 20.0)
    assert t.trial is None and t.history[-1]["decision"] == "lose" and t.arm == STOCK


def _starting(**kw) -> Tuner:
    t = Tuner(TunerParams(window=50, **kw))
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, steady=False)
    return t


def test_the_models_pick_runs_from_the_start_up_and_is_verified_against_stock():
    """Before the first trial the model's best eligible arm becomes the incumbent (mb, predicted faster, is not
    eligible: its latency); the first trial is stock against it. The engine runs it 5% ahead as predicted: stock
    loses, and the record holds that trial, predicted −5% (stock against the pick), measured about the same."""
    t = _starting()
    eb = t.eb_arm(0.4)
    t.set_predictions({STOCK: 0.0, MB: 0.08, eb: 0.05}, {STOCK, eb})
    assert t.incumbent == t.arm == eb and t.unverified
    assert t.history[-1]["decision"] == "model" and t.history[-1]["predicted"] == pytest.approx(math.expm1(0.05))
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, steady=True)
    eng = Engine(t, lambda arm: 1.05 if arm == eb else 1.0)
    while t.counts["trials"] < 1 or t.trial is not None:
        eng.cycle()
    first = t.history[1]
    assert (first["incumbent"], first["challenger"], first["decision"]) == (eb, STOCK, "lose")
    assert t.incumbent == eb and not t.unverified and t.record.n == 1
    assert t.record.predicted[0] == pytest.approx(-0.05)
    assert t.record.measured[0] == pytest.approx(-math.log(1.05), abs=0.01)
    m = t.status()["model"]
    assert m["trials"] == 1 and m["predicted_vs_stock"] == pytest.approx(math.expm1(0.05))


def test_a_wrong_model_is_caught_by_the_verification_trial():
    """The model says EB(0.4) runs 5% ahead; the engine runs it 5% behind. Stock wins the first trial and the
    record's error, measured − predicted, is about +10 points."""
    t = _starting()
    eb = t.eb_arm(0.4)
    t.set_predictions({STOCK: 0.0, eb: 0.05}, {STOCK, eb})
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, steady=True)
    eng = Engine(t, lambda arm: 0.95 if arm == eb else 1.0)
    while t.counts["trials"] < 1 or t.trial is not None:
        eng.cycle()
    assert t.history[1]["decision"] == "win" and t.incumbent == STOCK
    assert t.record.errors()[0] == pytest.approx(-math.log(0.95) + 0.05, abs=0.01)


def test_the_models_pick_comes_first_only_where_it_may_run_and_leads_enough():
    t = _tuner(min_effect=0.005)
    eb = t.eb_arm(0.4)
    # pdi arms may not run here (the engine does not apply pd_interval); a lead under ln(1.005) picks nothing
    t.set_predictions({STOCK: 0.0, "pdi@8": 0.09, eb: 0.004}, {STOCK, "pdi@8", eb})
    assert t.model_pick() == "" and t.incumbent == STOCK  # steady already: no start-up pick
    t.set_predictions({STOCK: 0.0, "pdi@8": 0.09, eb: 0.03, t.eb_arm(0.2): 0.02}, {STOCK, "pdi@8", eb})
    assert t.model_pick() == eb and t.neighbours()[0] == eb and MB in t.neighbours()
    t.set_context(entries=[0.4], allow_mb=True, prefer_mb=False, mu_l=100, mu_o=11, allow_pdi=True)
    assert t.model_pick() == "pdi@8"
