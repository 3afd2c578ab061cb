"""Per-iteration cost of the ebctl hooks inside a real SGLang scheduler (docs/design.md §4 budget: p50 ≤ 10 µs,
p99 ≤ 50 µs), and the end-to-end effect: the same load against the same server with and without the plugin.

    python tools/bench_hook.py [--venv VENV] [--prompts 1000] [--concurrency 24] [--input-len 64]
                               [--output-len 64] [--rounds 3] [--json OUT]

Runs the tiny model on CPU (tools/sglang_cpu/, the environment of tools/sglang_env.sh, this checkout
installed into it). For each configuration a fresh server (and, with the plugin, a daemon) is started,
warmed up, and given the same seeded load by sglang's own client (``sglang.benchmark.serving``,
random-ids, all outputs ``--output-len`` tokens); configurations alternate over ``--rounds``:

- ``stock``: SGLANG_PLUGINS=none;
- ``ebctl off``: the plugin with policy ``off``: every hook runs, reads the policy, reports each iteration,
  and changes nothing (same batches as stock, so the end-to-end difference is the hooks' cost);
- ``ebctl eb``: policy eb with k = 1 and n_max = the server's limit; the client keeps more requests in
  flight than the server runs (concurrency 24 > 16), so requests wait and the gate decides every step.

Torch runs one OpenMP thread (``TORCH_PINNED``: SGLANG_CPU_OMP_THREADS_BIND=0, OMP_NUM_THREADS=1, the
test harness's ONE_TORCH_CORE), and the report says so: with its threads on every core of a 2-core machine,
any other thread that wakes (a zmq I/O thread, the HTTP server, tokenizer, detokenizer, daemon, client)
stalls a forward's parallel region for a scheduler time slice, and those stalls, not the engine or the
hooks, dominate every difference (measured: +15 % duration with 2 torch threads, ~1 % with one). Every
throughput comparison on the CPU server runs pinned; ``--all-cores`` (sglang's default threading) is for
seeing that contention, and its report is marked as such. sglang binds the thread to core 0 itself only
where its CPU kernels are built (AMX, arm64; ``srt/distributed/bootstrap.py`` ``_init_cpu_threads_env``);
the scheduler's allowed CPUs are printed with the results.

With torch pinned, the scheduler's main thread (which plans, runs the forward and processes results) is put
alone on core 0 and everything else (its other threads, the HTTP server, tokenizer, detokenizer, daemon, the
load client) on the other cores, as tools/ab_real.py does (``ab_real.pin``): a GPU server's scheduler has a core
to itself. Scheduler CPU: user + system time of the ``sglang::scheduler`` process (all its threads: torch's,
zmq's, the plugin's link thread) during the measured load, from /proc, and of its main thread alone; they move
less with other load on the machine than wall-clock times do (on a 2-vCPU VM the main thread's CPU for one load
still varies by ~5% between rounds). Each plugin configuration is compared with stock's run of the same round, a
ratio per round (the machine's speed drifts between rounds): the geometric mean and the range over the rounds,
and the difference per iteration (the plugin's iteration count over the measured load). Hook cost per iteration:
the plugin adds ``perf_counter_ns`` around its own work in every hook (not around sglang's originals) and keeps
the last 4,096 iterations' totals; ``GET /server_info`` returns their p50/p99
(``internal_states[0].ebctl.hook_ns``). End to end: the client's duration, output throughput and median
inter-token latency (≈ one decode iteration).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang"))  # the test harness: daemon, server, client
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))  # tools/ is not a package: its own dir on the path

from ab_real import pin, tree  # noqa: E402
from harness import Daemon, Server, bench  # noqa: E402
from server import ensure_installed, exit_on_sigterm, sglang_venv  # noqa: E402 -- tools/sglang_cpu, on the path via harness

CONFIGS = ("stock", "ebctl off", "ebctl eb")
TORCH_PINNED = {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}  # = harness.ONE_TORCH_CORE


def torch_env(all_cores: bool) -> dict[str, str]:
    """The server's torch threading: one OpenMP thread, or sglang's default (every core of the node)."""
    if all_cores:
        return {"SGLANG_CPU_OMP_THREADS_BIND": "all", "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    return dict(TORCH_PINNED)


def describe_torch(env: dict[str, str]) -> str:
    threads = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    if env == TORCH_PINNED:
        return f"torch pinned: one OpenMP thread ({threads})"
    return f"torch NOT pinned ({threads}): figures include thread contention, not comparable to pinned runs"



def run_one(config: str, venv: Path, model: Path, work: Path, load: dict, torch: dict[str, str]) -> dict:
    """One configuration on a fresh server whose torch threading is ``torch`` (``torch_env``)."""
    work.mkdir(parents=True, exist_ok=True)
    daemon = server = None
    try:
        args = ["--max-running-requests", str(load["max_running"])]
        if config == "stock":
            server = Server(venv, model, work, args, plugins="none", env=torch)
        else:
            mode = "off" if config == "ebctl off" else "eb"
            daemon = Daemon(work, {"controller.mode": mode, "controller.cold_mode": mode,
                                   "controller.k_override": "1",
                                   "controller.n_override": str(load["max_running"])})
            server = Server(venv, model, work, args, ebctl_config=daemon.cfg_path, env=torch)
        common = {"input_len": load["input_len"], "output_len": load["output_len"], "range_ratio": 1.0,
                  "concurrency": load["concurrency"]}
        bench(venv, server.url, work / "warmup.json", num_prompts=load["concurrency"], seed=99, **common)
        sched = scheduler_pid(server.proc.pid)
        if torch == TORCH_PINNED:  # the main thread alone on core 0, the rest (daemon, client) elsewhere
            pin([*tree(server.proc.pid), *([daemon.proc.pid] if daemon else [])])
        allowed = allowed_cpus(sched)
        cpu0, main0 = cpu_seconds(sched), cpu_seconds(sched, sched)
        dcpu0 = cpu_seconds(daemon.proc.pid) if daemon else 0.0
        it0 = server.ebctl()["iterations"] if config != "stock" else 0
        res = bench(venv, server.url, work / "bench.json", num_prompts=load["prompts"], seed=1, **common)
        out = {"config": config, "duration_s": res["duration"], "output_tok_s": res["output_throughput"],
               "median_itl_ms": res["median_itl_ms"], "p99_itl_ms": res["p99_itl_ms"],
               "completed": res["completed"], "sched_cpu_s": cpu_seconds(sched) - cpu0,
               "main_cpu_s": cpu_seconds(sched, sched) - main0,
               "daemon_cpu_s": cpu_seconds(daemon.proc.pid) - dcpu0 if daemon else 0.0,
               "sched_cpus_allowed": allowed}
        if config != "stock":
            st = server.ebctl()
            assert st["enabled"], st
            out.update({"iterations": st["iterations"] - it0, "hook_p50_us": st["hook_ns"]["p50"] / 1e3,
                        "hook_p99_us": st["hook_ns"]["p99"] / 1e3, "hook_max_us": st["hook_ns"]["max"] / 1e3,
                        "reports": st["reports"], "policy": st["mode"]})
        return out
    finally:
        if server is not None:
            server.close()
        if daemon is not None:
            daemon.stop()


def scheduler_pid(launcher: int) -> int:
    """The ``sglang::scheduler`` process in the launcher's process group."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                comm, rest = (d / "stat").read_text().rsplit(")", 1)
                if int(rest.split()[2]) == launcher and comm.endswith("(sglang::schedul"):
                    return int(d.name)
    raise RuntimeError(f"no sglang::scheduler process in group {launcher}")


