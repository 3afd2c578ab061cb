"""Latency targets as the measured search's objective (ebctl/slo.py, the tuner's goodput): which requests meet the
targets, a window's value on hand-worked numbers, the keys' validation, a tuner that prefers the arm with the higher
goodput where its rate is lower, and that without targets nothing changes."""

import dataclasses
import math

import pytest

from ebctl import config, slo, tuner
from ebctl.config import ConfigError
from ebctl.controller import Controller, ControllerParams
from ebctl.observed import Observed
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode
from ebctl.trial import Applied, Trial, Window
from ebctl.tuner import STOCK, Tuner, TunerParams

NAN = math.nan
PAIR = slo.Targets(2.0, 0.1)  # TTFT ≤ 2 s, TPOT ≤ 100 ms

# (input, output, finish reason, TTFT s, TPOT s) finishing together; against PAIR:
REQUESTS = (
    FinishedRequest(100, 10, "stop", 1.0, 0.05),  # a: within both, 10 tokens
    FinishedRequest(100, 20, "stop", 3.0, 0.05),  # b: TTFT late
    FinishedRequest(100, 30, "stop", 1.0, 0.2),  # c: TPOT slow
    FinishedRequest(100, 1, "stop", 1.0, NAN),  # d: one token, no TPOT: its TTFT alone, within
    FinishedRequest(100, 5, "abort", NAN, NAN),  # e: aborted: judged, missed
    FinishedRequest(100, 8, "stop", NAN, 0.05),  # f: TTFT not measured: not judged where a TTFT target is set
)


def rep(kind, wall, *, prefill=0, decode=0, finished=(), running=100, waiting=50, version=1):
    return IterationReport(engine_id="e", seq=0, wall_time=wall, forward_s=0.0, kind=kind, prefill_tokens=prefill,
                           prefill_reqs=1 if prefill else 0, decode_reqs=decode, running=running, waiting=waiting,
                           policy_version=version, finished=tuple(finished))


def test_which_requests_meet_the_targets():
    assert [slo.judge(f, PAIR) for f in REQUESTS] == [(True, True), (False, True), (True, False), (True, True),
                                                      (False, False), None]
    # TPOT only: f is judged (its TTFT is not asked for), and within
    assert slo.judge(REQUESTS[5], slo.Targets(0.0, 0.1)) == (True, True)
    # TTFT only: c's slow TPOT does not count
    assert slo.judge(REQUESTS[2], slo.Targets(2.0, 0.0)) == (True, True)
    # a TPOT target on a multi-token request whose TPOT was not measured: not judged
    assert slo.judge(FinishedRequest(100, 9, "stop", 1.0, NAN), PAIR) is None
    assert not slo.Targets().set and slo.Targets(0.0, 0.1).set and PAIR.describe() == "TTFT ≤ 2 s and TPOT ≤ 100 ms"


def test_tally_counts_output_tokens_and_places_first_tokens():
    # judged: a 10 + b 20 + c 30 + d 1 + e 5 = 66 tokens; within both: a + d = 11; within TTFT: a, c, d = 41;
    # within TPOT: a, b, d = 31
    assert slo.tally(REQUESTS, PAIR) == slo.Tally(judged=66, good=11, ttft_ok=41, tpot_ok=31)
    # TPOT alone: f joins (8 tokens, within); good = a 10 + b 20 + d 1 + f 8 = 39 of 74
    assert slo.tally(REQUESTS, slo.Targets(0.0, 0.1)).judged == 74
    assert slo.tally(REQUESTS, slo.Targets(0.0, 0.1)).good == 39
    # finished at 3.0 s, only those whose first token came at or after 2.5 s: a's came at 3 − 0.05·9 = 2.55, b's at
    # 3 − 0.05·19 = 2.05 (out), c's at 3 − 0.2·29 < 0 (out); d (one token) and e (no TPOT) are placed at their
    # finish; f at 2.65 but not judged. Judged a 10 + d 1 + e 5 = 16, good 11.
    assert slo.first_token_at(REQUESTS[0], 3.0) == pytest.approx(2.55)
    got = slo.tally(REQUESTS, PAIR, finish=3.0, since=2.5)
    assert (got.judged, got.good) == (16, 11)


