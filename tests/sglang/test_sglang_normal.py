"""The plugin in the normal event loop (``--disable-overlap-schedule``) of a server that cannot mix
(``--chunked-prefill-size -1``: no chunked prefill, so no mixed batches), real daemon, sglang's client."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from harness import BURST, EB_K4_N8, Rig, check_accounting, eb_check

from ebctl.protocol import BatchKind

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def rig(sglang_venv, tiny_model, module_workdir):
    r = Rig(sglang_venv, tiny_model, module_workdir,
            ["--max-running-requests", "16", "--disable-overlap-schedule", "--chunked-prefill-size", "-1"],
            daemon=EB_K4_N8)
    yield r
    r.close()


def test_normal_loop_reports_every_completion_once(rig):
    st = rig.set_eb()
    assert st["enabled"] and st["engine_id"] == "dp0" and st["mixed_unavailable"] is True
    _, reps = check_accounting(rig, num_prompts=30, input_len=48, output_len=40, range_ratio=0.1, concurrency=12,
                               seed=11)
    assert rig.daemon.engine()["reports"] >= len(reps)
    assert Counter(r.kind for r in reps)[BatchKind.DECODE] > 0


def test_normal_loop_eb_k4_nmax8(rig):
    st0 = rig.set_eb()
    mark = rig.tap.mark()
    assert rig.bench(**BURST, seed=12)["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    chk = eb_check(reps, k=4, n_max=8)
    assert not chk["over_cap"] and not chk["early_refill"] and not chk["short_refill"], chk
    assert chk["refills"] >= 3 and chk["held"] > 0, chk
    assert max(r.running for r in reps) == 8
    assert rig.server.ebctl()["defers"] > st0["defers"]


def test_mb_without_chunked_prefill_stays_exclusive_and_says_so(rig):
    st0 = rig.set_mode("mb", n_max=8)
    assert st0["mixed_unavailable"] is True
    mark = rig.tap.mark()
    assert rig.bench(**BURST, seed=13)["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    assert reps and all(r.mixed_unavailable for r in reps)
    assert not any(r.kind is BatchKind.MIXED for r in reps)
    chk = eb_check(reps, k=4, n_max=8)  # mb that cannot mix falls back to eb with the policy's k and n_max
    assert not chk["over_cap"] and not chk["early_refill"], chk
    st = rig.server.ebctl()
    assert st["is_mixed_chunk"] is False and st["mode"] == "mb"
    assert rig.daemon.engine()["mixed_unavailable"] is True  # `ebctl status` shows it
