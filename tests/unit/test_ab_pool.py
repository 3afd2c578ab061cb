"""ebctl.ab.pool and tools/ab_pool.py: runs paired with the baseline's of the same round, pooled over sittings by a
cluster bootstrap; expected values worked by hand. No server."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ebctl.ab import pool as pool_module

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pool():
    return pool_module


def test_a_run_is_paired_with_the_baseline_of_its_own_round(pool):
    # round 1: x 90 against b 100; round 2: 200 against 200; round 3 ran no baseline. Pairing gives 0.9 and 1.0;
    # the ratio of the means (290/300 = 0.967) would let round 2's faster machine hide round 1's loss.
    sitting = {1: {"b": {"tok_s": 100.0}, "x": {"tok_s": 90.0}}, 2: {"b": {"tok_s": 200.0}, "x": {"tok_s": 200.0}},
               3: {"x": {"tok_s": 50.0}}}
    assert pool.paired_ratios([sitting, {}], "x", "b", "tok_s") == [[pytest.approx(0.9), 1.0], []]
    zero = {1: {"b": {"tok_s": 0.0}, "x": {"tok_s": 5.0}}, 2: {"b": {"tok_s": 10.0}, "x": {"tok_s": math.nan}}}
    assert pool.paired_ratios([zero], "x", "b", "tok_s") == [[]]  # no ratio from a zero baseline or a NaN


def test_rounds_weigh_alike_and_the_interval_resamples_sittings(pool):
    # sitting A: rounds at 0.9 and 1.0; sitting B: one at 1.1. Estimate: the geometric mean of the three rounds,
    # (0.9 * 1.0 * 1.1)^(1/3) = 0.99^(1/3) = 0.99665 (averaging per sitting first would give 1.0216).
    # Resampling the two sittings: AA (p = 1/4) gives sqrt(0.9) = 0.94868, BB (1/4) 1.1, AB (1/2) 0.99665; the
    # 2.5th and 97.5th percentiles fall inside the AA and BB blocks.
    est, lo, hi, sittings, rounds = pool.pooled([[0.9, 1.0], [1.1], []])
    assert est == pytest.approx(0.99 ** (1 / 3))
    assert lo == pytest.approx(math.sqrt(0.9)) and hi == pytest.approx(1.1)
    assert (sittings, rounds) == (2, 3)
    one = pool.pooled([[0.95, 0.97]])  # one sitting: every draw is the same, the interval has no width
    assert one[1] == one[2] == pytest.approx(one[0]) == pytest.approx(math.sqrt(0.95 * 0.97))
    assert math.isnan(pool.pooled([[], []])[0])


def _doc(rounds: list[tuple[float, float]], *, baseline: str = "pdi=8", slo: list | None = None) -> dict:
    """A sitting of 10 s runs, last part 5 s: each round the baseline at b, ``ebctl`` at x output tok/s; each run
    two requests: 30 tokens within 1 s / 10 ms ending at 8 s, and 20 tokens with TTFT 2 s ending at 9 s."""
    recs = [{"status": "ok", "ttft": 0.5, "tpot": 0.005, "tokens": 30, "end": 8.0, "t": 1.0},
            {"status": "ok", "ttft": 2.0, "tpot": 0.005, "tokens": 20, "end": 9.0, "t": 1.0}]
    runs = [{"config": name, "round": i, "records": recs, "summary": {"tok_s": v, "tok_s_last": v}}
            for i, (b, x) in enumerate(rounds, 1) for name, v in ((baseline, b), ("ebctl", x))]
    return {"settings": {"duration": 10.0, "last": 5.0, "slo": slo}, "configs": [baseline, "ebctl"], "runs": runs}


def test_goodput_from_the_records_and_a_configuration_renamed(pool):
    rounds = pool.round_figures(_doc([(100.0, 90.0)]), (1.0, 0.01), {"ebctl": "default"})
    assert set(rounds[1]) == {"pdi=8", "default"}
    # only the first request is within both targets: 30 tokens over 10 s, and it ended in the last 5 s: 30/5
    assert rounds[1]["default"]["goodput_tok_s"] == pytest.approx(3.0)
    assert rounds[1]["default"]["goodput_last_tok_s"] == pytest.approx(6.0)
    assert "goodput_tok_s" not in pool.round_figures(_doc([(1.0, 1.0)]), None, {})[1]["ebctl"]


def test_the_command_pools_two_sittings_and_names_a_bad_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "ab.json").write_text(json.dumps(_doc([(100.0, 90.0), (100.0, 100.0)], slo=[1, 0.01])))
    (tmp_path / "b" / "ab.json").write_text(json.dumps(_doc([(100.0, 110.0)], slo=[1, 0.01])))
    cmd = [sys.executable, str(REPO / "tools" / "ab_pool.py"), str(tmp_path / "a" / "ab.json"),
           str(tmp_path / "b" / "ab.json"), "--baseline", "pdi=8"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("| ebctl |"))
    assert row.startswith("| ebctl | 2 | 3 | 0.997 [0.949, 1.100] |")  # the hand-worked case above
    assert "goodput at TTFT ≤ 1 s, TPOT ≤ 10 ms" in out and "a 0.900, 1.000; b 1.100" in out
    (tmp_path / "c.json").write_text("{not json")
    bad = subprocess.run([*cmd[:2], str(tmp_path / "c.json"), "--baseline", "pdi=8"], capture_output=True, text=True)
    assert bad.returncode == 2 and "c.json: not a tools/ab_real.py --json record" in bad.stderr
    nob = subprocess.run([*cmd[:3], "--baseline", "alone"], capture_output=True, text=True)
    assert nob.returncode == 2 and "no finished run of the baseline 'alone'" in nob.stderr


def test_the_decode_step_is_the_median_of_the_later_half_of_its_lines(pool, tmp_path):
    # the knob's lines at 8 running: 9, 9, 5, 5 ms, later half 5 and 5 -> 5 ms; ebctl's 1, 6, 6, 7 -> 6 and 7 ->
    # 6.5 ms: ratio 1.3 (slower). The first half (the learning) is left out: over all lines the ratio would be 0.857.
    doc = _doc([(100.0, 90.0)])
    doc["runs"][0]["decode_pace"] = {"8": [0.009, 0.009, 0.005, 0.005], "9": [0.001]}
    doc["runs"][1]["decode_pace"] = {"8": [0.001, 0.006, 0.006, 0.007], "9": [0.002]}
    rounds = pool.round_figures(doc, None, {}, pace=8)
    assert rounds[1]["pdi=8"]["step_s"] == pytest.approx(0.005)
    assert rounds[1]["ebctl"]["step_s"] == pytest.approx(0.0065)
    assert math.isnan(pool.round_figures(doc, None, {}, pace=9)[1]["ebctl"]["step_s"])  # one line: no median
    assert math.isnan(pool.later_pace({}, 8))  # a run recorded before ab_real kept the decode log
    assert "step_s" not in pool.round_figures(doc, None, {})[1]["ebctl"]
    (tmp_path / "ab.json").write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, str(REPO / "tools" / "ab_pool.py"), str(tmp_path / "ab.json"),
                          "--baseline", "pdi=8", "--pace", "8"], capture_output=True, text=True, check=True).stdout
    assert "| ebctl | 1 | 1 | 0.900 [0.900, 0.900] | 0.900 [0.900, 0.900] | 1.300 [1.300, 1.300] |" in out
    assert "time per decode step at 8 running" in out


def _sitting(n: int, commit: str, alone: float, ebctl: float) -> dict:
    """A sitting kept as data (docs/results/ab_real.jsonl's shape): one round, sglang alone and ebctl."""
    def run(config: str, tok_s: float, p99: float) -> dict:
        return {"config": config, "round": 1, "summary": {"tok_s": tok_s, "tok_s_last": tok_s, "ttft_p99": p99,
                                                          "tpot_p99": p99 / 100, "completed": 10, "failed": 0}}
    return {"sitting": n, "label": None, "commit": commit, "date": f"2026-01-0{n}", "machine": "a VM",
            "command": "python tools/ab_real.py --runs 1", "configs": ["alone", "ebctl"],
            "settings": {"runs": 1, "duration": 60.0, "last": 30.0, "baseline": "alone", "slo": None,
                         "server_args": "", "trace": None},
            "runs": [run("alone", alone, 0.5), run("ebctl", ebctl, 0.4)]}


def test_the_summary_of_sittings_kept_as_data_pools_them_and_names_its_command(tmp_path):
    # sitting 1: ebctl 90 against alone's 100 (0.9), sitting 2: 110 against 100 (1.1). Pooled: the geometric mean
    # sqrt(0.9 * 1.1) = 0.995; over the two sittings resampled the 2.5th and 97.5th percentiles fall in the AA
    # (0.9) and BB (1.1) blocks, as in test_rounds_weigh_alike_and_the_interval_resamples_sittings. One run each: a
    # sitting's own interval has no width.
    data = tmp_path / "ab.jsonl"
    data.write_text("".join(json.dumps(s) + "\n" for s in (_sitting(1, "c1", 100, 90), _sitting(2, "c2", 100, 110))))
    out = tmp_path / "ab.md"
    cmd = [sys.executable, str(REPO / "tools" / "ab_pool.py"), "--summary", str(data), "--report", str(out)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert out.read_text() == text
    assert f"Written by `python tools/ab_pool.py --summary {data} --report {out}` at ebctl " in text
    assert "from 2 sittings (4 runs)" in text and "## The issue's workload" in text
    assert "| `ebctl` | `alone` | 2 | 2 | c1 to c2 | 0.995 [0.900, 1.100] | 0.995 [0.900, 1.100] |" in text
    assert ("| #1 | c1 | 2026-01-01 | `ebctl` | 1 | 90 | 100 | 0.900 [0.900, 0.900] | 0.900 [0.900, 0.900] | "
            "0.40 / 0.50 | 4.0 / 5.0 | - | 0 |") in text
    assert "| #2 | c2 | 2026-01-02 | `ebctl` | 1 | 110 | 100 | 1.100 [1.100, 1.100] |" in text
    both = subprocess.run([*cmd[:4], str(data), "--baseline", "alone"], capture_output=True, text=True)
    assert both.returncode == 2 and "--summary takes its sittings from its file" in both.stderr


def test_the_results_summary_is_what_the_tool_writes_from_the_data(pool):
    # docs/results/ab_real.md is generated: regenerate it after changing docs/results/ab_real.jsonl or this tool
    # (the command its first lines name); the version it names is left out of the comparison
    cmd = "python tools/ab_pool.py --summary docs/results/ab_real.jsonl --report docs/results/ab_real.md"
    docs = pool.load_sittings(REPO / "docs" / "results" / "ab_real.jsonl")
    assert sum(len(d["runs"]) for d in docs) == 409  # every run line the records printed
    want = pool.summary(docs, cmd, "VERSION")
    have = (REPO / "docs" / "results" / "ab_real.md").read_text()
    head = f"Written by `{cmd}` at ebctl "
    assert head in have, f"docs/results/ab_real.md does not name the command that writes it: `{cmd}`"
    version = have.split(head, 1)[1].split(",", 1)[0]
    assert have == want.replace("at ebctl VERSION,", f"at ebctl {version},"), f"stale: run `{cmd}`"