def test_a_windows_value_is_its_rate_times_its_attainment():
    """The window of test_tuner's hand-worked rate: τ_p = 1 s / 1000 tokens, τ_d = 2 s / 500 rows; a request of
    100 + 51 tokens costs 100 τ_p + 50 τ_d = 0.3 s: rate 151 / 0.3 = 503.3 tokens/s. Its finished requests (REQUESTS)
    met both targets with 11 of 66 judged output tokens: value 503.3 × 11/66 = 83.9."""
    w = Window("stock", start=0.0)
    w.add(rep(BatchKind.PREFILL, 1.0, prefill=1000), 1.0, PAIR)
    w.add(rep(BatchKind.DECODE, 3.0, decode=500, finished=REQUESTS), 2.0, PAIR)
    w.end = 3.0
    assert (w.judged_tokens, w.good_tokens) == (66, 11) and w.attainment() == pytest.approx(1 / 6)
    assert w.rate(100, 51) == pytest.approx(151 / 0.3)
    t = Tuner(TunerParams(slo_ttft_s=2.0, slo_tpot_s=0.1))
    t.mu_l, t.mu_o = 100, 51
    assert t._value(w) == pytest.approx(151 / 0.3 / 6) == pytest.approx(83.89, abs=0.01)
    # two windows at the same mix: the ratio of values is the ratio of goodputs (output part: rate × 51/151)
    assert slo.value(503.3, 0.5) / slo.value(450.0, 0.8) == pytest.approx((503.3 * 0.5) / (450.0 * 0.8))
    # nothing within the targets: the floor keeps the log finite (1% of the rate); nothing judged: the rate
    assert slo.value(500.0, 0.0) == pytest.approx(5.0) and slo.value(500.0, NAN) == 500.0
    # without targets the window judges nothing and the tuner's value is the rate
    bare = Window("stock", start=0.0)
    bare.add(rep(BatchKind.DECODE, 1.0, decode=500, finished=REQUESTS), 1.0)
    assert bare.judged_tokens == 0 and math.isnan(bare.attainment())
    t0 = Tuner(TunerParams())
    t0.mu_l, t0.mu_o = 100, 51
    assert t0._value(w) == w.rate(100, 51)


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("controller.slo_ttft_s", "-1", "out of range"),
    ("controller.slo_ttft_s", "1e9", "<= 86400"),
    ("controller.slo_tpot_s", "nan", "not finite"),
    ("controller.slo_tpot_s", "fast", "allowed: float >= 0.0"),
    ("controller.slo_tpot_s", "inf", "not finite"),
])
def test_bad_targets_are_refused_naming_the_key(key, value, needle):
    with pytest.raises(ConfigError) as e:
        config.load(None, {key: value})
    assert key in str(e.value) and needle in str(e.value) and repr(value) in str(e.value)


def test_targets_reach_the_tuner_and_change_live():
    cfg = config.load(None, {"controller.slo_ttft_s": "10", "controller.slo_tpot_s": "0.1"})
    assert (cfg.controller.slo_ttft_s, cfg.controller.slo_tpot_s) == (10.0, 0.1)
    tp = cfg.controller.tuner()
    assert (tp.slo_ttft_s, tp.slo_tpot_s) == (10.0, 0.1)
    assert (ControllerParams().slo_ttft_s, ControllerParams().slo_tpot_s) == (0.0, 0.0)  # default: none
    # `tune set` reaches a running controller through set_params: the tuner takes the new targets at its next
    # report (restarting its search), the status at once
    ctl = Controller(ControllerParams())
    assert ctl.status()["slo"]["ttft_s"] == 0.0 and not ctl.tuner.targets.set
    ctl.set_params(dataclasses.replace(ctl.params, slo_ttft_s=10.0))
    ctl.observe(rep(BatchKind.DECODE, 1.0, decode=10))
    assert ctl.tuner.targets == (10.0, 0.0) and ctl.status()["slo"]["ttft_s"] == 10.0
    assert ctl.tuner.counts["resets"] == 1 and ctl.tuner.reset_reason == "latency targets: none → TTFT ≤ 10 s"


def test_status_attainment_over_the_last_minute():
    """Two reports 10 s apart; RecentRate counts the tokens after the first report: REQUESTS (66 judged, 11 within
    both, 41 within TTFT, 31 within TPOT) finish in the second: 11/66, 41/66, 31/66, goodput 11 tokens / 10 s."""
    o = Observed(ControllerParams(slo_ttft_s=2.0, slo_tpot_s=0.1))
    o.add(rep(BatchKind.DECODE, 100.0, decode=10), 0)
    o.add(rep(BatchKind.DECODE, 110.0, decode=10, finished=REQUESTS), 0)
    st = o.slo_status()
    assert st["attainment"] == pytest.approx(11 / 66) and st["ttft_attainment"] == pytest.approx(41 / 66)
    assert st["tpot_attainment"] == pytest.approx(31 / 66) and st["goodput_tok_s"] == pytest.approx(1.1)
    none = Observed(ControllerParams())
    none.add(rep(BatchKind.DECODE, 110.0, decode=10, finished=REQUESTS), 0)
    assert math.isnan(none.slo_status()["attainment"]) and none.slo_status()["ttft_s"] == 0.0


# --- a synthetic engine: stock faster, EB's requests within the TPOT target ----------------------------------
K, N = 10, 100


class Engine:
    """Runs what the tuner asks for in cycles of one prefill and K decode steps (one request finishing in each),
    each step's time divided by the arm's speed; the i-th request's TPOT is ``tpot(arm, i)``, its TTFT ``ttft(arm)``
    (1 s by default)."""

    def __init__(self, tuner: Tuner, speed, tpot, *, ttft=lambda arm: 1.0, waiting=50):
        self.t, self.speed, self.tpot, self.ttft, self.waiting = tuner, speed, tpot, ttft, waiting
        self.now, self.version, self.arm, self.n = 0.0, 0, None, 0

    def cycle(self):
        if self.t.arm != self.arm:
            self.version += 1
            self.arm = self.t.arm
            self.t.bind(self.version, Applied(self.arm, self.t.mode(self.arm), K if self.arm.startswith("eb@") else 1,
                                              N))
        s = self.speed(self.arm)
        self.now += 0.5 / s
        self.t.observe(rep(BatchKind.PREFILL, self.now, prefill=100 * K, waiting=self.waiting, version=self.version))
        for i in range(K):
            self.now += 0.1 / s
            self.n += 1
            done = FinishedRequest(100, 5, "stop", self.ttft(self.arm), self.tpot(self.arm, self.n))
            self.t.observe(rep(BatchKind.DECODE, self.now, decode=N - i, finished=[done], running=N - 1,
                               waiting=self.waiting, version=self.version))

    def run(self, cycles):
        for _ in range(cycles):
            self.cycle()


