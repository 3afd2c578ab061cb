"""tools/sim_cold.py --quick (what CI runs of it): every policy of the slow CPU-like case runs from a cold start
and the comparison is printed. Its figures are not asserted (the full run's are in docs/results/sim_cold.md)."""

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sim_cold.py"


def test_sim_cold_quick_runs_every_policy_and_prints_the_comparison():
    p = subprocess.run([sys.executable, str(TOOL), "--quick", "--cases", "cpu"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    for spec in ("default", "v0", "mb", "eb:k=2", "eb:k=4", "eb:k=8"):
        assert any(line.split()[1:2] == [spec] and "output tok/s" in line for line in lines), (spec, p.stdout)
    assert "cpu: T = 120 s from a cold start; best static" in p.stdout and "worst default / best static" in p.stdout
