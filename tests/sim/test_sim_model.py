"""tools/sim_model.py's quick variant: the default given the engine's profile, from cold, against sglang's static
flags on one cell (qwen3-8b/h200, azure-conv, c = 2,048, 3,000 requests): it runs, writes its record and
report, and the controllers' rows say where they ended and what the model's record was. The figures are the
simulator's (deterministic), checked against bars below the issue's, so that a change that loses them fails."""

import json

from tools_module import tool


def test_the_quick_cell_runs_and_the_model_takes_what_the_best_static_flag_takes(tmp_path):
    with tool("sim_model") as sm:
        assert sm.main(["--quick", "--jobs", "2", "--json", str(tmp_path / "q.json"),
                        "--md", str(tmp_path / "q.md")]) == 0
        assert sm.parse_cell("qwen3-8b/h200:azure-conv:512") == ("qwen3-8b/h200", "azure-conv", 512)
        for bad, what in (("qwen3-8b/h200:nope:512", "workload 'nope'"), ("qwen3-8b/h200:azure-conv:x", "C='x'")):
            try:
                sm.parse_cell(bad)
            except ValueError as e:
                assert what in str(e)
            else:
                raise AssertionError(f"{bad} was accepted")
    doc = json.loads((tmp_path / "q.json").read_text())
    (cell,) = doc["cells"].values()
    rows = {r["policy"]: r for r in cell["rows"]}
    assert {"v0", "mb", "eb+", "default", "default:profile=engine", "default:profile=qwen3-8b/rtx-pro-6000",
            "sglang:pd-interval=8", "sglang:min-free-slots=512"} <= set(rows)
    mine = rows["default:profile=engine"]
    assert mine["record"]["n"] >= 0 and mine["moves"] and mine["moves"][0][2] == "model"  # the start-up's pick
    assert mine["vs_best_whole"] >= 0.97 and mine["vs_best_half"] >= 0.97
    assert rows["default:profile=qwen3-8b/rtx-pro-6000"]["vs_stock_half"] >= 0.98  # the wrong model
    assert "default + profile" in (tmp_path / "q.md").read_text()