def _search(**targets) -> Tuner:
    """Stock runs 10% faster than any EB arm; half of stock's requests take 200 ms per token, EB's all 50 ms."""
    t = Tuner(TunerParams(window=50, **targets))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5)
    eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 0.9,
                 lambda arm, i: 0.2 if arm == STOCK and i % 2 else 0.05)
    eng.run(1500)
    return t


def test_the_tuner_prefers_the_higher_goodput_where_its_rate_is_lower():
    """With TPOT ≤ 100 ms, stock's windows are worth 1.0 × ½ (half its tokens within), EB's 0.9 × 1: EB wins by
    about +80% although it serves 10% fewer tokens per second, and stays."""
    t = _search(slo_tpot_s=0.1)
    first = t.history[0]
    assert first["incumbent"] == STOCK and first["challenger"].startswith("eb@") and first["decision"] == "win"
    assert first["effect"] == pytest.approx(0.8, abs=0.05)
    assert t.incumbent.startswith("eb@")
    # status: the targets, each arm's attainment in its last measured window, each trial window's attainment
    st = t.status()["slo"]
    assert st["tpot_s"] == 0.1 and st["objective"] == "goodput"
    assert st["arms"][STOCK] == pytest.approx(0.5, abs=0.05) and st["arms"][t.incumbent] == 1.0
    assert first["attainment"][0][0] == STOCK and first["attainment"][0][1] == pytest.approx(0.5, abs=0.05)
    assert first["attainment"][1] == [first["challenger"], 1.0]


def test_without_targets_the_same_engine_keeps_stock():
    """The same engine judged by throughput (no targets): EB is 10% slower, stock stays; nothing of the
    objective shows in the status."""
    t = _search()
    assert t.incumbent == STOCK and t.counts["won"] == 0 and t.counts["lost"] >= 1
    assert t.status()["slo"] is None and all(h["attainment"] == [] for h in t.history)
    assert all(h["why"].startswith("clearly slower") for h in t.history if h["decision"] == "lose")


def test_targets_replace_the_ttft_guard():
    """EB 25% faster with TTFTs 15% longer than stock's: without targets the guard makes it lose (test_tuner's
    case); with a TTFT target both meet, the guard is off, and it wins."""
    def run(**targets) -> Tuner:
        t = Tuner(TunerParams(window=50, **targets))
        t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5)
        eng = Engine(t, lambda arm: 1.0 if arm == STOCK else 1.25, lambda arm, i: 0.05,
                     ttft=lambda arm: 1.0 if arm == STOCK else 1.15)
        while t.counts["won"] + t.counts["lost"] == 0:
            eng.cycle()
        return t

    assert run().history[-1]["why"].startswith("TTFT p99 +15%")
    assert run(slo_ttft_s=5.0).history[-1]["decision"] == "win"


def test_new_targets_drop_the_trial_and_what_was_measured():
    t = Tuner(TunerParams(window=50))
    t.trial, t.ref_lns, t.stock_lns, t.incumbent = Trial(STOCK, "eb@4", 0.0), [8.0] * 3, [8.0] * 3, "eb@4"
    t.p = dataclasses.replace(t.p, slo_tpot_s=0.1)
    t.observe(rep(BatchKind.DECODE, 1.0, decode=10))
    assert t.trial is None and t.ref_lns == [] and t.stock_lns == [] and t.history[-1]["decision"] == "aborted"
    assert t.reset_reason == "latency targets: none → TPOT ≤ 100 ms" and math.isnan(t.gain()["vs_stock"])


def test_with_targets_stock_climbs_an_octave_ladder_and_skips_eb_that_does_not_bind():
    t = Tuner(TunerParams(window=50, slo_ttft_s=10.0))
    t.set_context(entries=[0.05], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5, n=1024)
    # the closed form's θ 0.05 (0.8·2^(−16/4): eb@16), then an octave up at a time to θ_max (eb@0)
    assert t.neighbours() == ["eb@16", "eb@12", "eb@8", "eb@4", "eb@0"]
    assert Tuner(TunerParams()).neighbours() == []  # without targets: the closed forms only (none given here)
    # an EB window whose engine never held more than N − k requests: the gate never held anyone back
    w = Window("eb@12", 0.0, room=90)
    w.add(rep(BatchKind.DECODE, 1.0, decode=10, running=80, waiting=5), 1.0)
    assert not w.binds and Window("stock", 0.0).binds
    w.end, w.completions = 1.0, 50
    t.trial, t.arm, t.settling = Trial(STOCK, "eb@12", 0.0), "eb@12", 1
    t._closed(w)
    h = t.history[-1]
    assert h["decision"] == "lose" and h["why"].startswith("EB does not bind: at most 85 requests")
    # smaller θ would not bind either: only the ladder above it is left
    assert [a for a in t.neighbours() if a not in t.tried] == ["eb@8", "eb@4", "eb@0"]


