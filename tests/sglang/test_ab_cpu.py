"""``ebctl ab --cpu-demo`` on the real sglang CPU server: sglang alone and under ``ebctl start``, each started
fresh, the timed closed-loop streaming client (``--quick`` cut to 15 s of load: each server takes 25-50 s to
start on 2 cores); then Ctrl-C in the middle of an ``ebctl`` run. Together under 3 minutes.

Figures are printed, not asserted (timings on a shared CI machine): what is checked is that it exits 0, that each
configuration printed its line, that no request failed and some completed, the record's shape (device and
versions included), the report and the picture; and after Ctrl-C, exit 130, the partial record written, and no
process it recorded still running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def _ab(*args: str) -> list[str]:
    return [sys.executable, "-m", "ebctl", "ab", "--cpu-demo", *args]


def test_quick_ab_runs_alone_and_ebctl(sglang_venv, tiny_model, workdir):
    out = workdir / "ab.json"
    p = subprocess.run(_ab("--quick", "--duration", "15", "--last", "8", "--status-every", "5", "--venv",
                           str(sglang_venv), "--model", str(tiny_model), "--json", str(out), "--workdir",
                           str(workdir / "run")), capture_output=True, text=True, timeout=600, cwd="/")
    print(p.stdout[-6000:])
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for config in ("alone", "ebctl"):
        assert re.search(rf"^\[ab\] round 1/1 {config} *: .* completed, 0 failed", p.stdout, re.M), config
        assert f"| {config} | 1 |" in p.stdout, config
        assert f"[ab] round 1/1 · {config} (" in p.stderr  # the progress line
    res = json.loads(out.read_text())
    assert {"tool", "configs", "base_args", "settings", "workload", "bin_s", "runs", "summary", "ok",
            "environment"} <= set(res)
    assert res["ok"] and res["configs"] == ["alone", "ebctl"] and len(res["runs"]) == 2
    env = res["environment"]
    assert env["sglang"] == "0.5.23" and env["torch"] and env["ebctl"] and env["device"]["gpus"] == []
    for run in res["runs"]:
        assert "error" not in run, run.get("error")
        s = run["summary"]
        assert s["completed"] > 0 and s["failed"] == 0 and s["unfinished"] == 0, (run["config"], s)
        assert s["output_tokens"] > 0 and s["bins_30s"] and run["records"] and run["series"]["tok_s"]
        assert {"ttft", "tpot", "status", "t", "end"} <= set(run["records"][0])
        assert run["client_cpu_s"] > 0 and run["left_running"] == []
        assert run["pinned"] == 1, "pin() found no sglang::scheduler main thread to put on CPU 0"
        assert run["cpu_s"]["sglang::schedul"] > 0  # the scheduler's CPU under load, from /proc
    ebctl = next(r for r in res["runs"] if r["config"] == "ebctl")
    assert "ebctl daemon" in ebctl["cpu_s"] and "ebctl daemon" not in res["runs"][0]["cpu_s"]
    assert ebctl["status"] and any((s["status"] or {}).get("engines") for s in ebctl["status"])
    assert set(res["summary"]) == {"alone", "ebctl"}
    assert res["summary"]["alone"]["ratio"] == [1.0, 1.0, 1.0]  # the baseline against itself
    assert "| ebctl | 1 |" in (workdir / "run" / "ab.md").read_text()
    if (workdir / "run" / "ab.png").is_file():  # matplotlib (the plot extra) where it is installed
        assert (workdir / "run" / "ab.png").read_bytes()[:4] == b"\x89PNG"


def test_ctrl_c_stops_every_server_and_writes_the_partial_record(sglang_venv, tiny_model, workdir):
    out, err = workdir / "ctrlc.json", workdir / "ctrlc.err"
    with open(err, "w") as e:
        p = subprocess.Popen(_ab("--configs", "ebctl", "--runs", "1", "--duration", "120", "--status-every", "5",
                                 "--venv", str(sglang_venv), "--model", str(tiny_model), "--json", str(out),
                                 "--workdir", str(workdir / "ctrlc")), stdout=subprocess.PIPE, stderr=e, text=True,
                             cwd="/")
    try:
        deadline = time.monotonic() + 150
        while "· load ·" not in err.read_text() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
        time.sleep(4)  # some load measured
        p.send_signal(signal.SIGINT)
        stdout, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    print(stdout[-3000:])
    assert p.returncode == 130, f"{stdout[-3000:]}\n{err.read_text()[-3000:]}"
    res = json.loads(out.read_text())
    assert res["interrupted"] and not res["ok"] and len(res["runs"]) == 1
    run = res["runs"][0]
    assert run["interrupted"] and 0 < run["load_s"] < 120 and run["summary"]["completed"] > 0
    assert len(run["pids"]) >= 4  # ebctl start, its daemon, sglang's launcher and scheduler, the client
    left = [pid for pid in run["pids"] if Path(f"/proc/{pid}").exists()
            and (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"]
    assert left == [], {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left}
    assert "interrupted" in stdout and os.path.getsize(workdir / "ctrlc" / "ab.md") > 0
