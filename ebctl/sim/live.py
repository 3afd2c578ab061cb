"""The simulated engine as a live process: ``ebctl start --engine sim`` runs this beside the daemon.

Same engine and gate as ``ebctl simulate``, but the policy comes from the daemon over the real sockets
(``EngineLink``) and every iteration is reported back, paced in (scaled) real time, so ``ebctl status``
shows a live controller. Run: ``python -m ebctl.sim.live --config FILE [--speed X] [--workload NAME]``.

The defaults make a demo that shows learning within a minute: twice as many requests in flight as slots, so
requests always wait (the measured tuner runs trials only on a saturated engine), at 100 simulated seconds per
wall second (a measurement window is ~400 completions, ~50 simulated seconds of this engine, and a trial starts
only while exploring has cost under 1% of the time: trials come simulated minutes apart). The tuner's
windows and its exploration ledger run on the reports' (simulated) times; the daemon's wall-clock timers (eb+
probes of ``probe_s``, N changed at most every ``n_min_interval_s``, the policy TTL) last ``speed`` times longer
in simulated time, their shares of the time unchanged.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import msgspec

from ebctl import config as config_mod
from ebctl import profiles
from ebctl.link import EngineLink
from ebctl.protocol import IterationReport, Mode, Policy
from ebctl.sim import costs, hardware, runner, workloads
from ebctl.sim.engine import Engine, EngineConfig
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
    engine: dict[str, int] = field(default_factory=dict)

    def policy(self, now: float) -> Policy | None:
        p = self.link.policy(time.time())
        if p is not None and (self.last is None or p.version != self.last.version):
            self.timeline.append(ModeChange(now, str(p.mode), p.k, p.n_max))
        self.last = p
        return None if p is None else msgspec.structs.replace(p, issued_at=now)

    def observe(self, report: IterationReport) -> None:
        self.link.report(report)


def describe(p: Policy | None) -> str:
    """A policy as the [sim] lines name it: stock (no policy, or mode off), mb, or eb with its k and N."""
    if p is None or p.mode is Mode.OFF:
        return "stock"
    if p.mode is Mode.MB:
        return "mb"
    return f"eb k={p.k} N={p.n_max}"


def arm_of(p: Policy | None) -> str:
    """The arm a policy runs, as the engine can tell it: stock, mb, or EB at θ = k/N rounded to the quarter octave
    (the tuner's grid of θ, ``ebctl.tuner.QUARTERS``), written ``eb θ≈X`` with X = 2^(j/4): the engine's own count of
    what an arm buys is over all the time that arm ran, whatever N it ran at."""
    if p is None or p.mode is Mode.OFF:
        return "stock"
    if p.mode is Mode.MB:
        return "mb"
    return f"eb θ≈{theta_bucket(p.k / p.n_max):.3g}"


def theta_bucket(theta: float) -> float:
    """θ on the quarter-octave grid: 2^(round(4·log2 θ)/4)."""
    return 2.0 ** (round(4 * math.log2(theta)) / 4)


MIN_COMPARE_S = 30.0  # simulated seconds a mode must have run before its rate is compared with stock's


@dataclass(frozen=True, slots=True)
class Interval:
    """What the engine did between two [sim] lines (simulated seconds): its output tokens, the policies in force
    in order (repeats merged), the queue at the end, and per mode (stock, mb, eb) the output tokens and seconds
    since the warm-up (the first line's interval, where the batch fills from empty)."""

    t0: float
    t1: float
    tokens: int
    policies: tuple[str, ...]
    running: int
    waiting: int
    by_mode: tuple[tuple[str, float, float], ...] = ()
    arm: str = ""  # the arm running at the end (``arm_of``)

    @property
    def rate(self) -> float:
        return self.tokens / (self.t1 - self.t0) if self.t1 > self.t0 else math.nan


def bought(by_mode: tuple[tuple[str, float, float], ...], mode: str) -> str:
    """What running ``mode`` (an arm: ``arm_of``) bought: its output rate against stock's, both over all the time
    each ran since the warm-up (switches included: what a switch costs belongs to the mode switched to); '' until
    both ran ``MIN_COMPARE_S`` or when ``mode`` is stock."""
    runs = {m: (tok, sec) for m, tok, sec in by_mode}
    if mode == "stock" or mode not in runs or "stock" not in runs:
        return ""
    (tok, sec), (stok, ssec) = runs[mode], runs["stock"]
    if min(sec, ssec) < MIN_COMPARE_S or stok <= 0:
        return ""
    rate, srate = tok / sec, stok / ssec
    return (f"{mode} {rate / srate - 1:+.1%} on stock: {rate:,.0f} against {srate:,.0f} output tok/s "
            f"(over {sec:,.0f} s and {ssec:,.0f} s)")


def line(iv: Interval) -> str:
    """A [sim] line: output tok/s since the last line, the queue, the policy (old → new when it changed); under
    it, the engine's own count of what the arm now running bought against stock (``bought``: the figure
    ``ebctl status``'s helps row estimates from the tuner's windows), and of the arm that ran longest."""
    pols = iv.policies
    pol = pols[0] if len(pols) == 1 else (" → ".join(pols) if len(pols) <= 3
                                          else f"{pols[0]} → … → {pols[-1]} ({len(pols) - 1} changes)")
    longest = max((m for m in iv.by_mode if m[0] != "stock"), key=lambda m: m[2], default=None)
    arms = [a for a in dict.fromkeys([iv.arm, longest[0] if longest else ""]) if a and a != "stock"]
    gains = [g for g in (bought(iv.by_mode, a) for a in arms) if g]
    return (f"[sim] t={iv.t1:6.0f}s  output {iv.rate:5,.0f} tok/s  running {iv.running} waiting {iv.waiting}  "
            f"policy {pol}" + "".join(f"\n[sim]          {g}" for g in gains))


class Pacer:
    """Sleeps so that simulated time runs ``speed`` times faster than the wall clock; every ``every_s`` wall
    seconds prints a ``line`` on the interval since the last one. Each step's output tokens and seconds are
    counted to the mode of the policy it ran under."""

    def __init__(self, source: LinkSource, speed: float, every_s: float = 5.0) -> None:
        self.source, self.speed, self.every_s = source, speed, every_s
        self.t0 = time.monotonic()
        self.next_print = self.t0 + every_s
        self.engine: Engine | None = None
        self.stop = False
        self.now = 0.0  # simulated time of the last step
        self.mark = (0.0, 0)  # simulated time and output tokens at the last line
        self.policies: list[str] = []
        self.tokens = 0  # output tokens after the last step
        self.by_mode: dict[str, list[float]] | None = None  # None during the warm-up

    def attach(self, engine: Engine) -> None:
        self.engine = engine

    def __call__(self, now: float, rep: IterationReport) -> None:
        self.now = now
        if self.stop:
            raise Stop
        if self.engine is None:
            return
        pol = describe(self.source.last)
        if not self.policies or self.policies[-1] != pol:
            self.policies.append(pol)
        made, self.tokens = self.engine.tokens_out - self.tokens, self.engine.tokens_out
        if self.by_mode is not None:
            acc = self.by_mode.setdefault(arm_of(self.source.last), [0.0, 0.0])
            acc[0] += made
            acc[1] += rep.wall_time - now
        ahead = now / self.speed - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))
        wall = time.monotonic()
        if wall >= self.next_print:
            modes = tuple((m, tok, sec) for m, (tok, sec) in (self.by_mode or {}).items())
            iv = Interval(self.mark[0], rep.wall_time, self.tokens - self.mark[1], tuple(self.policies),
                          rep.running, rep.waiting, modes, arm_of(self.source.last))
            print(line(iv), flush=True)
            self.mark, self.policies = (rep.wall_time, self.tokens), [pol]
            self.next_print = wall + self.every_s
            if self.by_mode is None:
                self.by_mode = {}


