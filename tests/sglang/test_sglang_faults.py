"""Fail open in a real server: an exception inside a hook switches the plugin off in that scheduler, logs
once with the traceback, restores sglang's launch settings, and the server serves every request.

The fault is injected with the test switch ``engine.fault = "batch_result:40"``: the 40th call of the
``process_batch_result`` hook raises *after* the original ran (the case where calling it again would
process a batch twice). The policy is ``mb`` so that the plugin had changed ``is_mixed_chunk`` (launched
False, mixing allowed by the ``engine.mixed_without_flag`` opt-in: nothing rules mixing out on this server)
and capped admission when the fault hits. (The dead-daemon faults are in test_sglang_overlap.py.)

A fault on the follower rank of a ``--tp-size 2`` server: ``test_sglang_tp.py`` (its last test, on that
module's server).
"""

from __future__ import annotations

import time

import pytest
from harness import BURST, Rig, wait_for

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