def test_with_targets_windows_count_below_saturation_once_they_judged_a_request():
    unsaturated = Window("stock", 0.0)
    unsaturated.add(rep(BatchKind.DECODE, 1.0, decode=10, waiting=0, finished=REQUESTS[:1]), 1.0, PAIR)
    assert Tuner(TunerParams(slo_ttft_s=1.0))._counts(unsaturated)
    assert not Tuner(TunerParams())._counts(unsaturated)
    # a window that judged nothing (no request finished, or none whose first token it may count) does not count
    assert not Tuner(TunerParams(slo_ttft_s=1.0))._counts(Window("stock", 0.0))


def test_a_window_judges_requests_that_began_at_most_a_window_of_completions_before_it():
    """Windows of 50 completions; windows closing on their time hold fewer. A run began at 10 s; windows opened at
    (wall, completions of the run): (10, 0), (20, 30), (30, 60), (40, 90): one opening at 100 completions judges
    from the latest start at least 50 completions back, 20 s (30 ≤ 100 − 50, 60 is not); one opening at 40 from
    the run's start; the starts before the one chosen are dropped."""
    t = Tuner(TunerParams(window=50, slo_ttft_s=1.0))
    t._run_since, t._starts, t._run_done = 10.0, [(10.0, 0), (20.0, 30), (30.0, 60), (40.0, 90)], 100
    assert t._judge_since() == 20.0 and t._starts == [(20.0, 30), (30.0, 60), (40.0, 90)]
    t._run_since, t._starts, t._run_done = 10.0, [(10.0, 0), (20.0, 30)], 40
    assert t._judge_since() == 10.0


def test_the_eb_arm_mode_is_published_unchanged():
    # the objective changes which arm runs, not what an arm is
    assert Tuner(TunerParams(slo_ttft_s=1.0)).mode("eb@3") is Mode.EB


def test_the_simulator_runs_the_default_with_targets():
    from ebctl.sim import policies

    p = policies.make("default:ttft=10,tpot=0.1", max_running=1024, kv_tokens=10**6).controller.params
    assert (p.slo_ttft_s, p.slo_tpot_s) == (10.0, 0.1)
    assert dataclasses.replace(p, slo_ttft_s=0.0, slo_tpot_s=0.0) == ControllerParams()  # otherwise the default
    assert policies.make("eb+:method=measured,tpot=0.05", max_running=1024, kv_tokens=10**6).controller.params \
        .slo_tpot_s == 0.05
    with pytest.raises(ValueError, match=r"ttft=-1 must be in \[0, 86400\]"):
        policies.make("default:ttft=-1", max_running=1024, kv_tokens=10**6)
    with pytest.raises(ValueError, match=r"bad option 'theta=0\.3'"):
        policies.make("default:theta=0.3", max_running=1024, kv_tokens=10**6)


def test_status_shows_the_targets_and_the_attainment_in_one_line():
    from ebctl.cli import view

    st = {"slo": {"ttft_s": 10.0, "tpot_s": 0.1, "attainment": 0.623, "ttft_attainment": 0.7,
                  "tpot_attainment": 0.88, "goodput_tok_s": 1234.5},
          "tuner": {"incumbent": "eb@3", "theta_incumbent": 0.47, "trials": 4}, "output_tok_s": 2000.0,
          "gain": {"vs_stock": 0.2, "low": 0.1, "high": 0.3, "explore_share": 0.01, "elapsed_s": 100.0}}
    assert view.slo_text(st) == "TTFT ≤ 10 s, TPOT ≤ 100 ms: 62% met (TTFT 70%, TPOT 88%) · goodput 1,234 tok/s"
    assert "EB θ 0.47: +20.0% goodput against stock" in view.gain_text(st)
    none = {**st, "slo": {"ttft_s": 0.0, "tpot_s": 0.0, "attainment": NAN}}
    assert view._targets(none) == "" and "+20.0% against stock" in view.gain_text(none)
    assert view._targets({"slo": {"ttft_s": 0.0, "tpot_s": 0.05}}) == "TPOT ≤ 50 ms"


def _pdi_search(tpot, *, allow_pdi=True, **targets) -> Tuner:
    """Stock at speed 1, sglang's prefill-decode interval at 0.95 (N = 8) or 0.9 (N = 16, 4), EB at 0.9; the
    i-th request's TPOT is ``tpot(arm, i)``."""
    t = Tuner(TunerParams(window=50, **targets))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5, allow_pdi=allow_pdi)
    eng = Engine(t, lambda arm: {STOCK: 1.0, "pdi@8": 0.95}.get(arm, 0.9), tpot)
    eng.run(1500)
    return t


