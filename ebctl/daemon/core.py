"""The ebctl daemon: reports in, one Controller per engine id, policies out, a control API (docs/design.md).

The loop reads like a sentence: poll → decode → ``controller.observe`` → ``update`` → encode → publish,
plus a timer that re-sends every engine's latest policy (with a fresh ``issued_at``) every
``daemon.republish_s`` so that, while the daemon lives, no engine's policy reaches its TTL.
``Daemon.ingest`` and ``Daemon.handle_control`` are the socket-free core; ``run`` is the shell around them.

Sockets (chosen once at start-up): telemetry PULL (bind), policy PUB (bind; one frame
``engine_id + b"\\0" + Policy``), control REP (bind; always answers, even garbage). Nothing a peer sends
can stop the loop: bad frames are counted (``status``) and logged, rate-limited.

Run it as ``ebctl daemon`` or ``python -m ebctl.daemon --config FILE [--set KEY=VALUE ...] [--insecure]``.
SIGTERM (or the ``shutdown`` op) stops it cleanly with exit code 0; SIGHUP re-reads the config file.

This module holds the core (``ingest``, ``handle_control``) and the entry points; ``Daemon`` gets its
control ops (status, tune, reload, calibrate, config, shutdown) from ``control.ControlOps`` and its shell
(sockets, loop, publishing, signals) from ``shell.DaemonShell``; the per-engine records are in ``records``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from prometheus_client import CollectorRegistry

from ebctl import bounds, config
from ebctl.config import Config, ConfigError
from ebctl.controller import Controller
from ebctl.daemon import metrics
from ebctl.daemon.control import ControlOps, load_costs
from ebctl.daemon.dispatch import DispatchRecord, DispatchSide
from ebctl.daemon.records import RECENT_REPORTS, SEQ_JUMP, Counters, Engine
from ebctl.daemon.shell import DaemonShell
from ebctl.link import reject_reason, topic
from ebctl.protocol import (
    CONTROL_OPS,
    ControlReply,
    ControlRequest,
    DispatchReport,
    IterationReport,
    ProtocolError,
    Telemetry,
    decode,
)

log = logging.getLogger("ebctl.daemon")

class Daemon(ControlOps, DaemonShell):
    """``Daemon(cfg).run()`` serves until SIGTERM, ``shutdown`` or ``stop()``; returns the exit code."""

    def __init__(self, cfg: Config, *, overrides: dict[str, Any] | None = None, restarts: int = 0,
                 resume: bool = False) -> None:
        """``restarts``: how many times a supervisor (``ebctl start``) restarted the daemon (status);
        ``resume``: re-apply the keys the previous daemon on this runtime directory had tuned."""
        self.cfg = cfg
        self.overrides = dict(overrides or {})  # re-applied on reload: flags beat the file, as at start
        self.base = cfg  # the config as file + flags gave it, before any `tune`
        self.tuned: dict[str, Any] = {}  # keys changed by `tune` (kept across reloads that leave them alone)
        self.restarts = restarts
        self.costs, self.cost_source = load_costs(cfg.daemon.profile)
        self.engines: dict[str, Engine] = {}
        self.dispatch = DispatchSide(window=cfg.dispatch.fwd_window)  # SBS: T̄_fwd per rank, the DP controllers
        self.counters = Counters()
        self.started = time.monotonic()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(metrics.DaemonCollector(self))
        self._stop = threading.Event()
        self._reload_requested = False
        self.exit_code = 0  # what ``run`` returns after a clean stop (1: the runtime directory disappeared)
        self.last_reload: dict[str, Any] = {}  # the last reload's outcome, for status
        self._pub: zmq.Socket | None = None
        self._ops: dict[str, Callable[[dict[str, Any], float], ControlReply]] = {
            "status": self._op_status, "tune": self._op_tune, "reload": self._op_reload,
            "calibrate": self._op_calibrate, "config": self._op_config, "shutdown": self._op_shutdown}
        if resume:
            self.resume_tuned()

    # --- the core: no sockets, testable with bytes ----------------------------------------------------
    def ingest(self, frame: bytes, now: float, mono: float) -> Engine | DispatchRecord | None:
        """decode → bound → observe → update one report; the engine (or DP-controller dispatcher) whose policy
        should be published, or None. Every frame is counted once: received, dispatch_received or rejected."""
        self.counters.frames += 1
        lim = self.cfg.daemon
        try:
            r: IterationReport | DispatchReport = decode(frame, Telemetry)
        except ProtocolError as e:
            self._reject(self.counters.rejected, e, "report")
            return None
        if type(r) is DispatchReport:
            if (fault := bounds.dispatch_report_fault(r, lim)) is not None:
                self._reject(self.counters.rejected, ProtocolError(f"dispatch report beyond bound {fault}"),
                             "report", f"bound:{fault}")
                return None
            rec = self.dispatch.ingest(r, mono)
            if r.engine_id not in self.dispatch.dispatchers:
                self._reject(self.counters.rejected, ProtocolError(
                    f"dispatcher {r.engine_id!r}: not '<prefix>/dispatch' or 'dispatch', or too many"), "report")
            else:
                self.counters.dispatch_received += 1
            return rec
        if (fault := bounds.report_fault(r, lim)) is not None:
            self._reject(self.counters.rejected, ProtocolError(f"report of {r.engine_id!r} beyond bound {fault} "
                                                               "(daemon.max_*)"), "report", f"bound:{fault}")
            return None
        eng = self.engines.get(r.engine_id) or self._new_engine(r.engine_id, mono)
        if eng is None:
            return None
        if r.instance != eng.instance and not self._takes_over(eng, r, mono):
            return None
        if r.seq <= eng.last_seq:  # replayed, or out of order: its completions were counted already
            eng.replayed += 1
            self._reject(self.counters.rejected, ProtocolError(
                f"engine {r.engine_id!r}: seq {r.seq} not above the last one, {eng.last_seq}"), "report", "replayed")
            return None
        self.counters.received += 1
        if eng.last_seq >= 0 and r.seq > eng.last_seq + 1:
            if r.seq - eng.last_seq > SEQ_JUMP:
                eng.seq_jumps += 1
            else:
                eng.seq_gaps += r.seq - eng.last_seq - 1
        eng.last_seq, eng.last_report = r.seq, mono
        self.dispatch.forward(r)
        self._keep(eng, r)
        try:
            eng.controller.observe(r)
            version = eng.controller.update(now).version
        except Exception:  # the controller promises not to raise; if it ever does, the daemon lives on
            self.counters.faults += 1
            log.exception("controller of engine %r failed on a report", r.engine_id)
            return None
        return eng if version != eng.published else None

    def _keep(self, eng: Engine, r: IterationReport) -> None:
        """Keep ``r`` (without its finished list) among the engine's recent reports, within RECENT_REPORTS and
        ``daemon.recent_bytes``."""
        kept = msgspec.structs.replace(r, finished=()) if r.finished else r
        eng.recent.append(kept)
        eng.recent_bytes += bounds.kept_bytes(kept)
        while len(eng.recent) > RECENT_REPORTS or (eng.recent_bytes > self.cfg.daemon.recent_bytes
                                                   and len(eng.recent) > 1):
            eng.recent_bytes -= bounds.kept_bytes(eng.recent.popleft())

    def _takes_over(self, eng: Engine, r: IterationReport, mono: float) -> bool:
        """A report for ``eng`` from another process than the one reporting so far: it takes the id over when
        the first one has been silent for a policy lifetime (an engine restart); otherwise two engines claim
        one id (two launches, one runtime directory) and the newcomer is refused, counted, logged."""
        if not eng.instance or not (mono - eng.last_report < eng.controller.params.ttl_s):
            if eng.instance:
                log.info("engine %r: a new process (%s) took over from %s", r.engine_id, r.instance, eng.instance)
                eng.last_seq = -1
            eng.instance = r.instance
            return True
        eng.duplicates += 1
        self.counters.rejected["duplicate"] += 1
        if eng.duplicates <= 5 or eng.duplicates % 1000 == 0:
            log.warning("engine id %r is used by two processes (%s, reporting, and %s): the second one's reports "
                        "are refused (%d so far); give each engine its own id (engine.id_prefix, daemon.node)",
                        r.engine_id, eng.instance, r.instance, eng.duplicates)
        return False

    def _new_engine(self, engine_id: str, mono: float) -> Engine | None:
        if "\0" in engine_id:
            self._reject(self.counters.rejected, ProtocolError(f"engine {engine_id!r}: NUL in engine id"), "report")
            return None
        if len(self.engines) >= self.cfg.daemon.max_engines:
            self._reject(self.counters.rejected, ProtocolError(
                f"engine {engine_id!r}: more than daemon.max_engines={self.cfg.daemon.max_engines} engines"),
                "report", "bound:engines")
            return None
        ctl = Controller(self.cfg.controller, self.costs, engine_id=engine_id, cost_source=self.cost_source)
        eng = self.engines[engine_id] = Engine(ctl, topic(engine_id), created=mono)
        log.info("new engine %r", engine_id)
        return eng

    def _reject(self, counts: dict[str, int], err: ProtocolError, what: str, reason: str = "") -> None:
        reason = reason or reject_reason(err)
        counts[reason] = counts.get(reason, 0) + 1
        n = counts[reason]
        if n <= 5 or n % 1000 == 0:  # logged, but a flood of garbage cannot flood the log
            log.warning("rejected %s (%s, %d so far): %s", what, reason, n, err)

    def handle_control(self, frames: list[bytes], now: float) -> ControlReply:
        """One control request → its reply. Never raises: garbage gets ``ok=False`` and is counted. A refusal
        the request earned (malformed, unknown op, a refused tune) is the client's mistake (``control_refused``);
        an op that raised is the daemon's (``faults``); both count in ``control_errors``."""
        c = self.counters
        c.control_requests += 1
        try:
            if len(frames) != 1:
                raise ProtocolError(f"malformed ControlRequest: {len(frames)} frames, expected 1")
            req: ControlRequest = decode(frames[0], ControlRequest)
        except ProtocolError as e:
            c.control_errors += 1
            c.control_refused += 1
            self._reject(c.control_rejected, e, "control request")
            return ControlReply(ok=False, error=f"bad request: {e}")
        op = self._ops.get(req.op)
        if op is None:
            c.control_errors += 1
            c.control_refused += 1
            return ControlReply(ok=False, error=f"unknown op {req.op!r}; ops: {', '.join(CONTROL_OPS)}")
        try:
            reply = op(req.args, now)
        except Exception as e:  # a bug in an op must still answer, and must not stop the daemon
            c.control_errors += 1
            c.faults += 1
            log.exception("fault %d, in control op %r (the daemon goes on)", c.faults, req.op)
            return ControlReply(ok=False, error=f"{req.op} failed: {type(e).__name__}: {e}")
        if not reply.ok:
            c.control_errors += 1
            c.control_refused += 1
            log.warning("control %s refused: %s", req.op, reply.error)
        return reply


