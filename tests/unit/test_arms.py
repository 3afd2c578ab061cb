"""The arms and their grid (ebctl/arms.py), on hand-worked numbers."""

import math

import pytest

from ebctl.arms import MB, PD_MAX, STOCK, Grid, mode, pd_interval, pdi_steps, settle
from ebctl.protocol import Mode


def test_the_grid_by_hand():
    """θ_i = 0.8·2^(−i/4): θ_4 = 0.4, θ_6 = 0.8/2^1.5 = 0.2828 (the nearest to 0.3: θ_5 = 0.3364 is farther);
    θ_25 = 0.8/2^6.25 = 0.01051 is the last at or above θ_min = 0.01 (θ_26 = 0.00884); with θ_min = 0.05 = 0.8/16,
    θ_min itself is the last, 16."""
    g = Grid(0.8, 0.01)
    assert g.top == 25 and Grid(0.8, 0.05).top == 16
    assert g.theta("eb@0") == 0.8 and g.theta("eb@4") == pytest.approx(0.4)
    assert g.theta("eb@6") == pytest.approx(0.28284, rel=1e-4) and g.theta("eb@25") == pytest.approx(0.010511, rel=1e-4)
    assert math.isnan(g.theta(STOCK)) and math.isnan(g.theta(MB)) and math.isnan(g.theta("pdi@8"))
    assert g.eb_arm(0.4) == "eb@4" and g.eb_arm(0.3) == "eb@6" and g.eb_arm(0.0001) == "eb@25"
    assert g.eb_arm(5.0) == "eb@0" and g.eb_arm(math.nan) == "eb@25" and g.eb_arm(0.0) == "eb@25"


def test_k_and_the_lowest_arm_at_the_engines_n():
    """At N = 16: θ_8 = 0.2 is k = ⌊3.2⌋ = 3, θ_10 = 0.1414 is ⌊2.26⌋ = 2, θ_11 = 0.1189 is ⌊1.90⌋ = 1: the lowest
    arm with k ≥ 2 is eb@10. N unknown (0): every arm is k = 1, and none is lowest."""
    g = Grid(0.8, 0.01, 16)
    assert (g.k("eb@8"), g.k("eb@10"), g.k("eb@11")) == (3, 2, 1)
    assert g.k(STOCK) == 1 and g.k(MB) == 1
    assert g.lowest() == "eb@10"
    assert Grid(0.8, 0.01).k("eb@0") == 1 and Grid(0.8, 0.01).lowest() == ""
    assert Grid(0.8, 0.01, 1).lowest() == ""  # θ_max·1 = 0.8: k = 1 everywhere


def test_entries_and_the_ladder():
    """Closed forms 0.05 and 0.2 at N = 16: 0.05 (eb@16, k = 0) enters at eb@10, 0.2 at eb@8; the smallest θ first.
    0.5 is above theta_entry 0.2: it enters at eb@8. The ladder climbs an octave at a time from the largest entry."""
    g = Grid(0.8, 0.01, 16)
    assert g.entries([0.05, 0.2], 0.2) == ["eb@10", "eb@8"]
    assert g.entries([0.5, 0.2], 0.2) == ["eb@8"]
    assert Grid(0.8, 0.01).entries([0.05], 0.2) == ["eb@16"]  # N unknown: no k to check
    assert g.ladder(["eb@10", "eb@8"]) == ["eb@4", "eb@0"]
    assert g.ladder([]) == ["eb@6", "eb@2"]  # from the lowest, eb@10
    assert Grid(0.8, 0.01).ladder([]) == []


def test_eb_steps():
    """From eb@10 at N = 16 (k = 2) an octave: up θ_6 = 0.283, k = 4; down θ_14 = 0.0707, k = 1: stock. At N = 0
    from eb@24 down would be eb@28, beyond the grid's 25: stock; up eb@20. Down first after a move down. A quarter
    octave from θ_6 (k = 4): θ_5 k = 5 and θ_7 k = 3."""
    g = Grid(0.8, 0.01, 16)
    assert g.eb_steps("eb@10", 4, 0) == ["eb@6", STOCK] and g.eb_steps("eb@10", 4, -1) == [STOCK, "eb@6"]
    assert g.eb_steps("eb@6", 1, 0) == ["eb@5", "eb@7"]
    assert Grid(0.8, 0.01).eb_steps("eb@24", 4, -1) == [STOCK, "eb@20"]
    assert Grid(0.8, 0.01).eb_steps("eb@0", 4, 1) == ["eb@4"]  # nothing above θ_max
    # at N = 8: below θ_5 (k = 2) θ_6 is k = 2 too, skipped; θ_7 = 0.238 is k = 1: stock
    assert Grid(0.8, 0.01, 8).eb_steps("eb@5", 1, 0) == ["eb@4", STOCK]


def test_pdi_steps_mode_interval_and_settling():
    assert pdi_steps("pdi@8", 0, False) == ["pdi@4", "pdi@16"]  # shorter first unless TPOT binds
    assert pdi_steps("pdi@8", 0, True) == ["pdi@16", "pdi@4"]
    assert pdi_steps(f"pdi@{PD_MAX}", 1, False) == [f"pdi@{PD_MAX // 2}"]  # no longer one
    assert pdi_steps("pdi@1", -1, True) == [STOCK, "pdi@2"]  # the last win went shorter: below 1 is stock
    assert pd_interval("pdi@16") == 16 and pd_interval("eb@3") == 0 and pd_interval(STOCK) == 0
    assert mode(STOCK) is Mode.OFF and mode(MB) is Mode.MB and mode("eb@3") is Mode.EB and mode("pdi@8") is Mode.OFF
    assert (settle(STOCK), settle(MB), settle("pdi@8"), settle("eb@3")) == (2, 2, 2, 1)
