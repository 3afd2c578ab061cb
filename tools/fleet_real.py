"""A fleet on the real SGLang CPU server: two servers behind SGLang's gateway (smg), with and without ebctl.

    python tools/fleet_real.py [--configs plain,ebctl] [--runs 3] [--duration 240] [--last 120]
                               [--concurrency 32] [--policy least_load] [--gateway-args='...'] [--set K=V]
                               [--health-generation] [--kill-at S] [--json FILE] [--report FILE] [--quick]

Every run starts the fleet FRESH: two tiny-model servers (tools/sglang_cpu, the base args of tools/ab_real.py),
each with one torch thread, server i's scheduler main thread pinned to core i once the fleet is up
(tools/ab_real.py's ``pin``: ``SGLANG_CPU_OMP_THREADS_BIND`` pins nothing on a CPU without AMX; every other
thread, the gateway and the client keep every core; ``--no-pin``: none pinned), and ``smg launch`` in front
(smg 1.13.0 from tools/smg_env.sh) with ``--policy`` and the gateway settings. Configurations:

- ``plain``: the servers without the plugin (``SGLANG_PLUGINS=none``);
- ``ebctl``: one node daemon (``ebctl daemon``, node name ``n1``, default configuration, cold) and each server
  started by ``ebctl start --engine sglang --join --server sN``: the deployment docs/fleet.md describes.

Configurations run interleaved, ``--runs`` rounds. The client is tools/ab_real.py's (a timed closed loop of
``--concurrency`` streaming requests, each a fresh random prompt, the issue workload's lengths) pointed at the
gateway. ``--kill-at S``: server 2's process group gets SIGKILL S seconds into the load; the run then also counts
the failed requests sent before the kill (in flight on it, or elsewhere) and after it (none may fail: the
gateway must send every later request to the survivor). For ``ebctl`` runs the node daemon's status is read
every ``--status-every`` s: the engines reporting and gone per server (``ebctl status --daemon`` shows the same).

Gateway settings (``--gateway-args``; default: ``RECOMMENDED``, what docs/fleet.md found by these runs) and
``--health-generation`` (leave sglang's ``/health`` generating a token, its default; by default the servers run
with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``). ``--gateway-args=`` (empty) runs smg's own defaults.

Printed: a line per run, then a table per configuration (medians over its runs) with the ratio of output tok/s
to ``plain`` (bootstrap 95% interval, as tools/ab_real.py). ``--quick``: one run each, 40 s, kill at 20 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import ab_real  # noqa: E402

RECOMMENDED = ("--disable-worker-overload-protection", "--health-check-interval-secs", "1",
               "--health-failure-threshold", "2", "--health-check-timeout-secs", "2")
NODE = "n1"


def smg_bin(arg: str | None = None) -> Path:
    """``arg``, else the smg of the cached environment tools/smg_env.sh builds once."""
    if arg:
        return Path(arg)
    p = subprocess.run(["bash", str(REPO / "tools" / "smg_env.sh")], capture_output=True, text=True, check=True)
    return Path(p.stdout.strip().splitlines()[-1]) / "bin" / "smg"


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")


def _wait_http(url: str, procs: list[subprocess.Popen], timeout: float, what: str) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: a process exited with {p.returncode} before {url} answered")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {url} did not answer within {timeout:.0f} s")
        time.sleep(0.5)


class Fleet:
    """Two servers (plain, or joined to one node daemon) and smg in front; ``url`` is the gateway's,
    ``control`` the node daemon's control endpoint (None for plain). ``kill_server(i)``: SIGKILL to server i's
    process group; ``kill_daemon()``, ``start_daemon()``: the node daemon. ``close()`` stops everything."""

    def __init__(self, h: Any, venv: Path, model: Path, work: Path, *, ebctl: bool, smg: Path, policy: str,
                 gateway_args: list[str], server_args: list[str], health_generation: bool = False,
                 settings: list[str] = (), servers: int = 2, timeout: float = 300.0) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.h, self.venv, self.work, self.settings = h, venv, work, list(settings)
        self.procs: list[subprocess.Popen] = []
        self.daemon: subprocess.Popen | None = None
        self.ports = [h.free_port() for _ in range(servers)]
        self.rt = work / "rt"
        self.control = f"ipc://{self.rt / 'control.sock'}" if ebctl else None
        self.servers: list[subprocess.Popen] = []
        t0 = time.monotonic()
        try:
            base = {k: v for k, v in h.server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
            base["OMP_NUM_THREADS"] = "1"
            if not health_generation:
                base["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "0"
            if ebctl:
                self.start_daemon()
            py = str(venv / "bin" / "python")
            for i, port in enumerate(self.ports):
                env = {**base, "SGLANG_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1))}
                server = ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port), *server_args]
                if ebctl:
                    cmd = [py, "-m", "ebctl", "--runtime-dir", str(self.rt), *self._sets(), "start", "--engine",
                           "sglang", "--join", "--server", f"s{i + 1}", "--", *server]
                else:
                    env["SGLANG_PLUGINS"] = "none"
                    cmd = [py, "-m", "sglang.launch_server", *server]
                self.servers.append(_spawn(cmd, env, work / f"server{i + 1}.log"))
            self.procs += self.servers
            for port in self.ports:
                _wait_http(f"http://127.0.0.1:{port}/health", self.servers, timeout, "the servers")
            gport = h.free_port()
            self.url = f"http://127.0.0.1:{gport}"
            self.gateway = _spawn([str(smg), "launch", "--host", "127.0.0.1", "--port", str(gport),
                                   "--prometheus-port", str(h.free_port()), "--policy", policy, "--worker-urls",
                                   *(f"http://127.0.0.1:{p}" for p in self.ports), *gateway_args],
                                  dict(os.environ), work / "smg.log")
            self.procs.append(self.gateway)
            _wait_http(f"{self.url}/health", [self.gateway], 60, "the gateway")
            answered, deadline = 0, time.monotonic() + timeout
            while answered < 2 * servers:  # the gateway has registered its workers (it probes each first)
                try:
                    h.post_json(f"{self.url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {
                        "max_new_tokens": 2}}, timeout=60)
                    answered += 1
                except OSError:  # urllib's HTTPError too: 404 "no worker serves model" until registered
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
        except BaseException:
            self.close()
            raise
        self.ready_s = time.monotonic() - t0

    def _sets(self) -> list[str]:
        return [x for kv in [f"daemon.node={NODE}", *self.settings] for x in ("--set", kv)]

    def start_daemon(self) -> None:
        py = str(self.venv / "bin" / "python")
        self.daemon = _spawn([py, "-m", "ebctl", "--runtime-dir", str(self.rt), *self._sets(), "daemon"],
                             dict(os.environ), self.work / "daemon.log")
        self.procs.append(self.daemon)
        deadline = time.monotonic() + 30
        while self.h.daemon_status(self.control) is None:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the node daemon did not answer: {(self.work / 'daemon.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def kill_daemon(self) -> None:
        os.killpg(self.daemon.pid, signal.SIGKILL)
        self.daemon.wait(10)

    def kill_server(self, i: int) -> None:
        """SIGKILL to server ``i``'s sglang (its launcher's process group: scheduler and detokenizer too)."""
        out = subprocess.run(["pgrep", "-f", f"sglang.launch_server .*--port {self.ports[i]} "],
                             capture_output=True, text=True).stdout.split()
        for pid in map(int, out):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)

    def status(self) -> dict[str, Any] | None:
        return self.h.daemon_status(self.control) if self.control else None

    def close(self) -> None:
        for p in reversed(self.procs):  # ebctl start: SIGINT stops its engine; sglang: SIGTERM to the launcher
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT if p in self.servers and self.control else signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for port in getattr(self, "ports", []):  # a sglang left by a group that moved (none expected)
            out = subprocess.run(["pgrep", "-f", f"sglang.launch_server .*--port {port} "], capture_output=True,
                                 text=True).stdout.split()
            for pid in map(int, out):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def policies(status: dict[str, Any] | None) -> dict[str, str]:
    """engine → its policy and the measured search's state, in a few words, from the node daemon's status."""
    out = {}
    for eid, st in sorted(((status or {}).get("engines") or {}).items()):
        tu = st.get("tuner") if isinstance(st.get("tuner"), dict) else {}
        g = st.get("gain") if isinstance(st.get("gain"), dict) else {}
        gain, cost = g.get("vs_stock"), g.get("explore_share")
        out[eid] = (f"{st.get('mode')} k={st.get('k')} N={st.get('n_max')} incumbent {tu.get('incumbent', '-')} "
                    f"trials {tu.get('trials', '-')} gain {gain if gain is None else f'{gain:+.1%}'} exploring "
                    f"{cost if cost is None else f'{cost:.1%}'}")
    return out


def servers_seen(status: dict[str, Any] | None) -> dict[str, str]:
    """server → "live" or "gone", from the node daemon's status (``ebctl.fleet`` reads the engine ids)."""
    from ebctl import fleet

    if not status:
        return {}
    node = str((status.get("daemon") or {}).get("node") or "")
    out: dict[str, str] = {}
    for eid, st in (status.get("engines") or {}).items():
        server = fleet.where(eid, node).server
        if not st.get("gone") or server not in out:
            out[server] = "gone" if st.get("gone") else "live"
    return dict(sorted(out.items()))


