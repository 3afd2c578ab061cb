"""Memory of the daemon over simulated hours: does what it holds fill to its bounds, or grow without one?

Drives the real daemon in-process (``core.Daemon.ingest`` on encoded reports, the shell's own ``_publish`` and
``_republish`` into a sink instead of the PUB socket, the ``status`` op every 10 s as ``ebctl status`` does,
a Prometheus scrape every 15 s) with synthetic servers built on the project's ``IterationReport``: 16 slots,
KV 16,384 tokens, prompts of 10-240 tokens in prefills of at most 256, outputs of geometric mean 42, Poisson
arrivals at about 0.7 of the slots' capacity (bursts queue, at most 64 requests), ~50 reports/s each, the
gate's counts every 16th report (the tiny-model CPU server of tools/sglang_cpu, as the soak runs it). Time is
simulated: the hours run as fast as one core allows.

At each checkpoint (simulated minutes 1, 2, 5, 10, 30, 60, 120, 180, ... within ``--hours``) it collects
garbage, takes a tracemalloc snapshot (this script's own allocations, the synthetic servers', left out) and
sizes every structure that grows with reports or time, per engine and daemon-wide (bytes by a deep walk of
the objects, entries by their length). It prints one table per checkpoint, the traced totals, and the
allocation sites that grew most from the 10-minute checkpoint (or the first) to the last.

``--churn-s S``: every S simulated seconds the second server restarts, alternately under its own name (silent
for ``--restart-gap-s``, then a new process: new instance, seq from 0) and under a new name (the old id falls
silent for good). ``--faults-s S``: every S simulated seconds, in turn, what the soak does to a daemon it
keeps: ``tune set`` of a live key and back, a broken config file reloaded (refused) and then the good one, and
30 s in which the daemon reads nothing (SIGSTOP). ``--config soak`` is the soak's daemon configuration (eb, θ
by Eq. 3 + 5, TTL 5 s, republish 1 s); ``default`` the shipped one (eb+, the measured θ: the tuner runs).
``--no-trace``: no tracemalloc, only the process's RSS at each checkpoint (tracemalloc's own bookkeeping
inflates it otherwise).

    python tools/daemon_memory.py --hours 2 [--config soak|default] [--churn-s 300] [--max-engines N]
                                  [--faults-s 120] [--no-trace]
"""

from __future__ import annotations

import argparse
import ctypes
import enum
import gc
import heapq
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from prometheus_client import generate_latest

from ebctl import config
from ebctl.daemon import Daemon
from ebctl.daemon.shell import Shell
from ebctl.protocol import BatchKind, ControlRequest, FinishedRequest, IterationReport, encode

WALL0 = 1.7e9  # the synthetic servers' wall clock at simulated time 0
SLOTS, KV_TOTAL, CHUNK = 16, 16_384, 256
MEAN_OUT = 42.0
RATE = 10.0  # requests/s per server: about 0.7 of what its 16 slots serve (the soak's --rate-frac)
MAX_QUEUE = 64  # requests waiting at most: the synthetic servers' own memory stays bounded
COUNTS_EVERY = 16  # sglang_patch/state.py: the gate's counts ride every 16th report
STATUS_S, SCRAPE_S = 10.0, 15.0
STOP_S = 30.0  # the soak's stop30: SIGSTOP for 30 s
RECENT_SAMPLE = 256  # kept reports sized one by one at a checkpoint (the rest by their mean)
CHECK_MIN = (1, 2, 5, 10, 30, 60, 120, 180, 240, 360, 480, 720)
SOAK = {"daemon.republish_s": 1.0, "controller.mode": "eb", "controller.theta_method": "paper",
        "controller.cold_mode": "eb", "controller.ttl_s": 5.0}


