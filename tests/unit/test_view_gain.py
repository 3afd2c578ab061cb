"""``ebctl status``'s "helps" line: the engine's output rate, the measured gain against stock, the cost of
exploring, from an engine's status as the daemon sends it."""

import math

from ebctl.cli.view import gain_text


def test_the_helps_line_states_rate_gain_interval_and_cost():
    st = {"output_tok_s": 687.4, "tuner": {"incumbent": "eb@6", "theta_incumbent": 0.2828, "trials": 3},
          "gain": {"vs_stock": 0.318, "low": 0.282, "high": 0.355, "explore_share": 0.0042, "elapsed_s": 240.0}}
    assert gain_text(st) == ("EB θ 0.283: +31.8% against stock [+28.2%, +35.5%] · 3 trials · "
                             "exploring cost 0.4% of 4 min")


def test_at_stock_and_without_the_measured_search():
    at_stock = {"output_tok_s": 700.0, "tuner": {"incumbent": "stock", "theta_incumbent": math.nan, "trials": 1},
                "gain": {"vs_stock": 0.0, "low": 0.0, "high": 0.0, "explore_share": 0.0, "elapsed_s": 30.0}}
    assert gain_text(at_stock) == "at stock (nothing measured faster) · 1 trial · exploring cost 0.0% of 30 s"
    assert gain_text({"output_tok_s": math.nan, "gain": None}).startswith("gain against stock: not measured")


def test_trials_that_ran_ahead_of_the_incumbent_show_as_a_gain():
    """The ledger is net (``Tuner`` docstring, Ledger): a negative share reads as what exploring gained."""
    st = {"output_tok_s": 700.0, "tuner": {"incumbent": "mb", "theta_incumbent": math.nan, "trials": 2},
          "gain": {"vs_stock": 0.1, "low": 0.05, "high": 0.15, "explore_share": -0.003, "elapsed_s": 120.0}}
    assert gain_text(st).endswith(" · exploring gained 0.3% of 2 min")


# An engine's status as the daemon sends it, in the demo's state after two minutes (values from a run of
# `ebctl start --engine sim`, trimmed to what the compact view reads).
DEMO = {"mode": "eb", "k": 29, "n_max": 350, "n_limit": 1024, "version": 1180, "reports": 100200,
        "last_report_age_s": 0.07, "last_update_age_s": 0.07, "output_tok_s": 1797.8, "theta0": 0.0307,
        "delta_theta": 0.0314, "theta_star": 0.0841, "n_star": 350, "p0": 0.00343, "eta": 9.2e-6, "fit_r2": 0.0145,
        "n_obs": 1024.0, "mu_l": 1130.5, "mu_o": 201.6, "n_window": 500, "kv_reserve_frac": 0.0704,
        "reason": "mixed cost unknown: eb; measured: settled at theta=0.0841",
        "cost_reason": "default: online fits pass but give alpha_d=1.1e-05 s, under 1% of the mean decode step "
                       "(0.0859 s): the intercept is not identified at these batch sizes, and Eq. 3 needs it",
        "costs": {"alpha_p": 0.00128, "beta_p": 2.49e-05, "alpha_d": 0.00892, "beta_d": 4.59e-05, "source": "default"},
        "cost_fits": {"prefill": {"state": "passed, not in use", "in_use": False, "rel_err": 0.00068,
                                  "reason": "median error 0.1% (mean predictor 21.7%)", "n": 2000},
                      "decode": {"state": "passed, not in use", "in_use": False, "rel_err": 0.0026, "n": 2000},
                      "mixed": {"state": "waiting", "in_use": False, "reason": "0 iterations < 50", "n": 0}},
        "tuner": {"state": "settled", "incumbent": "eb@13", "theta_incumbent": 0.0841, "trial": None, "trials": 19,
                  "won": 3, "lost": 16},
        "gain": {"vs_stock": 0.0391, "low": 0.0213, "high": 0.0573, "explore_share": -0.0007, "elapsed_s": 13166.7},
        "slo": {"ttft_s": 0.0, "tpot_s": 0.0}}


def _rows(st, width=80):
    from rich.console import Console

    from ebctl.cli import view

    c = Console(width=width, record=True, color_system=None)
    c.print(view.status_view({"daemon": {"pid": 1, "engines": 1}, "engines": {"sim0": st}}))
    return c.export_text().splitlines()


def test_at_80_columns_the_helps_row_shows_its_interval_whole():
    helps = next(r for r in _rows(DEMO) if r.startswith("  helps"))
    assert len(helps) <= 80
    assert "EB θ 0.0841: +3.9% against stock [+2.1%, +5.7%]" in helps
    head = next(r for r in _rows(DEMO) if r.startswith("engine sim0"))
    assert "1,798 out tok/s" in head  # the output rate moved to the engine's first row


