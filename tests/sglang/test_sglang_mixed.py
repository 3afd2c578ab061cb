"""A server that can mix (``--enable-mixed-chunk``) with small prefill chunks (``--chunked-prefill-size 64``):
mb forms mixed batches; under eb, a prompt whose prefill is split over steps goes on alone while the gate
holds — no waiting request joins it below k (its steps read from the plugin's per-rank trace)."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from harness import BURST, EB_K4_N8, Rig, eb_check

from ebctl.protocol import BatchKind

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def rig(sglang_venv, tiny_model, module_workdir):
    traces = module_workdir / "traces"
    traces.mkdir()
    r = Rig(sglang_venv, tiny_model, module_workdir,
            ["--max-running-requests", "16", "--enable-mixed-chunk", "--chunked-prefill-size", "64"],
            daemon=EB_K4_N8, engine={"engine.trace_dir": str(traces)})
    r.trace = traces / "trace.dp0.r0.jsonl"
    yield r
    r.close()


def test_mb_forms_mixed_batches(rig):
    st0 = rig.set_mode("mb", n_max=8)
    assert st0["launch_mixed_chunk"] is True and st0["mixed_unavailable"] is False
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=4)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    kinds = Counter(r.kind for r in reps)
    assert kinds[BatchKind.MIXED] > 0, kinds
    assert max(r.running for r in reps) <= 8
    assert all(not r.mixed_unavailable for r in reps)
    st = rig.server.ebctl()
    assert st["is_mixed_chunk"] is True and st["mixed_steps"] > st0["mixed_steps"]


def test_a_chunk_in_flight_admits_no_new_request_until_the_gate_opens(rig):
    """k = n_max = 8: the gate holds whenever anything runs, so a request that arrives while a long prompt's
    prefill goes on (after the queue had emptied and the refill ended) finds the gate holding. In a closed
    loop that never happens (no request finishes during a prefill, so no client sends one): open loop."""
    rig.set_eb()
    rig.daemon.tune(controller__k_override=8)
    try:
        st0 = rig.wait_policy("eb", k=8, n_max=8)
        _chunk_goes_on_alone(rig, st0, k=8)
    finally:
        rig.daemon.tune(controller__k_override=4)


def _chunk_goes_on_alone(rig, st0, k):
    assert rig.server.ebctl()["is_mixed_chunk"] is False  # eb: exclusive batches
    start = len(rig.trace.read_text().splitlines())
    mark = rig.tap.mark()
    # Open loop (Poisson arrivals): requests arrive while a long prompt's prefill goes on over several steps
    # (up to 600 tokens, 64 a step) after the refill that admitted it ended (the queue had emptied).
    # Whether an arrival lands in a chunked prefill is chance (fewer do on a faster machine): up to three rounds
    # of fresh prompts until the case has happened at least three times.
    for seed in (31, 32, 33):
        res = rig.bench(num_prompts=60, input_len=600, output_len=8, range_ratio=0.1, concurrency=60, seed=seed,
                        request_rate=15.0)
        assert res["completed"] == 60
        time.sleep(0.3)
        lines = [json.loads(x) for x in rig.trace.read_text().splitlines()[start:]]
        held = {d["it"] for d in lines if d.get("reason") == "chunk_in_flight"}
        if len(held) >= 3:
            break
    planned = {d["it"]: d for d in lines if "planned" in d}
    assert len(held) >= 3, Counter(d.get("reason") for d in lines)  # the case happened
    # Each step where the gate held while a chunk was in flight ran that chunk alone: one request.
    alone = [planned[i] for i in sorted(held)]
    assert all(p["planned"] == "prefill" and p["reqs"] == 1 for p in alone), alone[:5]
    st = rig.server.ebctl()
    assert st["chunk_alone"] - st0["chunk_alone"] == len(held)
    assert st["gate_reasons"]["chunk_in_flight"] >= len(held)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    chk = eb_check(reps, k=k, n_max=8)
    assert not chk["over_cap"] and not chk["early_refill"], chk
    eng = rig.daemon.engine()
    assert eng["gate_reasons"]["chunk_in_flight"] >= len(held)  # the daemon's status shows the reason
