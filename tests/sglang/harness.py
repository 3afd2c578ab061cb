"""Test harness for the real SGLang server on CPU with the ebctl plugin (test infrastructure).

- :class:`Daemon`: ``python -m ebctl.daemon`` in a subprocess, in a private runtime dir, short TTLs;
  ``kill9()``/``restart()`` for the fault tests, ``tune()``/``status()`` over the control socket.
- :class:`Tap`: the plugin's telemetry goes to a PULL socket owned by the test, which records every report
  and forwards it unchanged to the daemon's telemetry socket. The daemon still receives every report and
  computes the policy; the test gets each iteration to assert on (running ≤ n_max, batch kinds, k).
- :func:`engine_config`: the config file the plugin reads (``EBCTL_CONFIG``): the daemon's, with the
  telemetry endpoint pointed at the tap.
- :class:`Server`: ``tiny_server`` (tools/sglang_cpu/server.py) with ``SGLANG_PLUGINS`` always set.
- :func:`bench`: sglang's own client, ``python -m sglang.benchmark.serving --dataset-name random-ids``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import zmq

from ebctl import config
from ebctl.link import ControlClient, DaemonUnreachable
from ebctl.protocol import BatchKind, IterationReport, ProtocolError, decode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "sglang_cpu"))
sys.path.insert(0, str(REPO / "tests"))  # polling.py, also when tools/bench_hook.py imports this module
import polling  # noqa: E402
from server import free_port, post_json, server_env, stop, tiny_server  # noqa: E402

# Short lifetimes: a dead daemon's policy expires within ttl_s; republish keeps a live one fresh.
DAEMON_DEFAULTS = {
    "daemon.republish_s": "0.2",
    "controller.ttl_s": "1.5",
    "controller.max_defer_s": "1000",  # the tests check k; anti-starvation would blur it
}


EB_K4_N8 = {"controller.mode": "eb", "controller.cold_mode": "eb", "controller.k_override": "4",
            "controller.n_override": "8"}  # the daemon's file: a restarted daemon comes back with it
BURST = {"num_prompts": 40, "input_len": 32, "output_len": 32, "range_ratio": 0.25}  # all at once, 8-32 out


# Torch on one thread: on a 2-core machine, torch threads on both cores stall for a time slice whenever any
# other thread (zmq I/O, daemon, client, tokenizer) wakes; one thread runs faster and steadier. The BIND
# variable pins nothing on a CPU without AMX (sglang/srt/distributed/bootstrap.py 277-301); tools/ab_real.py
# pins by itself (its pin()).
ONE_TORCH_CORE = {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
# Two ranks (--tp-size 2 / --dp-size 2): a core each (sglang asserts ranks <= NUMA nodes without the variable).
TP_TORCH_CORES = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """tests/polling.py's, polling a server every 0.1 s unless told otherwise."""
    return polling.wait_for(pred, timeout, what, interval)


def toml(values: dict[str, str]) -> str:
    """``{"section.key": "value"}`` → TOML text (values parsed by config.coerce on load)."""
    sections: dict[str, list[str]] = {}
    for key, raw in values.items():
        section, name = key.split(".", 1)
        spec = config.SPECS[key]
        if spec.type is str:
            val = json.dumps(raw)
        elif spec.type is bool:
            val = "true" if str(raw).lower() in ("1", "true", "yes", "on") else "false"
        else:
            val = str(raw)
        sections.setdefault(section, []).append(f"{name} = {val}")
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())


