"""ebctl.ab's pure core: percentiles, TPOT of a stream, throughput bins and windows, the bootstrap of a ratio, the
issue's workload, the configuration syntax, the table and the record, /proc readings; expected values worked by
hand. No server."""

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ebctl.ab import configs, device, procs, report, stats, workloads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ab():
    """The modules' functions under one name, as the tests were first written against tools/ab_real.py."""
    return SimpleNamespace(**{k: v for m in (stats, configs, workloads, report, procs, device)
                              for k, v in vars(m).items() if not k.startswith("__")})


def test_the_command_and_its_pure_modules_import_nothing_heavy():
    code = ("import sys, ebctl.cli.ab, ebctl.ab.cli, ebctl.ab.stats, ebctl.ab.report, ebctl.ab.pool; "
            "print(sorted({'zmq', 'numpy', 'aiohttp', 'matplotlib', 'scipy', 'ebctl.link'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_percentile_interpolates_between_order_statistics(ab):
    xs = [4, 1, 3, 2]
    assert ab.percentile(xs, 50) == 2.5  # position 1.5 between 2 and 3
    assert ab.percentile(xs, 99) == pytest.approx(3.97)  # position 2.97
    assert ab.percentile(xs, 0) == 1 and ab.percentile(xs, 100) == 4
    assert ab.percentile([7.0], 99) == 7.0
    assert math.isnan(ab.percentile([], 50))


def test_tpot_and_ttft_of_a_hand_made_stream(ab):
    # sent at 10.0; tokens 1 at 10.5, 2 at 10.6, 4 at 10.9 (two in one chunk), 5 at 11.3
    events = [(10.5, 1), (10.6, 2), (10.9, 4), (11.3, 5)]
    s = ab.stream_summary(10.0, events)
    assert s["ttft"] == pytest.approx(0.5)
    assert s["tpot"] == pytest.approx((11.3 - 10.5) / 4)  # 0.2 s per token after the first
    assert s["tokens"] == 5 and s["first"] == 10.5 and s["last"] == 11.3
    assert ab.stream_summary(1.0, [(1.25, 1)])["tpot"] is None  # one token: no TPOT
    assert ab.stream_summary(1.0, [])["ttft"] is None
    assert ab.tpot(2.0, 3.0, 3) == 0.5


def test_token_histogram_and_windows(ab):
    hist: list[float] = []
    ab.add_tokens(hist, [(0.2, 1), (0.7, 3), (2.5, 4)])  # 1 + 2 tokens in [0, 1), 1 token in [2, 3)
    ab.add_tokens(hist, [(1.1, 2)])  # another request: 2 tokens in [1, 2)
    assert hist == [3.0, 2.0, 1.0]
    assert ab.window_rate(hist, 1.0, 0, 3) == pytest.approx(2.0)  # 6 tokens in 3 s
    assert ab.window_rate(hist, 1.0, 1, 3) == pytest.approx(1.5)
    assert ab.window_rate(hist, 1.0, 0.5, 1.5) == pytest.approx(1.5 + 1.0)  # half of 3 and half of 2, in 1 s
    assert ab.window_rate(hist, 1.0, 2, 10) == pytest.approx(1 / 8)  # empty bins past the end count as zero
    assert math.isnan(ab.window_rate(hist, 1.0, 2, 2))
    assert ab.bins(hist, 1.0, 2.0, 3.0) == [pytest.approx(2.5), pytest.approx(1.0)]  # [0, 2) and the short [2, 3)


def test_bootstrap_of_constant_data_has_a_zero_width_interval(ab):
    assert ab.bootstrap_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == (2.0, 2.0, 2.0)


def test_bootstrap_of_two_runs_against_one(ab):
    # resamples of [1, 3]: {1,1} mean 1 (1/4), {1,3} mean 2 (1/2), {3,3} mean 3 (1/4); the baseline is 1:
    # median 2, 2.5th percentile 1, 97.5th 3
    med, lo, hi = ab.bootstrap_ratio([1.0, 3.0], [1.0], draws=4000, seed=3)
    assert (med, lo, hi) == (2.0, 1.0, 3.0)
    assert all(math.isnan(x) for x in ab.bootstrap_ratio([], [1.0]))


def test_summary_of_a_run(ab):
    hist = [10.0] * 10  # 10 tokens/s for 10 s
    recs = [
        {"t": 0.0, "end": 2.0, "status": "ok", "ttft": 0.5, "tpot": 0.1},
        {"t": 1.0, "end": 3.0, "status": "ok", "ttft": 1.5, "tpot": 0.3},
        {"t": 7.0, "end": 9.0, "status": "ok", "ttft": 0.25, "tpot": None},  # in flight at 8, done in the drain
        {"t": 7.5, "end": 8.5, "status": "failed", "ttft": None, "tpot": None},
        {"t": 7.9, "end": None, "status": "unfinished", "ttft": 0.4, "tpot": None},
    ]
    s = ab.summarize(recs, hist, 1.0, duration=8.0, last=2.0)
    assert s["tok_s"] == 10.0 and s["tok_s_last"] == 10.0
    assert s["ttft_p50"] == 0.5 and s["tpot_p50"] == pytest.approx(0.2)  # over completed requests only
    assert (s["sent"], s["completed"], s["failed"], s["unfinished"]) == (5, 3, 1, 1)
    assert (s["in_flight_at_end"], s["completed_in_drain"]) == (3, 1)
    assert s["output_tokens"] == 100.0 and len(s["bins_30s"]) == 1


def test_issue_workload_is_seeded_and_in_range(ab):
    pairs = ab.issue_workload(480, 0)
    assert pairs == ab.issue_workload(480, 0) and pairs != ab.issue_workload(480, 1)
    assert len(pairs) == 480
    assert all(10 <= i <= 240 and 1 <= o <= 160 for i, o in pairs)
    big = ab.issue_workload(50_000, 5)
    assert sum(i for i, _ in big) / len(big) == pytest.approx(131, abs=1.5)
    assert sum(o for _, o in big) / len(big) == pytest.approx(42, abs=1.0)


def test_configuration_syntax(ab):
    assert ab.parse_config("alone") == {"name": "alone", "engine": "alone", "flags": [], "sets": [], "env": {}}
    assert ab.parse_config("mixed")["flags"] == ["--enable-mixed-chunk"]
    assert ab.parse_config("mfsd=4")["flags"] == ["--min-free-slots-delay", "4"]
    assert ab.parse_config("pdi=2")["flags"] == ["--prefill-decode-interval", "2"]
    c = ab.parse_config("ebctl:mixed;controller.mode=off; --schedule-policy lpm")
    assert c["engine"] == "ebctl" and c["sets"] == ["controller.mode=off"]
    assert c["flags"] == ["--enable-mixed-chunk", "--schedule-policy", "lpm"]
    assert ab.parse_config("alone:--schedule-conservativeness 0.5")["flags"] == ["--schedule-conservativeness", "0.5"]
    c = ab.parse_config("plugin:pdi=8;engine.fault=next_batch:1")  # sglang with the plugin loaded, no ebctl start
    assert c == {"name": "plugin:pdi=8;engine.fault=next_batch:1", "engine": "plugin",
                 "flags": ["--prefill-decode-interval", "8"], "sets": ["engine.fault=next_batch:1"], "env": {}}
    # an upper-case NAME=VALUE is the server's environment (ebctl start gives sglang PYTHONUNBUFFERED=1)
    assert ab.parse_config("plugin:pdi=8;PYTHONUNBUFFERED=1")["env"] == {"PYTHONUNBUFFERED": "1"}
    assert ab.parse_config("alone:MALLOC_ARENA_MAX=2;FOO=")["env"] == {"MALLOC_ARENA_MAX": "2", "FOO": ""}
    for bad in ("stock", "alone:controller.mode=off", "pdi=8;engine.fault=next_batch:1", "ebctl:oops", "mfsd=",
                "alone:pythonunbuffered=1"):
        with pytest.raises(ValueError):
            ab.parse_config(bad)
    with pytest.raises(ValueError, match=r"unknown key 'engine\.faults'"):  # caught before the sitting starts
        ab.parse_config("plugin:engine.faults=next_batch:1")
    with pytest.raises(ValueError, match=r"controller\.mode='sometimes'"):
        ab.parse_config("ebctl:controller.mode=sometimes")


def test_status_text_prints_gain_and_exploration_when_present(ab):
    st = {"engines": {"dp0": {"mode": "eb", "k": 4, "n_max": 16, "gain": {"eb": 0.0312345, "n": 3},
                              "exploration": 0.1}}}
    assert ab.status_text(ab.engine_status(st)) == 'mode eb k 4 n_max 16 gain {"eb":0.03123,"n":3} exploration 0.1'
    assert ab.status_text(ab.engine_status({"engines": {"dp0": {"mode": "off", "k": 1, "n_max": 16}}})) == \
        "mode off k 1 n_max 16"
    assert ab.status_text(ab.engine_status(None)) == "no status"


def test_a_status_read_is_one_row_of_the_record(ab):
    engine = {"mode": "eb", "k": 4, "n_max": 16, "output_tok_s": 687.4,
              "tuner": {"state": "trial", "incumbent": "eb@6"},
              "gain": {"vs_stock": 0.318, "low": 0.282, "high": 0.355, "explore_share": 0.0042}}
    run = {"status": [{"t": 60.2, "status": {"engines": {"dp0": engine}}}, {"t": 120.0, "status": None}]}
    assert ab.status_rows(run) == [
        "| 60 | eb | 4 | 16 | trial | eb@6 | 687 | +31.8% [+28.2%, +35.5%] | 0.4% |",
        "| 120 | - | - | - | - | - | - | - | - |"]


def test_goodput_counts_the_tokens_of_requests_within_both_targets(ab):
    recs = [
        {"status": "ok", "ttft": 0.5, "tpot": 0.04, "tokens": 10},   # meets both
        {"status": "ok", "ttft": 1.5, "tpot": 0.04, "tokens": 20},   # TTFT over 1.0
        {"status": "ok", "ttft": 0.2, "tpot": 0.06, "tokens": 30},   # TPOT over 0.05
        {"status": "ok", "ttft": 1.0, "tpot": None, "tokens": 1},    # one token: TTFT alone, on the limit: meets
        {"status": "failed", "ttft": 0.1, "tpot": 0.01, "tokens": 5},  # failed: a miss whatever its times
        {"status": "unfinished", "ttft": None, "tpot": None, "tokens": 0},
    ]
    g = ab.goodput(recs, 10.0, (1.0, 0.05))
    assert g["goodput_tok_s"] == pytest.approx((10 + 1) / 10.0) and g["attained"] == pytest.approx(2 / 6)
    assert math.isnan(ab.goodput([], 10.0, (1.0, 0.05))["attained"])
    # --from-json reads a one-token request's TPOT (None in the JSON) back as NaN: still TTFT alone
    back = [{**r, "tpot": math.nan if r["tpot"] is None else r["tpot"]} for r in recs]
    assert ab.goodput(back, 10.0, (1.0, 0.05)) == g
    # the last 4 of 10 s: the good requests that ended from 6 s on (the 10-token one at 7 s; the one-token one
    # at 5 s does not count; one that ended in the drain, at 11 s, does): 10 + 3 tokens over 4 s
    ends = [7.0, 2.0, 8.0, 5.0, 9.0, None]
    timed = [{**r, "end": e} for r, e in zip(recs, ends, strict=True)]
    timed.append({"status": "ok", "ttft": 0.3, "tpot": 0.01, "tokens": 3, "end": 11.0})
    got = ab.goodput(timed, 10.0, (1.0, 0.05), last=4.0)
    assert got["goodput_last_tok_s"] == pytest.approx((10 + 3) / 4.0)
    assert got["goodput_tok_s"] == pytest.approx((10 + 1 + 3) / 10.0)


def test_slo_option_and_the_goodput_columns(ab):
    assert ab.parse_slo("1.5,0.05") == (1.5, 0.05)
    for bad in ("1.5", "a,b", "0,0.05", "1,-1", "1,2,3"):
        with pytest.raises(ValueError, match="--slo"):
            ab.parse_slo(bad)
    # two configurations, one run each: alone's good tokens 40 of 10 s, ebctl's 60: goodput ratio 1.5
    def run(name, good_tokens):
        recs = [{"status": "ok", "ttft": 0.1, "tpot": 0.01, "tokens": good_tokens, "end": 6.0},
                {"status": "ok", "ttft": 9.0, "tpot": 0.01, "tokens": 100, "end": 7.0}]
        summary = {"tok_s": 14.0, "tok_s_last": 14.0, "ttft_p50": 0.1, "ttft_p99": 9.0, "tpot_p50": 0.01,
                   "tpot_p99": 0.01, "completed": 2, "failed": 0, "unfinished": 0}
        return {"config": name, "summary": summary, "records": recs}
    text, summary = ab.table(["alone", "ebctl"], [run("alone", 40), run("ebctl", 60)], "alone", 5.0,
                             slo=(1.0, 0.05), duration=10.0)
    assert summary["ebctl"]["goodput_tok_s"] == 6.0 and summary["ebctl"]["attained"] == 0.5
    assert summary["ebctl"]["goodput_ratio"][0] == pytest.approx(1.5)
    assert "TTFT ≤ 1 s, TPOT ≤ 50 ms" in text.splitlines()[0]
    assert "| 50.0% | 1.500 [1.500, 1.500] | 1.500 [1.500, 1.500] |" in text  # the good ones ended in the last 5 s
    plain, _ = ab.table(["alone"], [run("alone", 40)], "alone", 5.0)
    assert "goodput" not in plain
    # the record --report writes: a live run's settings hold the targets as parsed (a tuple), --from-json's as
    # JSON reads them back (a list); both records show the goodput columns
    whole = {"in_flight_at_end": 0, "completed_in_drain": 0}  # what a real run's summary has besides
    runs = [{**r, "summary": {**r["summary"], **whole}, "round": 1, "client_cpu_s": 1.0, "client_wall_s": 10.0,
             "ready_s": 30.0, "status": []} for r in (run("alone", 40), run("ebctl", 60))]
    for slo in ((1.0, 0.05), [1.0, 0.05]):
        doc = {"settings": {"slo": slo, "last": 5.0, "duration": 10.0, "runs": 1, "concurrency": 2, "pin": True,
                            "baseline": "alone"}, "configs": ["alone", "ebctl"], "runs": runs, "base_args": [],
               "workload": {"source": "issue", "seed": 0}, "bin_s": 30.0}
        assert "| 50.0% | 1.500 [1.500, 1.500] | 1.500 [1.500, 1.500] |" in ab.report(doc, "cmd"), type(slo)
    # controller.mode = off: the daemon's status has no tuner (null, read back by --from-json as NaN)
    off = {"mode": "off", "k": 1, "n_max": 16, "tuner": math.nan, "gain": math.nan, "output_tok_s": 980.0}
    runs[1]["status"] = [{"t": 60.0, "status": {"engines": {"dp0": off}}}]
    assert "| 60 | off | 1 | 16 | - | - | 980 | - | - |" in ab.report(doc, "cmd").splitlines()


def test_bootstrap_leaves_out_draws_with_a_zero_baseline(ab):
    # baseline goodput 0, 0, 3: a draw of three all-zero baselines (8/27 ≈ 30% of draws) has no ratio and is left
    # out; in the others the baseline mean is 1, 2 or 3 against 3: ratios 3, 1.5 or 1, all finite
    med, lo, hi = ab.bootstrap_ratio([3.0, 3.0, 3.0], [0.0, 0.0, 3.0])
    assert all(math.isfinite(x) for x in (med, lo, hi)) and 1.0 <= lo <= med <= hi <= 3.0
    assert all(math.isnan(x) for x in ab.bootstrap_ratio([1.0], [0.0, 0.0]))  # no baseline at all: no ratio


def _fake_proc(root: Path, procs: dict[int, tuple[int, str, str, int, int, list[int]]]) -> Path:
    """A /proc with ``pid: (ppid, comm, cmdline, utime, stime, tids)`` (proc(5): stat fields 4, 14, 15)."""
    for pid, (ppid, comm, cmd, ut, st, tids) in procs.items():
        d = root / str(pid)
        (d / "task").mkdir(parents=True)
        for t in tids:
            (d / "task" / str(t)).mkdir()
        fields = ["S", str(ppid), *["0"] * 9, str(ut), str(st), *["0"] * 30]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())
    (root / "self").mkdir()  # not a pid: skipped
    return root