def test_with_a_tpot_target_stock_tries_sglangs_prefill_decode_interval_first_and_keeps_the_best_n():
    """TPOT ≤ 100 ms; half of stock's requests take 200 ms per token, none under pdi@8 or pdi@16, half under
    pdi@4, all under EB. Stock missed TPOT, not TTFT, so pdi@8 is tried first: 0.95 × 1 against 1 × ½, a
    goodput ratio of 1.9 (ln 0.64). From pdi@8 the interval doubles (16: 0.9 × 1, 5% less) and halves (4:
    0.9 × ½): both lose, and pdi@8 stays. The policy of pdi@8 is stock's mode with pd_interval 8."""
    t = _pdi_search(lambda arm, i: 0.2 if (arm in (STOCK, "pdi@4") or arm.startswith("eb@")) and i % 2 else 0.05,
                    slo_tpot_s=0.1)
    first = t.history[0]
    assert (first["incumbent"], first["challenger"], first["decision"]) == (STOCK, "pdi@8", "win")
    assert first["effect"] == pytest.approx(0.9, abs=0.08)
    assert t.incumbent == "pdi@8"
    assert {h["challenger"] for h in t.history[1:3]} == {"pdi@16", "pdi@4"}
    assert all(h["decision"] == "lose" for h in t.history[1:])
    assert next(h["effect"] for h in t.history if h["challenger"] == "pdi@16") == pytest.approx(0.9 / 0.95 - 1,
                                                                                                abs=0.005)
    assert t.mode("pdi@8") is Mode.OFF and t.pd_interval("pdi@8") == 8 and t.pd_interval(STOCK) == 0


def test_from_the_interval_that_won_against_stock_the_search_shortens_it_first_where_ttft_binds():
    """TTFT ≤ 1 s, TPOT ≤ 100 ms. Stock meets TTFT and misses TPOT for every request, so pdi@8 comes first and
    wins; under pdi@8 every other request waits 2 s for its first token (TTFT binds): the next trial halves the
    interval (pdi@4 meets both for every request), not doubles it (pdi@16 misses TTFT for all). On simulated H200
    (azure-conv, c = 512, the paper's targets) pdi@16 was tried first there, lost 0% against 0%, and spent the
    exploration budget: pdi@4, at 97%, never ran."""
    n = iter(range(10**9))
    ttft = {"pdi@8": lambda: 2.0 if next(n) % 2 else 0.5, "pdi@16": lambda: 2.0}
    t = Tuner(TunerParams(window=50, slo_ttft_s=1.0, slo_tpot_s=0.1))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5, allow_pdi=True)
    eng = Engine(t, lambda arm: 1.0, lambda arm, i: 0.2 if arm == STOCK else 0.05,
                 ttft=lambda arm: ttft.get(arm, lambda: 0.5)())
    eng.run(1500)
    steps = [(h["incumbent"], h["challenger"], h["decision"]) for h in t.history[:2]]
    assert steps == [(STOCK, "pdi@8", "win"), ("pdi@8", "pdi@4", "win")]
    assert t.incumbent.startswith("pdi@") and t.pd_interval(t.incumbent) <= 4


def test_pdi_arms_need_targets_and_an_engine_that_applies_them_and_come_last_where_ttft_binds():
    t = Tuner(TunerParams(window=50, slo_ttft_s=1.0))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=True)
    assert t.neighbours()[-1] == "pdi@8" and not t.tpot_binds  # nothing measured yet: EB's entries first
    t.tpot_binds = True
    assert t.neighbours()[0] == "pdi@8"
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=False)  # the engine cannot
    assert not any(a.startswith("pdi@") for a in t.neighbours())
    plain = Tuner(TunerParams(window=50))  # no targets: the throughput search of before
    plain.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=True)
    assert not any(a.startswith("pdi@") for a in plain.neighbours())
    # from pdi@N: 2N and N/2; at 1, below it lies stock; 32 is the largest
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=True)
    t.incumbent = "pdi@1"
    assert t.neighbours() == ["pdi@2", STOCK]
    t.incumbent = "pdi@32"
    assert t.neighbours() == ["pdi@16"]
    # from pdi@8: the direction of the last win between intervals; after a win from stock, halved first unless
    # TPOT binds (a longer interval holds prefills back longer)
    t.incumbent, t.direction = "pdi@8", 0
    t.tpot_binds = False
    assert t.neighbours() == ["pdi@4", "pdi@16"]
    t.tpot_binds = True
    assert t.neighbours() == ["pdi@16", "pdi@4"]
    t.direction = -1
    assert t.neighbours() == ["pdi@4", "pdi@16"]
    t.direction, t.tpot_binds = 1, False
    assert t.neighbours() == ["pdi@16", "pdi@4"]
    # an engine that stops applying it (restarted on another sglang): back to stock, nothing of pdi's kept
    t.ref_lns, t.gain_ln, t.gain_var, t.tried = [7.0] * 4, 0.64, 0.01, {"pdi@16"}
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=False)
    assert t.incumbent == STOCK and t.arm == STOCK
    assert t.ref_lns == [] and t.gain()["vs_stock"] == 0.0 and not t.tried
    # targets cleared under a pdi incumbent: stock, the throughput search's start
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=True)
    t.incumbent = t.arm = "pdi@8"
    t.p = dataclasses.replace(t.p, slo_ttft_s=0.0)
    t.observe(rep(BatchKind.DECODE, 1.0, decode=10))
    assert t.incumbent == STOCK and t.arm == STOCK


