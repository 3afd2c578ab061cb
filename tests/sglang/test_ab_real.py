"""``tools/ab_real.py --quick`` on the real sglang CPU server: sglang alone and under ``ebctl start``, each
started fresh, then the timed closed-loop streaming client. The load is cut from --quick's 45 s to 20 s per
configuration (each server takes about 50 s to start on 2 cores): the test stays under 3 minutes.

Its figures are printed, not asserted (timings on a shared CI machine): what is checked is that it exits 0,
that each configuration printed its line, that no request failed and some completed, and the JSON's shape."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_quick_ab_runs_alone_and_ebctl(sglang_venv, tiny_model, workdir):
    out = workdir / "ab.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "ab_real.py"), "--quick", "--duration", "20", "--last",
                        "10", "--status-every", "10", "--venv", str(sglang_venv), "--model", str(tiny_model),
                        "--json", str(out), "--workdir", str(workdir / "run")], capture_output=True, text=True,
                       timeout=600)
    print(p.stdout[-6000:])
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for config in ("alone", "ebctl"):
        assert re.search(rf"^\[ab\] round 1/1 {config} *: .* completed, 0 failed", p.stdout, re.M), config
        assert f"| {config} | 1 |" in p.stdout, config
    res = json.loads(out.read_text())
    assert {"tool", "configs", "base_args", "settings", "workload", "bin_s", "runs", "summary", "ok"} <= set(res)
    assert res["ok"] and res["configs"] == ["alone", "ebctl"] and len(res["runs"]) == 2
    for run in res["runs"]:
        assert "error" not in run, run.get("error")
        s = run["summary"]
        assert s["completed"] > 0 and s["failed"] == 0 and s["unfinished"] == 0, (run["config"], s)
        assert s["output_tokens"] > 0 and s["bins_30s"] and run["records"]
        assert {"ttft", "tpot", "status", "t", "end"} <= set(run["records"][0])
        assert run["client_cpu_s"] > 0
        assert run["pinned"] == 1, "pin() found no sglang::scheduler main thread to put on CPU 0"
        assert run["cpu_s"]["sglang::schedul"] > 0  # the scheduler's CPU under load, from /proc
    ebctl = next(r for r in res["runs"] if r["config"] == "ebctl")
    assert "ebctl daemon" in ebctl["cpu_s"] and "ebctl daemon" not in res["runs"][0]["cpu_s"]
    assert ebctl["status"] and any((s["status"] or {}).get("engines") for s in ebctl["status"])
    assert set(res["summary"]) == {"alone", "ebctl"}
    assert res["summary"]["alone"]["ratio"] == [1.0, 1.0, 1.0]  # the baseline against itself