def test_the_process_tree_and_its_cpu_by_name_from_proc(ab, tmp_path):
    import os

    tick = os.sysconf("SC_CLK_TCK")
    # 10 = ebctl start; 30 its daemon and 40 sglang (a child listed before its parent in pid order: 20 under 40),
    # 20 the scheduler; 50 a process outside the tree
    proc = _fake_proc(tmp_path, {
        10: (1, "python", "python -m ebctl --runtime-dir rt start --engine sglang", 1 * tick, 0, [10]),
        30: (10, "python", "python -m ebctl.daemon --config c", 2 * tick, 1 * tick, [30]),
        40: (10, "python", "python -m sglang.launch_server", 5 * tick, 2 * tick, [40, 41]),
        20: (40, "sglang::schedul", "sglang::scheduler", 90 * tick, 3 * tick, [20, 21, 22]),
        50: (1, "python", "python other", 7 * tick, 0, [50]),
    })
    assert ab.tree(10, proc) == [10, 20, 30, 40]
    assert ab.tree_cpu(10, proc) == {"ebctl start": 1.0, "ebctl daemon": 3.0, "python": 7.0,
                                     "sglang::schedul": 93.0}


def _task(root: Path, pid: int, tid: int, name: str, ticks: int, cores: str, vol: int, invol: int,
          minflt: int = 0, majflt: int = 0) -> None:
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    # proc(5): fields 5-9, minflt (10), cminflt, majflt (12), cmajflt, then utime (14)
    (d / "stat").write_text(f"{tid} ({name}) S 1 0 0 0 0 0 {minflt} 0 {majflt} 0 {ticks} 0 {' '.join(['0'] * 30)}\n")
    (d / "status").write_text(f"Name:\t{name}\nCpus_allowed_list:\t{cores}\nvoluntary_ctxt_switches:\t{vol}\n"
                              f"nonvoluntary_ctxt_switches:\t{invol}\n")


