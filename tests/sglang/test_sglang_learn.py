"""The learning controller on the real SGLang 0.5.23 CPU server: tools/learn_real.py --quick runs the tiny model
under ``ebctl start`` with the defaults (mode eb+, theta_method measured, no profile) and
``--enable-mixed-chunk``, while sglang's own client holds 24 requests in flight for 150 s. Asserted: the
prefill, decode and mixed cost fits each passed the quality test at some status read under load, and the
controller planned with the online costs at some read (the prefill fit only through eb+'s EB probes: under stock
with mixed chunks sglang mixes every prompt into the running batch; a fit may fail again later when its error
crosses the mean predictor's with noise),
the measured-θ tuner started at least one trial, and every request the client sent completed (the client's
own count). Two settings differ from the defaults so that 150 s on a 2-core CI machine beside the test's own
client checks the machinery: probes may take 10% of the time (``controller.probe_share``: one every 30 s
instead of 100 s), and the quality test runs at 40% (``controller.cost_max_rel_err``). The 5-minute run with
the defaults is the full tool run, whose figures are in docs/results/learn_real.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_eb_plus_learns_every_cost_fit_and_runs_trials_without_losing_a_request(sglang_venv, workdir):
    result = workdir / "result.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "learn_real.py"), "--quick", "--venv",
                        str(sglang_venv), "--workdir", str(workdir / "run"), "--json", str(result),
                        "--set", "controller.probe_share=0.1", "--set", "controller.cost_max_rel_err=0.4"],
                       capture_output=True, text=True, timeout=900)
    print(p.stdout[-5000:])
    assert result.is_file(), f"learn_real.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    res = json.loads(result.read_text())
    final = res["final"]
    assert res["sent"] > 0 and res["completed"] == res["sent"], (res["completed"], res["sent"])
    assert set(res["first_passed"]) == {"prefill", "decode", "mixed"}, (res["first_passed"], res["timeline"])
    assert 0 < res["reads_online"] <= res["reads"], (res["reads_online"], res["reads"])
    assert final["probes"]["count"] >= 1 and final["tuner"]["trials"] >= 1, (final["probes"], final["tuner"])
    assert p.returncode == 0
