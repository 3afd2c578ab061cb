"""tools/bench_hook.py runs the CPU server with one pinned OpenMP thread, says so, and ``--all-cores`` really
unpins it (the test harness's Server pins unless told otherwise). No server is started here."""

import sys
from pathlib import Path

import pytest
from tools_module import tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_hook():
    with tool("bench_hook") as module:  # puts tests/sglang (the harness) on sys.path
        yield module
    sys.modules.pop("ab_real", None)  # imported by bench_hook from tools/


class Started(Exception):
    """Raised by the stand-in Server once it has recorded its environment."""


def server_env_of(bench_hook, monkeypatch, config: str, torch: dict[str, str]) -> dict[str, str]:
    seen: dict[str, str] = {}

    def server(venv, model, work, args, **kw):
        seen.update(kw.get("env") or {})
        raise Started

    class Daemon:  # the plugin's configurations start a daemon first; a stand-in that only has a config path
        def __init__(self, work, settings):
            self.cfg_path = work / "ebctl.toml"

        def stop(self):
            pass

    monkeypatch.setattr(bench_hook, "Server", server)
    monkeypatch.setattr(bench_hook, "Daemon", Daemon)
    with pytest.raises(Started):
        bench_hook.run_one(config, Path("venv"), Path("model"), Path("/tmp/bench-hook-test"), {"max_running": 16},
                           torch)
    return seen


@pytest.mark.parametrize("config", ["stock", "ebctl off", "ebctl eb"])
def test_every_configuration_runs_pinned_by_default(bench_hook, monkeypatch, config):
    pinned = bench_hook.torch_env(all_cores=False)
    # one OpenMP thread, sglang's bind list naming core 0: what the issue measured as the engine's own speed
    assert pinned == {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
    assert server_env_of(bench_hook, monkeypatch, config, pinned) == pinned
    assert bench_hook.describe_torch(pinned).startswith("torch pinned: one OpenMP thread")


def test_all_cores_really_unpins_and_says_so(bench_hook, monkeypatch):
    unpinned = bench_hook.torch_env(all_cores=True)
    assert unpinned["SGLANG_CPU_OMP_THREADS_BIND"] == "all"  # sglang's default: every core of the NUMA node
    assert server_env_of(bench_hook, monkeypatch, "stock", unpinned) == unpinned
    assert "NOT pinned" in bench_hook.describe_torch(unpinned)


def test_the_report_names_the_threading(bench_hook):
    row = {"config": "stock", "round": 0, "iterations": 100, "duration_s": 7.0, "sched_cpu_s": 6.0,
           "daemon_cpu_s": 0.0, "output_tok_s": 1500.0, "median_itl_ms": 9.0, "sched_cpus_allowed": "0-1"}
    text = bench_hook.report([row], {"prompts": 300, "concurrency": 24, "input_len": 64, "output_len": 64,
                                     "max_running": 16}, bench_hook.torch_env(all_cores=False))
    assert "torch pinned: one OpenMP thread (OMP_NUM_THREADS=1, SGLANG_CPU_OMP_THREADS_BIND=0)" in text
    assert "the scheduler's main thread allowed on CPUs 0-1" in text


def test_each_round_is_compared_with_stocks_run_of_that_round(bench_hook):
    # round 0: stock 10 s, off 11 s (+10%); round 1 (the machine slower): stock 20 s, off 19 s (−5%); 1,000
    # iterations each: +1,000 µs and −1,000 µs per iteration. Medians would say off 15 s against stock's 15 s.
    rows = [{"config": "stock", "round": 0, "main_cpu_s": 10.0}, {"config": "stock", "round": 1, "main_cpu_s": 20.0},
            {"config": "ebctl off", "round": 0, "main_cpu_s": 11.0, "iterations": 1000},
            {"config": "ebctl off", "round": 1, "main_cpu_s": 19.0, "iterations": 1000},
            {"config": "ebctl eb", "round": 2, "main_cpu_s": 5.0, "iterations": 1000}]  # no stock run in round 2
    mean, lo, hi, per_iter, n = bench_hook.paired(rows, "ebctl off", "main_cpu_s")
    assert mean == pytest.approx((1.1 * 0.95) ** 0.5)
    assert (lo, hi, n) == (pytest.approx(0.95), pytest.approx(1.1), 2)
    assert per_iter == pytest.approx(0.0)
    assert bench_hook.paired(rows, "ebctl eb", "main_cpu_s") is None
