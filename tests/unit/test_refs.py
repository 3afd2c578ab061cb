"""The measured search's references (ebctl/refs.py): the incumbent's windows, the bars they set, the pooled pair
sd and the latency guard's p99 ratio, on hand-worked numbers."""

import math

import numpy as np
import pytest

from ebctl.refs import EARLY_STOP_SETTLING, REF_WINDOWS, THIN_WIN, Refs, excess


def test_the_latency_guard_compares_p99s_of_pooled_windows():
    """Stock's windows 1.0, 2.0, ..., 100.0 s (p99 by numpy's linear rule: 99.01) and 200 more at 1 s in another
    window (300 pooled: the p99 at index 296.01 of the sorted pool, 97.01); fewer than MIN_TTFTS: no judgement."""
    stock = [[float(i) for i in range(1, 101)]]
    assert excess([99.01 * 1.2] * 100, stock) == pytest.approx(0.2)
    assert math.isnan(excess([500.0] * 99, stock))
    stock.append([1.0] * 200)
    assert excess([97.01] * 100, stock) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(excess([500.0] * 100, [[1.0] * 99]))


def test_three_windows_set_the_reference_and_the_bars():
    """ln rates 8.0, 8.1, 7.9: mean 8.0, sd 0.1; one window decides beyond 3/√2 · 0.1 · √(1 + 1/3) = 0.3·√(2/3) =
    0.245; the mean of two has variance 0.01 · (1/2 + 1/3) = 0.00833, its bar 3/√2 · 0.0913 = 0.194; a pair's sd is
    at least √1.5 · 0.1 = 0.122 (the pooled prior, 0.01, is less)."""
    r = Refs()
    for ln in (8.0, 8.1, 7.9):
        r.add_incumbent(ln, 0.9)
    assert r.ref() == pytest.approx(8.0) and r.window_sd == pytest.approx(0.1) and not r.thin
    assert r.early_stop_bar == pytest.approx(0.3 * math.sqrt(2 / 3)) and r.thin_win == 0.0
    assert r.early_win_bar() == r.early_stop_bar and r.stop_bar(False) == r.early_stop_bar
    assert r.stop_bar(True) == r.early_stop_bar  # the first settling window's 0.15: beyond it already
    bar, var = r.two_windows()
    assert var == pytest.approx(0.01 * (0.5 + 1 / 3)) and bar == pytest.approx(3 / math.sqrt(2) * math.sqrt(var))
    assert r.prior_sd == pytest.approx(math.sqrt(1.5) * 0.1)
    assert r.ref_att == [0.9, 0.9, 0.9]
    # a tenth of the spread: the bar is its floor, 0.03, and the first settling window's 0.15
    quiet = Refs()
    for ln in (8.0, 8.01, 7.99):
        quiet.add_incumbent(ln, 0.9)
    assert quiet.early_stop_bar == 0.03 and quiet.stop_bar(False) == 0.03
    assert quiet.stop_bar(True) == EARLY_STOP_SETTLING


def test_thin_references_widen_the_bars():
    """Two windows: no sd yet (0), the bar its floor 0.03, widened to 0.15 for every window while thin, and an
    early win needs ln 2; none: no reference (NaN)."""
    r = Refs()
    assert math.isnan(r.ref()) and r.early_stop_bar == 0.03
    r.add_incumbent(8.0, math.nan)
    r.add_incumbent(8.1, math.nan)
    assert r.thin and r.window_sd == 0.0 and r.early_stop_bar == 0.03
    assert r.stop_bar(False) == EARLY_STOP_SETTLING and r.early_win_bar() == THIN_WIN == math.log(2.0)
    assert r.two_windows() == (THIN_WIN, 0.0)


def test_the_pairs_pool_and_shrink():
    """Pairs 0.01, 0.03: ss = 2·0.01² = 0.0002 on 1 df; pooled with 2 pseudo-pairs at 0.01: sd √(0.0004/3) = 0.01155;
    the variance of their mean, shrunk the same way: (0.0002 + 2·0.0004/3) / 3 / 2 = 7.78e-5. One pair pools
    nothing."""
    r = Refs()
    d = np.array([0.01, 0.03])
    assert r.prior_sd == pytest.approx(0.01)
    r.pool(d)
    assert r.pooled_ss == pytest.approx(0.0002) and r.pooled_df == 1
    assert r.prior_sd == pytest.approx(math.sqrt(0.0004 / 3))
    assert r.effect_var(d) == pytest.approx((0.0002 + 2 * 0.0004 / 3) / 3 / 2)
    r.pool(np.array([0.5]))
    assert r.pooled_df == 1


def test_the_last_windows_are_kept():
    r = Refs()
    for i in range(REF_WINDOWS + 2):
        r.add_incumbent(float(i), 1.0)
        r.add_stock(float(i), [0.1 * i], [0.01 * i])
    assert r.ref_lns == [float(i) for i in range(2, REF_WINDOWS + 2)] and len(r.ref_att) == REF_WINDOWS
    assert r.stock_lns == r.ref_lns and r.stock_ttfts[0] == [pytest.approx(0.2)] and len(r.stock_tpots) == REF_WINDOWS
