"""A fleet behind SGLang's gateway: two real sglang CPU servers, each joined to one node daemon (``ebctl start
--join``), and smg 1.13.0 (``least_load``, the settings docs/fleet.md found) in front; load through the gateway.

- kill -9 of one server mid-load: only requests sent before the kill may fail; every request sent after it
  completes (on the survivor); the node daemon marks that server's engine gone and ``ebctl status --daemon``
  shows one server live, the other gone;
- kill -9 of the node daemon: the survivor's policy expires and it serves stock (through the gateway); the
  daemon back on the same sockets, the survivor reports to it again (its idle beats) and gets a policy.

The load's figures are printed, not asserted (timings on a shared CI machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import post_json, wait_for

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import ab_real  # noqa: E402
import fleet_real  # noqa: E402

SETTINGS = ["daemon.engine_gone_s=3", "controller.ttl_s=1.5", "daemon.republish_s=0.2"]


@pytest.fixture(scope="module")
def smg() -> Path:
    return fleet_real.smg_bin()


def test_a_fleet_behind_smg_loses_only_the_dead_servers_requests(sglang_venv, tiny_model, workdir, smg):
    h = ab_real.harness()
    fleet = fleet_real.Fleet(h, sglang_venv, tiny_model, workdir / "fleet", ebctl=True, smg=smg, policy="least_load",
                             gateway_args=list(fleet_real.RECOMMENDED), server_args=ab_real.base_args(""),
                             settings=SETTINGS)
    try:
        wait_for(lambda: fleet_real.servers_seen(fleet.status()) == {"s1": "live", "s2": "live"}, 30,
                 "both servers reporting to the node daemon")
        client = ab_real.start_client(sglang_venv, fleet.url, workdir, concurrency=32, duration=16.0, drain=60.0,
                                      pairs=ab_real.issue_workload(480, 0), ids=ab_real.model_vocab(tiny_model),
                                      seed=1)
        t0 = time.monotonic()
        time.sleep(8.0)
        fleet.kill_server(1)
        killed_at = time.monotonic() - t0
        assert client.wait(200) == 0
        res = json.loads((workdir / "client.json").read_text())
        split = fleet_real.kill_split(res["records"], killed_at)
        ok = [r for r in res["records"] if r["status"] == "ok"]
        after = [r for r in res["records"] if r["t"] >= killed_at]
        print(f"gateway load: {len(res['records'])} sent, {len(ok)} ok, killed at {killed_at:.1f} s: {split}; "
              f"errors {sorted({r['err'][:100] for r in res['records'] if r['err']})[:3]}")
        assert len(after) > 20 and split["failed_after_kill"] == 0  # every later request completed
        assert all(r["status"] in ("ok", "failed") for r in res["records"])  # nothing left hanging

        # the node daemon: s2 gone, s1 live; the fleet view over the daemon says the same
        wait_for(lambda: fleet_real.servers_seen(fleet.status()) == {"s1": "live", "s2": "gone"}, 20,
                 "s2 marked gone, s1 still reporting while idle")
        view = subprocess.run([str(sglang_venv / "bin" / "python"), "-m", "ebctl", "status", "--daemon",
                               fleet.control], capture_output=True, text=True, timeout=60)
        assert view.returncode == 0, view.stderr
        print(view.stdout)
        rows = {w: ln for ln in view.stdout.splitlines() for w in ("s1", "s2") if w in ln.split()}
        assert "gone" in rows["s2"] and "gone" not in rows["s1"], view.stdout

        # the node daemon killed: the survivor's policy expires, it serves stock; back, it steers again
        fleet.kill_daemon()

        def survivor() -> dict:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{fleet.ports[0]}/server_info", timeout=30) as r:
                return json.loads(r.read())["internal_states"][0]["ebctl"]

        st = wait_for(lambda: (s := survivor())["policy_version"] == -1 and s, 15, "stock after the policy's TTL")
        assert st["enabled"] and st["mode"] == "none"
        for i in range(4):
            out = post_json(f"{fleet.url}/generate", {"input_ids": [7 + i, 8, 9], "sampling_params": {
                "max_new_tokens": 4, "ignore_eos": True}}, timeout=60)  # the tiny model samples EOS at times
            assert out["meta_info"]["completion_tokens"] == 4
        fleet.start_daemon()
        wait_for(lambda: fleet_real.servers_seen(fleet.status()).get("s1") == "live", 20,
                 "the survivor's idle beats reaching the restarted daemon")
        wait_for(lambda: survivor()["policy_version"] >= 0, 20, "a policy from the restarted daemon")
    finally:
        fleet.close()