class Server:
    """One synthetic scheduler: slots, a queue, and the report of each iteration (its wall clock is the
    simulation's)."""

    def __init__(self, engine_id: str, rng: np.random.Generator, rate: float) -> None:
        self.engine_id, self.rng, self.rate = engine_id, rng, rate
        self.instance = rng.bytes(4).hex()
        self.seq = 0
        self.slots: list[list[float]] = []  # [input, output, generated, first-token time, arrival]
        self.queue: deque[tuple[float, int, int]] = deque()  # (arrival, input, output)
        self.next_arrival = 0.0
        self.policy_version = -1
        self.gate = {"threshold": 0, "starvation": 0, "idle": 0, "wait_k": 0}

    def restart(self, engine_id: str) -> None:
        """A new process (under ``engine_id``): new instance, seq from 0, nothing running, no policy."""
        self.engine_id, self.instance, self.seq = engine_id, self.rng.bytes(4).hex(), 0
        self.slots.clear()
        self.queue.clear()
        self.policy_version = -1
        self.gate = dict.fromkeys(self.gate, 0)

    def _arrivals(self, t: float) -> None:
        while self.next_arrival <= t:
            if len(self.queue) < MAX_QUEUE:  # beyond it the client's request times out before it is queued
                self.queue.append((self.next_arrival, int(self.rng.integers(10, 241)),
                                   int(self.rng.geometric(1.0 / MEAN_OUT))))
            self.next_arrival += self.rng.exponential(1.0 / self.rate)

    def step(self, t: float) -> tuple[IterationReport, float]:
        """The iteration starting at ``t``: its report and when the next one starts."""
        self._arrivals(t)
        rng, finished = self.rng, []
        if not self.slots and not self.queue:  # idle: an idle sglang server reports every 2 s
            kind, fwd, dt = BatchKind.IDLE, 0.0, min(2.0, max(self.next_arrival - t, 0.001))
            p_reqs = p_tok = p_ctx = d_reqs = d_ctx = 0
            self.gate["idle"] += 1
        elif self.queue and len(self.slots) < SLOTS and (not self.slots or rng.random() < 0.35):
            p_reqs = p_tok = p_ctx = 0
            while self.queue and len(self.slots) < SLOTS and p_tok + self.queue[0][1] <= CHUNK:
                arrival, inp, out = self.queue.popleft()
                p_reqs, p_tok, p_ctx = p_reqs + 1, p_tok + inp, p_ctx + inp * (inp + 1) // 2
                self.slots.append([inp, out, 0, math.nan, arrival])
            mixed = bool(self.slots[:-p_reqs]) and rng.random() < 0.1
            d_reqs = len(self.slots) - p_reqs if mixed else 0
            d_ctx = sum(int(s[0] + s[2]) for s in self.slots[:d_reqs]) if mixed else 0
            kind = BatchKind.MIXED if mixed else BatchKind.PREFILL
            fwd = (0.006 + 4e-5 * p_tok + 5e-4 * d_reqs) * rng.normal(1.0, 0.03)
            dt = fwd + 0.002
            for s in self.slots[len(self.slots) - p_reqs:]:
                s[3] = t + dt
            self.gate["threshold"] += 1
        else:
            d_reqs, d_ctx = len(self.slots), sum(int(s[0] + s[2]) for s in self.slots)
            p_reqs = p_tok = p_ctx = 0
            kind = BatchKind.DECODE
            fwd = (0.010 + 5e-4 * d_reqs) * rng.normal(1.0, 0.03)
            dt = fwd + 0.002
            self.gate["wait_k"] += bool(self.queue)
        if kind is BatchKind.DECODE or kind is BatchKind.MIXED:
            keep = []
            for i, s in enumerate(self.slots):
                if i < d_reqs:
                    s[2] += 1
                if s[2] >= s[1]:
                    out = int(s[1])
                    tpot = (t + dt - s[3]) / (out - 1) if out > 1 else math.nan
                    finished.append(FinishedRequest(int(s[0]), out, "stop", s[3] - s[4], tpot))
                else:
                    keep.append(s)
            self.slots = keep
        kv = sum(int(s[0] + s[2]) for s in self.slots)
        r = IterationReport(
            engine_id=self.engine_id, instance=self.instance, plugin_version="0.9.0", seq=self.seq,
            wall_time=WALL0 + t + dt, forward_s=max(fwd, 0.0), kind=kind, prefill_reqs=p_reqs, prefill_tokens=p_tok,
            decode_reqs=d_reqs, decode_ctx_tokens=d_ctx, prefill_ctx_tokens=p_ctx, running=len(self.slots),
            waiting=len(self.queue), kv_used=kv, kv_total=KV_TOTAL, max_running=SLOTS,
            policy_version=self.policy_version, pd_interval_available=True,
            gate_reasons=dict(self.gate) if self.seq % COUNTS_EVERY == 0 else {}, finished=tuple(finished))
        self.seq += 1
        return r, t + dt


