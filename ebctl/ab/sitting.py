"""One sitting of the A/B: every round runs every configuration once, each on a fresh server, its load from the
client, its record kept; the record written after every run (a partial one on Ctrl-C: every server stopped
first, exit 130). The shell around ``serve``, ``client`` and the pure figures."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebctl.ab import configs, procs, report, serve, stats, workloads

CLIENT = Path(__file__).resolve().parent / "client.py"
INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``run`` is its record as far as it got (its servers already stopped)."""

    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__()
        self.run = run


@dataclass
class Plan:
    """What a sitting runs, as the command line set it (``cli.plan``)."""

    cfgs: list[dict[str, Any]]
    baseline: str
    python: str  # the server's Python: sglang (and the client's aiohttp) are there
    args: list[str]  # launch_server's arguments, every configuration's
    env: dict[str, str]  # added to every server's environment (the CPU demo's)
    pairs: list[tuple[int, int]]
    ids: dict[str, Any]  # {"ids": [low, high), "exclude": [...]}: the token ids prompts are drawn from
    work: Path
    settings: dict[str, Any]  # the options, as recorded (runs, duration, last, drain, loop, rate, ...)
    source: str  # the workload's name
    command: str
    environment: dict[str, Any] = field(default_factory=dict)
    port: int = 0

    @property
    def names(self) -> list[str]:
        return [c["name"] for c in self.cfgs]