def test_a_pdi_arms_decode_only_steps_do_not_count_as_where_the_engines_admission_stops():
    """``Tuner.reach`` (the batch stock's admission stops at, which caps EB arms' N) learns from decode steps with
    requests waiting under stock; under a pdi arm those steps are sglang's interval holding prefills back."""
    t = Tuner(TunerParams(window=50, slo_tpot_s=0.1))
    t.bind(1, Applied("pdi@8", Mode.OFF, 1, 100, 8))
    t.bind(2, Applied(STOCK, Mode.OFF, 1, 100))
    t.observe(rep(BatchKind.DECODE, 1.0, decode=40, running=40, waiting=20, version=1))
    assert math.isnan(t.reach)
    t.observe(rep(BatchKind.DECODE, 2.0, decode=90, running=90, waiting=20, version=2))
    assert t.reach == 90


@pytest.mark.parametrize(("targets", "n_obs", "filled", "needed"), [
    # with targets: two turnovers of the batch the engine held, 256 of 1,024 slots, full window or not
    ({"slo_tpot_s": 0.1}, 256.0, 400, 2 * 256),
    ({"slo_tpot_s": 0.1}, 256.0, 100, 2 * 256),
    ({"slo_tpot_s": 0.1}, math.nan, 100, 2 * 1024),  # nothing seen yet: N
    ({}, 256.0, 400, 400 + 2 * 1024),  # without: a full window and two turnovers of the engine's N
    ({}, 256.0, 100, None),  # ... never before the window is full
])
def test_the_search_waits_for_two_turnovers_of_the_batch_the_engine_holds(targets, n_obs, filled, needed):
    """The start-up's end (``Steering.context``): with targets two turnovers of the batch; without, a full length
    window too. The drift reference is taken from a full window only, targets or not."""
    from ebctl.estimate import LengthWindow
    from ebctl.probe import ModeProbe
    from ebctl.steer import Steering, View

    params = ControllerParams(tune_window=400, window=400, **targets)
    steer = Steering(Tuner(params.tuner()), ModeProbe())
    window = LengthWindow(400)
    for _ in range(filled):
        window.append(100, 10)
    view = View(params, None, True, 1024, 10**6, None, False, 1.0, 0, True, n_obs)
    batch = 256 if targets and n_obs == n_obs else 1024
    checks = ((needed - 1, False), (needed, True)) if needed else ((10**6, False),)
    for completions, steady in [*checks, (400 + 2 * batch, needed is not None)]:
        steer.context(view, window, completions, 100.0, 10.0, [0.4], Mode.EB)
        assert steer.tuner.steady is steady, completions
        assert (steer._drift_ref is not None) is (filled == 400 and completions >= 400 + 2 * batch), completions


def test_a_window_far_ahead_counts_at_most_its_own_seconds_as_gained():
    """The net ledger shown in status: a challenger window worth 40× the incumbent's reference (goodput under
    targets) over 10 s gains 10 s, not 390 s."""
    t = Tuner(TunerParams(window=50, slo_tpot_s=0.1))
    t.ref_lns, t.incumbent, t.arm = [math.log(100.0)] * 3, STOCK, "pdi@8"
    w = Window("pdi@8", 0.0)
    w.add(rep(BatchKind.DECODE, 10.0, decode=4000, finished=[FinishedRequest(10, 5, "stop", 0.1, 0.01)] * 50),
          10.0, slo.Targets(0.0, 0.1))
    w.end = 10.0
    t._value = lambda _w: 4000.0  # its worth: 40× the reference
    t._closed(w)
    assert t.explore_net_s == pytest.approx(-10.0) and t.explore_s == 0.0


@pytest.mark.parametrize(("missed", "started", "attained"), [(4, 3.6, 4 / 15), (3, 7.5, 20 / 45), (2, 1005.0, 0.6),
                                                            (0, 1005.0, 1.0)])
def test_an_incumbent_that_misses_the_targets_for_most_tokens_is_challenged_after_one_window(missed, started,
                                                                                              attained):
    """TPOT ≤ 100 ms; request n (the n-th to finish) takes 200 ms per token if n mod 5 < ``missed``, else 50 ms; 5
    tokens each. Windows of 50 completions: 5 cycles of 1.5 s (a prefill of 0.5 s, then 10 decode steps of 0.1 s,
    one request finishing in each: request n at 1.5·⌊(n−1)/10⌋ + 0.6 + 0.1·((n−1) mod 10)). The first window
    opens at the first report (0.5 s) and judges the requests whose first token (finish − 4 × TPOT) came after
    it: of requests 1-10, 4, 8, 9 and 10 with 4 slow in 5 (4 and 9 within), 3, 4, 8, 9 and 10 with 3 in 5 (all but
    10 within); all from 11 on.

    4 slow in 5: after request 21, 15 judged, 4 within (4, 9, 14, 19): 4/15 + 2·√(4/15 · 11/15 / 15) = 0.495 < ½,
    the first time (after request 20: 4/14 + 0.241 = 0.527): stock is clearly missing the target, its window closes
    at the next report's start, 3.6 s, and the trial begins there. 3 in 5: the share tends to 2/5, which needs
    about 100 judged to be clearly below ½: the window runs to its 50 completions, 7.5 s, 20 of 45 within; it is
    challenged after it all the same (under half). 3/5 or all within: stock is challenged once the budget (1% of
    the time since the first report) covers a trial's expected cost, one window's seconds (10 s) before any: at
    the first window's end from 1,000.5 s on, 134 × 7.5 = 1,005 s (``Tuner.trial_cost``)."""
    t = Tuner(TunerParams(window=50, slo_tpot_s=0.1))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5)
    eng = Engine(t, lambda arm: 1.0, lambda arm, i: 0.2 if arm == STOCK and i % 5 < missed else 0.05)
    while t.trial is None:
        eng.cycle()
    assert t.trial.started == pytest.approx(started)
    assert t.attained[STOCK] == pytest.approx(attained)


