"""The paper fit (ebctl.sim.paperfit): on cells simulated with known overheads it finds them again.

A small stand-in for the paper's setup (a 2 × 2 grid, short synthetic workloads, concurrency 128): the
"measurements" are what the cost model predicts with TRUTH, computed from the runs, not from the fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ebctl.sim import gpucost, paperfit

TRUTH = gpucost.Overheads(iter_s=2e-3, req_s=4e-5, interference=0.8, switch_s=5e-3, graph_s=1e-3)
GPU = "H200"


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(paperfit, "TABLE2", {"ShareGPT": "uniform:L=100,O=60", "LongBench": "uniform:L=600,O=8",
                                             "NuminaMath": "geometric:L=50,O=200"})
    monkeypatch.setattr(paperfit, "GRID_N", (32, 64))
    monkeypatch.setattr(paperfit, "GRID_B", (512, 2048))
    monkeypatch.setattr(paperfit, "FIT_THETAS", (0.1, 0.5))
    monkeypatch.setattr(paperfit, "EB_SPECS", ["eb:theta=0.1", "eb:theta=0.5"])
    monkeypatch.setattr(paperfit, "CONCURRENCY", 128)
    monkeypatch.setattr(paperfit, "SAT_REQUESTS", 600)
    monkeypatch.setattr(paperfit, "TABLE2_REQUESTS", 300)
    data = {"v1_saturation_tok_per_s": {GPU: [{"mu_L": 400, "mu_O": 50, "tok_per_s": 0.0},
                                             {"mu_L": 100, "mu_O": 100, "tok_per_s": 0.0},
                                             {"mu_L": 50, "mu_O": 300, "tok_per_s": 0.0}]},
            "table2_rps": {GPU: {w: {"v1": 0.0, "eb_vs_v1_pct": 0.0} for w in paperfit.TABLE2}}}
    monkeypatch.setattr(paperfit.paperdata, "data", lambda: data)
    runs = {key: paperfit.record(*key) for key in paperfit.configurations((GPU,))}
    o = TRUTH.vector()
    for p in data["v1_saturation_tok_per_s"][GPU]:
        p["tok_per_s"] = paperfit.predict_cell(runs, GPU, f"sat {p['mu_L']}/{p['mu_O']}", o)
    for w, row in data["table2_rps"][GPU].items():
        row["v1"] = paperfit.predict_cell(runs, GPU, f"v1 {w}", o)
        row["eb_vs_v1_pct"] = (paperfit.predict_cell(runs, GPU, f"eb/v1 {w}", o) - 1) * 100
    return runs


def test_the_fit_finds_the_overheads_the_cells_were_made_with(small):
    got = paperfit.fit_gpu(GPU, small)
    for name, measured in paperfit.cells(GPU):
        assert paperfit.predict_cell(small, GPU, name, got.vector()) == pytest.approx(measured, rel=1e-4), name
    assert np.allclose(got.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6), (got, TRUTH)


def test_a_left_out_cell_is_not_used(small, monkeypatch):
    # spoil one cell's measurement: the fit that leaves it out still finds the truth, the full fit does not
    row = paperfit.paperdata.data()["table2_rps"][GPU]["ShareGPT"]
    row["eb_vs_v1_pct"] += 30.0
    left_out = paperfit.fit_gpu(GPU, small, leave_out="eb/v1 ShareGPT")
    assert np.allclose(left_out.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6)
    full = paperfit.fit_gpu(GPU, small)
    assert not np.allclose(full.vector(), TRUTH.vector(), rtol=0.05, atol=1e-6)
    assert math.isfinite(full.iter_s)