class Progress:
    """The progress line on stderr: rewritten in place on a terminal, a line at each change elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = ""

    def show(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
        elif text.split(" · ")[:3] != self.last.split(" · ")[:3]:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.last = text

    def done(self) -> None:
        if self.tty and self.last:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        self.last = ""


def _clock(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def time_left(runs_left: int, load_left: float, *, duration: float, start_s: float, drain_s: float = 5.0) -> float:
    """Seconds the sitting still needs: what the run under way has left (``load_left``) and, for each run after
    it, a server start (``start_s``: the mean so far), its load and a short drain."""
    return max(0.0, load_left) + runs_left * (start_s + duration + drain_s)


@contextlib.contextmanager
def _no_sigint():
    """Stopping servers is not interrupted by a second Ctrl-C."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def run_one(plan: Plan, cfg: dict[str, Any], work: Path, seed: int, tell: Any) -> dict[str, Any]:
    """Start the configuration fresh, load it, stop it; the run's record (``error`` set if it did not start,
    ``interrupted`` if Ctrl-C came). ``tell(phase, seconds of load left)`` shows the progress."""
    st = plan.settings
    run: dict[str, Any] = {"config": cfg["name"], "seed": seed, "workdir": str(work), "status": [], "pids": []}
    port = plan.port or _free_port()
    args, url = serve.endpoint(plan.args, port)
    client = None
    server = serve.Server(plan.python, cfg, args, work, url, plan.env)
    run["pids"] = server.pids
    try:
        tell("starting", st["duration"])
        try:
            run["ready_s"] = server.ready(st["ready_timeout"])
        except (RuntimeError, TimeoutError) as e:  # a run that does not start is reported; the others still run
            run["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
            return run
        cpu0 = procs.tree_cpu(server.proc.pid)
        spec = {"url": url, "loop": st["loop"], "concurrency": st["concurrency"], "duration": st["duration"],
                "drain": st["drain"], "pairs": plan.pairs, **plan.ids, "seed": seed, "out": str(work / "client.json"),
                "arrivals": (workloads.poisson_arrivals(st["rate"], st["duration"], seed) if st["loop"] == "open"
                             else [])}
        (work / "client.spec.json").write_text(json.dumps(spec))
        with open(work / "client.log", "wb") as log:
            client = subprocess.Popen([plan.python, str(CLIENT), str(work / "client.spec.json")], cwd="/",
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        run["pids"] = [*server.remember(), client.pid]
        if st["pin"]:
            run["pinned"] = procs.pin([*procs.tree(server.proc.pid), client.pid])
        t0, threads0 = time.monotonic(), procs.scheduler_threads(procs.tree(server.proc.pid))
        next_status = st["status_every"] if server.control else math.inf
        try:
            while client.poll() is None:
                el = time.monotonic() - t0
                tell("load" if el < st["duration"] else "drain", st["duration"] - el)
                if el >= next_status and el < st["duration"]:
                    run["status"].append({"t": el, "status": serve.daemon_status(server.control)})
                    next_status += st["status_every"]
                if el > st["duration"] + st["drain"] + 120:
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    client.wait(min(1.0, max(0.05, next_status - el)))
        except KeyboardInterrupt:
            run["interrupted"] = True
            with _no_sigint():
                client.send_signal(signal.SIGTERM)  # it writes what it has
                with contextlib.suppress(subprocess.TimeoutExpired):
                    client.wait(15)
        run["cpu_s"] = {k: v - cpu0.get(k, 0.0) for k, v in procs.tree_cpu(server.proc.pid).items()}
        run["scheduler_threads"] = procs.thread_use(threads0, procs.scheduler_threads(procs.tree(server.proc.pid)),
                                                    max(1e-9, time.monotonic() - t0))
        if server.control:
            run["status"].append({"t": time.monotonic() - t0, "status": serve.daemon_status(server.control)})
        if not (work / "client.json").is_file():
            run["error"] = f"the client exited with {client.returncode}: " + \
                (work / "client.log").read_text(errors="replace")[-1500:]
            return run
        finish(run, json.loads((work / "client.json").read_text()), st, server.log)
    except KeyboardInterrupt:
        run["interrupted"] = True
    finally:
        with _no_sigint():
            if client is not None and client.poll() is None:
                client.kill()
                client.wait(10)
            run["left_running"] = server.close()
        if run.get("interrupted"):
            raise Interrupted(run)  # also where the try returned early
    return run


def finish(run: dict[str, Any], res: dict[str, Any], st: dict[str, Any], log: Path) -> None:
    """The run's figures from the client's results (over the load it ran: all of it, or up to an interrupt)."""
    duration = min(st["duration"], res.get("stopped_at") or math.inf)
    last = min(st["last"], duration)
    run["load_s"] = duration
    run["decode_pace"] = report.decode_pace(log.read_text(errors="replace")) if log.is_file() else {}
    run["summary"] = stats.summarize(res["records"], res["hist"], res["res"], duration, last)
    width = plot_bin(st["duration"])
    run["series"] = {"bin_s": width, "tok_s": stats.bins(res["hist"], res["res"], width, duration),
                     "ttft_p99": stats.ttft_p99_bins(res["records"], width, duration)}
    run["client_cpu_s"], run["client_wall_s"] = res["cpu_s"], res["wall_s"]
    run["records"] = res["records"]
    run["errors"] = sorted({r["err"] for r in res["records"] if r["err"]})[:10]
    if st["loop"] == "open":
        sent = [r["t"] for r in res["records"]]
        run["arrival_rate"] = len(sent) / duration if duration > 0 else math.nan


def plot_bin(duration: float) -> float:
    """The picture's bin: about 24 points over a run, never under 5 s."""
    return max(5.0, round(duration / 24))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(plan: Plan, runs: list[dict[str, Any]], summary: dict | None, interrupted: bool) -> dict[str, Any]:
    """The sitting's JSON record (``--json``), in the shape ``tools/ab_pool.py`` and ``--from-json`` read."""
    ok = (summary is not None and not interrupted and all(
        "summary" in r and not r["summary"]["failed"] and not r["summary"]["unfinished"] for r in runs))
    return {"tool": "ebctl ab", "commit": plan.environment.get("commit"), "environment": plan.environment,
            "command": plan.command, "configs": plan.names, "base_args": plan.args, "settings": plan.settings,
            "workload": {"source": plan.source, "seed": plan.settings["seed"], "pairs": plan.pairs},
            "bin_s": stats.BIN_S, "runs": runs, "summary": summary, "interrupted": interrupted, "ok": ok}


def write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(stats.finite(doc), separators=(",", ":"), default=str))


def sit(plan: Plan, out: Path | None) -> tuple[list[dict[str, Any]], bool]:
    """Every round, every configuration; (the runs, interrupted?). The record goes to ``out`` after each run."""
    st, progress = plan.settings, Progress()
    width = max(len(n) for n in plan.names)
    runs: list[dict[str, Any]] = []
    total = st["runs"] * len(plan.cfgs)
    count = 0
    try:
        for rnd in range(1, st["runs"] + 1):
            for i, cfg in enumerate(configs.round_order(plan.cfgs, rnd, st["order"]), 1):
                count += 1
                starts = [r["ready_s"] for r in runs if "ready_s" in r]
                start_s = sum(starts) / len(starts) if starts else 60.0

                def tell(phase: str, left: float, rnd: int = rnd, i: int = i, cfg: dict = cfg,
                         start_s: float = start_s, count: int = count) -> None:
                    rest = time_left(total - count, left + (start_s if phase == "starting" else 0),
                                     duration=st["duration"], start_s=start_s)
                    progress.show(f"[ab] round {rnd}/{st['runs']} · {cfg['name']} ({i}/{len(plan.cfgs)}) · {phase} · "
                                  f"{_clock(max(0.0, left))} of load left · about {_clock(rest)} left in all")

                try:
                    run = run_one(plan, cfg, plan.work / f"r{count}", st["seed"] * 1_000_003 + count, tell)
                except Interrupted as e:
                    e.run["round"] = rnd
                    runs.append(e.run)
                    progress.done()
                    print(report.run_line(rnd, st["runs"], e.run, width) + " (interrupted)", flush=True)
                    raise
                finally:
                    progress.done()
                run["round"] = rnd
                runs.append(run)
                print(report.run_line(rnd, st["runs"], run, width), flush=True)
                write(out, record(plan, runs, None, False))
    except KeyboardInterrupt:
        progress.done()
        return runs, True
    return runs, False
