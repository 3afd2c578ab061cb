"""A tensor-parallel server (``--tp-size 2``, two scheduler ranks in lockstep) is steered: both ranks apply
the source rank's policy at the same iterations and take the same gate decisions (their traces match line
for line), EB(k = 4, n_max = 8) holds, every request completes, and kill -9 of the daemon takes both ranks
back to stock together. Last, a fault on the follower rank only (``engine.fault = "abort_output:1@1"``: its
first ``send_abort_output``, which nothing before that test calls) takes both ranks to stock at one iteration:
the follower tells the source, keeps applying the group's policy meanwhile, and the source's farewell envelope
switches the group off. The lockstep in both event loops; the daemon's death and the follower's fault in the
overlap loop, sglang's default (CI time: each costs about 20 s a loop). Real sglang 0.5.23 on CPU, real
daemon, sglang's client."""

from __future__ import annotations

import json
import threading
import time

import pytest
from harness import BURST, EB_K4_N8, TP_TORCH_CORES, Rig, eb_check, post_json, wait_for

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module", params=["overlap", "normal"])
def rig(request, sglang_venv, tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"tp-{request.param}")
    traces = workdir / "traces"
    traces.mkdir()
    args = ["--tp-size", "2", "--max-running-requests", "16"]
    if request.param == "normal":
        args.append("--disable-overlap-schedule")
    r = Rig(sglang_venv, tiny_model, workdir, args, daemon=EB_K4_N8,
            engine={"engine.trace_dir": str(traces), "engine.fault": "abort_output:1@1"}, env=TP_TORCH_CORES)
    r.traces = traces
    yield r
    r.close()


def traces(rig) -> tuple[list[dict], list[dict]]:
    """Both ranks' traces, cut to the lines both have written: the files are read one after the other while the
    ranks go on (idle iterations after the load), so the one read second may hold an iteration or two more."""
    a, b = (rig.traces / f"trace.dp0.r{i}.jsonl" for i in (0, 1))
    r0, r1 = ([json.loads(x) for x in p.read_text().splitlines()] for p in (a, b))
    assert abs(len(r0) - len(r1)) <= 8, (len(r0), len(r1))  # a moment's lag, not ranks that went apart
    n = min(len(r0), len(r1))
    return r0[:n], r1[:n]


def decisions(lines: list[dict]) -> list[dict]:
    """The gate decisions of a trace (the other lines are the steps planned)."""
    return [d for d in lines if "reason" in d]


def test_both_ranks_apply_one_policy_and_decide_alike(rig):
    st = rig.set_eb()
    assert st["steering"] and st["group_size"] == 2 and st["reporting"] and st["policy_version"] >= 0
    assert rig.daemon.engine()["group_size"] == 2  # the daemon sees one engine for the group
    mark = rig.tap.mark()
    assert rig.bench(**BURST, seed=21)["completed"] == BURST["num_prompts"]
    time.sleep(0.5)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st["policy_version"]]
    chk = eb_check(reps, k=4, n_max=8)
    assert not chk["over_cap"] and not chk["early_refill"] and not chk["short_refill"], chk
    assert chk["refills"] >= 3 and chk["held"] > 0, chk
    assert max(r.running for r in reps) == 8
    r0, r1 = traces(rig)
    assert len(r0) > 50 and r0 == r1  # the same decisions and batches, at the same iterations, same policy
    assert {d["reason"] for d in decisions(r0)} >= {"threshold", "wait_k"}


def queued_load(rig, *, num_prompts: int, seed: int, queued: int) -> tuple[threading.Thread, dict]:
    """A load of 24 in flight on a thread (its result in the dict once joined), returned once ``queued`` reports
    showed the batch at the cap of 8 with requests waiting behind it."""
    mark = rig.tap.mark()
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(rig.bench(num_prompts=num_prompts, input_len=32,
                                                                   output_len=48, range_ratio=0.5, concurrency=24,
                                                                   seed=seed)))
    load.start()
    wait_for(lambda: sum(r.running >= 8 and r.waiting > 0 for r in rig.tap.since(mark)) >= queued, 60,
             "the load to fill the batch and queue behind it")
    return load, result


