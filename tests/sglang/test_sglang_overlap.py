"""The plugin in a real SGLang server (overlap event loop, the default), a real daemon, sglang's client.

One server for the module (a start costs ~20 s on 2 cores); each test sets the policy it needs with
``tune`` and waits until the plugin reports it applied. Every iteration report also reaches the test
through the tap (harness.Tap), on its way to the daemon.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from harness import BURST, EB_K4_N8, Rig, check_accounting, eb_check, wait_for

from ebctl.protocol import BatchKind

pytestmark = pytest.mark.sglang



@pytest.fixture(scope="module")
def rig(sglang_venv, tiny_model, module_workdir):
    r = Rig(sglang_venv, tiny_model, module_workdir, ["--max-running-requests", "16"], daemon=EB_K4_N8)
    yield r
    r.close()


def test_plugin_loads_in_the_scheduler_and_reports(rig):
    rig.generate(2)
    st = rig.server.ebctl()
    assert st["enabled"] and st["started"] and st["steering"] and st["reporting"] and st["group_size"] == 1, st
    assert st["engine_id"] == "dp0" and st["launch_mixed_chunk"] is False
    eng = wait_for(rig.daemon.engine, 10, "the daemon to list engine dp0")
    assert eng["reports"] > 0 and eng["last_report_age_s"] < 30
    assert rig.tap.reports and {r.engine_id for r in rig.tap.reports} == {"dp0"}
    assert rig.tap.rejected == 0
    assert all(r.max_running == 16 and r.kv_total == 16384 for r in rig.tap.reports)


def test_accounting_daemon_sees_every_completion_once(rig):
    rig.set_eb()
    _, reps = check_accounting(rig, num_prompts=30, input_len=48, output_len=40, range_ratio=0.1, concurrency=12,
                               seed=7)
    kinds = Counter(r.kind for r in reps)
    assert kinds[BatchKind.PREFILL] and kinds[BatchKind.DECODE]


def test_eb_k4_nmax8_refills_at_k_and_caps_at_nmax(rig):
    st0 = rig.set_eb()
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=3)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    assert len(reps) > 20
    chk = eb_check(reps, k=4, n_max=8)
    assert not chk["over_cap"], chk["over_cap"][:3]
    assert not chk["early_refill"], chk["early_refill"][:3]
    assert not chk["short_refill"], chk["short_refill"][:3]
    assert chk["refills"] >= 3 and chk["held"] > 0, chk
    assert max(r.running for r in reps) == 8
    st = rig.server.ebctl()
    assert st["defers"] > st0["defers"] and st["is_mixed_chunk"] is False
    assert not any(r.kind is BatchKind.MIXED for r in reps)


def test_mb_without_enable_mixed_chunk_is_unavailable_and_forms_no_mixed_batch(rig):
    """Launched without --enable-mixed-chunk (chunked prefill on): sglang never turned mixing on, so mb does
    not either (it could break configurations sglang refuses to mix): eb with the policy's k and n_max, and
    the reason in /server_info, in every report and in the daemon's status."""
    st0 = rig.set_mode("mb", n_max=8)
    assert st0["mixed_unavailable"] is True and "--enable-mixed-chunk" in st0["mixed_unavailable_reason"]
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=4)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st0["policy_version"]]
    assert reps and not any(r.kind is BatchKind.MIXED for r in reps)
    assert all(r.mixed_unavailable and "--enable-mixed-chunk" in r.mixed_unavailable_reason for r in reps)
    assert max(r.running for r in reps) <= 8
    st = rig.server.ebctl()
    assert st["is_mixed_chunk"] is False and st["mixed_steps"] == st0["mixed_steps"]
    eng = rig.daemon.engine()
    assert eng["mixed_unavailable"] is True and "--enable-mixed-chunk" in eng["mixed_unavailable_reason"]


def test_off_is_sglang_as_launched(rig):
    """off: the hooks pass every call through (tests/sglang/test_plugin_unit.py proves it call by call);
    here: no deferral, no cap, mixing back at its launch value, and the running batch reaches the server's
    own limit (16) under a burst, where any policy of this module would have stopped at 8."""
    st0 = rig.set_mode("off")
    assert st0["is_mixed_chunk"] is False
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=5)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = rig.tap.since(mark)
    assert {r.policy_version for r in reps} == {st0["policy_version"]}
    assert max(r.running for r in reps) == 16
    assert not any(r.kind is BatchKind.MIXED for r in reps)
    st = rig.server.ebctl()
    assert (st["defers"], st["capped"], st["mixed_steps"]) == (st0["defers"], st0["capped"], st0["mixed_steps"])


def test_dead_daemon_means_stock_after_ttl_and_a_restart_resumes_control(rig):
    rig.set_eb()
    # kill -9 mid-load: every request still completes
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(rig.bench(num_prompts=48, input_len=32, output_len=96,
                                                             range_ratio=0.5, seed=6)))
    mark = rig.tap.mark()
    t.start()
    wait_for(lambda: len(rig.tap.since(mark)) > 30, 30, "load to start")
    rig.daemon.kill9()
    killed_at = time.monotonic()
    t.join(300)
    assert out["completed"] == 48
    # the policy expires ttl_s after the last one received: stock sglang from then on
    st = rig.wait_policy("none", timeout=rig.daemon.cfg.controller.ttl_s + 10)
    assert time.monotonic() - killed_at >= rig.daemon.cfg.controller.ttl_s - 0.3
    assert st["enabled"] and st["policy_version"] == -1 and st["is_mixed_chunk"] is False
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=8)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = rig.tap.since(mark)
    assert {r.policy_version for r in reps} == {-1}
    assert max(r.running for r in reps) == 16  # no cap of ours any more
    # the daemon comes back (same config, same sockets): the engine picks its policy up, no restart
    rig.daemon.start()
    rig.generate(2)  # an idle engine sends nothing; the daemon learns of it from its next report
    st1 = rig.wait_policy("eb", k=4, n_max=8)
    mark = rig.tap.mark()
    res = rig.bench(**BURST, seed=9)
    assert res["completed"] == BURST["num_prompts"]
    time.sleep(0.3)
    reps = [r for r in rig.tap.since(mark) if r.policy_version == st1["policy_version"]]
    chk = eb_check(reps, k=4, n_max=8)
    assert reps and not chk["over_cap"] and not chk["early_refill"], chk
    assert rig.server.ebctl()["defers"] > st1["defers"]
    assert rig.server.alive()
