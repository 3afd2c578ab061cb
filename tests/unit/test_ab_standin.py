"""``ebctl ab`` against a stand-in for sglang (no GPU here, and the real server's tests live in tests/sglang): a
package named ``sglang`` on the path whose ``launch_server`` serves ``/health_generate`` (503 for its first
1.5 s, as sglang while it starts) and a streaming ``/generate``, and an ``nvidia-smi`` that lists two H100s. It
shows the open loop's arrivals (their rate and their exponential gaps) and the GPU path: nothing pinned, the
readiness wait, the device recorded, the user's launch arguments passed. The bad inputs exit 2 naming the value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # the client's (sglang brings it; the dev extra too)
import itertools

from scipy import stats as sps

from ebctl.ab import workloads

STANDIN = textwrap.dedent('''
    """A stand-in for ``python -m sglang.launch_server`` (test infrastructure): /health_generate, /generate."""
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    os.nice(5)  # the client under test keeps time first
    t0 = time.monotonic()
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(json.dumps({"argv": argv, "plugins": os.environ.get("SGLANG_PLUGINS")}) + "\\n")

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ready = time.monotonic() - t0 > 1.5
            if not ready:
                with open(os.environ["STANDIN_LOG"], "a") as f:
                    f.write("503\\n")
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["sampling_params"]["max_new_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for k in range(1, n + 1):
                time.sleep(0.001)
                self.wfile.write(b"data: " + json.dumps({"meta_info": {"completion_tokens": k}}).encode() + b"\\n\\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\\n\\n")

    class S(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024  # an open loop's bursts: the default backlog of 5 drops connections

    S(("127.0.0.1", port), H).serve_forever()
''')
SMI = "#!/bin/sh\n" + "echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15'\n" * 2


@pytest.fixture
def standin(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """(environment, model folder, stand-in log): ``sglang`` and ``nvidia-smi`` first on the paths."""
    (tmp_path / "py" / "sglang").mkdir(parents=True)
    (tmp_path / "py" / "sglang" / "__init__.py").write_text("")
    (tmp_path / "py" / "sglang" / "launch_server.py").write_text(STANDIN)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text(SMI)
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 512, "max_position_embeddings": 2048}))
    log = tmp_path / "standin.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "py"), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "STANDIN_LOG": str(log)}
    return env, model, log


def _ab(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ebctl", "ab", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd="/")


def test_the_open_loop_sends_every_planned_arrival_and_the_gpu_path(standin, tmp_path):
    env, model, log = standin
    # about 2,100 arrivals
    rate, duration = 120.0, 17.5
    p = _ab(env, "--configs", "alone", "--runs", "1", "--duration", str(duration), "--rate", str(rate),
            "--dataset", "random-ids", "--random-input-len", "16", "--random-output-len", "4", "--drain", "20",
            "--workdir", str(tmp_path / "w"), "--", "--model-path", str(model), "--tp-size", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((tmp_path / "w" / "ab.json").read_text())
    run = doc["runs"][0]
    sent = sorted(r["t"] for r in run["records"])
    assert len(sent) >= 2000 and run["summary"]["failed"] == 0 and run["summary"]["unfinished"] == 0
    # the open loop follows its schedule (a Poisson process: workloads.poisson_arrivals, whose statistics the
    # next test checks): every planned arrival was sent, each at or after its planned time, whether or not earlier
    # requests had ended. How late each went is the machine's business (nothing is timed here).
    spec = json.loads(next((tmp_path / "w").rglob("client.spec.json")).read_text())
    planned = spec["arrivals"]
    assert len(planned) == len(sent) and abs(len(planned) / duration / rate - 1) < 0.1
    assert all(abs(s - q) <= 1e-4 for s, q in zip(sorted(r["sched"] for r in run["records"]), planned, strict=True))
    assert all(r["t"] >= r["sched"] - 1e-3 for r in run["records"])
    # the GPU path: nothing pinned, ready only once /health_generate said so, the device from nvidia-smi
    assert doc["settings"]["pin"] is False and "pinned" not in run
    lines = log.read_text().splitlines()
    assert run["ready_s"] >= 1.5 and "503" in lines
    started = json.loads(lines[0])
    assert started["plugins"] == "none"  # sglang alone: no plugin, even with ebctl installed
    assert started["argv"][:4] == ["--model-path", str(model), "--tp-size", "2"]
    assert "--host" in started["argv"] and "--port" in started["argv"]
    dev = doc["environment"]["device"]
    assert dev["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2 and dev["source"] == "nvidia-smi"
    assert "2 × NVIDIA H100 80GB HBM3" in (tmp_path / "w" / "ab.md").read_text()
    assert run["left_running"] == []


def test_poisson_arrivals_by_their_statistics():
    a = workloads.poisson_arrivals(100.0, 2000.0, seed=3)  # about 200,000
    assert abs(len(a) / 2000.0 / 100.0 - 1) < 0.01
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert sps.kstest(gaps, "expon", args=(0, 0.01)).pvalue > 0.01
    assert a == workloads.poisson_arrivals(100.0, 2000.0, seed=3) and all(0 <= t < 2000 for t in a)
    with pytest.raises(ValueError, match="--rate 0"):
        workloads.poisson_arrivals(0, 10)


@pytest.mark.parametrize(("args", "says"), [
    (["--configs", "alone,stock"], "configuration 'stock': 'stock' is none of"),
    (["--configs", "alone,alone"], "named twice"),
    (["--configs", "ebctl:controller.mode=sometimes"], "controller.mode='sometimes'"),
    (["--baseline", "mixed"], "--baseline mixed: not among --configs"),
    (["--slo", "1"], "--slo '1'"),
    (["--loop", "open"], "--loop open needs --rate"),
    (["--rate", "-3"], "--rate -3.0"),
    (["--dataset", "sharegpt"], "--dataset sharegpt needs --dataset-path"),
    (["--trace", "{trace}"], "line 3: output_tokens='x' is not a number"),
    (["--dataset", "mooncake", "--dataset-path", "{mooncake}"], "line 2: not a Mooncake row"),
])
def test_bad_input_exits_2_naming_the_value(standin, tmp_path, args, says):
    env, model, _ = standin
    (tmp_path / "t.csv").write_text("input_tokens,output_tokens\n10,5\nx0,x\n".replace("x0", "12"))
    (tmp_path / "m.jsonl").write_text('{"input_length": 5, "output_length": 3}\n{"input_length": 5}\n')
    args = [a.format(trace=tmp_path / "t.csv", mooncake=tmp_path / "m.jsonl") for a in args]
    p = _ab(env, *args, "--workdir", str(tmp_path / "w"), "--", "--model-path", str(model), timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr[-2000:]


def test_no_launch_arguments_is_a_usage_error(standin):
    env, _, _ = standin
    p = _ab(env, "--configs", "alone", timeout=60)
    assert p.returncode == 2 and "give sglang's launch arguments after --, with --model-path" in p.stderr


def test_the_closed_loop_and_ctrl_c_under_ebctl_start(standin, tmp_path):
    """``ebctl`` runs ``ebctl start --engine sglang`` around the stand-in (a supervisor, a daemon, the server):
    Ctrl-C in the middle of the load stops all of them, writes the partial record and exits 130."""
    import signal
    import time

    env, model, _ = standin
    err = tmp_path / "err"
    with open(err, "w") as e:
        p = subprocess.Popen([sys.executable, "-m", "ebctl", "ab", "--configs", "ebctl", "--runs", "1", "--duration",
                              "60", "--concurrency", "4", "--status-every", "1", "--dataset", "random-ids",
                              "--random-input-len", "16", "--random-output-len", "8", "--workdir", str(tmp_path / "w"),
                              "--", "--model-path", str(model)], stdout=subprocess.PIPE, stderr=e, text=True, env=env,
                             cwd="/")
    try:
        deadline = time.monotonic() + 60
        while "· load ·" not in err.read_text() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out[-3000:] + err.read_text()[-3000:]
    doc = json.loads((tmp_path / "w" / "ab.json").read_text())
    run = doc["runs"][0]
    assert doc["interrupted"] and run["interrupted"] and 0 < run["load_s"] < 60
    assert run["summary"]["completed"] > 0 and run["summary"]["failed"] == 0
    assert run["status"] and all("t" in s for s in run["status"])  # the daemon read while it ran
    names = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in run["pids"]
                     if Path(f"/proc/{pid}/cmdline").exists())
    assert len(run["pids"]) >= 4, run["pids"]  # ebctl start, its daemon, the server, the client
    alive = [pid for pid in run["pids"] if Path(f"/proc/{pid}").exists()
             and (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"]
    assert alive == [], names
    assert "interrupted" in out and (tmp_path / "w" / "ab.md").is_file()