def test_a_fit_that_passed_but_is_not_in_use_reads_as_such_and_the_costs_row_says_why():
    rows = _rows(DEMO, width=200)
    fits = next(r for r in rows if r.startswith("  fits"))
    assert "✗" not in fits
    assert "prefill passed (err 0.1%), not in use" in fits and "mixed waiting (0 iterations < 50)" in fits
    costs = next(r for r in rows if r.startswith("  costs"))
    assert "built-in defaults (fits pass; decode intercept not identified yet) · α_P 0.00128" in costs
    failed = {**DEMO, "cost_fits": {"decode": {"state": "failed", "in_use": False, "rel_err": 0.3,
                                               "reason": "median error 30.0% > 10%"}}}
    assert "decode ✗ median error 30.0% > 10%" in next(r for r in _rows(failed, 200) if r.startswith("  fits"))
    online = {**DEMO, "costs": {**DEMO["costs"], "source": "online"}, "cost_reason": "online: online fits passed",
              "cost_fits": {"decode": {"state": "in use", "in_use": True, "rel_err": 0.021}}}
    rows = _rows(online, 200)
    assert "costs fitted online from this engine · α_P" in next(r for r in rows if r.startswith("  costs"))
    assert "decode ✓ err 2.1%" in next(r for r in rows if r.startswith("  fits"))


def test_why_says_in_words_what_the_controller_decided():
    from ebctl.cli.view import decision_text

    assert decision_text(DEMO) == "EB, k = 29 of N = 350: measured 3.9% faster than stock"
    at_stock = {**DEMO, "mode": "off", "tuner": {**DEMO["tuner"], "incumbent": "stock", "won": 0, "trials": 4}}
    assert decision_text(at_stock) == "stock sglang: no arm measured faster than stock (0 of 4 trials won)"
    trying = {**DEMO, "tuner": {**DEMO["tuner"], "trial": {"challenger": "mb"}}}
    assert decision_text(trying) == "EB, k = 29 of N = 350: trying mb against eb@13 (3 of 19 trials won)"
    cold = {"mode": "off", "reason": "cold start: waiting for data"}
    assert decision_text(cold) == "stock sglang: cold start: waiting for data"


def test_explain_glosses_every_symbol_of_the_block_and_shows_the_reasons_whole():
    from rich.console import Console

    from ebctl.cli import view

    c = Console(width=100, record=True, color_system=None)
    c.print(view.explain_view({"engines": {"sim0": DEMO}}))
    text = c.export_text()
    for symbol in ("θ̂0", "Δθ", "N̂*", "p̂0, η̂", "N_obs", "μ̂_L, μ̂_O", "KV res.", "helps", "fits"):
        assert symbol in text, symbol
    assert "the intercept is not identified at these batch sizes, and Eq. 3 needs it" in " ".join(text.split())


def test_the_plugin_row_names_its_version_and_an_older_protocol():
    from ebctl.cli.view import plugin_text

    st = {"plugin_version": "0.1.0", "plugin_protocol": 2, "gate_reasons": {"threshold": 1200, "starvation": 3}}
    assert plugin_text(st, 2) == ("v0.1.0 (protocol 2) · gate threshold 1,200 · starvation 3", "")
    old = {"plugin_version": "0.0.9", "plugin_protocol": 1}
    assert plugin_text(old, 2) == ("v0.0.9 (protocol 1, older than the daemon's 2)", "yellow")
    assert plugin_text({"plugin_version": "", "plugin_protocol": 1}, 2)[0] == (
        "version unknown (protocol 1, older than the daemon's 2)")  # a version-1 plugin does not say its version
    assert plugin_text({}, 2) == ("", "")  # a block with nothing from the plugin has no plugin row


def test_the_model_line_puts_the_prediction_beside_the_measurement():
    from ebctl.cli.view import model_text

    st = {"tuner": {"incumbent": "pdi@4", "model": {"predicted_vs_stock": 0.031, "trials": 4, "mean_abs_error": 0.006,
                                                    "pick": "", "unverified": False}},
          "gain": {"vs_stock": 0.028, "low": 0.010, "high": 0.046}}
    assert model_text(st) == "predicted +3.1%, measured +2.8% [+1.0%, +4.6%]; 4 trials, mean |error| 0.6 pt"
    st["tuner"]["model"].update(trials=0, mean_abs_error=math.nan, unverified=True, pick="eb@8")
    assert model_text(st) == ("predicted +3.1%, measured +2.8% (not measured yet) [+1.0%, +4.6%]; no trial yet"
                              " · next: eb@8")
    assert model_text({"tuner": {"model": None}}) == ""
