"""``ebctl start --engine sglang -- --dp-size 2 ...`` with ``dispatch.mode = sbs``: unchanged sglang arguments,
``start`` adds ``--load-snapshot-publish-interval 1``; the daemon steers both ranks and the DP controller's
dispatcher; an exception injected in the dispatch hook (``engine.fault = "dispatch:150"``, mid-load) flushes
the buffer through sglang's own dispatch, is logged once, and sglang's client still completes every
request; Ctrl-C leaves nothing behind. Real sglang 0.5.23 on CPU."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess

import pytest
from harness import TP_TORCH_CORES, bench, free_port, kill_leftovers, post_json, processes_with, server_env, wait_for
from harness import daemon_status as status

pytestmark = pytest.mark.sglang

TINY_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--max-total-tokens", "16384", "--mem-fraction-static", "0.1", "--max-running-requests", "16",
             "--sleep-on-idle", "--dp-size", "2", "--load-balance-method", "round_robin"]


def test_ebctl_start_dp2_sbs_fault_in_the_dispatch_hook_and_ctrl_c(sglang_venv, tiny_model, workdir):
    rt, traces = workdir / "rt", workdir / "traces"
    traces.mkdir()
    port = free_port()
    marker = f"EBCTL_CONFIG={rt / 'start.toml'}"
    cmd = [str(sglang_venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt),
           "--set", "dispatch.mode=sbs", "--set", "daemon.republish_s=0.2", "--set", "controller.ttl_s=1.5",
           "--set", "engine.fault=dispatch:150", "--set", f"engine.trace_dir={traces}",
           "start", "--engine", "sglang", "--",
           "--model-path", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), *TINY_ARGS]
    env = {k: v for k, v in server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
    env.update(TP_TORCH_CORES)
    log_path = workdir / "start.log"
    log = open(log_path, "wb")  # noqa: SIM115 -- closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    url, control = f"http://127.0.0.1:{port}", f"ipc://{rt / 'control.sock'}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            with contextlib.suppress(OSError):
                post_json(f"{url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
                          timeout=10)
                return True
            return False
        wait_for(healthy, 300, "sglang --dp-size 2 under ebctl start to serve", interval=1.0)
        st = wait_for(lambda: (s := status(control) or {}).get("dispatchers", {}).get("dispatch", {}).get("state")
                      == "sbs" and s, 30, "the dispatcher to run SBS")
        launcher = [c for c in processes_with(marker).values() if "sglang.launch_server" in c]
        assert launcher and "--load-snapshot-publish-interval 1" in launcher[0]  # added by ebctl start
        assert "--dp-size 2" in launcher[0]
        out = bench(sglang_venv, url, workdir / "bench.json", num_prompts=200, input_len=32, output_len=32,
                    range_ratio=0.5, concurrency=24, seed=41)
        assert out["completed"] == 200, out  # through the fault: sglang's client completed every request
        st = wait_for(lambda: (s := status(control)) and s["dispatchers"]["dispatch"]["state"] == "failed" and s,
                      10, "the dispatcher's last report")
        d = st["dispatchers"]["dispatch"]
        assert d["reason"] == "exception in dispatch hook dispatch" and d["buffered"] == 0
        assert d["released"] > 0 and {"dp0", "dp1"} <= set(st["engines"])
        text = log_path.read_text(errors="replace")
        assert text.count("ebctl: exception in dispatch hook") == 1
        assert "RuntimeError: ebctl: injected fault in dispatch hook dispatch" in text
        assert "DataParallelController hit an exception" not in text
        ev = [json.loads(x) for x in (traces / "dispatch.jsonl").read_text().splitlines()]
        held = sorted(e["rid"] for e in ev if e.get("how") == "held")
        assert held and held == sorted(e["rid"] for e in ev if e.get("how") in ("sbs", "flush", "abort", "overload"))
        assert sum("off" in e for e in ev) == 1
        out = bench(sglang_venv, url, workdir / "bench2.json", num_prompts=40, input_len=32, output_len=16,
                    concurrency=8, seed=42)
        assert out["completed"] == 40  # stock dispatch from now on
        assert len([json.loads(x) for x in (traces / "dispatch.jsonl").read_text().splitlines()]) == len(ev)

        proc.send_signal(signal.SIGINT)  # what Ctrl-C does: the foreground process gets SIGINT
        rc = proc.wait(90)
        assert rc == 0, log_path.read_text()[-3000:]
        wait_for(lambda: not processes_with(marker), 15, "every process of ebctl start to exit")
        assert status(control) is None and not (rt / "start.toml").exists()
    finally:
        log.close()
        kill_leftovers(proc, marker)
