"""tools/sim_knobs.py: goodput at a target pair, the tight pair from stock's latencies, and the cell's best static
setting, on hand-made runs; then its --quick run (what CI runs of it; the full table is docs/results/sim_knobs.md)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tools_module import tool

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_knobs.py"


@pytest.fixture(scope="module")
def knobs():
    with tool("sim_knobs") as module:
        yield module


def run(policy, tok_per_s, ttft, tpot, out, makespan=10.0):
    return {"policy": policy, "tok_per_s": tok_per_s, "makespan_s": makespan, "ttft": np.array(ttft, float),
            "tpot": np.array(tpot, float), "out": np.array(out, float)}


def test_goodput_and_the_tight_pair(knobs):
    # requests: (TTFT, TPOT, tokens) = (1, 0.05, 10) met; (3, 0.05, 20) TTFT late; (1, 0.2, 30) TPOT slow;
    # (1, nan, 1) one token: TTFT alone, met; an aborted one (TTFT nan): missed. Targets (2 s, 0.1 s).
    r = run("v0", 0.0, [1, 3, 1, 1, np.nan], [0.05, 0.05, 0.2, np.nan, np.nan], [10, 20, 30, 1, 5])
    assert knobs.goodput(r, (2.0, 0.1)) == pytest.approx(((10 + 1) / 10.0, 2 / 5))
    # stock's p75 of TTFT (1, 3, 1, 1: numpy's linear rule → 1.5) and p90 of TPOT (0.05, 0.05, 0.2 → 0.17): stock,
    # the only static setting, meets both for 3 of 5 (60%), within 50-90%
    assert knobs.tight_slo({"v0": r}) == pytest.approx((1.5, 0.17))


def test_the_tight_pair_is_scaled_down_until_the_best_static_setting_meets_it_for_at_most_90_percent(knobs):
    """Stock's TTFTs 1-10 s (p75 7.75 s), TPOTs 0.05 s (p90 0.05 s); a knob with TTFTs 0.7-7 s and TPOTs 0.04 s
    meets stock's pair for all ten requests. Scaled by 0.98 at a time, the TTFT target 7.75 × 0.98^i stays above
    the knob's largest TTFT, 7 s, up to i = 5 (7.005 s) and falls below it at i = 6 (6.865 s): 9 of 10, 90%, the
    first scale at which the best static setting meets the pair for at most 90%. Stock meets no scaled pair (its
    TPOTs of 0.05 s miss 0.049 s)."""
    ttft = np.arange(1.0, 11.0)
    stock = run("v0", 90.0, ttft, [0.05] * 10, [10] * 10)
    knob = run("sglang:pd-interval=8", 95.0, ttft * 0.7, [0.04] * 10, [10] * 10)
    base = (float(np.percentile(ttft, 75)), 0.05)
    assert base[0] == pytest.approx(7.75)
    assert knobs.goodput(knob, base)[1] == 1.0  # stock's own pair: the knob meets it for all
    slo = knobs.tight_slo({"v0": stock, "sglang:pd-interval=8": knob, "default": run("default", 1.0, [0], [0], [1])})
    assert slo == pytest.approx((7.75 * 0.98**6, 0.05 * 0.98**6))
    assert knobs.goodput(knob, slo)[1] == pytest.approx(0.9)


def test_the_best_static_setting_of_a_cell(knobs):
    runs = {"default": run("default", 95.0, [1, 1], [0.05, 0.05], [10, 10]),
            "v0": run("v0", 90.0, [1, 20], [0.05, 0.05], [10, 10]),
            "sglang:min-free-slots=4": run("sglang:min-free-slots=4", 100.0, [20, 20], [0.05, 0.05], [10, 10])}
    row = knobs.cell_row(runs)
    assert row["tok"] == (95.0, "sglang:min-free-slots=4", 100.0)
    # at the paper's 10 s the knob's requests both miss TTFT, stock's first meets: best static v0, 1 tok/s
    assert row["paper"]["best"] == "v0" and row["paper"]["best_good"] == pytest.approx((1.0, 0.5))
    assert row["paper"]["ctl"] == pytest.approx((2.0, 1.0))
    assert "targeted" not in row["paper"]


def test_the_default_with_the_targets_set_is_its_own_column(knobs):
    """``--slo-objective``: the default run with a pair as its targets is looked up by its spec (exact floats), never
    counted as a static setting, and set beside the best static one at that pair."""
    assert knobs.slo_spec((10.0, 0.1)) == "default:ttft=10.0,tpot=0.1"
    tight = (1.2345678901234567, 0.0123456789)
    assert knobs.slo_spec(tight) == "default:ttft=1.2345678901234567,tpot=0.0123456789"
    runs = {"default": run("default", 95.0, [1, 20], [0.05, 0.05], [10, 10]),
            "v0": run("v0", 90.0, [1, 20], [0.05, 0.05], [10, 10]),
            knobs.slo_spec(knobs.PAPER_SLO): run("default:...", 80.0, [1, 1], [0.05, 0.05], [10, 10])}
    row = knobs.cell_row(runs)
    assert row["tok"] == (95.0, "v0", 90.0)  # the targeted run is not a static setting
    assert row["paper"]["best_good"] == pytest.approx((1.0, 0.5))
    assert row["paper"]["targeted"] == pytest.approx((2.0, 1.0))
    assert "targeted" not in row["tight"]


def test_quick_run_prints_the_tables():
    p = subprocess.run([sys.executable, str(TOOL), "--quick", "--jobs", "1", "--slo-objective"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "| balanced | 512 |" in p.stdout and "| decode-heavy | 512 |" in p.stdout
    assert "Lowest default / best static" in p.stdout
    assert "| balanced | 512 | paper |" in p.stdout and "| decode-heavy | 512 | tight (" in p.stdout
    assert "Default with targets / best static goodput: " in p.stdout
