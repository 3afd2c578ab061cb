"""Fuzz a real daemon over its own sockets while a valid engine reports beside the fuzzer.

    python tools/fuzz_daemon.py [--frames 100000] [--seed 0] [--json OUT.json] [--workdir DIR]

Starts ``python -m ebctl.daemon`` with the default configuration on a fresh runtime directory, an engine
(``EngineLink``, id ``good``) that reports 200 iterations a second with finished requests and reads its policy
every 20 ms, and sends ``--frames`` frames, seeded:

* telemetry (95%): random bytes; valid reports cut short; valid reports with 1-8 bytes flipped, inserted or
  deleted; valid structs with hostile values (strings up to 20,000 characters, up to 50,000 finished requests,
  counts up to 2**63 − 1, NaN timings, replayed seqs, new engine ids, odd dispatcher ids); valid reports of
  ``fz<i>`` engines;
* control (5%): random bytes, mutated valid requests, unknown ops, valid status requests (each answer read);
* every 10,000th frame, a 5 MB frame on a socket of its own (ZeroMQ's ``maxmsgsize`` drops it and that
  connection: it never reaches the daemon's code, so it is counted apart).

Exit 0 when the daemon never exited; its RSS stayed within ``--rss-mb`` (50) MB of what it was after the warm-up;
every telemetry frame that reached it is counted once (``frames`` = the fuzzer's + the engine's, and = received +
dispatch_received + every rejection reason); every control request got an answer and is counted; and the engine
was served throughout: a policy arrived at least every ``controller.ttl_s`` (so it never fell back to stock).
``--frames 3000`` is the quick variant CI runs (tests/daemon/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ebctl import config  # noqa: E402
from ebctl.link import ControlClient, DaemonUnreachable, EngineLink  # noqa: E402
from ebctl.protocol import (  # noqa: E402
    BatchKind,
    ControlReply,
    ControlRequest,
    DispatchReport,
    FinishedRequest,
    IterationReport,
    ProtocolError,
    decode,
    encode,
)

BIG = 5 << 20  # above the daemon's 4 MB maxmsgsize


def rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    return int(text.split("VmRSS:")[1].split()[0]) / 1024


class Fuzzer:
    """Seeded frame generators (numpy's Generator: one seed, one sequence of frames)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.fz_seq: dict[str, int] = {}

    def report(self, engine_id: str = "", seq: int | None = None) -> IterationReport:
        rng = self.rng
        eid = engine_id or f"fz{int(rng.integers(0, 8))}"
        if seq is None:
            seq = self.fz_seq[eid] = self.fz_seq.get(eid, -1) + 1
        n = int(rng.integers(0, 6))
        fin = tuple(FinishedRequest(int(rng.integers(1, 500)), int(rng.integers(1, 300))) for _ in range(n))
        kind = [BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED, BatchKind.IDLE][int(rng.integers(0, 4))]
        return IterationReport(engine_id=eid, instance=f"i-{eid}", seq=seq, wall_time=time.time(),
                               forward_s=float(rng.uniform(1e-3, 5e-2)), kind=kind,
                               prefill_tokens=int(rng.integers(0, 4096)), prefill_reqs=int(rng.integers(0, 8)),
                               decode_reqs=int(rng.integers(0, 256)), running=int(rng.integers(0, 256)),
                               waiting=int(rng.integers(0, 64)), kv_used=int(rng.integers(0, 100_000)),
                               kv_total=100_000, max_running=256, finished=fin)

    def hostile(self) -> bytes:
        rng = self.rng
        base = self.report(seq=int(rng.integers(0, 1000)))
        r = msgspec.structs.replace
        choice = int(rng.integers(0, 9))
        if choice == 0:
            m = r(base, mixed_unavailable_reason="x" * int(rng.integers(0, 20_000)))
        elif choice == 1:
            m = r(base, finished=(FinishedRequest(1, 1),) * int(rng.integers(0, 50_000)))
        elif choice == 2:
            field = ["max_running", "running", "waiting", "kv_total", "kv_used", "seq", "decode_reqs"][
                int(rng.integers(0, 7))]
            m = r(base, **{field: int(rng.choice([2**63 - 1, 2**53 + 1, 2**40, 2**31]))})
        elif choice == 3:
            m = r(base, forward_s=float(rng.choice([math.nan, math.inf, -1.0])))
        elif choice == 4:
            m = r(base, engine_id=f"e{int(rng.integers(0, 10**9))}\x1b[2J", instance=str(rng.integers(0, 10**9)))
        elif choice == 5:
            m = r(base, gate_reasons={f"r{i}": int(rng.integers(0, 2**62)) for i in range(int(rng.integers(0, 80)))})
        elif choice == 6:
            m = DispatchReport(engine_id=["dispatch", "a/dispatch", "x" * 100, "dispatch\x00"][int(rng.integers(0, 4))],
                               instance=str(rng.integers(0, 4)), seq=int(rng.integers(0, 100)), ranks=2,
                               reason="y" * int(rng.integers(0, 3000)))
        elif choice == 7:
            m = r(base, group_size=int(rng.choice([0, 1, 2, 1 << 20])))
        else:
            m = r(base, finished=(FinishedRequest(int(rng.integers(0, 2**62)), 5, "z" * int(rng.integers(0, 5000))),))
        return encode(m)

    def mutate(self, frame: bytes) -> bytes:
        rng = self.rng
        b = bytearray(frame)
        for _ in range(int(rng.integers(1, 9))):
            op, at = int(rng.integers(0, 3)), int(rng.integers(0, max(len(b), 1)))
            if op == 0 and b:
                b[at] = int(rng.integers(0, 256))
            elif op == 1:
                b.insert(at, int(rng.integers(0, 256)))
            elif b:
                del b[at]
        return bytes(b)

    def telemetry(self) -> bytes:
        rng = self.rng
        u = rng.random()
        if u < 0.25:
            return rng.bytes(int(rng.integers(1, 2000)))
        if u < 0.45:
            f = encode(self.report())
            return f[: int(rng.integers(0, len(f)))]
        if u < 0.70:
            return self.mutate(encode(self.report()))
        if u < 0.90:
            return self.hostile()
        return encode(self.report())

    def control(self) -> bytes:
        rng = self.rng
        u = rng.random()
        if u < 0.3:
            return rng.bytes(int(rng.integers(0, 500)))
        if u < 0.6:
            return self.mutate(encode(ControlRequest(op="status")))
        if u < 0.8:
            return encode(ControlRequest(op=["format-disk", "", "x" * 5000, "tune"][int(rng.integers(0, 4))],
                                         args={"updates": {"controller.ttl_s": "nan"}}))
        return encode(ControlRequest(op="status"))


def engine_loop(link: EngineLink, stop: threading.Event, seen: dict[str, Any]) -> None:
    """The valid engine: 200 reports a second, a policy read every 20 ms; the longest time without one."""
    rng = np.random.default_rng(1)
    seq, last_policy, n = 0, time.monotonic(), 0
    while not stop.is_set():
        for _ in range(4):
            fin = tuple(FinishedRequest(int(rng.integers(20, 400)), int(rng.geometric(1 / 60))) for _ in range(2))
            link.report(IterationReport(engine_id="good", seq=seq, wall_time=time.time(), forward_s=0.01,
                                        kind=BatchKind.DECODE, decode_reqs=32, running=32, waiting=8,
                                        kv_total=100_000, max_running=64, finished=fin))
            seq += 1
        now = time.monotonic()
        link.policy(now)
        got = link.stats()["policies_received"]
        if got > n:
            seen["max_gap_s"] = max(seen.get("max_gap_s", 0.0), now - last_policy) if n else 0.0
            n, last_policy = got, now
        seen["policies"], seen["reports"] = n, seq
        seen["gap_now_s"] = now - last_policy
        stop.wait(0.02)


def run(frames: int, seed: int, work: Path, rss_limit: float) -> dict[str, Any]:
    rt = work / "rt"
    cfg_path = work / "ebctl.toml"
    cfg_path.write_text(f'[daemon]\nruntime_dir = "{rt}"\n')
    cfg = config.load(str(cfg_path))
    log = open(work / "daemon.log", "wb")  # noqa: SIM115 - closed below
    d = subprocess.Popen([sys.executable, "-m", "ebctl.daemon", "--config", str(cfg_path)], stdout=log,
                         stderr=subprocess.STDOUT, cwd=REPO)
    ctx = zmq.Context()
    stop = threading.Event()
    seen: dict[str, Any] = {}
    out: dict[str, Any] = {"frames": frames, "seed": seed}
    try:
        with ControlClient.from_config(cfg, timeout_s=5.0) as cli:
            cli.wait_ready(20.0, alive=lambda: d.poll() is None)
        link = EngineLink.from_config(cfg, "good", max_running=64)
        eng = threading.Thread(target=engine_loop, args=(link, stop, seen), daemon=True)
        eng.start()
        time.sleep(3.0)  # warm-up: the engine's controller and windows exist, the first policies arrived
        rss0 = rss_mb(d.pid)
        push = ctx.socket(zmq.PUSH)
        push.connect(cfg.endpoint("telemetry"))
        req = ctx.socket(zmq.REQ)
        req.rcvtimeo = req.sndtimeo = 10_000
        req.connect(cfg.endpoint("control"))
        fz = Fuzzer(seed)
        sent_tel = sent_ctl = answered = big = 0
        rss_max, t0, next_rss = rss0, time.monotonic(), 0.0
        for i in range(frames):
            if d.poll() is not None:
                break
            if i % 10_000 == 9_999:
                s = ctx.socket(zmq.PUSH)
                s.linger = 0
                s.connect(cfg.endpoint("telemetry"))
                s.send(fz.rng.bytes(BIG))
                s.close()
                big += 1
            elif fz.rng.random() < 0.05:
                req.send(fz.control())
                sent_ctl += 1
                try:
                    decode(req.recv(), ControlReply)
                    answered += 1
                except (zmq.Again, ProtocolError):
                    break
            else:
                push.send(fz.telemetry())
                sent_tel += 1
            if time.monotonic() >= next_rss:
                rss_max, next_rss = max(rss_max, rss_mb(d.pid)), time.monotonic() + 0.5
        fuzz_s = time.monotonic() - t0
        time.sleep(1.0)
        stop.set()
        eng.join(2.0)
        link.close()  # linger 0: what it still queued is not sent (its own count says what was)
        engine_sent = link.stats()["sent"]
        status: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        with ControlClient.from_config(cfg, timeout_s=5.0) as cli:
            while time.monotonic() < deadline:  # until the daemon drained what was sent
                try:
                    status = cli.request("status").data
                except DaemonUnreachable:
                    break
                if status["daemon"]["counters"]["frames"] >= sent_tel + engine_sent:
                    break
                time.sleep(0.2)
        rss_max = max(rss_max, rss_mb(d.pid))
        c = status.get("daemon", {}).get("counters", {})
        counted = c.get("received", 0) + c.get("dispatch_received", 0) + sum((c.get("rejected") or {}).values())
        good = status.get("engines", {}).get("good", {})
        out.update({
            "alive": d.poll() is None, "fuzz_s": round(fuzz_s, 1), "sent_telemetry": sent_tel,
            "engine_reports_sent": engine_sent, "sent_control": sent_ctl, "control_answered": answered,
            "big_frames_dropped_by_zmq": big, "daemon_frames": c.get("frames"), "counted": counted,
            "received": c.get("received"), "dispatch_received": c.get("dispatch_received"),
            "rejected": {k: n for k, n in (c.get("rejected") or {}).items() if n}, "faults": c.get("faults"),
            "control_requests": c.get("control_requests"), "engines": status.get("daemon", {}).get("engines"),
            "rss_start_mb": round(rss0, 1), "rss_max_mb": round(rss_max, 1),
            "policies_received": seen.get("policies"), "max_policy_gap_s": round(seen.get("max_gap_s", math.inf), 2),
            "ttl_s": cfg.controller.ttl_s, "good_engine_reports": good.get("reports"),
            "good_engine_version": good.get("version")})
        ok = (out["alive"] and sent_tel + sent_ctl + big == frames and answered == sent_ctl
              and c.get("frames") == sent_tel + engine_sent == counted
              and c.get("control_requests", 0) >= sent_ctl and rss_max - rss0 <= rss_limit
              and out["max_policy_gap_s"] < cfg.controller.ttl_s and seen.get("gap_now_s", 0) < cfg.controller.ttl_s)
        out["ok"] = bool(ok)
        return out
    finally:
        stop.set()
        ctx.destroy(linger=0)
        d.terminate()
        try:
            out["daemon_exit"] = d.wait(10)
        except subprocess.TimeoutExpired:
            d.kill()
        log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rss-mb", type=float, default=50.0, help="allowed RSS growth after the warm-up (MB)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the daemon's log here")
    a = ap.parse_args(argv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="ebfz-"))
    work.mkdir(parents=True, exist_ok=True)
    res = run(a.frames, a.seed, work, a.rss_mb)
    for k, v in res.items():
        print(f"{k:28} {v}")
    print(f"daemon log: {work / 'daemon.log'}")
    print("ok" if res.get("ok") else "NOT MET")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
