"""``tools/sim_vs_real.py --quick`` on the real sglang CPU server: it measures, calibrates and predicts.

Its figures are printed, not asserted (timings on a shared CI machine): what is checked is that every
configuration was measured and predicted, and that the calibration used the stock and mixed runs only."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_quick_comparison_runs_end_to_end(sglang_venv, tmp_path):
    out = tmp_path / "svr.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "sim_vs_real.py"), "--quick", "--venv", str(sglang_venv),
                        "--json", str(out), "--out", str(tmp_path / "cal")], capture_output=True, text=True,
                       timeout=900)
    print(p.stdout)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"stock", "mixed", "eb k=4"}
    for config, row in res["summary"].items():
        assert row["measured"] and all(v > 0 for v in row["measured"]), config
        assert math.isfinite(row["predicted"]) and row["predicted"] > 0, config
    assert {"prefill", "decode", "mixed"} <= set(res["calibration"])
    assert "| eb k=4 |" in p.stdout and "| no |" in p.stdout  # EB is out of sample, and says so
    profile = json.loads((tmp_path / "cal" / "profile.json").read_text())
    assert profile["schema"] == 2 and profile["sim"]["iteration_costs"]["decode"] is not None
