"""RSS of the real daemon process over real time: does it level off, and if not, what grows?

Starts the daemon as ``ebctl start`` does (``python -m ebctl.daemon --config FILE``, its own process, under a
temporary runtime directory, with the soak's configuration: eb, θ by Eq. 3 + 5, TTL 5 s, republish 1 s, plus
a Prometheus exporter on a free port) and feeds it over its real sockets: two synthetic servers (those of
tools/daemon_memory.py, ~55 reports/s each, stepped in real time) report through ``ebctl.link.EngineLink``, the
plugin's own link (PUSH to the telemetry socket, SUB to the policies; the servers apply the policy version
they hold), ``status`` is asked every 10 s through one ``ebctl.link.ControlClient`` (as the soak does) and the
exporter scraped every 15 s. ``--faults-s S``: every S s, in turn, what the soak does to a daemon it keeps:
``tune`` of a live key and back; a broken config file reloaded by SIGHUP (refused), then the good one by
the ``reload`` op; SIGSTOP for 30 s; the second server restarted (its link closed, 30 s silent, a new link
and instance under the same id).

Every ``--sample-s`` (10) s it reads the daemon's /proc/PID/status (VmRSS, RssAnon, RssFile, Threads), its
fds, and, through a wrapper the daemon runs in (``python -c WRAPPER``: the daemon's own ``cli_main`` after
two signal handlers), the daemon's view of itself on SIGUSR2: Python's allocated blocks, glibc's
``mallinfo2`` (in use, free but kept, mmapped), and with ``--trace`` tracemalloc's traced memory and its own
bookkeeping. With ``--trace`` (tracemalloc on from the start, ``--frames`` deep) SIGUSR1 dumps a snapshot at
``--snap-min`` (default 10) and at the end; the sites that grew most between them are printed (``--top``).
``--arena-max N`` runs the daemon with MALLOC_ARENA_MAX=N.

It prints every sample, then the slope of each series from ``--warmup-min`` (5) on, in MB/h with its standard
error (``scipy.stats.linregress``), and with faults the RSS each fault's interval added (from the sample
before it to the sample before the next); ``--json`` writes the samples and the growth. Run it niced, one at a time:

    nice -n 10 python tools/daemon_rss.py --minutes 30 [--trace] [--arena-max 2] [--faults-s 60]
                                          [--scrape-s 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scistats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import daemon_memory as dm

from ebctl.link import ControlClient, DaemonUnreachable, EngineLink

# Runs in the daemon's process: argv = [stats file, snapshot prefix, the daemon's own arguments...].
# SIGUSR2 appends one JSON line of the process's own view; SIGUSR1 collects garbage and dumps a tracemalloc
# snapshot. Both run on the main thread between bytecodes (no thread of ours: a thread would take a malloc
# arena of its own).
WRAPPER = r"""
import ctypes, gc, json, os, signal, sys, time, tracemalloc
stats_path, snap_prefix = sys.argv[1], sys.argv[2]
sys.argv = ["python -m ebctl.daemon", *sys.argv[3:]]
class M(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
try:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = M
except (OSError, AttributeError):
    libc = None
snaps = [0]
def sample(*_):
    d = {"t": time.time(), "blocks": sys.getallocatedblocks()}
    if libc is not None:
        m = libc.mallinfo2()
        d.update(malloc_used=m.uordblks / 2**20, malloc_free=m.fordblks / 2**20, malloc_mmap=m.hblkhd / 2**20,
                 malloc_arena=m.arena / 2**20)
    if tracemalloc.is_tracing():
        d.update(traced=tracemalloc.get_traced_memory()[0] / 2**20,
                 tracemalloc_own=tracemalloc.get_tracemalloc_memory() / 2**20)
    with open(stats_path, "a") as f:
        f.write(json.dumps(d) + "\n")
def snapshot(*_):
    if tracemalloc.is_tracing():
        snaps[0] += 1
        gc.collect()  # garbage in cycles is not growth
        tracemalloc.take_snapshot().dump(f"{snap_prefix}{snaps[0]}")
signal.signal(signal.SIGUSR2, sample)
signal.signal(signal.SIGUSR1, snapshot)
from ebctl.daemon.core import cli_main
frames = int(os.environ.get("EBCTL_RSS_TRACE", "0"))
if frames:  # after the imports: traced, they take 20 s, and what they allocate stays
    tracemalloc.start(frames)
sys.exit(cli_main())
"""

GOOD = ("[daemon]\nruntime_dir = \"{rt}\"\nrepublish_s = 1.0\nmetrics_port = {port}\n"
        "[controller]\nmode = \"eb\"\ntheta_method = \"paper\"\ncold_mode = \"eb\"\nttl_s = 5.0\n")
NAMES = ("node/s1/dp0", "node/s2/dp0")
STOP_S = RESTART_GAP_S = 30.0


def proc_sample(pid: int) -> dict[str, float]:
    """The daemon's RSS (MB: all, anonymous, file-backed), threads and fds from /proc."""
    out: dict[str, float] = {}
    keys = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file", "Threads:": "threads"}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k = line.split(":", 1)[0] + ":"
        if k in keys:
            v = int(line.split()[1])
            out[keys[k]] = v if k == "Threads:" else v / 1024
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Feed:
    """The synthetic servers in real time, each behind its own EngineLink."""

    def __init__(self, rt: Path, seed: int) -> None:
        self.rt = rt
        rng = np.random.default_rng(seed)
        self.t0 = time.monotonic()
        dm.WALL0 = time.time()  # the servers' wall clock: t = 0 is now
        self.servers = [dm.Server(n, np.random.default_rng(rng.integers(1 << 62)), rate=dm.RATE) for n in NAMES]
        self.links = [self._link(s) for s in self.servers]
        self.heap = [(self.now(), i) for i in range(len(self.servers))]
        self.reports = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _link(self, srv: dm.Server) -> EngineLink:
        link = EngineLink(srv.engine_id, telemetry_endpoint=f"ipc://{self.rt / 'telemetry.sock'}",
                          policy_endpoint=f"ipc://{self.rt / 'policy.sock'}", max_running=dm.SLOTS)
        srv.instance = link.instance
        return link

    def restart(self, i: int, gap_s: float) -> None:
        """Server ``i`` exits (link closed) and comes back after ``gap_s`` as a new process under its id."""
        self.links[i].close()
        srv = self.servers[i]
        srv.restart(srv.engine_id)
        self.links[i] = self._link(srv)
        self.heap = [(max(t, self.now() + gap_s) if j == i else t, j) for t, j in self.heap]
        heapq.heapify(self.heap)
        srv.next_arrival = self.now() + gap_s  # the clients send to the servers that are up

    def step_until(self, deadline: float) -> None:
        """Every iteration due before ``deadline`` (s of feed time), sleeping until each is due."""
        while self.heap[0][0] < deadline:
            t, i = self.heap[0]
            if (wait := t - self.now()) > 0:
                time.sleep(wait)
            heapq.heappop(self.heap)
            srv, link = self.servers[i], self.links[i]
            r, t_next = srv.step(t)
            link.report(r)
            pol = link.policy(time.monotonic())
            srv.policy_version = pol.version if pol is not None else -1
            self.reports += 1
            heapq.heappush(self.heap, (t_next, i))
        if (wait := deadline - self.now()) > 0:
            time.sleep(wait)

    def close(self) -> None:
        for link in self.links:
            link.close()


def slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Slope per hour, its standard error, and the mean of ``ys`` (x in seconds); NaN with < 3 points."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
    if len(pts) < 3:
        return math.nan, math.nan, math.nan
    r = scistats.linregress([p[0] for p in pts], [p[1] for p in pts])
    return r.slope * 3600, r.stderr * 3600, float(np.mean([p[1] for p in pts]))


def growth(base: Path, last: Path, top: int) -> list[dict[str, Any]]:
    """The allocation sites (by traceback) that grew most from snapshot ``base`` to ``last``."""
    drop = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<string>")]
    a = tracemalloc.Snapshot.load(str(base)).filter_traces(drop)
    b = tracemalloc.Snapshot.load(str(last)).filter_traces(drop)
    out = []
    for s in b.compare_to(a, "traceback")[:top]:
        out.append({"size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size,
                    "traceback": [f"{f.filename}:{f.lineno}" for f in s.traceback]})
    for key in ("filename", "lineno"):
        for s in b.compare_to(a, key)[:top]:
            out.append({"by": key, "size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size,
                        "traceback": [f"{f.filename}:{f.lineno}" for f in s.traceback]})
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ebrss-"))
    rt = tmp / "rt"
    rt.mkdir(mode=0o700)
    port = free_port() if a.scrape_s > 0 else 0
    good = GOOD.format(rt=rt, port=port)
    cfg = tmp / "ebctl.toml"
    cfg.write_text(good)
    stats_path, snap_prefix = tmp / "self.jsonl", tmp / "snap"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONTRACEMALLOC", None)
    if a.trace:
        env["EBCTL_RSS_TRACE"] = str(a.frames)
    if a.arena_max:
        env["MALLOC_ARENA_MAX"] = str(a.arena_max)
    log = open(tmp / "daemon.log", "wb")  # noqa: SIM115 -- the child holds it
    daemon = subprocess.Popen([sys.executable, "-c", WRAPPER, str(stats_path), str(snap_prefix), "--config",
                               str(cfg)], env=env, stderr=log, stdout=log, stdin=subprocess.DEVNULL,
                              start_new_session=True, cwd="/")
    log.close()
    control = ControlClient(f"ipc://{rt / 'control.sock'}", timeout_s=3.0)
    samples: list[dict[str, Any]] = []
    faults: list[tuple[float, str]] = []
    feed: Feed | None = None
    try:
        control.wait_ready(60.0, alive=lambda: daemon.poll() is None)
        feed = Feed(rt, a.seed)
        end = a.minutes * 60.0
        next_sample = next_status = next_scrape = 0.0
        next_fault = a.faults_s if a.faults_s > 0 else math.inf
        snap_at = [m * 60.0 for m in a.snap_min if m * 60.0 < end] if a.trace else []
        n_fault, stopped_until, status_fail = 0, -1.0, 0
        while (t := feed.now()) < end:
            if stopped_until > 0 and t >= stopped_until:
                os.kill(daemon.pid, signal.SIGCONT)
                stopped_until = -1.0
            if t >= next_sample:
                next_sample += a.sample_s
                s = {"t": t, **proc_sample(daemon.pid), "reports": feed.reports}
                if t >= stopped_until:  # a stopped process takes its signals when it goes on
                    os.kill(daemon.pid, signal.SIGUSR2)
                samples.append(s)
                print(f"{t / 60:6.1f} min  RSS {s['rss']:6.1f} MB (anon {s['anon']:6.1f}, file {s['file']:5.1f}), "
                      f"{s['threads']:.0f} threads, {s['fds']:.0f} fds, {feed.reports:,} reports", flush=True)
            if snap_at and t >= snap_at[0] and t >= stopped_until:
                snap_at.pop(0)
                os.kill(daemon.pid, signal.SIGUSR1)
            if t >= next_status and t >= stopped_until:
                next_status = t + a.status_s
                try:
                    reply = control.request("status")
                    status_fail += not reply.ok
                except DaemonUnreachable:
                    status_fail += 1
            if port and t >= next_scrape and t >= stopped_until:
                next_scrape = t + a.scrape_s
                with contextlib.suppress(OSError), \
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                    r.read()
            if t >= next_fault and t >= stopped_until:
                next_fault, n_fault = t + a.faults_s, n_fault + 1
                kind = ("tune", "reload", "stop30", "restart")[(n_fault - 1) % 4]
                faults.append((t, kind))
                if kind == "tune":
                    control.request("tune", updates={"controller.n_min_interval_s": 1.0})
                    control.request("tune", updates={"controller.n_min_interval_s": 5.0})
                elif kind == "reload":
                    cfg.write_text(good + "[controller\nbroken = \n")
                    os.kill(daemon.pid, signal.SIGHUP)
                    feed.step_until(feed.now() + 1.0)  # the loop takes the signal within its poll
                    cfg.write_text(good)
                    control.request("reload")
                elif kind == "stop30":
                    os.kill(daemon.pid, signal.SIGSTOP)
                    stopped_until = t + STOP_S
                else:
                    feed.restart(1, RESTART_GAP_S)
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited ({daemon.returncode}): "
                                   f"{(tmp / 'daemon.log').read_text()[-2000:]}")
            held = stopped_until > 0  # the daemon's timers wait for it
            feed.step_until(min(next_sample, end, stopped_until if held else math.inf, *(() if held else (
                next_status, next_scrape if port else math.inf, next_fault))))
        if a.trace:
            os.kill(daemon.pid, signal.SIGUSR1)
            os.kill(daemon.pid, signal.SIGUSR2)
            time.sleep(5.0)  # a snapshot of the daemon's heap takes a moment
    finally:
        if feed is not None:
            feed.close()
        control.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGCONT)
            daemon.terminate()
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    own = [json.loads(line) for line in stats_path.read_text().splitlines()] if stats_path.exists() else []
    for o in own:  # the daemon's own view, on the feed's clock (its t = 0 is dm.WALL0)
        o["t"] -= dm.WALL0
    result: dict[str, Any] = {"args": vars(a), "samples": samples, "self": own, "faults": faults,
                              "status_failed": status_fail, "reports": feed.reports if feed else 0}
    snaps = sorted(snap_prefix.parent.glob(snap_prefix.name + "*"), key=lambda p: int(p.name[len("snap"):]))
    if len(snaps) >= 2:
        result["growth"] = growth(snaps[0], snaps[-1], a.top)
    if a.keep:
        result["dir"] = str(tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def report(r: dict[str, Any]) -> None:
    a, w = r["args"], r["args"]["warmup_min"] * 60.0
    print(f"\n{r['reports']:,} reports, {len(r['faults'])} faults, {r['status_failed']} status polls unanswered; "
          f"slopes from minute {a['warmup_min']:g} (MB/h ± standard error, mean):")
    s = [x for x in r["samples"] if x["t"] >= w]
    for key, name in (("rss", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile"), ("threads", "threads"),
                      ("fds", "fds")):
        m, se, mean = slope([x["t"] for x in s], [x.get(key) for x in s])
        print(f"  {name:28s} {m:+8.3f} ± {se:.3f}   (mean {mean:.1f})")
    o = [x for x in r["self"] if x["t"] >= w]
    for key, name in (("traced", "tracemalloc traced (MiB)"), ("tracemalloc_own", "tracemalloc's own (MiB)"),
                      ("malloc_used", "glibc in use (MiB)"), ("malloc_free", "glibc free, kept (MiB)"),
                      ("malloc_mmap", "glibc mmapped (MiB)"), ("blocks", "Python blocks (/h)")):
        if any(key in x for x in o):
            m, se, mean = slope([x["t"] for x in o], [x.get(key) for x in o])
            print(f"  {name:28s} {m:+8.3f} ± {se:.3f}   (mean {mean:.1f})")
    if r["faults"]:
        print("\nRSS growth from the sample before each fault to the sample before the next (MB):")
        xs = r["samples"]
        ends = [t for t, _ in r["faults"][1:]] + [math.inf]
        steps: dict[str, list[float]] = {}
        for (t, kind), t_end in zip(r["faults"], ends, strict=True):
            before = [x["rss"] for x in xs if x["t"] <= t]
            after = [x["rss"] for x in xs if x["t"] <= t_end]
            if before and after:
                steps.setdefault(kind, []).append(after[-1] - before[-1])
        for kind, d in steps.items():
            print(f"  {kind:8s} " + " ".join(f"{v:+.1f}" for v in d))
    if "growth" in r:
        print(f"\nallocation sites that grew most from the snapshot at minute {a['snap_min'][0]:g} to the end:")
        for g in r["growth"]:
            by = g.get("by", "traceback")
            print(f"  {g['size_diff'] / 1024:+9.1f} KiB {g['count_diff']:+8d} blocks (now {g['size'] / 1024:9.1f} "
                  f"KiB) [{by}]  " + " <- ".join(reversed(g["traceback"][-4:])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="real minutes to run (default 30)")
    ap.add_argument("--trace", action="store_true", help="tracemalloc in the daemon, snapshots compared")
    ap.add_argument("--frames", type=int, default=8, help="tracemalloc frames per allocation (default 8)")
    ap.add_argument("--snap-min", type=float, nargs="+", default=[10.0], help="first snapshot (min; default 10)")
    ap.add_argument("--arena-max", type=int, default=0, help="MALLOC_ARENA_MAX for the daemon (0: unset)")
    ap.add_argument("--faults-s", type=float, default=0.0, help="a tune, reload, stop or restart this often (0: none)")
    ap.add_argument("--status-s", type=float, default=10.0)
    ap.add_argument("--scrape-s", type=float, default=15.0, help="metrics scrape interval (0: no exporter)")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--warmup-min", type=float, default=5.0, help="slopes from this minute on (default 5)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (log, snapshots)")
    ap.add_argument("--json", default="", help="write samples and growth here")
    a = ap.parse_args(argv)
    r = run(a)
    report(r)
    if a.json:
        Path(a.json).write_text(json.dumps(r, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
