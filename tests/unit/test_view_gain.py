"""``ebctl status``'s "helps" line: the engine's output rate, the measured gain against stock, the cost of
exploring, from an engine's status as the daemon sends it."""

import math

from ebctl.cli.view import gain_text


def test_the_helps_line_states_rate_gain_interval_and_cost():
    st = {"output_tok_s": 687.4, "tuner": {"incumbent": "eb@6", "theta_incumbent": 0.2828, "trials": 3},
          "gain": {"vs_stock": 0.318, "low": 0.282, "high": 0.355, "explore_share": 0.0042, "elapsed_s": 240.0}}
    assert gain_text(st) == ("output 687 tok/s · 3 trials · EB θ 0.283: +31.8% against stock [+28.2%, +35.5%] · "
                             "exploring cost 0.4% of 4 min")


def test_at_stock_and_without_the_measured_search():
    at_stock = {"output_tok_s": 700.0, "tuner": {"incumbent": "stock", "theta_incumbent": math.nan, "trials": 1},
                "gain": {"vs_stock": 0.0, "low": 0.0, "high": 0.0, "explore_share": 0.0, "elapsed_s": 30.0}}
    assert gain_text(at_stock) == ("output 700 tok/s · 1 trial · at stock (nothing measured faster) · exploring cost "
                                   "0.0% of 30 s")
    assert gain_text({"output_tok_s": math.nan, "gain": None}).startswith("output — tok/s · gain against stock: "
                                                                          "not measured")


def test_trials_that_ran_ahead_of_the_incumbent_show_as_a_gain():
    """The ledger is net (``Tuner`` docstring, Ledger): a negative share reads as what exploring gained."""
    st = {"output_tok_s": 700.0, "tuner": {"incumbent": "mb", "theta_incumbent": math.nan, "trials": 2},
          "gain": {"vs_stock": 0.1, "low": 0.05, "high": 0.15, "explore_share": -0.003, "elapsed_s": 120.0}}
    assert gain_text(st).endswith(" · exploring gained 0.3% of 2 min")
