"""Fail open in a real server: an exception inside a hook switches the plugin off in that scheduler, logs
once with the traceback, restores sglang's launch settings, and the server serves every request.

The fault is injected with the test switch ``engine.fault = "batch_result:40"``: the 40th call of the
``process_batch_result`` hook raises *after* the original ran (the case where calling it again would
process a batch twice). The policy is ``mb`` so that the plugin had changed ``is_mixed_chunk`` (launched
False, mixing allowed by the ``engine.mixed_without_flag`` opt-in: nothing rules mixing out on this server)
and capped admission when the fault hits. (The dead-daemon faults are in test_sglang_overlap.py.)

On a ``--tp-size 2`` server, in both event loops, the fault is injected on the follower rank only
(``"run_batch:60@1"``): the follower tells the source, keeps applying the group's eb policy meanwhile, and
the source's last envelope takes both ranks to stock at one iteration; every request completes.
"""

from __future__ import annotations

import json
import time

import pytest
from harness import BURST, EB_K4_N8, TP_TORCH_CORES, Rig, wait_for

from ebctl.protocol import BatchKind

pytestmark = pytest.mark.sglang

MB = {"controller.mode": "mb", "controller.cold_mode": "mb", "controller.k_override": "4",
      "controller.n_override": "8"}


@pytest.fixture(scope="module")
def rig(sglang_venv, tiny_model, module_workdir):
    r = Rig(sglang_venv, tiny_model, module_workdir, ["--max-running-requests", "16"], daemon=MB,
            engine={"engine.fault": "batch_result:40", "engine.mixed_without_flag": "true"})
    yield r
    r.close()


def test_hook_exception_turns_the_plugin_off_and_the_server_serves_on(rig):
    st0 = rig.wait_policy("mb", n_max=8)
    assert st0["enabled"] and st0["is_mixed_chunk"] is True
    res = rig.bench(**BURST, seed=21)
    assert res["completed"] == BURST["num_prompts"]
    st = rig.server.ebctl()
    assert not st["enabled"] and st["error"] == "exception in hook batch_result", st
    assert st["is_mixed_chunk"] is False  # back to its launch value
    assert st["link"] is None  # sockets closed: the daemon hears nothing more from this engine
    log = rig.server.log()
    assert log.count("ebctl: exception in hook") == 1
    assert "RuntimeError: ebctl: injected fault in hook batch_result" in log
    assert "Scheduler hit an exception" not in log
    sent = len(rig.tap.reports)
    assert sum(r.kind is not BatchKind.IDLE for r in rig.tap.reports) == 39  # every batch until the fault
    # from now on: stock sglang, every request served, nothing reported, no second log
    res = rig.bench(**BURST, seed=22)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.5)
    assert len(rig.tap.reports) == sent
    assert rig.server.log().count("ebctl: exception in hook") == 1
    assert rig.server.alive()
    eng = wait_for(rig.daemon.engine, 5, "the daemon's record of dp0")
    assert eng["reports"] == sent


@pytest.fixture(scope="module", params=["overlap", "normal"])
def tp_rig(request, sglang_venv, tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"tpf-{request.param}")
    traces = workdir / "traces"
    traces.mkdir()
    args = ["--tp-size", "2", "--max-running-requests", "16"]
    if request.param == "normal":
        args.append("--disable-overlap-schedule")
    r = Rig(sglang_venv, tiny_model, workdir, args, daemon=EB_K4_N8,
            engine={"engine.fault": "run_batch:60@1", "engine.trace_dir": str(traces)}, env=TP_TORCH_CORES)
    r.traces = traces
    yield r
    r.close()


def test_a_follower_fault_takes_both_ranks_to_stock_at_one_generation(tp_rig):
    """Only the source's status reaches GET /server_info (a follower has no socket to the tokenizer), so each
    rank's trace shows where it went stock: its last line, the same iteration and generation on both."""
    rig = tp_rig
    st = rig.wait_policy("eb", k=4, n_max=8)
    assert st["group_size"] == 2 and st["reporting"]
    assert rig.bench(**BURST, seed=23)["completed"] == BURST["num_prompts"]  # the fault hits along the way

    def stopped() -> dict | None:
        s = rig.server.ebctl()
        if s["enabled"]:
            rig.generate(2)  # the fault comes at the follower's 60th forward: a few more, if need be
            return None
        return s
    st = wait_for(stopped, 60, "the follower's fault to reach the source")
    assert not st["enabled"] and st["error"] == "follower rank 1: exception in hook run_batch", st
    assert (st["policy_version"], st["mode"], st["is_mixed_chunk"]) == (-1, "none", False)
    r0, r1 = ([json.loads(x) for x in (rig.traces / f"trace.dp0.r{i}.jsonl").read_text().splitlines()] for i in (0, 1))
    faults = [x for x in r1 if "fault" in x]
    assert [x["fault"] for x in faults] == ["exception in hook run_batch"]  # told once
    steered = [x for x in r1 if "fault" not in x]
    off0, off1 = r0[-1], steered[-1]  # each rank's last line: where it went stock
    assert off0["off"] == st["error"] and off1["off"] == "exception in hook run_batch"
    assert (off0["it"], off0["gen"]) == (off1["it"], off1["gen"]) and off0["gen"] == st["group_generation"]
    assert r0[:-1] == steered[:-1]  # the same decisions and batches on both ranks until then: the faulted
    # follower kept the group's policy
    assert faults[0]["it"] <= off1["it"] and faults[0]["gen"] < off1["gen"]
    assert any(x.get("v", -1) >= 0 for x in r0[:-1])  # steered before it
    # stock from then on, on both ranks: every request served, nothing more traced, no second fault logged
    assert rig.bench(**{**BURST, "num_prompts": 16}, seed=24)["completed"] == 16
    assert len((rig.traces / "trace.dp0.r0.jsonl").read_text().splitlines()) == len(r0)
    log = rig.server.log()
    assert log.count("ebctl: exception in hook run_batch on follower rank 1") == 1
    assert log.count("ebctl: follower rank 1 of engine dp0 reported") == 1
    assert "Scheduler hit an exception" not in log and rig.server.alive()
