"""``ebctl simulate`` (here through ``python -m ebctl.sim``'s app): JSON, table, sweep, errors, plot."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from ebctl.sim import cli

app = typer.Typer()
app.command()(cli.simulate)
runner = CliRunner()

SMALL = ["--requests", "300", "--concurrency", "64", "--max-running", "32", "--kv-tokens", "60000",
         "--no-progress"]


def test_json_results():
    r = runner.invoke(app, [*SMALL, "--workload", "balanced", "--policies", "v0,mb,eb-auto,eb+", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [x["policy"] for x in out["results"]] == ["v0", "mb", "eb-auto", "eb+"]
    for x in out["results"]:
        for key in ("tok_per_s", "total_tok_per_s", "req_per_s", "preemptions", "goodput_frac", "peak_kv_frac"):
            assert isinstance(x[key], int | float)
        for key in ("ttft_s", "tpot_s", "itl_s"):
            assert set(x[key]) >= {"p50", "p90", "p99"} and x[key]["p50"] <= x[key]["p99"]
        assert x["requests"] == 300
    assert out["engine"]["kv_tokens"] == 60000 and out["profile"] == "qwen3-8b/h200"


def test_sweep_theta_adds_fixed_thetas_and_the_best():
    r = runner.invoke(app, [*SMALL, "--policies", "v0", "--sweep-theta", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    pol = [x["policy"] for x in out["results"]]
    assert pol[0] == "v0" and len(pol) == 20 and pol[1] == f"eb:theta=0.05,n={out['sweep']['caps']['0.05']}"
    assert out["best_fixed_theta"]["policy"] in pol and 0 < out["best_fixed_theta"]["share"]["v0"] <= 1.001


def test_sweep_static_adds_sglangs_knobs_and_names_the_best_of_them():
    # 32 slots: K = 2, 4, 8, 16 (up to half the slots); N = 1, 2, 4, 8, 16, 32
    small = ["--requests", "120", "--concurrency", "48", "--max-running", "32", "--kv-tokens", "60000",
             "--no-progress"]
    r = runner.invoke(app, [*small, "--policies", "eb-auto", "--sweep-static", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    pol = [x["policy"] for x in out["results"]]
    assert pol == ["eb-auto", "v0", "mb", *(f"sglang:min-free-slots={k}" for k in (2, 4, 8, 16)),
                   *(f"sglang:pd-interval={n}" for n in (1, 2, 4, 8, 16, 32))]
    static = [x for x in out["results"] if x["policy"] != "eb-auto"]
    best = max(static, key=lambda x: x["tok_per_s"])
    auto = out["results"][0]
    assert out["best_static"]["tok_per_s"]["policy"] == best["policy"]
    assert out["best_static"]["tok_per_s"]["share"]["eb-auto"] == pytest.approx(auto["tok_per_s"] / best["tok_per_s"])
    assert len({x["tok_per_s"] for x in static}) > 3  # the knobs reached the engine: not all stock's schedule
    bad = runner.invoke(app, [*small, "--policies", "v0", "--sweep-static", "--engine-rules", "vllm"])
    assert bad.exit_code == 2 and "sets sglang's own flags" in " ".join(bad.output.split())


def test_table_and_trace(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("input_tokens,output_tokens,timestamp_s\n" + "".join(f"{50 + i},{20 + i % 7},{i * 0.01}\n"
                                                                    for i in range(200)))
    r = runner.invoke(app, [*SMALL, "--trace", str(t), "--policies", "v0,eb:k=4", "--open-loop"])
    assert r.exit_code == 0, r.output
    assert "eb:k=4" in r.stdout and "open-loop" in r.stdout and "tok/s" in r.stdout


@pytest.mark.parametrize("args", [["--policies", "v7"], ["--workload", "nope"], ["--profile", "none/gpu"],
                                  ["--workload", "balanced", "--trace", "x.csv"], ["--concurrency", "0"]])
def test_bad_arguments_exit_2(args):
    r = runner.invoke(app, [*SMALL, *args])
    assert r.exit_code == 2


def test_plot_without_matplotlib_says_how(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "_has_matplotlib", lambda: False)
    r = runner.invoke(app, [*SMALL, "--plot", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "pip install 'ebctl[plot]'" in r.output


def test_a_calibrated_profile_prices_iterations_with_its_sim_costs(tmp_path):
    # a profile as tools/sim_vs_real.py writes it: every prefill and decode iteration takes 10 ms
    flat = {"intercept_s": 0.01}
    prof = {"schema": 2, "name": "flat", "model": "m", "gpu": "cpu",
            "costs": {"alpha_p": 0.0, "beta_p": 0.0, "alpha_d": 1e-3, "beta_d": 0.0},
            "sim": {"iteration_costs": {"prefill": flat, "decode": flat}, "engine": {"kv_tokens": 4096}}}
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(prof))
    trace = tmp_path / "one.csv"
    trace.write_text("input_tokens,output_tokens\n10,5\n")
    r = runner.invoke(app, ["--profile", str(path), "--trace", str(trace), "--requests", "1", "--policies", "v0",
                            "--max-running", "4", "--token-budget", "64", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # one request: a prefill (token 1) and 4 decode steps, 10 ms each: 5 tokens in 50 ms
    assert out["results"][0]["makespan_s"] == pytest.approx(0.05)
    assert out["results"][0]["tok_per_s"] == pytest.approx(100.0)
    assert out["engine"]["kv_tokens"] == 4096 and out["cost_model"]["name"] == "iteration-costs (period)"