def allowed_cpus(pid: int) -> str:
    """The CPUs the process's main thread may run on (``Cpus_allowed_list`` in /proc/PID/status), e.g. "0"."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """user + system CPU time of a process, all its threads (torch's, zmq's) included; of its thread ``tid``
    alone if given (the scheduler's main thread: its tid is its pid)."""
    fields = Path(f"/proc/{pid}" + (f"/task/{tid}" if tid else "") + "/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minimal_hooks(sched) -> dict:
    """A reference, not the product: hooks that read what a report needs from sglang (as the plugin reads it)
    and queue one tuple per step, with no policy, gate logic, counters, timing or fault handling. Its cost
    is what any Python plugin pays for the reads alone under the same conditions."""
    from itertools import compress
    from operator import attrgetter

    from sglang_patch.reading import kv_used_reader

    finished, out, kv_used = attrgetter("finished_output"), collections.deque(), kv_used_reader(sched)
    ring = [[0] * 5 for _ in range(4)]

    def next_batch(original, s, *a, **k):
        plan = original(s, *a, **k)
        e = ring[(s.forward_ct + 1) % 4]
        e[0], e[1], e[2], e[3] = s.forward_ct + 1, len(plan.running_batch.reqs), len(s.waiting_queue), kv_used()
        return plan

    def defer_prefill(original, s, rb, *a, **k):
        return original(s, rb, *a, **k) or (len(s.waiting_queue) > 0 and len(rb.reqs) >= 16)

    def allocatable(original, s, n, *a, **k):
        return min(original(s, n, *a, **k), 16 - n)

    def run_batch(original, s, b, *a, **k):
        res = original(s, b, *a, **k)
        ring[b.forward_iter % 4][4] = b.seq_lens_sum
        return res

    def batch_result(original, s, b, r, *a, **k):
        res = original(s, b, r, *a, **k)
        e, done = ring[b.forward_iter % 4], tuple(compress(b.reqs, map(finished, b.reqs)))
        out.append((e[0], time.time(), 0.0, b.forward_mode, 0, 0, len(b.reqs), e[4], e[1], e[2], e[3], 0, 16, 1,
                    False, done))
        return res

    return {"next_batch": next_batch, "defer_prefill": defer_prefill, "allocatable": allocatable,
            "run_batch": run_batch, "batch_result": batch_result}


def replay(iterations: int = 20000, sweep_mb: int = 0, minimal: bool = False) -> dict:
    """The same hook code replayed: each hook called in a loop, as one scheduler iteration (decode, batch
    16, a completion every 8th step), on stand-in objects (tests/sglang/fakes.py) with a real EngineLink
    (zmq sockets in this process) and an eb policy with requests waiting, so the gate and the report run.
    ``sweep_mb`` > 0: read and write a buffer of that size between iterations (untimed), so each iteration
    starts with cold caches and TLB, as after a forward pass in a real scheduler; 0: warm caches.
    ``minimal``: replay :func:`minimal_hooks` instead (the reference)."""
    import numpy as np
    import zmq
    from fakes import Sched, batch, new_state, req

    from ebctl.link import EngineLink, topic
    from ebctl.protocol import Mode, Policy, encode
    from sglang_patch import hooks

    with tempfile.TemporaryDirectory(prefix="bench-hook-") as tmp:
        ctx = zmq.Context()
        pull, pub = ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
        pull.rcvhwm = 0
        pull.bind(f"ipc://{tmp}/t.sock")
        pub.bind(f"ipc://{tmp}/p.sock")
        link = EngineLink("dp0", telemetry_endpoint=f"ipc://{tmp}/t.sock", policy_endpoint=f"ipc://{tmp}/p.sock",
                          queue=iterations + 10)
        st = new_state()
        st.link = link
        hooks.STATE = st
        policy = Policy(engine_id="dp0", version=1, ttl_s=3600, mode=Mode.EB, k=4, n_max=16, max_defer_s=1e9)
        deadline = time.monotonic() + 10
        while link.policy(time.monotonic()) is None and time.monotonic() < deadline:
            pub.send(topic("dp0") + encode(policy))
            time.sleep(0.01)
        reqs = [req(f"r{i}", n_in=64, n_out=32) for i in range(16)]
        dec = batch(reqs, mode="DECODE", lens=list(range(64, 80)))
        sched = Sched(running_batch=dec, waiting_queue=[req(f"w{i}") for i in range(8)])
        plan = type("Plan", (), {"batch_to_run": dec, "running_batch": dec})()
        got_plan, got_false, got_n, got_res, got_none = (lambda *a, **k: plan), (lambda *a, **k: False), \
            (lambda *a, **k: 3), (lambda *a, **k: "res"), (lambda *a, **k: None)
        def step(h: dict) -> int:
            t0 = time.perf_counter_ns()
            h["next_batch"](got_plan, sched, running_batch=dec, last_batch=dec)
            h["defer_prefill"](got_false, sched, dec)
            h["allocatable"](got_n, sched, 16, running_batch=dec)
            sched.forward_ct += 1
            dec.forward_iter = sched.forward_ct
            h["run_batch"](got_res, sched, dec)
            h["batch_result"](got_none, sched, dec, "res")
            return time.perf_counter_ns() - t0

        hooked = minimal_hooks(sched) if minimal else hooks.HOOKS
        bare = {name: (lambda original, *a, **k: original(*a, **k)) for name in hooks.HOOKS}  # sglang's wrapper
        buf = np.ones(sweep_mb * 2**20 // 8) if sweep_mb else None
        def sweep() -> None:
            if buf is not None:
                buf.sum()
                buf[::8] += 1.0  # one write per cache line

        times, base = [], []
        for i in range(iterations):
            if i % 8 == 0:  # one request finishes, a fresh one takes its place
                done = reqs[i % 16]
                done.finished_output, done.finished_reason = True, type("FINISH_LENGTH", (), {})()
                reqs[i % 16] = req(f"n{i}", n_in=64)
                dec.reqs = list(reqs)
            sweep()
            times.append(step(hooked))
            sweep()
            base.append(step(bare))
        assert minimal or (st.on and st.reports == iterations and st.policy is not None), (st.on, st.error)
        link.close()
        pull.close(0)
        pub.close(0)
        ctx.term()
    times.sort()
    base.sort()
    floor = base[len(base) // 2]  # the same calls through a do-nothing hook: the loop's own cost
    return {"iterations": iterations, "sweep_mb": sweep_mb, "p50_us": (times[len(times) // 2] - floor) / 1e3,
            "p99_us": (times[(99 * len(times)) // 100] - floor) / 1e3, "max_us": (times[-1] - floor) / 1e3,
            "floor_us": floor / 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv")
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=24,
                    help="client concurrency; above --max-running so requests wait at every step and eb's gate "
                         "decides each one (an empty queue skips it)")
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--replay-only", action="store_true", help="only the replays (no sglang needed)")
    ap.add_argument("--sweep-mb", type=int, default=16,
                    help="buffer swept between iterations of the cold replay (MB; this VM: 2 MB L2, 32 MB L3)")
    ap.add_argument("--all-cores", action="store_true",
                    help="sglang's default threading, torch on every core (default: one pinned OpenMP thread; "
                         "the module docstring says why)")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    torch = torch_env(a.all_cores)
    os.environ.update(torch)  # the replays below run in this process
    print(describe_torch(torch))
    warm, cold = replay(), replay(3000, sweep_mb=a.sweep_mb)
    ref = replay(3000, sweep_mb=a.sweep_mb, minimal=True)
    print(f"hook code replayed (one iteration's hook calls in a loop on stand-ins, real zmq link, eb policy, minus "
          f"the same calls through a do-nothing hook):\n"
          f"  warm caches: p50 {warm['p50_us']:.1f} µs, p99 {warm['p99_us']:.1f} µs per iteration "
          f"({warm['iterations']} iterations, floor {warm['floor_us']:.1f} µs)\n"
          f"  cold caches ({a.sweep_mb} MB swept between iterations): p50 {cold['p50_us']:.1f} µs, "
          f"p99 {cold['p99_us']:.1f} µs ({cold['iterations']} iterations, floor {cold['floor_us']:.1f} µs)\n"
          f"  reference, cold: minimal hooks (the same sglang reads, one tuple queued, no ebctl logic): "
          f"p50 {ref['p50_us']:.1f} µs, p99 {ref['p99_us']:.1f} µs")
    if a.replay_only:
        return 0
    if not a.all_cores:  # what this tool starts inherits the other CPUs; pin() then moves the scheduler's main thread
        os.sched_setaffinity(0, (set(range(os.cpu_count() or 1)) - {0}) or {0})
    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    load = {"prompts": a.prompts, "concurrency": a.concurrency, "max_running": a.max_running,
            "input_len": a.input_len, "output_len": a.output_len}
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as tmp:
        model = Path(tmp) / "model"
        subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                        str(model)], check=True, capture_output=True)
        for rnd in range(a.rounds):
            for config in CONFIGS:
                t0 = time.monotonic()
                r = run_one(config, venv, model, Path(tmp) / f"{rnd}-{config.replace(' ', '-')}", load, torch)
                r["round"] = rnd
                results.append(r)
                print(f"  round {rnd} {config:<10} done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    print(report(results, load, torch))
    if a.json:
        Path(a.json).write_text(json.dumps({"load": load, "torch": torch, "results": results}, indent=1))
    return 0


def report(results: list[dict], load: dict, torch: dict[str, str]) -> str:
    allowed = sorted({r.get("sched_cpus_allowed", "?") for r in results})  # /proc/PID/status: the main thread's
    lines = [f"load: {load['prompts']} prompts, concurrency {load['concurrency']}, input {load['input_len']}, "
             f"output {load['output_len']} tokens, --max-running-requests {load['max_running']}, tiny model on "
             f"{os.cpu_count()} CPU cores; median over {max(r['round'] for r in results) + 1} round(s)",
             f"{describe_torch(torch)}; the scheduler's main thread allowed on CPUs {', '.join(allowed)}",
             f"{'config':<10} {'iters':>6} {'hook p50':>9} {'hook p99':>9} {'sched CPU':>10} {'main CPU':>9} "
             f"{'daemon CPU':>10} "
             f"{'duration':>9} {'(min)':>7} {'out tok/s':>10} {'ITL p50':>8}"]
    for config in CONFIGS:
        rs = [r for r in results if r["config"] == config]
        m = {k: statistics.median(r[k] for r in rs) for k in (rs[0] if rs else {}) if isinstance(rs[0][k], float | int)}
        lines.append(f"{config:<10} {_fmt(m.get('iterations'), '6.0f'):>6} "
                     f"{_fmt(m.get('hook_p50_us'), '.1f', ' µs'):>9} "
                     f"{_fmt(m.get('hook_p99_us'), '.1f', ' µs'):>9} {_fmt(m.get('sched_cpu_s'), '.2f', ' s'):>10} "
                     f"{_fmt(m.get('main_cpu_s'), '.2f', ' s'):>9} "
                     f"{_fmt(m.get('daemon_cpu_s'), '.2f', ' s'):>10} {_fmt(m.get('duration_s'), '.2f', ' s'):>9} "
                     f"{_fmt(min((r['duration_s'] for r in rs), default=None), '.2f', ' s'):>7} "
                     f"{_fmt(m.get('output_tok_s'), '.0f'):>10} {_fmt(m.get('median_itl_ms'), '.2f', ' ms'):>8}")
    for key, what in (("main_cpu_s", "the scheduler main thread's CPU time"), ("sched_cpu_s", "scheduler CPU time"),
                      ("duration_s", "duration")):
        for config in CONFIGS[1:]:
            got = paired(results, config, key)
            if got is not None:
                mean, lo, hi, per_iter, n = got
                per = "" if key == "duration_s" or math.isnan(per_iter) else f", {per_iter:+.0f} µs per iteration"
                lines.append(f"{config} vs stock, {what} for the same load: {100 * (mean - 1):+.1f} % "
                             f"(geometric mean of {n} round(s), range {100 * (lo - 1):+.1f} to {100 * (hi - 1):+.1f} %)"
                             f"{per}")
    lines.append("budget (docs/design.md §4): hook work per iteration p50 ≤ 10 µs, p99 ≤ 50 µs")
    lines.append("per round (duration s / scheduler CPU s / its main thread's s / hook p50 µs): " + "; ".join(
        f"{r['round']} {r['config']}: {r['duration_s']:.2f}/{r['sched_cpu_s']:.2f}/{_fmt(r.get('main_cpu_s'), '.2f')}/"
        f"{_fmt(r.get('hook_p50_us'), '.0f')}" for r in results))
    return "\n".join(lines)


def paired(results: list[dict], config: str, key: str) -> tuple[float, float, float, float, int] | None:
    """``config``'s ``key`` against stock's in the same round, each round a ratio (the machine's speed drifts
    between rounds, less within one): the geometric mean of the ratios, their lowest and highest, the mean
    difference per iteration in µs (NaN where a run has no iteration count), and the number of rounds."""
    stock = {r["round"]: r for r in results if r["config"] == "stock" and r.get(key)}
    pairs = [(r, stock[r["round"]]) for r in results if r["config"] == config and r["round"] in stock and r.get(key)]
    if not pairs:
        return None
    ratios = [r[key] / s[key] for r, s in pairs]
    per_iter = statistics.mean(1e6 * (r[key] - s[key]) / r["iterations"] if r.get("iterations") else math.nan
                               for r, s in pairs)
    return statistics.geometric_mean(ratios), min(ratios), max(ratios), per_iter, len(pairs)


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
