"""The measured search's ledger (ebctl/ledger.py): exploring's cost, the budget, the gain against stock, on
hand-worked numbers."""

import math

import pytest

from ebctl.arms import STOCK
from ebctl.ledger import Ledger, carried, mean_var


def test_mean_var_allows_for_the_windows_lag_one_autocorrelation():
    # 1, 2, 3, 4: mean 2.5, s² = 5/3, ρ = (0.75 − 0.25 + 0.75) / 5 = 0.25, var = s²/4 · 1.25/0.75 = 25/36
    m, v = mean_var([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and abs(v - 25 / 36) < 1e-12
    # alternating: ρ < 0 is clipped to 0, plain s²/n = (4/3)/4
    m, v = mean_var([1.0, -1.0, 1.0, -1.0])
    assert m == 0.0 and abs(v - 1 / 3) < 1e-12
    # under four windows ρ is not estimated: (1, 3): s² = 2, var = 1
    assert mean_var([1.0, 3.0]) == (2.0, 1.0)
    assert mean_var([5.0, 5.0, 5.0]) == (5.0, 0.0)


def test_a_window_charges_the_bound_when_slower_and_the_net_figure_either_way():
    """10 s at 0.8 of the reference cost 10·0.2 = 2 s in both sums; 5 s of the incumbent's way back at 1.5× gain
    5·0.5 = 2.5 s in the net figure only; 4 s at 3× gain at most their own 4 s; a window that does not count (NaN)
    adds only to the challengers' running time."""
    led = Ledger()
    led.charge(10.0, math.log(0.8), challenger=True)
    assert led.explore_s == pytest.approx(2.0) and led.explore_net_s == pytest.approx(2.0) and led.explore_run_s == 10
    led.charge(5.0, math.log(1.5), challenger=False)
    assert led.explore_s == pytest.approx(2.0) and led.explore_net_s == pytest.approx(-0.5) and led.explore_run_s == 10
    led.charge(4.0, math.log(3.0), challenger=True)
    assert led.explore_net_s == pytest.approx(-4.5) and led.explore_run_s == 14
    led.charge(3.0, math.nan, challenger=True)
    assert led.explore_s == pytest.approx(2.0) and led.explore_net_s == pytest.approx(-4.5) and led.explore_run_s == 17
    # the budget: 1% of 1000 s less the 2 s spent; nothing before the first report
    assert led.budget_left(0.01, 1000.0) == pytest.approx(8.0) and led.budget_left(0.01, math.nan) == 0.0
    # a trial's expected cost: 2 s over 4 trials, at least one window's seconds
    assert led.trial_cost(4, 0.1) == pytest.approx(0.5) and led.trial_cost(4, 10.0) == 10.0
    assert led.trial_cost(0, 10.0) == 10.0
    g = led.gain(True, 1000.0, 8.0)
    assert g["explore_share"] == pytest.approx(-0.0045) and g["explore_bound_s"] == pytest.approx(2.0)
    assert g["vs_stock"] == 0.0 and g["elapsed_s"] == 1000.0 and g["budget_left_s"] == 8.0
    assert led.gain(True, math.nan, 0.0)["elapsed_s"] == 0.0 and led.gain(True, math.nan, 0.0)["explore_share"] == 0.0


def test_the_gain_carried_along_the_trials():
    """EB(θ_8) beats stock by ln 0.2 (var 0.02); EB(θ_4) beats it by 0.05 (0.01): 0.25, 0.03 chained. Stock losing
    to it by −0.1 (0.004) measures it again: 0.1. A lost challenger other than stock leaves it; stock winning, 0."""
    g = carried((0.0, 0.0), STOCK, "eb@8", "win", 0.2, 0.02)
    assert g == (0.2, 0.02)
    g = carried(g, "eb@8", "eb@4", "win", 0.05, 0.01)
    assert g == pytest.approx((0.25, 0.03))
    assert carried(g, "eb@4", STOCK, "lose", -0.1, 0.004) == (0.1, 0.004)
    assert carried(g, "eb@4", "eb@0", "lose", -0.1, 0.004) == g
    assert carried(g, "eb@4", STOCK, "win", 0.1, 0.004) == (0.0, 0.0)
    led = Ledger()
    led.carry(STOCK, "eb@8", "win", 0.2, 0.02)
    assert (led.gain_ln, led.gain_var) == (0.2, 0.02)


def test_the_gain_from_the_windows_once_each_side_has_three():
    """The incumbent's windows at ln 8.2, 8.3, 8.1 against stock's 8.0, 8.1, 7.9: ln 0.2, variance 0.01/3 + 0.01/3;
    with two of the incumbent's, the carried figure; at stock, the carried one (0)."""
    led = Ledger()
    led.gain_ln, led.gain_var = math.log(1.3), 0.01
    for ln in (8.0, 8.1, 7.9):
        led.add_stock(ln)
    led.add_incumbent(8.2)
    led.add_incumbent(8.3)
    assert led.vs_stock(False) == (math.log(1.3), 0.01)
    led.add_incumbent(8.1)
    ln, var = led.vs_stock(False)
    assert ln == pytest.approx(0.2) and var == pytest.approx(0.02 / 3)
    assert led.vs_stock(True) == (math.log(1.3), 0.01)
    for _ in range(200):
        led.add_incumbent(8.0)
    assert len(led.gain_inc) == 128  # GAIN_WINDOWS
