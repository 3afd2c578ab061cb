"""``ebctl start --engine sglang -- <sglang args>``: the product's way in. It starts the daemon, then
``python -m sglang.launch_server`` with SGLANG_PLUGINS=ebctl and EBCTL_CONFIG; the engine reports and
obeys; kill -9 of the daemon under load loses no request (the supervisor restarts the daemon, the engine
runs its policy to its TTL, then stock, until the new daemon publishes); Ctrl-C (SIGINT) stops both the way
sglang stops cleanly (SIGTERM to its launcher alone), logs no crash and leaves no process behind, also while
sglang is still loading."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from harness import ONE_TORCH_CORE, bench, free_port, kill_leftovers, post_json, processes_with, server_env, wait_for
from harness import daemon_status as status

pytestmark = pytest.mark.sglang

TINY_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--max-total-tokens", "16384", "--mem-fraction-static", "0.1", "--max-running-requests", "16",
             "--sleep-on-idle"]


def engine_state(url: str) -> dict:
    """The plugin's status in GET /server_info."""
    with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
        return json.loads(r.read())["internal_states"][0]["ebctl"]


def test_ebctl_start_runs_daemon_and_sglang_and_ctrl_c_stops_both(sglang_venv, tiny_model, workdir):
    rt = workdir / "rt"
    port = free_port()
    marker = f"EBCTL_CONFIG={rt / 'start.toml'}"
    cmd = [str(sglang_venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt),
           "--set", "controller.cold_mode=eb", "--set", "controller.k_override=4",
           "--set", "controller.n_override=8", "--set", "daemon.republish_s=0.2", "--set", "controller.ttl_s=1.5",
           "start", "--engine", "sglang", "--",
           "--model-path", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), *TINY_ARGS]
    env = {k: v for k, v in server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
    env.update(ONE_TORCH_CORE)
    log = open(workdir / "start.log", "wb")  # noqa: SIM115 -- closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (workdir / "start.log").read_text()[-3000:]
            with contextlib.suppress(OSError):
                post_json(f"{url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
                          timeout=10)
                return True
            return False
        wait_for(healthy, 240, "sglang under ebctl start to serve", interval=1.0)
        control = f"ipc://{rt / 'control.sock'}"
        eng = wait_for(lambda: (status(control) or {}).get("engines", {}).get("dp0"), 30,
                       "the daemon to list the engine")
        assert eng["reports"] > 0 and eng["mode"] == "eb" and (eng["k"], eng["n_max"]) == (4, 8)
        with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
            st = json.loads(r.read())["internal_states"][0]["ebctl"]
        assert st["enabled"] and st["mode"] == "eb" and st["engine_id"] == "dp0"
        assert len(processes_with(marker)) >= 3  # sglang launcher, scheduler, detokenizer (+ the daemon)

        # kill -9 of the daemon mid-load: every request completes, the supervisor restarts the daemon, the
        # engine is steered again once the new daemon publishes.
        first = status(control)["daemon"]["pid"]
        out: dict = {}
        load = threading.Thread(target=lambda: out.update(bench(
            sglang_venv, url, workdir / "bench.json", num_prompts=200, input_len=32, output_len=64,
            range_ratio=0.5, concurrency=24, seed=3)))
        load.start()
        wait_for(lambda: engine_state(url)["iterations"] > st["iterations"] + 50, 60, "the load to start")
        os.kill(first, signal.SIGKILL)
        seen = []
        while load.is_alive():
            seen.append(engine_state(url))
            time.sleep(0.1)
        load.join()
        assert out["completed"] == 200, out  # sglang's client completed every request
        again = wait_for(lambda: (status(control) or {}).get("daemon", {}).get("pid") not in (None, first)
                         and status(control), 30, "the restarted daemon")
        assert again["daemon"]["restarts"] == 1
        assert proc.poll() is None and again["engines"]["dp0"]["reports"] > 0
        assert all(s["enabled"] for s in seen)  # the plugin never failed
        final = wait_for(lambda: engine_state(url)["mode"] == "eb" and engine_state(url), 30, "eb again")
        assert final["k"] == 4 and final["n_max"] == 8
        assert "restart 1" in (workdir / "start.log").read_text()

        before = len((workdir / "start.log").read_bytes())
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does: the foreground process gets SIGINT
        rc = proc.wait(90)
        print(f"Ctrl-C to the exit of ebctl start: {time.monotonic() - t0:.2f} s")
        assert rc == 0, (workdir / "start.log").read_text()[-3000:]
        wait_for(lambda: not processes_with(marker), 15, "every process of ebctl start to exit")
        assert status(control) is None
        assert not (rt / "start.toml").exists()
        assert_clean_stop((workdir / "start.log").read_bytes()[before:].decode(errors="replace"))
    finally:
        log.close()
        kill_leftovers(proc, marker)


def assert_clean_stop(said: str) -> None:
    """What was logged from Ctrl-C on: no crash of sglang's (a scheduler stopped under its launcher is one to it:
    SIGQUIT, crash diagnostics), no traceback, no SIGKILL after the grace period."""
    for sign in ("crashed", "SIGQUIT", "crash diagnostics", "Traceback", "ignored SIGTERM"):
        assert sign not in said, said[-3000:]


def test_ctrl_c_while_sglang_loads_stops_everything_quietly(sglang_venv, tiny_model, workdir):
    """Ctrl-C before sglang serves (its launcher cannot drain yet: SIGTERM kills it, leaving its scheduler and
    detokenizer loading): everything stops, without waiting out the grace period."""
    rt = workdir / "rt"
    marker = f"EBCTL_CONFIG={rt / 'start.toml'}"
    cmd = [str(sglang_venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt), "start", "--engine", "sglang",
           "--", "--model-path", str(tiny_model), "--host", "127.0.0.1", "--port", str(free_port()), *TINY_ARGS]
    env = {k: v for k, v in server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
    env.update(ONE_TORCH_CORE)
    log = open(workdir / "start.log", "wb")  # noqa: SIM115 -- closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    try:
        # sglang's launcher has spawned its scheduler (which loads the model for a while yet)
        wait_for(lambda: len(processes_with(marker)) >= 3 and "server_args=" in (workdir / "start.log").read_text(),
                 120, "sglang to start loading")
        before = len((workdir / "start.log").read_bytes())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, (workdir / "start.log").read_text()[-3000:]
        wait_for(lambda: not processes_with(marker), 15, "every process of ebctl start to exit")
        assert_clean_stop((workdir / "start.log").read_bytes()[before:].decode(errors="replace"))
    finally:
        log.close()
        kill_leftovers(proc, marker)
