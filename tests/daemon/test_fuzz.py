"""Fuzzing a real daemon over its sockets, seeded and bounded to seconds: tools/fuzz_daemon.py's quick variant
(random, truncated, mutated and hostile frames on both sockets beside a valid engine), and hypothesis-generated
reports with any value msgpack can carry. The daemon must live, count every frame once, and go on serving."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import zmq
from ebd_helpers import finished, report, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebctl.link import EngineLink
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, encode

REPO = Path(__file__).resolve().parents[2]
U64 = st.integers(-(2**63), 2**64 - 1)  # every int msgpack encodes


def test_the_quick_fuzz_run_meets_every_check(tmp):
    out = tmp / "fuzz.json"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "fuzz_daemon.py"), "--frames", "3000", "--seed", "7",
                        "--json", str(out), "--workdir", str(tmp / "w")], capture_output=True, text=True, timeout=300)
    assert out.is_file(), p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    # the tool's verdict, and its parts read back independently of it
    assert res["ok"] and res["alive"] and res["daemon_exit"] == 0, res
    assert res["daemon_frames"] == res["sent_telemetry"] + res["engine_reports_sent"] == res["counted"], res
    assert res["control_answered"] == res["sent_control"] > 0 and res["faults"] == 0, res
    assert res["max_policy_gap_s"] < res["ttl_s"] and res["good_engine_reports"] == res["engine_reports_sent"], res
    assert sum(res["rejected"].values()) > res["sent_telemetry"] / 2  # most fuzz is refused, by reason


reports = st.builds(
    IterationReport, engine_id=st.text(max_size=300), instance=st.text(max_size=40), seq=U64,
    wall_time=st.floats(), forward_s=st.floats(), kind=st.sampled_from(list(BatchKind)),
    prefill_reqs=U64, prefill_tokens=U64, decode_reqs=U64, decode_ctx_tokens=U64, prefill_ctx_tokens=U64,
    running=U64, waiting=U64, kv_used=U64, kv_total=U64, max_running=U64, policy_version=U64,
    mixed_unavailable=st.booleans(), mixed_unavailable_reason=st.text(max_size=3000), group_size=U64,
    gate_reasons=st.dictionaries(st.text(max_size=30), U64, max_size=8),
    finished=st.lists(st.builds(FinishedRequest, U64, U64, st.text(max_size=20), st.floats()), max_size=30).map(tuple))


def test_hypothesis_reports_are_counted_and_the_daemon_serves_on(spawn):
    d = spawn()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(d.cfg.endpoint("telemetry"))
    sent = [0]

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(rep=reports)
    def send(rep: IterationReport) -> None:
        try:
            frame = encode(rep)
        except (OverflowError, msgspec.EncodeError):  # not encodable: never reaches a socket
            return
        push.send(frame)
        sent[0] += 1

    try:
        send()
        wait_for(lambda: d.status()["daemon"]["counters"]["frames"] >= sent[0], 20, "every frame taken in")
        c = d.status()["daemon"]["counters"]
        assert d.proc.poll() is None and c["faults"] == 0
        assert c["frames"] == sent[0] == c["received"] + c["dispatch_received"] + sum(c["rejected"].values())
        with EngineLink.from_config(d.cfg, "after-fuzz") as link:  # a valid engine is still served
            rng = np.random.default_rng(0)
            for s in range(60):
                link.report(report("after-fuzz", s, finished(rng, 50, 2)))
            wait_for(lambda: d.status()["engines"].get("after-fuzz", {}).get("reports") == 60, 10, "its reports")
            wait_for(lambda: link.policy(time.monotonic()) is not None, 10, "a policy for it")
    finally:
        ctx.destroy(linger=0)