def kill_split(records: list[dict[str, Any]], kill_at: float | None) -> dict[str, int]:
    """Failed requests sent before the kill (in flight then) and after it."""
    bad = [r for r in records if r["status"] != "ok"]
    if kill_at is None:
        return {"failed_before_kill": len(bad), "failed_after_kill": 0}
    return {"failed_before_kill": sum(r["t"] < kill_at for r in bad),
            "failed_after_kill": sum(r["t"] >= kill_at for r in bad)}


def run_one(h: Any, venv: Path, model: Path, work: Path, name: str, a: Any, smg: Path, pairs: list, ids: list,
            seed: int) -> dict[str, Any]:
    run: dict[str, Any] = {"config": name, "seed": seed, "status": [], "workdir": str(work)}
    try:
        fleet = Fleet(h, venv, model, work, ebctl=name == "ebctl", smg=smg, policy=a.policy,
                      gateway_args=a.gateway_args, server_args=ab_real.base_args(a.server_args),
                      health_generation=a.health_generation, settings=a.sets)
    except Exception as e:
        run["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
        return run
    try:
        run["ready_s"] = fleet.ready_s
        if a.pin:  # each scheduler on a core of its own (two servers, two cores here); the rest float
            every = set(range(os.cpu_count() or 1))
            run["pinned"] = sum(ab_real.pin(ab_real.tree(s.pid), core=i % len(every), rest=every)
                                for i, s in enumerate(fleet.servers))
        client = ab_real.start_client(venv, fleet.url, work, concurrency=a.concurrency, duration=a.duration,
                                      drain=a.drain, pairs=pairs, ids=ids, seed=seed)
        t0 = time.monotonic()
        events = sorted([*((x * a.status_every, "status") for x in range(1, int(a.duration // a.status_every) + 1)),
                         *(((a.kill_at, "kill"),) if a.kill_at is not None else ())])
        try:
            for at, what in events:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    client.wait(max(0.0, at - (time.monotonic() - t0)))
                    break
                if what == "kill":
                    fleet.kill_server(1)
                    run["killed_at"] = time.monotonic() - t0
                elif fleet.control:
                    run["status"].append({"t": time.monotonic() - t0, "servers": servers_seen(fleet.status())})
            client.wait(a.duration + a.drain + 120)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
        if fleet.control:
            time.sleep(0 if a.kill_at is None else 1)
            last = fleet.status()
            run["status"].append({"t": time.monotonic() - t0, "servers": servers_seen(last)})
            run["policies"] = policies(last)
        if client.returncode != 0 or not (work / "client.json").is_file():
            run["error"] = f"the client exited with {client.returncode}"
            return run
        res = json.loads((work / "client.json").read_text())
        run["summary"] = {**ab_real.summarize(res["records"], res["hist"], res["res"], a.duration, a.last),
                          **kill_split(res["records"], run.get("killed_at"))}
        run["errors"] = sorted({r["err"][:160] for r in res["records"] if r["err"]})[:5]
    finally:
        fleet.close()
    return run


def run_line(rnd: int, runs: int, run: dict[str, Any]) -> str:
    head = f"[fleet] round {rnd}/{runs} {run['config']:<6}"
    if "summary" not in run:
        return f"{head}: FAILED: {run.get('error')}"
    s, f = run["summary"], ab_real.fmt
    line = (f"{head}: {f(s['tok_s'])} out tok/s (last part {f(s['tok_s_last'])}), TTFT p50/p99 "
            f"{f(s['ttft_p50'], 1, 2)}/{f(s['ttft_p99'], 1, 2)} s, TPOT p50/p99 {f(s['tpot_p50'], 1e3, 1)}/"
            f"{f(s['tpot_p99'], 1e3, 1)} ms, {s['completed']} completed, {s['failed']} failed")
    if "killed_at" in run:
        line += (f" (server 2 killed at {run['killed_at']:.0f} s: {s['failed_before_kill']} failed of those sent "
                 f"before, {s['failed_after_kill']} of those sent after)")
    line += f", ready in {run['ready_s']:.0f} s" + (f", {run['pinned']} schedulers pinned" if "pinned" in run else "")
    if run["status"]:
        seen = [f"{x['t']:.0f} s {','.join(f'{k} {v}' for k, v in x['servers'].items()) or 'none'}"
                for x in run["status"]]
        line += f" | node daemon: {'; '.join(seen)}"
    if run.get("policies"):
        line += " | at the end: " + "; ".join(f"{k} {v}" for k, v in run["policies"].items())
    if run.get("errors"):
        line += f" | errors: {run['errors'][:2]}"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,ebctl", help="comma-separated: plain, ebctl")
    ap.add_argument("--runs", type=int, default=3, help="rounds; each runs every configuration once")
    ap.add_argument("--duration", type=float, default=240.0, help="seconds of load per run")
    ap.add_argument("--last", type=float, default=120.0, help="the last part's length (s) for its throughput")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds to wait for the requests in flight at the end")
    ap.add_argument("--concurrency", type=int, default=32, help="requests always in flight (two servers of 16 slots)")
    ap.add_argument("--policy", default="least_load", help="smg's --policy (least_load, round_robin, ...)")
    ap.add_argument("--gateway-args", default=None, help="smg flags (default: RECOMMENDED; empty: smg's defaults)")
    ap.add_argument("--health-generation", action="store_true",
                    help="leave sglang's /health generating a token (its default) instead of a liveness answer")
    ap.add_argument("--kill-at", type=float, default=None, help="SIGKILL server 2 this many seconds into the load")
    ap.add_argument("--status-every", type=float, default=30.0, help="seconds between the node daemon's status reads")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="an ebctl setting of the node daemon (repeatable), e.g. controller.mode=off")
    ap.add_argument("--server-args", default="", help="sglang flags added to every server's base args")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave thread placement to the kernel (default: server i's scheduler on core i, see pin())")
    ap.add_argument("--requests", type=int, default=480, help="(input, output) pairs, cycled in order")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--venv", default=None, help="the sglang CPU environment (default: tools/sglang_env.sh's)")
    ap.add_argument("--smg", default=None, help="the smg binary (default: tools/smg_env.sh's)")
    ap.add_argument("--model", type=Path, default=None, help="a tiny model built by make_tiny_model.py")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every run's record here")
    ap.add_argument("--report", type=Path, default=None, help="write the markdown record here")
    ap.add_argument("--quick", action="store_true", help="one run each, 40 s of load, server 2 killed at 20 s")
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.duration, a.last, a.kill_at, a.status_every = 1, 40.0, 15.0, 20.0, 10.0
    a.gateway_args = list(RECOMMENDED) if a.gateway_args is None else shlex.split(a.gateway_args)
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    if not names or set(names) - {"plain", "ebctl"} or len(set(names)) != len(names):
        ap.error(f"--configs {a.configs!r}: plain and/or ebctl, each once")
    if a.kill_at is not None and not 0 < a.kill_at < a.duration:
        ap.error("--kill-at must fall within the load")
    a.last = min(a.last, a.duration)

    h = ab_real.harness()
    from server import ensure_installed, exit_on_sigterm, sglang_venv

    exit_on_sigterm()

    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    smg = smg_bin(a.smg)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="ebfl-"))
    work.mkdir(parents=True, exist_ok=True)
    model = a.model or work / "model"
    subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                    str(model)], check=True, capture_output=True)
    ids = ab_real.model_vocab(model)
    pairs = ab_real.issue_workload(a.requests, a.seed)
    cmd = f"python tools/fleet_real.py {shlex.join(sys.argv[1:] if argv is None else argv)}"
    print(f"[fleet] {', '.join(names)}: {a.runs} round(s) of {a.duration:.0f} s, c = {a.concurrency}, smg --policy "
          f"{a.policy} {shlex.join(a.gateway_args)}; /health {'generates' if a.health_generation else 'liveness'}"
          f"; workdir {work}", flush=True)
    t_start = time.monotonic()
    runs: list[dict[str, Any]] = []
    for rnd in range(1, a.runs + 1):
        for name in names:
            run = run_one(h, venv, model, work / f"r{len(runs) + 1}", name, a, smg, pairs, ids,
                          a.seed * 1_000_003 + len(runs) + 1)
            run["round"] = rnd
            runs.append(run)
            print(run_line(rnd, a.runs, run), flush=True)
    text, summary = ab_real.table(names, runs, names[0], a.last)
    done = [r for r in runs if "summary" in r]
    after = {n: sum(r["summary"]["failed_after_kill"] for r in done if r["config"] == n) for n in names}
    print(f"\n`{cmd}`: {time.monotonic() - t_start:.0f} s in all\n\n{text}")
    if a.kill_at is not None:
        print("\nfailed among the requests sent after the kill: "
              + ", ".join(f"{n} {after[n]}" for n in names))
    if a.json:
        a.json.write_text(json.dumps({"command": cmd, "settings": vars(a), "runs": runs, "summary": summary},
                                     default=str))
    if a.report:
        lines = [f"`{cmd}`", "", "```", *(run_line(r["round"], a.runs, r) for r in runs), "```", "", text]
        a.report.write_text("\n".join(lines) + "\n")
    bad = [r for r in runs if "summary" not in r or r["summary"]["failed_after_kill"]
           or (a.kill_at is None and r["summary"]["failed"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
