"""``tools/soak.py --quick`` on two real sglang CPU servers (``ebctl start`` and ``--join``): every fault of the
soak once, in its seeded order, under open-loop load: kill -9 and SIGSTOP of the daemon, a broken then a good
reload, ``tune set``, the runtime directory removed, the trace directory's filesystem full, a server killed and
restarted under its name, the daemon upgraded to the next protocol version and back.

What is checked is what the tool's own checks print (PASS lines; the RSS and fd slopes are not judged over a few
minutes) and the record's shape; the hour-long run's figures are in docs/results/soak.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]


def test_quick_soak_survives_every_fault(sglang_venv, tiny_model, workdir):
    work = workdir / "soak"
    work.mkdir()
    (work / "model").symlink_to(tiny_model)
    out = workdir / "soak.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "soak.py"), "--quick",
                        "--venv", str(sglang_venv), "--workdir", str(work), "--json", str(out),
                        "--png", str(workdir / "soak.png")], capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("PASS", "FAIL", "["))]
    print("\n".join(lines))
    assert p.returncode == 0, "\n".join(lines) + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert sorted(r["fault"] for r in doc["faults"]) == sorted(
        ("kill9", "stop30", "reload", "tune", "rundir", "tracefull", "server", "upgrade"))
    assert all(c["pass"] for c in doc["checks"]) and len(doc["checks"]) >= 8
    up = next(r for r in doc["faults"] if r["fault"] == "upgrade")
    assert up["next_protocol"] == doc["protocol"] + 1 and up["back_protocol"] == doc["protocol"]
    reload = next(r for r in doc["faults"] if r["fault"] == "reload")
    assert reload["bad_refused"] and "not valid TOML" in reload["bad_error"]
    full = next(r for r in doc["faults"] if r["fault"] == "tracefull")
    assert full["plugins_on"] and all("No space left" in (t or "") for t in full["traces"].values())
    server = next(r for r in doc["faults"] if r["fault"] == "server")
    assert server["restart_s"] > 1.0  # a new sglang started (a server left running would answer at once)
    ok = [r for r in doc["requests"] if r["ok"]]
    assert len(ok) > 100
    # the failed requests are those the kill cut: on s2, sent before it and ended by it (within the second
    # the kernel takes to close the sockets), every one
    failed = [r for r in doc["requests"] if not r["ok"]]
    assert all(r["server"] == "s2" and r["sent"] <= server["killed_at"] and
               server["down_at"] <= r["done"] <= server["killed_at"] + 5.0 for r in failed), failed[:3]
