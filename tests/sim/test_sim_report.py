"""The simulate report: latency beside throughput, who wins on which measure, and why goodput can be 0."""

from __future__ import annotations

import os

from rich.console import Console

from ebctl.sim import cli, runner


def row(policy, tok, ttft50, ttft99, tpot99, itl99, good, **kw):
    return {"policy": policy, "tok_per_s": tok, "total_tok_per_s": tok * 6, "req_per_s": tok / 200,
            "ttft_s": {"p50": ttft50, "p99": ttft99}, "tpot_s": {"p50": tpot99 / 2, "p99": tpot99},
            "itl_s": {"p99": itl99}, "goodput_frac": good, "preemptions": 0, "peak_kv_frac": 0.9,
            "mode_share": {}, **kw}


RESULTS = [row("v0", 1000.0, 1.0, 4.0, 0.20, 0.5, 0.30, ttft_slo_frac=0.8, tpot_slo_frac=0.4),
           row("mb", 900.0, 1.5, 3.0, 0.15, 0.4, 0.50, ttft_slo_frac=0.7, tpot_slo_frac=0.6),
           row("eb-auto", 1050.0, 2.0, 6.0, 0.18, 3.0, 0.10, ttft_slo_frac=0.5, tpot_slo_frac=0.5),
           row("eb+", 1050.0, 2.0, 6.0, 0.18, 3.0, 0.10, ttft_slo_frac=0.5, tpot_slo_frac=0.5)]


def test_winners_per_measure_with_ties():
    w = {x["measure"]: (x["policies"], x["value"]) for x in cli.winners(RESULTS)}
    assert w == {"output tok/s": (["eb-auto", "eb+"], 1050.0), "TTFT p50": (["v0"], 1.0),
                 "TTFT p99": (["mb"], 3.0), "TPOT p99": (["mb"], 0.15), "ITL p99": (["mb"], 0.4),
                 "goodput": (["mb"], 0.5)}


def test_winners_leave_the_sweep_rows_to_the_best_theta_line():
    w = cli.winners([*RESULTS, row("eb:theta=0.50,n=300", 2000.0, 0.1, 0.2, 0.01, 0.01, 0.9)])
    assert all("eb:theta=0.50,n=300" not in x["policies"] for x in w)


def test_no_goodput_note_when_some_policy_meets_the_slo():
    assert cli.notes(RESULTS, 2.0, 0.1) == []


def test_goodput_note_gives_the_queueing_arithmetic():
    # c = 512 in flight, 346 running: 166 queue; at 8.56 req/s each waits 166 / 8.56 = 19.39 s (Little's law)
    stock = row("v0", 1784.0, 17.4, 37.7, 0.406, 0.59, 0.0, ttft_slo_frac=0.01, tpot_slo_frac=0.02,
                concurrency=512, mean_running=346.0)
    stock["req_per_s"] = 8.56
    eb = row("eb-auto", 1827.0, 23.2, 37.7, 0.428, 3.3, 0.004, ttft_slo_frac=0.01, tpot_slo_frac=0.06)
    (note,) = cli.notes([stock, eb], 2.0, 0.1)
    assert note.startswith("goodput ≤ 1% for every policy: at most 1% of requests met TTFT ≤ 2 s and 6% TPOT ≤ 100 ms")
    assert "166 queue for about 19.4 s each at 8.56 req/s" in note and "--concurrency 346 or less" in note


def test_an_open_loop_run_gets_no_queueing_arithmetic():
    stock = row("v0", 1.0, 30.0, 60.0, 0.5, 0.6, 0.0, concurrency="open-loop", mean_running=10.0)
    (note,) = cli.notes([stock], 2.0, 0.1)
    assert "Little" not in note


def test_the_default_slo_is_mlperfs_server_limit_for_an_8b_model():
    # mlcommons/inference loadgen/mlperf.conf: llama3_1-8b.Server.ttft_latency = 2000, tpot_latency = 100 (ms)
    assert (runner.Slo().ttft_s, runner.Slo().tpot_s) == (2.0, 0.1)


def test_80_columns_put_latency_beside_throughput_and_name_the_winners():
    header = {"profile": "p", "workload": "w", "requests": 4000, "concurrency": 512,
              "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "winners": cli.winners(RESULTS),
              "notes": ["a note"]}
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    cli.render(header, RESULTS, console)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    first = text.split("┘")[0]  # the first part of the split table
    for needle in ("out tok/s", "TTFT p50/p99 s", "TPOT p50/p99 ms", "1,050 +5.0%", "900 -10.0%", "1.00/4.00"):
        assert needle in first, needle
    flat = " ".join(text.split())
    assert "80%/40%" in flat  # SLO met: TTFT / TPOT alone
    assert "TTFT ≤ 2 s and TPOT ≤ 100 ms" in flat
    assert "best · output tok/s: eb-auto, eb+ (1,050) · TTFT p50: v0 (1.00 s)" in flat
    assert "ITL p99: mb (400.0 ms) · goodput: mb (50%)" in flat and "note: a note" in flat