def test_the_schedulers_threads_switches_and_cores_from_proc(ab, tmp_path):
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def reading(t: int) -> dict:  # t = 0, 1: two readings 10 s apart; pid 7 is not a scheduler
        root = tmp_path / str(t)
        for pid, comm in ((20, "sglang::schedul"), (7, "python")):
            (root / str(pid)).mkdir(parents=True)
            (root / str(pid) / "comm").write_text(comm + "\n")
        _task(root, 20, 20, "sglang::schedul", (100 + 9 * t) * tick, "0", 1000 + 300 * t, 5 + 20 * t,
              minflt=4000 + 500 * t, majflt=3 + t)
        _task(root, 20, 21, "ebctl-link-dp0", (2 + t) * tick, "1", 0, 0, minflt=10 + 100 * t)
        _task(root, 20, 22, "ZMQbg/IO/0", 1 * tick, "1", 0, 0)
        if t:  # started after the pin by the main thread: its core
            _task(root, 20, 23, "ZMQbg/IO/0", 2 * tick, "0", 0, 0)
        _task(root, 7, 7, "python", 50 * tick, "0", 9, 9)
        return ab.scheduler_threads([20, 7], root)

    u = ab.thread_use(reading(0), reading(1), 10.0)
    # by hand: (1300 - 1000) / 10 = 30 voluntary and (25 - 5) / 10 = 2 involuntary per s; the main thread 9 s
    # of CPU, the link thread 1 s, the two ZeroMQ threads 3 - 1 = 2 s; the second one shares core 0
    assert u["main_voluntary_per_s"] == pytest.approx(30.0) and u["main_involuntary_per_s"] == pytest.approx(2.0)
    assert {k: t["cpu_s"] for k, t in u["threads"].items()} == pytest.approx(
        {"main": 9.0, "ebctl-link-dp0": 1.0, "ZMQbg/IO/0": 2.0})
    assert u["threads"]["ZMQbg/IO/0"]["cores"] == ["0", "1"] and u["on_main_core"] == ["ZMQbg/IO/0"]
    line = ab.run_line(1, 1, {"config": "x", "pinned": 1, "scheduler_threads": u, "status": [],
                              "summary": {k: 0 for k in ("tok_s", "tok_s_last", "ttft_p50", "ttft_p99", "tpot_p50",
                                                         "tpot_p99", "completed", "failed", "in_flight_at_end",
                                                         "completed_in_drain", "unfinished")},
                              "client_cpu_s": 1, "client_wall_s": 10, "ready_s": 1}, 1)
    # faults by hand: the main thread (4500 - 4000) / 10 = 50 minor and (4 - 3) / 10 = 0.1 major per s; all
    # threads (500 + 100) / 10 = 60 minor per s
    assert (u["minflt_per_s"], u["majflt_per_s"], u["all_minflt_per_s"]) == pytest.approx((50.0, 0.1, 60.0))
    assert "30 voluntary, 2 involuntary switches/s, 50 minor and 0 major page faults/s (all threads: 60 minor); " \
           "on its core too: ZMQbg/IO/0" in line