@pytest.mark.parametrize("rig", ["overlap"], indirect=True)
def test_kill9_of_the_daemon_takes_both_ranks_to_stock_together(rig):
    st = rig.set_eb()
    n_before = len(decisions(traces(rig)[0]))
    load, result = queued_load(rig, num_prompts=120, seed=22, queued=20)
    rig.daemon.kill9()
    load.join(300)
    try:
        assert result.get("completed") == 120, result  # sglang's client completed every request
        r0, r1 = traces(rig)
        assert r0 == r1  # through the expiry too
        after = decisions(r0)[n_before:]
        versions = [d["v"] for d in after]
        assert st["policy_version"] in versions and versions[-1] == -1  # steered, then stock
        flip = versions.index(-1)
        assert all(v == -1 for v in versions[flip:])  # stock from one iteration on, on both ranks
        assert rig.server.ebctl()["mode"] == "none" and rig.server.alive()
    finally:
        rig.daemon.start()
    rig.wait_policy("eb", k=4, n_max=8)  # a new daemon: steered again


@pytest.mark.parametrize("rig", ["overlap"], indirect=True)
def test_a_follower_fault_takes_both_ranks_to_stock_at_one_generation(rig):
    """The last test of the module: the plugin stays off afterwards. An abort of every request (the queued
    ones are answered through ``send_abort_output`` on every rank) makes the follower's hook raise. Only the
    source's status reaches GET /server_info (a follower has no socket to the tokenizer), so each rank's trace
    shows where it went stock: its last line, the same iteration and generation on both."""
    rig.set_eb()
    load, _ = queued_load(rig, num_prompts=96, seed=25, queued=10)
    post_json(f"{rig.server.url}/abort_request", {"abort_all": True})
    load.join(300)

    def stopped() -> dict | None:
        s = rig.server.ebctl()
        if s["enabled"]:
            rig.generate(1)  # the source reads the notice when it next builds an envelope: one more iteration
            return None
        return s
    st = wait_for(stopped, 60, "the follower's fault to reach the source")
    assert not st["enabled"] and st["error"] == "follower rank 1: exception in hook abort_output", st
    assert (st["policy_version"], st["mode"]) == (-1, "none"), st
    r0, r1 = ([json.loads(x) for x in (rig.traces / f"trace.dp0.r{i}.jsonl").read_text().splitlines()] for i in (0, 1))
    faults = [x for x in r1 if "fault" in x]
    assert [x["fault"] for x in faults] == ["exception in hook abort_output"]  # told once
    steered = [x for x in r1 if "fault" not in x]
    off0, off1 = r0[-1], steered[-1]  # each rank's last line: where it went stock
    assert off0["off"] == st["error"] and off1["off"] == "exception in hook abort_output"
    assert (off0["it"], off0["gen"]) == (off1["it"], off1["gen"]) and off0["gen"] == st["group_generation"]
    assert r0[:-1] == steered[:-1]  # the same decisions and batches on both ranks until then: the faulted
    # follower kept the group's policy
    assert faults[0]["it"] <= off1["it"] and faults[0]["gen"] < off1["gen"]
    assert any(x.get("v", -1) >= 0 for x in r0[:-1])  # steered before it
    # stock from then on, on both ranks: every request served, nothing more traced, no second fault logged
    assert rig.bench(**{**BURST, "num_prompts": 16}, seed=26)["completed"] == 16
    assert len((rig.traces / "trace.dp0.r0.jsonl").read_text().splitlines()) == len(r0)
    log = rig.server.log()
    assert log.count("ebctl: exception in hook abort_output on follower rank 1") == 1
    assert log.count("ebctl: follower rank 1 of engine dp0 reported") == 1
    assert "Scheduler hit an exception" not in log and rig.server.alive()