def test_a_window_missing_the_ttft_target_runs_whole():
    """TTFT ≤ 1 s and TPOT ≤ 100 ms; every request of stock's waits 2 s for its first token, all within the TPOT
    target. Stock meets the targets for none of its tokens and is challenged after one window (the test above),
    but that window runs to its 50 completions (7.5 s), not to the quarter at which one clearly missing TPOT
    closes: a TTFT holds the wait in the queue, which the start-up's end does not say is steady."""
    t = Tuner(TunerParams(window=50, slo_ttft_s=1.0, slo_tpot_s=0.1))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5)
    eng = Engine(t, lambda arm: 1.0, lambda arm, i: 0.05, ttft=lambda arm: 2.0 if arm == STOCK else 0.5)
    while t.trial is None:
        eng.cycle()
    assert t.trial.started == pytest.approx(7.5)
    assert t.attained[STOCK] == 0.0


@pytest.mark.parametrize(("attained", "n", "missing"), [
    (0.0, 1.0, True),  # none within: no spread
    (0.4, 100.0, True),  # 0.4 + 2·√(0.24/100) = 0.498
    (0.4, 96.0, False),  # 0.4 + 2·√(0.24/96) = 0.5: not below
    (0.5, 1e9, False),
    (math.nan, 100.0, False),  # nothing judged
    (0.1, 0.0, False),
])
def test_clearly_missing_is_two_standard_errors_of_a_share_below_half(attained, n, missing):
    assert tuner.clearly_missing(attained, n) is missing


@pytest.mark.parametrize(("att", "explore_s", "trials", "wall", "starts"), [
    ([0.8, 0.8, 0.4], 0.0, 0, 500.0, False),  # met for 2/3 on average (its last window 40%): 5 s left, a trial 10 s
    ([0.8, 0.8, 0.4], 0.0, 0, 1000.5, True),  # 1% of 1,000 s covers one window's 10 s
    ([0.3, 0.4, 0.6], 0.0, 0, 500.0, True),  # met for 43% on average: challenged whatever the budget says
    ([0.8, 0.8, 0.8], 0.0, 1, 500.0, False),  # one trial, won at no cost: the next still needs one window's 10 s
    ([0.8, 0.8, 0.8], 0.0, 1, 1000.5, True),
    ([0.8, 0.8, 0.8], 30.0, 2, 4000.5, False),  # two trials gave up 30 s: 15 s each; 40 − 30 = 10 s left
    ([0.8, 0.8, 0.8], 30.0, 2, 4600.5, True),  # 46 − 30 = 16 s left
])
def test_from_an_incumbent_meeting_the_targets_a_trial_waits_until_the_budget_covers_its_expected_cost(
        att, explore_s, trials, wall, starts):
    """TTFT ≤ 1 s; stock has three steady windows with the attainments ``att``; the first report came at 0.5 s and
    the budget is 1% of the time since. Where stock met the targets for at least half its tokens on average, the
    budget left must cover a trial's expected cost: the mean cost of the trials so far, at least one window (10 s)."""
    t = Tuner(TunerParams(window=50, slo_ttft_s=1.0))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, allow_pdi=True)
    t.ref_lns, t.ref_att = [7.0] * 3, att
    t.first_wall, t._last_wall, t.explore_s, t.counts["trials"] = 0.5, wall, explore_s, trials
    t._start_trial(Window("eb@3", 0.0))
    assert (t.trial is not None) is starts