class Sink:
    """The PUB socket's stand-in: counts what the shell sends."""

    def __init__(self) -> None:
        self.frames = 0

    def send(self, frame: bytes) -> None:
        self.frames += 1


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of ``obj`` and everything it reaches that ``seen`` does not hold yet (numpy buffers included;
    classes, modules, functions and enum members are shared, not counted)."""
    stack, total = [obj], 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type | type(sys) | type(deep_size)) or o is None:
            continue
        seen.add(id(o))
        if isinstance(o, enum.Enum):
            continue
        total += sys.getsizeof(o, 0)  # an array that owns its buffer: the buffer included
        if isinstance(o, np.ndarray):
            stack.append(o.base)  # a view: the array it views
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset | deque):
            stack.extend(o)
        elif isinstance(o, msgspec.Struct):
            stack.extend(getattr(o, f) for f in o.__struct_fields__)
        elif not isinstance(o, str | bytes | int | float | bool | complex):
            if hasattr(o, "__dict__"):
                stack.append(o.__dict__)
            for cls in type(o).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(o, slot) and slot not in ("__dict__", "__weakref__"):
                        stack.append(getattr(o, slot))
    return total


def structures(d: Daemon) -> dict[str, tuple[int, int]]:
    """Every structure that grows with reports or time: name → (entries, bytes), summed over the engines."""
    out: dict[str, list[int]] = {}

    def add(name: str, entries: int, obj: Any, seen: set[int]) -> None:
        e = out.setdefault(name, [0, 0])
        e[0] += entries
        e[1] += deep_size(obj, seen)

    def add_sampled(name: str, kept: deque, seen: set[int]) -> None:
        """Like ``add`` for a deque of reports: the deque itself, and the reports by a sample of RECENT_SAMPLE
        of them (each report's objects are its own: msgspec decodes every field afresh)."""
        e = out.setdefault(name, [0, 0])
        e[0] += len(kept)
        e[1] += sys.getsizeof(kept)
        seen.add(id(kept))  # the rest of the engine does not walk it again
        step = max(len(kept) // RECENT_SAMPLE, 1) | 1  # odd: not in step with the gate's counts (every 16th)
        sample = [kept[j] for j in range(0, len(kept), step)]
        if sample:
            e[1] += round(sum(deep_size(r, seen) for r in sample) * len(kept) / len(sample))

    shared: set[int] = set()
    deep_size(d.settings, shared)  # the configuration and the seed costs: shared by every controller
    for eid, eng in d.engines.items():
        ctl, seen = eng.controller, set(shared)
        o, t = ctl.seen, ctl.tuner
        add_sampled("Engine.recent (reports kept)", eng.recent, seen)
        add("Observed.window (LengthWindow)", len(o.window), o.window, seen)
        add("Observed.output_rate (RecentRate)", len(o.output_rate._samples), o.output_rate, seen)
        add("Observed.slo_recent (RecentRate x4)", sum(len(x._samples) for x in o.slo_recent), o.slo_recent, seen)
        add("OnlineCosts.windows (rows, 3 kinds)", sum(len(w) for w in ctl.online_costs.windows.values()),
            ctl.online_costs.windows, seen)
        add("OnlineCosts fits and shapes", len(ctl.online_costs.fits), (ctl.online_costs.fits,
                                                                         ctl.online_costs.shapes), seen)
        add("Tuner._versions (policy versions)", len(t._versions), t._versions, seen)
        add("Tuner.history (trials)", len(t.history), t.history, seen)
        add("Tuner window, trial and refs", len(t._starts) + (len(t.window.ttfts) if t.window else 0),
            (t.window, t.trial, t._starts, t.ref_lns, t.stock_lns, t.stock_ttfts, t.stock_tpots, t.gain_inc,
             t.gain_stock, t.attained), seen)
        add("dispatch.forwards (forward times)", len(d.dispatch.forwards.get(eid, ())),
            d.dispatch.forwards.get(eid), seen)
        add("the rest of the engine (policy, controller)", 1, eng, seen)
    seen = set(shared)
    add("Daemon.engines (ids)", len(d.engines), (), seen)
    add("Daemon.newer", len(d.newer), d.newer, seen)
    add("DispatchSide.dispatchers", len(d.dispatch.dispatchers), d.dispatch.dispatchers, seen)
    add("Counters", 1, d.counters, seen)
    add("ControlOps.last_reload, tuned", len(d.settings.tuned), (d.control.last_reload, d.settings.tuned), seen)
    return {k: (v[0], v[1]) for k, v in out.items()}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_mb() -> dict[str, float]:
    """Where the process's memory sits besides what tracemalloc sees: glibc's heap (``mallinfo2``: in use,
    free but kept, mmapped) and pymalloc's arenas (1 MiB each in use, ``sys._debugmallocstats``); {} where
    unavailable."""
    out: dict[str, float] = {}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
        out.update(malloc_used=m.uordblks / 2**20, malloc_free=m.fordblks / 2**20, malloc_mmap=m.hblkhd / 2**20)
    except (OSError, AttributeError):
        pass
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        for line in f.read().decode(errors="replace").splitlines():
            if line.startswith("# arenas allocated current"):
                out["pymalloc_arenas"] = float(line.split("=")[-1])
    return out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def run(hours: float, cfg_name: str, churn_s: float, restart_gap_s: float, engines: int, seed: int,
        trace: bool, top: int, max_engines: int = 0, faults_s: float = 0.0) -> dict[str, Any]:
    overrides = {**(SOAK if cfg_name == "soak" else {}), **({"daemon.max_engines": max_engines} if max_engines else {})}
    tmp = Path(tempfile.mkdtemp(prefix="ebdm-"))
    good = f'[daemon]\nruntime_dir = "{tmp / "rt"}"\n'
    (tmp / "rt").mkdir(mode=0o700)
    cfg_file = tmp / "ebctl.toml"
    cfg_file.write_text(good)
    cfg = config.load(str(cfg_file), {k: str(v) for k, v in overrides.items()})
    d = Daemon(cfg, overrides={k: str(v) for k, v in overrides.items()})
    shell = Shell(d, threading.Event())
    shell._pub = sink = Sink()
    rng = np.random.default_rng(seed)
    names = ["dp0", *(f"s{i + 2}/dp0" for i in range(engines - 1))]
    servers = [Server(n, np.random.default_rng(rng.integers(1 << 62)), rate=RATE) for n in names]
    heap = [(0.001 * i, i) for i in range(len(servers))]
    end = hours * 3600.0
    checks = [m * 60.0 for m in CHECK_MIN if m * 60.0 <= end + 1e-9]
    if not checks or checks[-1] < end:
        checks.append(end)
    status_req = [encode(ControlRequest(op="status"))]
    next_rep, next_status, next_scrape = cfg.daemon.republish_s, STATUS_S, SCRAPE_S
    next_churn = churn_s if churn_s > 0 else math.inf
    silent_until, churns, renames = -1.0, 0, 0
    next_fault, faults, stopped_until = faults_s if faults_s > 0 else math.inf, 0, -1.0
    here = str(Path(__file__).resolve())
    filters = [tracemalloc.Filter(False, here), tracemalloc.Filter(False, tracemalloc.__file__)]
    if trace:
        tracemalloc.start(1)
    points: list[dict[str, Any]] = []
    snaps: dict[float, tracemalloc.Snapshot] = {}
    reports, wall0 = 0, time.monotonic()
    t = 0.0
    while checks:
        t, i = heapq.heappop(heap)
        if t >= checks[0]:
            heapq.heappush(heap, (t, i))
            at = checks.pop(0)
            gc.collect()
            point = {"t_min": at / 60, "reports": reports, "engines": len(d.engines),
                     "wall_s": time.monotonic() - wall0, "gc_objects": len(gc.get_objects()),
                     "blocks": sys.getallocatedblocks(), "rss_mb": rss_mb(), **heap_mb(), "structures": structures(d)}
            if trace:
                snap = tracemalloc.take_snapshot().filter_traces(filters)
                snaps[at] = snap
                point["traced_mb"] = sum(s.size for s in snap.statistics("filename")) / 2**20
                point["tracemalloc_mb"] = tracemalloc.get_tracemalloc_memory() / 2**20  # its own bookkeeping
            points.append(point)
            _print_point(point, trace)
            continue
        srv = servers[i]
        if i == len(servers) - 1 and t >= next_churn:  # the last server restarts
            churns += 1
            next_churn = t + churn_s
            if churns % 2:  # under its own name, after a silence
                silent_until = t + restart_gap_s
                srv.restart(srv.engine_id)
            else:  # under a new name: the old id falls silent for good
                renames += 1
                srv.restart(f"s{len(servers)}r{renames}/dp0")
            srv.next_arrival = max(t, silent_until)  # the clients send to the servers that are up
        if t < silent_until and i == len(servers) - 1:
            heapq.heappush(heap, (silent_until, i))
            continue
        r, t_next = srv.step(t)
        heapq.heappush(heap, (t_next, i))
        now, mono = WALL0 + t_next, t_next
        if mono >= next_fault:  # what the soak does to a daemon it keeps: tune, reload, SIGSTOP
            next_fault, faults = mono + faults_s, faults + 1
            _fault(d, faults, cfg_file, good, now)
            if faults % 3 == 0:
                stopped_until = mono + STOP_S
        if mono < stopped_until:  # stopped: the links' queues drop what it does not read
            continue
        eng = d.ingest(encode(r), now, mono)
        reports += 1
        if eng is not None:
            shell._publish(eng, now, mono)
        e = d.engines.get(srv.engine_id)
        if e is not None and e.instance == srv.instance:
            srv.policy_version = e.published
        if mono >= next_rep:
            shell._republish(now, mono)
            next_rep = mono + cfg.daemon.republish_s
        if mono >= next_status:
            msgspec.msgpack.encode(d.handle_control(status_req, now))  # what the shell encodes and sends
            next_status = mono + STATUS_S
        if mono >= next_scrape:
            generate_latest(d.registry)
            next_scrape = mono + SCRAPE_S
    result = {"config": cfg_name, "hours": hours, "churn_s": churn_s, "points": points, "published": sink.frames,
              "max_engines": cfg.daemon.max_engines, "refused_engines": d.counters.rejected["bound:engines"],
              "faults": d.counters.faults, "errors": sum(e.controller.errors for e in d.engines.values()),
              "control_faults": faults}
    shutil.rmtree(tmp, ignore_errors=True)
    if trace and len(snaps) >= 2:
        keys = sorted(snaps)
        base = next((k for k in keys if k >= 600.0 - 1e-9 and k < keys[-1]), keys[0])
        stats = snaps[keys[-1]].compare_to(snaps[base], "lineno")
        result["growth_from_min"] = base / 60
        result["top_growth"] = [(str(s.traceback[0]), s.size_diff, s.count_diff, s.size) for s in stats[:top]]
        print(f"\nallocation sites that grew most from minute {base / 60:g} to minute {keys[-1] / 60:g}:")
        for where, diff, count, size in result["top_growth"]:
            print(f"  {diff / 1024:+9.1f} KiB {count:+8d} blocks (now {size / 1024:9.1f} KiB)  {where}")
    return result


def _fault(d: Daemon, n: int, cfg_file: Path, good: str, now: float) -> None:
    """The soak's faults on a living daemon, in turn: ``tune set`` of a live key and back; a broken config file
    reloaded by SIGHUP (refused), then the good one by ``ebctl reload``; SIGSTOP (the caller skips ``STOP_S``)."""
    def op(name: str, **args: Any) -> None:
        msgspec.msgpack.encode(d.handle_control([encode(ControlRequest(op=name, args=args))], now))

    if n % 3 == 1:
        op("tune", updates={"controller.n_min_interval_s": 1.0})
        op("tune", updates={"controller.n_min_interval_s": 5.0})
    elif n % 3 == 2:
        cfg_file.write_text("[daemon\n")
        d.reload("SIGHUP", now)
        cfg_file.write_text(good)
        op("reload")


def _print_point(p: dict[str, Any], trace: bool) -> None:
    traced = f", traced {p['traced_mb']:.2f} MiB (tracemalloc's own {p['tracemalloc_mb']:.1f})" if trace else ""
    print(f"\n== simulated minute {p['t_min']:g}: {p['reports']:,} reports, {p['engines']} engines{traced}, "
          f"RSS {p['rss_mb']:.1f} MB, {p['gc_objects']:,} gc-tracked objects, {p['wall_s']:.0f} s wall", flush=True)
    if "malloc_used" in p:
        print(f"  glibc malloc: {p['malloc_used']:.1f} MiB in use, {p['malloc_free']:.1f} MiB free but kept, "
              f"{p['malloc_mmap']:.1f} MiB mmapped; pymalloc arenas {p.get('pymalloc_arenas', math.nan):.0f}, "
              f"{p['blocks']:,} blocks allocated")
    print(f"  {'structure':44s} {'entries':>9s} {'KiB':>9s}")
    for name, (n, b) in p["structures"].items():
        print(f"  {name:44s} {n:9,d} {b / 1024:9.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours (default 2)")
    ap.add_argument("--config", choices=("soak", "default"), default="soak", help="the daemon's configuration")
    ap.add_argument("--churn-s", type=float, default=0.0, help="the last server restarts this often (0: never)")
    ap.add_argument("--restart-gap-s", type=float, default=30.0, help="a same-name restart's silence (s)")
    ap.add_argument("--engines", type=int, default=2, help="servers reporting (default 2)")
    ap.add_argument("--max-engines", type=int, default=0, help="daemon.max_engines (0: the configuration's)")
    ap.add_argument("--faults-s", type=float, default=0.0, help="a tune, a reload or a 30 s stop this often (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=12, help="allocation sites listed")
    ap.add_argument("--no-trace", action="store_true", help="no tracemalloc: RSS only")
    a = ap.parse_args(argv)
    logging.getLogger("ebctl").addHandler(logging.NullHandler())  # the daemon's lines (new engines, reloads): not here
    r = run(a.hours, a.config, a.churn_s, a.restart_gap_s, max(a.engines, 1), a.seed, not a.no_trace, a.top,
            a.max_engines, a.faults_s)
    pts = r["points"]
    print(f"\nconfig {a.config}, churn {a.churn_s:g} s, max_engines {r['max_engines']}: published "
          f"{r['published']:,} frames, faults {r['faults']}, controller errors {r['errors']}, reports of refused "
          f"engine ids {r['refused_engines']:,}")
    print("| simulated min | reports | engines | traced MiB | RSS MB |")
    print("|---|---|---|---|---|")
    for p in pts:
        traced = f"{p['traced_mb']:.2f}" if "traced_mb" in p else "—"
        print(f"| {p['t_min']:g} | {p['reports']:,} | {p['engines']} | {traced} | {p['rss_mb']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