class Daemon:
    """The real daemon, restartable on the same runtime dir (same endpoints)."""

    def __init__(self, workdir: Path, settings: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.runtime_dir = workdir / "rt"
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        self.settings = {**DAEMON_DEFAULTS, "daemon.runtime_dir": str(self.runtime_dir), **(settings or {})}
        self.cfg_path = workdir / "daemon.toml"
        self.cfg_path.write_text(toml(self.settings))
        self.cfg = config.load(str(self.cfg_path))
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.start()

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"daemon.{self.starts}.log", "wb")  # noqa: SIM115 -- owned by the child
        self.proc = subprocess.Popen([sys.executable, "-m", "ebctl.daemon", "--config", str(self.cfg_path)],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        wait_for(self._answers, 20, "the daemon to answer")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}: "
                                 f"{(self.workdir / f'daemon.{self.starts}.log').read_text()[-2000:]}")
        try:
            return self.request("status", timeout_s=2.0)["daemon"]["pid"] == self.proc.pid
        except DaemonUnreachable:
            return False

    def request(self, op: str, timeout_s: float = 10.0, **args: Any) -> Any:
        # 10 s: with both cores held by pinned sglang ranks, a live daemon once took over 2 s to answer (CI)
        with ControlClient(self.cfg.endpoint("control"), timeout_s=timeout_s) as c:
            reply = c.request(op, **args)
        assert reply.ok, f"daemon refused {op} {args}: {reply.error}"
        return reply.data

    def status(self) -> dict:
        return self.request("status")

    def engine(self, engine_id: str = "dp0") -> dict | None:
        return self.status()["engines"].get(engine_id)

    def tune(self, **updates: Any) -> None:
        """``tune`` with ``controller__k_override=4`` style keys (``__`` for the dot)."""
        self.request("tune", updates={k.replace("__", "."): str(v) for k, v in updates.items()})

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Tap:
    """PULL (the plugin's telemetry endpoint) → record → PUSH to the daemon. One thread, stopped by close()."""

    def __init__(self, workdir: Path, daemon_endpoint: str) -> None:
        self.endpoint = f"ipc://{workdir / 'tap.sock'}"
        self.reports: list[IterationReport] = []
        self.rejected = 0
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.linger = 0
        self._pull.bind(self.endpoint)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.linger = 0
        self._push.sndhwm = 100_000
        self._push.connect(daemon_endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ebctl-tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            while True:
                try:
                    frame = self._pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    self.reports.append(decode(frame, IterationReport))
                except ProtocolError:
                    self.rejected += 1
                with contextlib.suppress(zmq.Again):
                    self._push.send(frame, zmq.NOBLOCK)

    def mark(self) -> int:
        """Index of the next report: ``since(mark)`` returns what came after."""
        return len(self.reports)

    def since(self, mark: int) -> list[IterationReport]:
        return self.reports[mark:]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pull.close(0)
        self._push.close(0)
        self._ctx.term()


def engine_config(workdir: Path, daemon: Daemon, tap: Tap | None, extra: dict[str, str] | None = None) -> Path:
    """The plugin's config: the daemon's, telemetry through the tap (if any), plus ``extra``."""
    values = dict(daemon.settings)
    if tap is not None:
        values["daemon.telemetry_endpoint"] = tap.endpoint
    values.update(extra or {})
    path = workdir / f"engine.{len(list(workdir.glob('engine.*.toml')))}.toml"
    path.write_text(toml(values))
    return path


class Server:
    """The tiny sglang server; ``plugins`` is always put in SGLANG_PLUGINS ("none": no plugin at all)."""

    def __init__(self, venv: Path, model: Path, workdir: Path, args: Iterable[str] = (), *,
                 plugins: str = "ebctl", ebctl_config: Path | None = None, env: dict[str, str] | None = None) -> None:
        """``env``: on top of ONE_TORCH_CORE (e.g. TP_TORCH_CORES for ``--tp-size 2``)."""
        env = {**{k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")},
               **ONE_TORCH_CORE, **(env or {})}
        env["SGLANG_PLUGINS"] = plugins
        if ebctl_config is not None:
            env["EBCTL_CONFIG"] = str(ebctl_config)
        self.venv = venv
        self.log_path = workdir / f"server.{time.monotonic_ns()}.log"
        self._cm = tiny_server(venv, model, list(args), env=env, log_path=self.log_path, timeout=180)
        t0 = time.monotonic()
        self.url, self.proc = self._cm.__enter__()
        self.ready_s = time.monotonic() - t0

    def server_info(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=30) as r:
            return json.loads(r.read())

    def ebctl(self) -> dict:
        """The plugin's status, as the scheduler adds it to GET /server_info."""
        return self.server_info()["internal_states"][0]["ebctl"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def bench(venv: Path, url: str, out: Path, *, num_prompts: int, input_len: int = 32, output_len: int = 16,
          range_ratio: float = 1.0, concurrency: int | None = None, seed: int = 1,
          timeout: float = 300, request_rate: float | None = None) -> dict:
    """Run sglang's own load client; its JSON result (``completed``, ``total_output_tokens``, ...)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    cmd = [str(venv / "bin" / "python"), "-m", "sglang.benchmark.serving", "--backend", "sglang",
           "--host", host, "--port", port, "--dataset-name", "random-ids", "--num-prompts", str(num_prompts),
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", str(range_ratio), "--max-concurrency", str(concurrency or num_prompts),
           "--warmup-requests", "0", "--disable-tqdm", "--seed", str(seed), "--output-file", str(out)]
    if request_rate is not None:  # open loop: Poisson arrivals at this rate (closed loop otherwise)
        cmd += ["--request-rate", str(request_rate)]
    out.unlink(missing_ok=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=server_env())
    assert p.returncode == 0 and out.exists(), f"benchmark failed ({p.returncode}):\n{p.stdout[-3000:]}\n" \
                                               f"{p.stderr[-3000:]}"
    return json.loads(out.read_text().splitlines()[-1])


def warm_shapes(url: str, max_tokens: int, *, seed: int = 0) -> None:
    """Run one prefill of every row count 1..``max_tokens`` (one request each, a fresh random prompt of ids
    10-499, within the tiny model's 512, one output token, one at a time). On this project's Intel VM (AMX) the
    first forward of a row count costs more than later ones (kernels built for the shape; torch's bf16 ``linear``
    alone: ~1 ms the first time, 0.07 ms after): a prefill of a row count already
    run took 4.7 ms (median), a first one 8.3 ms, and in a 60-s calibration more than half the prefills were
    first ones (the prefill cost fit then failed its held-out test at 40%, with 30% and 63%; warmed, 10%). A
    prefill batch holds at most the chunk size (``--chunked-prefill-size``) of rows; decode batches (one row a
    request) warm up in their first seconds."""
    rng = random.Random(seed)
    for n in range(1, max_tokens + 1):
        post_json(f"{url}/generate", {"input_ids": [rng.randrange(10, 500) for _ in range(n)],
                                      "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout=60)


class Rig:
    """Daemon + tap + sglang server with the plugin: what most tests share (module scope)."""

    def __init__(self, venv: Path, model: Path, workdir: Path, server_args: Iterable[str] = (), *,
                 daemon: dict[str, str] | None = None, engine: dict[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.venv, self.workdir = venv, workdir
        self.daemon = self.tap = self.server = None
        try:
            self.daemon = Daemon(workdir, daemon)
            self.tap = Tap(workdir, self.daemon.cfg.endpoint("telemetry"))
            cfg = engine_config(workdir, self.daemon, self.tap, engine)
            self.server = Server(venv, model, workdir, server_args, ebctl_config=cfg, env=env)
        except BaseException:
            self.close()
            raise
        self.benches = 0

    def bench(self, **kw: Any) -> dict:
        self.benches += 1
        return bench(self.venv, self.server.url, self.workdir / f"bench.{self.benches}.json", **kw)

    def wait_policy(self, mode: str, timeout: float = 20.0, **fields: Any) -> dict:
        """Until the plugin runs ``mode`` (eb/mb/off/none) with ``fields`` (k=4, n_max=8, ...)."""
        t0 = time.monotonic()

        def ok() -> dict | None:
            st = self.server.ebctl()
            if st["mode"] == mode and all(st[k] == v for k, v in fields.items()):
                return st
            if mode != "none" and time.monotonic() - t0 > 0.5:
                self.generate(1)  # a daemon with data recomputes on the engine's next report: make one
            return None
        return wait_for(ok, timeout, f"the plugin to apply mode={mode} {fields}", interval=0.2)

    def set_mode(self, mode: str, **fields: Any) -> dict:
        """Tune the daemon to ``mode`` (mode and cold_mode, so it holds before and after data) and wait
        until the plugin applied it; the plugin's status then."""
        self.daemon.tune(controller__mode=mode, controller__cold_mode=mode)
        return self.wait_policy(mode, **fields)

    def set_eb(self) -> dict:
        self.daemon.tune(**{k.replace(".", "__"): v for k, v in EB_K4_N8.items()})
        return self.wait_policy("eb", k=4, n_max=8)

    def generate(self, n: int = 1) -> None:
        """A few small requests, e.g. to make the engine report (it is silent while idle)."""
        for _ in range(n):
            post_json(f"{self.server.url}/generate", {"input_ids": [5, 6, 7, 8],
                      "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})

    def close(self) -> None:
        for part, how in ((self.server, "close"), (self.tap, "close"), (self.daemon, "stop")):
            if part is not None:
                with contextlib.suppress(Exception):
                    getattr(part, how)()


def settled_completions(rig: Rig, quiet_s: float = 1.5, timeout: float = 15.0) -> int:
    """The daemon's completion count once it has stayed put for ``quiet_s``: longer than an idle sglang
    scheduler's poll (1 s, ``IdleSleeper.maybe_sleep``) and the link's flush (0.1 s), so that an earlier load's
    last completions, which ride on the next report when their step had no forward of its own, are in it."""
    count, since, deadline = rig.daemon.engine()["completions"], time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.25)
        now = rig.daemon.engine()["completions"]
        if now != count:
            count, since = now, time.monotonic()
    return count


def check_accounting(rig: Rig, **bench_kw: Any) -> tuple[dict, list[IterationReport]]:
    """Run the client; assert the daemon counted each completion once, with the client's token sums."""
    before = settled_completions(rig)
    mark = rig.tap.mark()
    res = rig.bench(**bench_kw)
    n = res["completed"]
    assert n == bench_kw["num_prompts"], res
    wait_for(lambda: rig.daemon.engine()["completions"] - before >= n, 10, "the daemon to count completions")
    time.sleep(0.5)  # nothing more may arrive
    reps = rig.tap.since(mark)
    finished = [f for r in reps for f in r.finished]
    counted = rig.daemon.engine()["completions"] - before
    assert counted == n, f"daemon counted {counted} completions, the client completed {n} ({len(finished)} in the tap)"
    assert len(finished) == n, f"{len(finished)} completions reported, the client completed {n}"
    out_tokens = sum(f.output_len for f in finished)
    assert out_tokens == res["total_output_tokens"], (out_tokens, res["total_output_tokens"])
    extra = sum(f.input_len for f in finished) - res["total_input_tokens"]
    assert extra in (0, n), extra  # the server may add a BOS token to each prompt
    assert {f.finish_reason for f in finished} == {"length"}  # the client sends ignore_eos
    assert all(0 < f.ttft_s < 60 for f in finished)
    assert all(r.forward_s > 0 for r in reps if r.kind is not BatchKind.IDLE)
    # The batch shape and KV read from sglang: each decode row holds its prompt (BOS included) and at most
    # output_len tokens; the KV in use covers the decode rows (less one shared BOS token per row at most).
    longest = bench_kw["input_len"] + bench_kw["output_len"] + 1
    dec = [r for r in reps if r.kind is BatchKind.DECODE]
    assert dec and all(r.prefill_reqs == 0 and r.decode_reqs >= 1 for r in dec)
    assert all(2 * r.decode_reqs <= r.decode_ctx_tokens <= longest * r.decode_reqs for r in dec), \
        [(r.decode_reqs, r.decode_ctx_tokens) for r in dec[:20]]
    assert all(r.decode_ctx_tokens - r.decode_reqs <= r.kv_used <= r.kv_total for r in dec), \
        [(r.decode_ctx_tokens, r.kv_used) for r in dec[:20]]
    return res, reps


def eb_check(reports: list[IterationReport], *, k: int, n_max: int) -> dict:
    """What EB(k, n_max) promises, checked on consecutive reports; the counts and the violations."""
    out: dict[str, Any] = {"over_cap": [], "early_refill": [], "short_refill": [], "refills": 0, "held": 0}
    prev = None
    for r in reports:
        if r.running > n_max:
            out["over_cap"].append(r)
        if r.kind is BatchKind.DECODE and r.waiting > 0 and 0 < n_max - r.running < k:
            out["held"] += 1  # stock would have admitted a waiting request here
        if r.kind is BatchKind.PREFILL and prev is not None and prev.kind is BatchKind.DECODE:
            before = r.running - r.prefill_reqs  # running when the gate said "refill"
            waiting_before = r.waiting + r.prefill_reqs
            if before > 0:
                out["refills"] += 1
                if n_max - before < k:
                    out["early_refill"].append((prev, r))
                if r.prefill_reqs < min(k, waiting_before):
                    out["short_refill"].append((prev, r))
        if r.kind is not BatchKind.IDLE:
            prev = r
    return out




def processes_with(marker: str) -> dict[int, str]:
    """Live processes whose environment holds ``marker`` (a run's unique EBCTL_CONFIG path): pid → command
    line. How a test finds everything ``ebctl start`` spawned, and only that."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() in (d / "environ").read_bytes() and \
                    (d / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def kill_leftovers(proc: subprocess.Popen, marker: str) -> None:
    """After a test of ``ebctl start``: SIGKILL its process group if it still runs, then every process that
    carries ``marker`` (only this run's), so a failed test leaves nothing behind."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)


def daemon_status(endpoint: str) -> dict | None:
    """The daemon's ``status`` over its control socket; None when it does not answer within 1 s."""
    try:
        with ControlClient(endpoint, timeout_s=1.0) as c:
            r = c.request("status")
    except DaemonUnreachable:
        return None
    return r.data if r.ok else None


@contextlib.contextmanager
def ebctl_start(venv: Path, model: Path, work: Path, server_args: list[str], sets: list[str], *,
                env: dict[str, str], serve_timeout: float = 300.0):
    """``ebctl start --engine sglang`` (runtime directory ``work/rt``, log ``work/start.log``) until sglang
    answers a generate request; yields the process and the server's URL; on exit, Ctrl-C (SIGINT: what
    stops both) and, after 120 s, SIGKILL of the whole process group."""
    rt, port = work / "rt", free_port()
    cmd = [str(venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt),
           *(x for kv in sets for x in ("--set", kv)), "start", "--engine", "sglang",
           "--", "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port), *server_args]
    log = open(work / "start.log", "wb")  # noqa: SIM115 -- closed in finally
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + serve_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ebctl start exited with {proc.returncode}:\n"
                                   f"{(work / 'start.log').read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                post_json(f"{url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
                          timeout=10)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"sglang under ebctl start did not serve within {serve_timeout:.0f} s")
            time.sleep(1.0)
        yield proc, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


__all__ = ["BURST", "EB_K4_N8", "ONE_TORCH_CORE", "TP_TORCH_CORES", "Daemon", "Rig", "Server", "Tap", "bench",
           "check_accounting", "daemon_status", "eb_check", "ebctl_start", "engine_config", "free_port",
           "kill_leftovers", "post_json", "processes_with", "server_env", "stop", "wait_for", "warm_shapes"]