@pytest.mark.parametrize(("ratio", "early", "effect"), [(1.5, False, 0.5), (5.0, True, 44 / 10 - 1)])
def test_a_trial_begun_on_one_window_wins_early_only_at_twice_the_incumbents_worth(ratio, early, effect):
    """Stock meets TPOT ≤ 100 ms for 1 in 5 of its requests (one reference window: the one-window rule); the
    challenger runs as fast and meets it for 0.2 × ``ratio`` of them. At 1.5× (ln 0.41: above the usual 3% bars,
    below ln 2) it does not win on two windows: the pairs decide once stock has run three windows, and it wins
    there (about +50%). At 5× (all within) it wins on two windows, as a challenger meeting the targets does
    against such an incumbent: against the one reference window, 10 of 44 judged within (the test above), +340%."""
    t = Tuner(TunerParams(window=50, slo_tpot_s=0.1))
    t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, mu_l=100, mu_o=5)
    good = 0.2 * ratio  # the challenger's share within the target: i % 10 < 10·good are
    eng = Engine(t, lambda arm: 1.0,
                 lambda arm, i: 0.05 if (i % 5 == 0 if arm == STOCK else i % 10 < round(10 * good)) else 0.2)
    while not t.history:
        eng.cycle()
    h = t.history[0]
    assert h["incumbent"] == STOCK and h["decision"] == "win"
    assert h["effect"] == pytest.approx(effect, rel=0.15)
    assert h["why"].startswith("clearly faster") is early and (h["pairs"] == 0) is early
    g = t.gain()  # one reference window has no spread: an early win's gain has no interval, not a zero-width one
    assert g["vs_stock"] == pytest.approx(effect, rel=0.15)
    assert math.isnan(g["low"]) and math.isnan(g["high"]) if early else g["low"] < g["vs_stock"] < g["high"]


def test_with_targets_the_start_ups_end_restarts_the_judged_run_and_stays():
    """When the start-up ends with targets the window open then (it judges the first burst's requests) is dropped
    and the next judge only requests whose first token comes after; the start-up ends once, though N_obs grows
    (the batch it waits for: 2 × 8 completions, then 2 × 256)."""
    from ebctl.estimate import LengthWindow
    from ebctl.probe import ModeProbe
    from ebctl.steer import Steering, View

    params = ControllerParams(tune_window=50, window=400, slo_tpot_s=0.1)
    steer = Steering(Tuner(params.tuner()), ModeProbe())
    t = steer.tuner
    eng = Engine(t, lambda arm: 1.0, lambda arm, i: 0.05)
    window = LengthWindow(400)
    for _ in range(20):
        window.append(100, 5)

    def context(n_obs, completions):
        view = View(params, None, True, 1024, 10**6, None, False, 1.0, 0, True, n_obs)
        steer.context(view, window, completions, 100.0, 5.0, [0.4], Mode.EB)

    context(8.0, 15)
    eng.run(2)
    assert not t.steady and t.window is not None and t._run_since == pytest.approx(0.5)
    context(8.0, 16)
    assert t.steady and t.window is None and math.isnan(t._run_since)
    eng.run(1)
    assert t._run_since == pytest.approx(3.0)  # the last report before the start-up ended: requests after it
    context(256.0, 40)
    assert t.steady


def test_with_targets_the_start_ups_windows_leave_the_reference_once_it_is_over():
    """A window judged during the start-up (the first burst's queue: 183 tok/s of goodput against 11,000-16,000
    after, on simulated H200) would widen the bars to let a challenger at 1/80 of stock run on; with targets the
    reference starts again when the controller says the start-up is over. Without targets nothing is dropped."""
    for targets, kept in (({"slo_ttft_s": 0.03}, []), ({}, [5.0, 9.5, 9.6])):
        t = Tuner(TunerParams(window=50, **targets))
        t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, steady=False)
        t.ref_lns = t.stock_lns = [5.0, 9.5, 9.6]
        t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, steady=True)
        assert t.ref_lns == kept and t.stock_lns == kept
        t.ref_lns = [9.5, 9.6, 9.7]
        t.set_context(entries=[0.4], allow_mb=False, prefer_mb=False, steady=True)  # once only
        assert t.ref_lns == [9.5, 9.6, 9.7]


def test_status_names_a_pdi_incumbent_and_its_interval():
    from ebctl.cli import view

    st = {"slo": {"ttft_s": 1.0, "tpot_s": 0.015}, "output_tok_s": 963.0, "mode": "off", "pd_interval": 8,
          "tuner": {"incumbent": "pdi@8", "theta_incumbent": NAN, "trials": 2},
          "gain": {"vs_stock": 2.1, "low": 1.3, "high": 3.3, "explore_share": -0.2, "elapsed_s": 480.0}}
    assert "pd-interval 8: +210.0% goodput against stock [+130.0%, +330.0%]" in view.gain_text(st)
    st["gain"].update(low=None, high=None)  # NaN in the tuner, null in the status JSON
    assert "+210.0% goodput against stock (no interval: won in two windows against one)" in view.gain_text(st)
    st["gain"].update(vs_stock=None)  # after a reset: not measured yet
    assert "pd-interval 8: — goodput against stock [—, —]" in view.gain_text(st)


def test_the_params_targets_are_the_two_slo_keys_and_the_tuner_gets_the_same():
    p = ControllerParams(slo_ttft_s=1.0, slo_tpot_s=0.01)
    assert p.targets == slo.Targets(1.0, 0.01) and p.targets.set
    assert p.tuner().targets == slo.Targets(1.0, 0.01)
    assert ControllerParams(slo_tpot_s=0.02).targets == slo.Targets(0.0, 0.02)  # one alone is set
    assert not ControllerParams().targets.set and not TunerParams().targets.set
    assert "targets" not in {f.name for f in dataclasses.fields(ControllerParams)}  # not a config key