def test_sglangs_decode_log_gives_the_step_time_at_each_running_count(ab):
    # two lines in sglang 0.5.23's format (metrics_reporter.py 1041), one prefill line, one at 0 running
    log = ("[2026-11-28 16:11:30] Prefill batch, #new-seq: 1, #new-token: 99, #cached-token: 0, token usage: 0.1\n"
           "[2026-11-28 16:11:30] Decode batch, #running-req: 12, #token: 1762, token usage: 0.11, cpu graph: False, "
           "gen throughput (token/s): 1500.00, #queue-req: 0\n"
           "[2026-11-28 16:11:31] Decode batch, #running-req: 12, #token: 1700, token usage: 0.10, cpu graph: False, "
           "gen throughput (token/s): 2000.00, #queue-req: 3\n"
           "[2026-11-28 16:11:32] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, cpu graph: False, "
           "gen throughput (token/s): 0.00, #queue-req: 0\n")
    # by hand: 12 / 1500 = 8 ms and 12 / 2000 = 6 ms per step
    assert ab.decode_pace(log) == {12: [pytest.approx(0.008), pytest.approx(0.006)]}
    runs = [{"config": "a", "decode_pace": {12: [0.008, 0.006], 16: [0.010]}},
            {"config": "b", "decode_pace": {"12": [0.005]}},  # keys as JSON gives them back
            {"config": "b", "decode_pace": {12: [0.004, 0.006]}}]
    rows = ab.pace_table(["a", "b"], runs)
    # n = 16 is not in b's runs: only n = 12; medians 7 ms (a) and 5 ms (b)
    assert rows[-4:] == ["| configuration | n = 12 |", "|---|---|", "| a | 7.00 (2) |",
                         "| b | 5.00 (3) |"]


def test_rotated_rounds_put_each_configuration_first_once_in_as_many_rounds(ab):
    # by hand: three configurations over four rounds; round 4 starts over
    assert [ab.round_order(["a", "b", "c"], r, "rotate") for r in (1, 2, 3, 4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert ab.round_order(["a", "b"], 2, "given") == ["a", "b"]
    assert ab.round_order(["a"], 5, "rotate") == ["a"]


def test_the_record_names_the_commit_and_a_changed_work_tree(ab, tmp_path):
    assert ab.head_commit(tmp_path) is None  # not a git work tree
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("a")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert ab.head_commit(tmp_path) == sha
    (tmp_path / "g").write_text("untracked: not the code that ran")
    assert ab.head_commit(tmp_path) == sha
    (tmp_path / "f").write_text("b")
    assert ab.head_commit(tmp_path) == sha + "+"
