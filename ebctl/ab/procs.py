"""What the A/B reads of the processes it started, from /proc (proc(5)): the process tree, its CPU by process
name, the scheduler threads' CPU, context switches and page faults, and ``pin`` (the CPU VM's placement, only
with ``--pin``). Every function takes the /proc root, so that tests give it a made-up one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _procs(proc: Path) -> dict[int, tuple[int, str, str, float]]:
    """Every live process: pid → (parent pid, comm, command line, CPU ticks user + system), from /proc/PID/stat
    (proc(5): fields 4, 14, 15)."""
    out: dict[int, tuple[int, str, str, float]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        comm, rest = _stat(raw)
        out[int(d.name)] = (int(rest[1]), comm, cmd, int(rest[11]) + int(rest[12]))
    return out


def _stat(raw: str) -> tuple[str, list[str]]:
    """A /proc/.../stat line: the name (field 2, in parentheses, which may hold spaces) and the fields after it
    (``rest[1]`` is field 4, the parent pid; ``rest[11]``, ``rest[12]`` fields 14, 15: user and system ticks)."""
    return raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def _descendants(procs: dict[int, tuple[int, str, str, float]], root: int) -> list[int]:
    keep = {root}
    for _ in range(8):  # a few passes reach the leaves (pid order is not parent-first)
        keep |= {pid for pid, p in procs.items() if p[0] in keep}
    return sorted(keep & (procs.keys() | {root}))


def tree(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and its live descendants (pids)."""
    return _descendants(_procs(proc), root)


def pin(pids: list[int], core: int = 0, proc: Path = Path("/proc"), rest: set[int] | None = None) -> int:
    """Give sglang's scheduler a core of its own, as a GPU server's scheduler has: the main thread of each
    ``sglang::scheduler`` process (its tid is its pid) on ``core``, every other thread of ``pids`` (the
    scheduler's helpers, the HTTP/tokenizer process, the detokenizer, ebctl's daemon, the client) on ``rest``
    (default: the other cores). ``SGLANG_CPU_OMP_THREADS_BIND`` does not do it on this CPU: sglang binds threads
    only on AMX or arm64 CPUs (sglang/srt/distributed/bootstrap.py 277-301, "init_cpu_threads_env ... is
    disabled"). Threads started later inherit their starter's set. Returns how many schedulers were pinned."""
    if rest is None:
        rest = (os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))) - {core} or {core}
    n = 0
    for pid in pids:
        try:
            comm = (proc / str(pid) / "comm").read_text().strip()
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            main = comm.startswith("sglang::sched") and tid == pid
            try:
                os.sched_setaffinity(tid, {core} if main else rest)
            except OSError:  # gone meanwhile
                continue
            n += main
    return n


def tree_cpu(root: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU seconds (user + system, every thread) of ``root`` and its live descendants, summed by process name
    (``comm``: sglang's processes name themselves ``sglang::scheduler`` etc., ebctl's daemon and supervisor are
    told apart by their command line)."""
    tick, procs, out = os.sysconf("SC_CLK_TCK"), _procs(proc), {}
    for pid in _descendants(procs, root):
        if pid in procs:
            _, comm, cmd, ticks = procs[pid]
            name = ("ebctl daemon" if "ebctl.daemon" in cmd else
                    "ebctl start" if " -m ebctl " in cmd and " start " in cmd else comm)
            out[name] = out.get(name, 0.0) + ticks / tick
    return out


def scheduler_threads(pids: list[int], proc: Path = Path("/proc")) -> dict[str, Any]:
    """The scheduler processes' threads (every ``sglang::schedul*`` among ``pids``), summed by thread name: CPU
    ticks and the cores each may run on (``Cpus_allowed_list``); for each main thread (the one that plans and runs
    batches) its context switches from /proc/PID/task/TID/status (proc(5)): voluntary when it waited (the GIL, a
    lock, a socket), involuntary when the kernel ran something else on its core; and each thread name's page faults
    (/proc/PID/task/TID/stat fields 10 and 12, minor and major: a minor fault is a page the kernel had to map, as
    when freed memory is given back and touched again)."""
    main, threads = {"voluntary": 0, "involuntary": 0}, {}
    for pid in pids:
        try:
            if not (proc / str(pid) / "comm").read_text().startswith("sglang::sched"):
                continue
            tids = sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for tid in tids:
            d = proc / str(pid) / "task" / str(tid)
            try:
                raw, status = (d / "stat").read_text(), (d / "status").read_text()
            except OSError:  # gone meanwhile
                continue
            comm, f = _stat(raw)
            ticks = int(f[11]) + int(f[12])
            kv = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            name = "main" if tid == pid else comm
            t = threads.setdefault(name, {"cpu": 0, "n": 0, "cores": set(), "minflt": 0, "majflt": 0})
            t["cpu"] += ticks
            t["minflt"] += int(f[7])
            t["majflt"] += int(f[9])
            t["n"] += 1
            t["cores"].add(kv.get("Cpus_allowed_list", "?").strip())
            if tid == pid:
                main["voluntary"] += int(kv.get("voluntary_ctxt_switches", 0))
                main["involuntary"] += int(kv.get("nonvoluntary_ctxt_switches", 0))
    return {"main": main, "threads": threads}


def thread_use(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What the scheduler's threads did between two ``scheduler_threads`` readings ``seconds`` apart: the main
    thread's context switches and page faults per second (and all the threads' minor faults), and each thread
    name's CPU seconds and allowed cores."""
    tick = os.sysconf("SC_CLK_TCK")
    b, a = before["main"], after["main"]
    own = after["threads"].get("main", {}).get("cores", set())

    def faults(key: str, names: Any) -> float:
        return sum(after["threads"][k][key] - before["threads"].get(k, {}).get(key, 0) for k in names) / seconds

    main_only = [k for k in after["threads"] if k == "main"]
    return {"main_voluntary_per_s": (a["voluntary"] - b["voluntary"]) / seconds,
            "main_involuntary_per_s": (a["involuntary"] - b["involuntary"]) / seconds,
            "minflt_per_s": faults("minflt", main_only), "majflt_per_s": faults("majflt", main_only),
            "all_minflt_per_s": faults("minflt", after["threads"]),
            # started after pin() by the main thread, they inherited its core: they take turns with it there
            "on_main_core": sorted(k for k, t in after["threads"].items() if k != "main" and t["cores"] & own),
            "threads": {k: {"cpu_s": (t["cpu"] - before["threads"].get(k, {}).get("cpu", 0)) / tick, "n": t["n"],
                            "cores": sorted(t["cores"])} for k, t in after["threads"].items()}}


def alive(pids: list[int], proc: Path = Path("/proc")) -> list[int]:
    """Those of ``pids`` that still run (not zombies: a zombie is gone, its parent has not reaped it yet)."""
    out = []
    for pid in pids:
        try:
            state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out