def main(cfg: Config, *, overrides: dict[str, Any] | None = None, restarts: int = 0, resume: bool = False) -> int:
    """``ebctl daemon``: log to stderr at ``daemon.log_level`` and serve until stopped."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("ebctl").setLevel(cfg.daemon.log_level.upper())
    try:
        daemon = Daemon(cfg, overrides=overrides, restarts=restarts, resume=resume)
    except ConfigError as e:
        log.error("refusing to start: %s", e)
        return 2
    return daemon.run()


def cli_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ebctl.daemon", description="Run the ebctl daemon.")
    ap.add_argument("--config", default=None, help=f"TOML file (default {config.DEFAULT_PATH} if it exists)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--insecure", action="store_true", help="allow plaintext tcp:// endpoints")
    ap.add_argument("--restarts", type=int, default=0, help=argparse.SUPPRESS)  # ebctl start's count, for status
    ap.add_argument("--resume", action="store_true", help="re-apply the keys a previous daemon had tuned")
    a = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value
    if a.insecure:
        overrides["daemon.insecure"] = "true"
    try:
        cfg = config.load(a.config, overrides)
    except ConfigError as e:
        print(f"ebctl daemon: {e}", file=sys.stderr)
        return 2
    return main(cfg, overrides=overrides, restarts=max(a.restarts, 0), resume=a.resume)
