"""The simulated engine as a live process: ``ebctl start --engine sim`` runs this beside the daemon.

Same engine and gate as ``ebctl simulate``, but the policy comes from the daemon over the real sockets
(``EngineLink``) and every iteration is reported back, paced in (scaled) real time, so ``ebctl status``
shows a live controller. Run: ``python -m ebctl.sim.live --config FILE [--speed X] [--workload NAME]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass, field

import msgspec

from ebctl import config as config_mod
from ebctl import profiles
from ebctl.link import EngineLink
from ebctl.protocol import IterationReport, Policy
from ebctl.sim import costs, hardware, runner, workloads
from ebctl.sim.engine import EngineConfig
from ebctl.sim.policies import ModeChange


class Stop(Exception):
    pass


@dataclass
class LinkSource:
    """A policy source backed by the daemon. The link has already applied the TTL on the wall clock; the
    engine runs on simulated time, so the policy is re-stamped with the simulated ``now``."""

    link: EngineLink
    name: str = "daemon"
    timeline: list[ModeChange] = field(default_factory=list)
    last: Policy | None = None

    def policy(self, now: float) -> Policy | None:
        p = self.link.policy(time.time())
        if p is not None and (self.last is None or p.version != self.last.version):
            self.timeline.append(ModeChange(now, str(p.mode), p.k, p.n_max))
        self.last = p
        return None if p is None else msgspec.structs.replace(p, issued_at=now)

    def observe(self, report: IterationReport) -> None:
        self.link.report(report)


class Pacer:
    """Sleeps so that simulated time runs ``speed`` times faster than the wall clock; prints a status line."""

    def __init__(self, source: LinkSource, speed: float, every_s: float = 5.0) -> None:
        self.source, self.speed, self.every_s = source, speed, every_s
        self.t0 = time.monotonic()
        self.next_print = self.t0 + every_s
        self.tokens = 0
        self.stop = False

    def __call__(self, now: float, rep: IterationReport) -> None:
        if self.stop:
            raise Stop
        self.tokens += rep.prefill_tokens + rep.decode_reqs
        ahead = now / self.speed - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))
        wall = time.monotonic()
        if wall >= self.next_print:
            p = self.source.last
            pol = f"{p.mode} k={p.k} N={p.n_max} v{p.version}" if p else "stock (no policy)"
            print(f"[sim] t={now:8.1f}s  {self.tokens / max(now, 1e-9):8.0f} tok/s (simulated)  "
                  f"running={rep.running:4d} waiting={rep.waiting:5d}  policy: {pol}", flush=True)
            self.next_print = wall + self.every_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ebctl.sim.live", description=__doc__)
    ap.add_argument("--config", default=None, help="ebctl config file (endpoints, node)")
    ap.add_argument("--engine-id", default="sim0")
    ap.add_argument("--profile", default="qwen3-8b/rtx-pro-6000")
    ap.add_argument("--workload", default="azure-conv")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1_000_000, help="stop after this many")
    ap.add_argument("--max-running", type=int, default=1024)
    ap.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        cfg = config_mod.load(a.config)
        prof = profiles.load(a.profile)
        wl = workloads.load(a.workload, a.requests, seed=a.seed)
        if not a.speed > 0 or a.concurrency < 1:
            raise ValueError("--speed must be > 0 and --concurrency >= 1")
    except (ValueError, OSError, config_mod.ConfigError, profiles.ProfileError) as e:
        print(f"ebctl.sim.live: {e}", file=sys.stderr)
        return 2
    engine_id = f"{cfg.daemon.node}/{a.engine_id}" if cfg.daemon.node else a.engine_id
    econf = EngineConfig(max_running=a.max_running, kv_tokens=hardware.kv_capacity_tokens(prof.model, prof.gpu),
                         engine_id=engine_id)
    with EngineLink.from_config(cfg, engine_id) as link:
        source = LinkSource(link)
        pacer = Pacer(source, a.speed)

        def on_signal(signum: int, _frame: object) -> None:
            pacer.stop = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(f"[sim] engine {engine_id}: {prof.name}, workload {wl.name}, c={a.concurrency}, "
              f"speed x{a.speed:g}; reporting to {cfg.endpoint('telemetry')}", flush=True)
        try:
            res = runner.run(wl, source, costs.build(prof), econf, concurrency=a.concurrency, on_step=pacer)
        except Stop:
            print(f"[sim] stopped; link: {link.stats()}", flush=True)
            return 0
    print(f"[sim] done: {res['req_per_s']:.2f} req/s, {res['tok_per_s']:.0f} tok/s (simulated)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
