"""``--sweep-theta`` at a batch cap that binds (Eq. 6's N̂* or ``--sweep-n``), and the note when θ changes nothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from ebctl.sim import cli, policies

app = typer.Typer()
app.command()(cli.simulate)
runner = CliRunner()

# short requests (inputs 100-300, outputs 20-60 tokens) on 16 slots: each run takes a few hundred steps
SMALL = ["--workload", "uniform:L=200,O=40", "--requests", "80", "--concurrency", "32", "--max-running", "16",
         "--no-progress", "--policies", "v0", "--sweep-theta", "--json"]


def sweep(*args: str) -> dict:
    r = runner.invoke(app, [*SMALL, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def schedule(r: dict) -> tuple:
    return r["makespan_s"], r["tokens_out"], tuple(sorted(r["steps"].items()))


def test_eq6_caps_by_hand():
    # every input 100 tokens, every output 50: the hazard fit falls back to p0 = 1/50, both variances are 0 so
    # the margin v̄ is 0, and Eq. 6 is N* = ⌊C / (μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ)))⌋ with C = 10,000:
    #   θ = 0.5:  100 + 0.5/(0.5·0.02)·ln 2      = 134.657 → 74.26 → 74
    #   θ = 0.25: 100 + 0.75/(0.25·0.02)·ln(4/3) = 143.152 → 69.86 → 69
    ins, outs = np.full(500, 100), np.full(500, 50)
    assert policies.eq6_caps([0.5, 0.25], input_len=ins, output_len=outs, kv_tokens=10_000,
                             max_running=200) == [74, 69]
    # clipped like the controller's: never below a tenth of the slots (100 of 1,000), never above the slots
    assert policies.eq6_caps([0.5], input_len=ins, output_len=outs, kv_tokens=10_000, max_running=1000) == [100]
    assert policies.eq6_caps([0.5], input_len=ins, output_len=outs, kv_tokens=10**8, max_running=200) == [200]


def test_a_binding_cap_gives_one_schedule_per_k():
    # N = 10 of 16 slots, KV for ~200 of these requests: the cap binds. k = ⌊10θ⌋ (at least 1) over θ = 0.05..0.95:
    # 1, 1, 1, 2, 2, 3, 3, ..., 9, 9: rows with the same k are the same schedule, rows with different k differ
    out = sweep("--kv-tokens", "60000", "--sweep-n", "10")
    rows = [r for r in out["results"] if r["policy"] != "v0"]
    assert [r["policy"] for r in rows][:2] == ["eb:theta=0.05,n=10", "eb:theta=0.10,n=10"]
    k = {r["policy"]: max(1, math.floor(policies.fixed_theta(r["policy"]) * 10)) for r in rows}
    assert sorted(set(k.values())) == list(range(1, 10))
    by_k: dict[int, set] = {}
    for r in rows:
        by_k.setdefault(k[r["policy"]], set()).add(schedule(r))
    assert all(len(s) == 1 for s in by_k.values())
    assert len({schedule(r) for r in rows}) == 9
    assert out["notes"] == [] and out["sweep"]["n"] == 10
    assert out["best_fixed_theta"]["theta"] == policies.fixed_theta(out["best_fixed_theta"]["policy"])


def test_every_theta_equal_to_stock_is_said_plainly():
    # 1,000 KV tokens hold about 3 of these requests (200 in + 40 out): the 16-slot cap never fills
    r = runner.invoke(app, [*SMALL[:-1], "--kv-tokens", "1000", "--sweep-n", "16", "--requests", "30"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "note: every eb:theta row equals v0's (stock) schedule exactly" in text
    assert "--sweep-n a cap below the batch the KV cache holds" in text


def test_the_default_cap_is_eq6_of_the_workload():
    out = sweep("--kv-tokens", "1000", "--requests", "30")
    caps = out["sweep"]["caps"]
    assert out["sweep"]["n"] == "eq6" and len(caps) == 19
    assert [r["policy"] for r in out["results"]][1:] == [f"eb:theta={t},n={n}" for t, n in
                                                         ((f"{float(t):.2f}", n) for t, n in caps.items())]
    assert all(1 <= n <= 16 for n in caps.values())


@pytest.mark.parametrize("n", ["-1", "17"])
def test_sweep_n_outside_the_slots_is_refused(n):
    r = runner.invoke(app, [*SMALL, "--sweep-n", n])
    assert r.exit_code == 2 and "--sweep-n" in r.output
