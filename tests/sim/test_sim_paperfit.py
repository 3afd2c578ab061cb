"""The paper fit (ebctl.sim.paperfit): the recorded sums price a run as a simulation with those overheads does;
on cells simulated with known overheads the fit finds them again; a left-out cell is not used; NuminaMath as
the paper served it agrees with the paper's own figures.

A small stand-in for the paper's setup (batch caps 32/64, short synthetic workloads, concurrency 128): the
"measurements" are what the cost model predicts with TRUTH, computed from the runs, not from the fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ebctl.sim import gpucost, paperdata, paperfit, policies, runner

TRUTH = gpucost.Overheads(iter_s=2e-3, req_s=3e-5, interference=0.8, switch_s=1e-3, overlap=0.6)
GPU = "H200"
SMALL = {"ShareGPT": "uniform:L=100,O=60", "LongBench": "uniform:L=600,O=8", "NuminaMath": "geometric:L=50,O=200"}


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(paperfit, "TABLE2", SMALL)
    monkeypatch.setattr(paperfit, "PAPER_N", (32, 64))
    monkeypatch.setattr(paperfit, "FIT_THETAS", (0.1, 0.5))
    monkeypatch.setattr(paperfit, "CONCURRENCY", 128)
    monkeypatch.setattr(paperfit, "SAT_REQUESTS", 600)
    monkeypatch.setattr(paperfit, "TABLE2_REQUESTS", 300)
    monkeypatch.setattr(paperdata, "BEST_CONFIG", {GPU: {w: {"v0": (512, 64), "v1": (2048, 64), "eb": (1024, 64)}
                                                         for w in SMALL}})
    monkeypatch.setattr(paperdata, "TPOT_MS", {GPU: {"ShareGPT": {"v1": 0.0, "eb": 0.0}}})
    data = {"v1_saturation_tok_per_s": {GPU: [{"mu_L": 400, "mu_O": 50, "tok_per_s": 0.0},
                                             {"mu_L": 100, "mu_O": 100, "tok_per_s": 0.0},
                                             {"mu_L": 50, "mu_O": 300, "tok_per_s": 0.0}]},
            "table2_rps": {GPU: {w: {"v1": 0.0, "eb_vs_v1_pct": 0.0} for w in SMALL}}}
    monkeypatch.setattr(paperdata, "data", lambda: data)
    runs = {key: paperfit.record(*key) for key in paperfit.configurations((GPU,))}
    o = TRUTH.vector()
    for p in data["v1_saturation_tok_per_s"][GPU]:
        p["tok_per_s"] = paperfit.predict_cell(runs, GPU, f"sat {p['mu_L']}/{p['mu_O']}", o)
    for w, row in data["table2_rps"][GPU].items():
        row["v1"] = paperfit.predict_cell(runs, GPU, f"v1 {w}", o)
        row["eb_vs_v1_pct"] = (paperfit.predict_cell(runs, GPU, f"eb/v1 {w}", o) - 1) * 100
    paperdata.TPOT_MS[GPU]["ShareGPT"]["v1"] = paperfit.predict_cell(runs, GPU, "tpot v1 ShareGPT", o)
    return runs


def test_the_sums_price_a_run_as_simulating_it_with_those_overheads_does(small):
    # the independent computation: the same run simulated with the cost model carrying TRUTH
    for key in (paperfit.table2_key(GPU, "ShareGPT", "v1"), paperfit.eb_keys(GPU, "NuminaMath")[-1]):
        gpu, wl, spec, n, b, requests, _ = key
        cfg = paperfit.engine(gpu, n, b)
        src = policies.make(spec, max_running=n, kv_tokens=cfg.kv_tokens)
        res = runner.run(paperfit.workload(wl, requests), src, paperfit.kernel_model(gpu).with_overheads(TRUTH),
                         cfg, concurrency=paperfit.CONCURRENCY)
        assert small[key].rate("req/s", TRUTH.vector()) == pytest.approx(res["req_per_s"], rel=1e-9), key
        assert small[key].tpot_s(TRUTH.vector()) == pytest.approx(res["tpot_s"]["mean"], rel=1e-9), key


def test_the_fit_finds_the_overheads_the_cells_were_made_with(small):
    got = paperfit.fit_gpu(GPU, small)
    for name, measured in paperfit.cells(GPU):
        assert paperfit.predict_cell(small, GPU, name, got.vector()) == pytest.approx(measured, rel=1e-4), name
    assert np.allclose(got.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6), (got, TRUTH)


def test_a_left_out_cell_is_not_used(small):
    # spoil one cell's measurement: the fit that leaves it out still finds the truth, the full fit does not
    row = paperdata.data()["table2_rps"][GPU]["ShareGPT"]
    row["eb_vs_v1_pct"] += 30.0
    left_out = paperfit.fit_gpu(GPU, small, leave_out="eb/v1 ShareGPT")
    assert np.allclose(left_out.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6)
    full = paperfit.fit_gpu(GPU, small)
    assert not np.allclose(full.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6)
    assert math.isfinite(full.iter_s)


def test_bounds_the_fit_uses():
    c = paperfit.kernel_model("RTX-PRO-6000").costs
    hi = dict(zip(gpucost.FIELDS, paperfit.upper("RTX-PRO-6000"), strict=True))
    assert hi["req_s"] == c.beta_d and hi["switch_s"] == c.alpha_p and hi["overlap"] == 1.0
    assert hi["interference"] == gpucost.interference_bound("RTX-PRO-6000")
    assert paperfit.at_bound("RTX-PRO-6000", gpucost.Overheads(req_s=c.beta_d, overlap=0.5)) == \
        ["iter_s=0", "req_s=max", "interference=0", "switch_s=0"]


def test_numinamath_as_served_agrees_with_the_papers_own_figures():
    inputs, outputs = paperdata.served("NuminaMath", 20_000, seed=0)
    t9_inputs, _ = paperdata.table9("NuminaMath", 20_000, seed=0)
    assert np.array_equal(inputs, t9_inputs)  # only the outputs differ from Table 9's row
    assert outputs.min() >= 800 and outputs.max() == 4000  # section 4.1: "122 / 800–4,000"
    assert np.mean(outputs == 4000) == pytest.approx(0.9, abs=0.01)
    # Little's law on each measured run: decoding requests = req/s · TPOT · mean output ≤ the batch cap N
    # (Table 2's req/s, section 4.3.3's TPOT, Tables 14-15's N), and Table 9's mean would leave most slots idle
    for gpu, by_wl in paperdata.TPOT_MS.items():
        for sched, tpot_ms in by_wl["NuminaMath"].items():
            rps = paperdata.data()["table2_rps"][gpu]["NuminaMath"][sched]
            n = paperdata.BEST_CONFIG[gpu]["NuminaMath"][sched][1]
            assert 0.7 * n < rps * tpot_ms / 1e3 * outputs.mean() <= n, (gpu, sched)
            assert rps * tpot_ms / 1e3 * 1039 < 0.3 * n, (gpu, sched)