class _Refused(Exception):
    """An argument the parser refuses (``args_error`` turns it into a message)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own prints the usage and exits 2
        raise _Refused(message)


def parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The engine's options (``python -m ebctl.sim.live --help``)."""
    ap = cls(prog="python -m ebctl.sim.live", description=__doc__)
    ap.add_argument("--config", default=None, help="ebctl config file (endpoints, node)")
    ap.add_argument("--engine-id", default="sim0")
    ap.add_argument("--profile", default="qwen3-8b/rtx-pro-6000")
    ap.add_argument("--workload", default="azure-conv")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="requests in flight (closed loop); 0: twice --max-running, so the engine stays saturated")
    ap.add_argument("--requests", type=int, default=1_000_000, help="stop after this many")
    ap.add_argument("--max-running", type=int, default=1024)
    ap.add_argument("--speed", type=float, default=100.0,
                    help="simulated seconds per wall second (slower where this machine cannot keep up)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def args_error(argv: list[str]) -> str:
    """Why the engine would refuse ``argv`` ('' if it takes them): ``ebctl start`` asks before it starts
    anything. ``--help`` is taken (the engine prints its help and exits)."""
    if "-h" in argv or "--help" in argv:
        return ""
    try:
        parser(_Parser).parse_args(argv)
    except _Refused as e:
        return str(e)
    return ""


def stopped_line(link_stats: dict[str, Any], now: float) -> str:
    """The engine's last line after Ctrl-C or SIGTERM: where it stopped and what its link did, in words."""
    n, dropped, pols = (link_stats.get(k, 0) for k in ("sent", "dropped", "policies_received"))
    return (f"[sim] stopped at t={now:,.0f} s (simulated): {n:,} reports sent to the daemon, {dropped:,} dropped, "
            f"{pols:,} policies received.")


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        cfg = config_mod.load(a.config)
        prof = profiles.load(a.profile)
        wl = workloads.load(a.workload, a.requests, seed=a.seed)
        if not a.speed > 0 or a.concurrency < 0 or a.max_running < 1:
            raise ValueError("--speed must be > 0, --concurrency >= 0 and --max-running >= 1")
    except (ValueError, OSError, config_mod.ConfigError, profiles.ProfileError) as e:
        print(f"ebctl.sim.live: {e}", file=sys.stderr)
        return 2
    prefix = cfg.engine.id_prefix or cfg.daemon.node  # as the plugin names sglang's ranks
    engine_id = f"{prefix}/{a.engine_id}" if prefix else a.engine_id
    concurrency = a.concurrency or 2 * a.max_running
    econf = EngineConfig(max_running=a.max_running, kv_tokens=hardware.kv_capacity_tokens(prof.model, prof.gpu),
                         engine_id=engine_id)
    with EngineLink.from_config(cfg, engine_id) as link:
        source = LinkSource(link)
        pacer = Pacer(source, a.speed)

        def on_signal(signum: int, _frame: object) -> None:
            pacer.stop = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(f"[sim] engine {engine_id}: {prof.name}, workload {wl.name}, {concurrency} requests in flight on "
              f"{a.max_running} slots, speed x{a.speed:g} (t: simulated seconds); reporting to "
              f"{cfg.endpoint('telemetry')}", flush=True)
        try:
            res = runner.run(wl, source, costs.build(prof), econf, concurrency=concurrency, on_step=pacer,
                             on_start=pacer.attach)
        except Stop:
            print(stopped_line(link.stats(), pacer.now), flush=True)
            return 0
    print(f"[sim] done: {res['req_per_s']:.2f} req/s, {res['tok_per_s']:.0f} tok/s (simulated)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
