"""The ebctl daemon: reports in, one Controller per engine id, policies out, a control API (docs/design.md).

The loop reads like a sentence: poll → decode → ``controller.observe`` → ``update`` → encode → publish,
plus a timer that re-sends every engine's latest policy (with a fresh ``issued_at``) every
``daemon.republish_s`` so that, while the daemon lives, no engine's policy reaches its TTL.
``Daemon.ingest`` and ``Daemon.handle_control`` are the socket-free core; ``run`` serves them through a shell.

Sockets (chosen once at start-up): telemetry PULL (bind), policy PUB (bind; one frame
``engine_id + b"\\0" + Policy``), control REP (bind; always answers, even garbage). Nothing a peer sends
can stop the loop: bad frames are counted (``status``) and logged, rate-limited.

Run it as ``ebctl daemon`` or ``python -m ebctl.daemon --config FILE [--set KEY=VALUE ...] [--insecure]``.
SIGTERM (or the ``shutdown`` op) stops it cleanly with exit code 0; SIGHUP re-reads the config file.

This module holds the core and the entry points. ``Daemon`` owns the records (``records.Engine`` per engine
id, ``records.Counters``, the DP controllers' ``dispatch.DispatchSide``), the configuration in force
(``control.Settings``) and the metrics registry (``metrics.DaemonCollector`` over those records), and
composes two parts, each given exactly what it uses:

* ``control.ControlOps`` (status, tune, reload, calibrate, config, shutdown): the settings, engines, dispatch
  side, counters and ``stop``; ``handle_control`` decodes a request and calls its op.
* ``shell.Shell`` (lock, sockets, poll loop, publishing, republish timer, signals, exporter), made by ``run``:
  it calls back into ``ingest``, ``handle_control``, ``reload`` and ``warnings`` and publishes from
  ``engines`` and ``dispatch`` (its ``shell.Core`` lists what it reads).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from ebctl import bounds, config, fleet
from ebctl.config import Config, ConfigError
from ebctl.controller import Controller
from ebctl.daemon import metrics
from ebctl.daemon.control import ControlOps, Settings
from ebctl.daemon.dispatch import DispatchRecord, DispatchSide
from ebctl.daemon.records import RECENT_REPORTS, SEQ_JUMP, Counters, Engine
from ebctl.daemon.shell import Shell
from ebctl.link import reject_reason, topic
from ebctl.protocol import (
    ACCEPTED_VERSIONS,
    CONTROL_OPS,
    PROTOCOL_VERSION,
    ControlReply,
    ControlRequest,
    DispatchReport,
    IterationReport,
    ProtocolError,
    Telemetry,
    decode,
    for_version,
    peek,
)

log = logging.getLogger("ebctl.daemon")


class Daemon:
    """``Daemon(cfg).run()`` serves until SIGTERM, ``shutdown`` or ``stop()``; returns the exit code."""

    def __init__(self, cfg: Config, *, overrides: dict[str, Any] | None = None, restarts: int = 0,
                 resume: bool = False) -> None:
        """``overrides``: the ``--set`` flags, re-applied on reload; ``restarts``: how many times a supervisor
        (``ebctl start``) restarted the daemon (status); ``resume``: re-apply the keys the previous daemon on
        this runtime directory had tuned."""
        self.settings = Settings(cfg, overrides)
        if resume:
            self.settings.resume_tuned()
        cfg = self.settings.cfg
        self.engines: dict[str, Engine] = {}
        self.dispatch = DispatchSide(window=cfg.dispatch.fwd_window)  # SBS: T̄_fwd per rank, the DP controllers
        self.counters = Counters()
        self.newer: dict[str, tuple[int, float]] = {}  # engines refused for a newer protocol: id → (version, mono)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(metrics.DaemonCollector(self.engines, self.dispatch, self.counters, restarts,
                                                       lambda: self.settings.cfg.daemon))
        self._stop = threading.Event()
        self.control = ControlOps(self.settings, self.engines, self.dispatch, self.counters, restarts=restarts,
                                  stop=self.stop, newer=self.newer)
        c = self.control
        self._ops: dict[str, Callable[[dict[str, Any], float], ControlReply]] = {
            "status": c.status, "tune": c.tune, "reload": c.reload, "calibrate": c.calibrate, "config": c.config,
            "shutdown": c.shutdown}

    @property
    def cfg(self) -> Config:
        """The configuration in force (``tune`` and ``reload`` replace it)."""
        return self.settings.cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        """Swap the configuration as is: nothing is re-applied to the controllers (the ops' ``tune`` does that)."""
        self.settings.cfg = cfg

    @property
    def cost_source(self) -> str:
        """Where the seed costs of new controllers come from (``daemon.profile``; "" for the defaults)."""
        return self.settings.cost_source

    @property
    def tuned(self) -> dict[str, Any]:
        """The keys ``tune`` changed on top of the file and flags."""
        return self.settings.tuned

    def run(self) -> int:
        """Serve until stopped. 0: clean stop; 2: refused (security/config); 1: could not start, or its runtime
        directory disappeared."""
        return Shell(self, self._stop).run()

    def stop(self) -> None:
        """Ask ``run`` to return (thread-safe; noticed within ``shell.POLL_MAX_S``)."""
        self._stop.set()

    def reload(self, via: str, now: float) -> ControlReply:
        """Re-read the config file, as the ``reload`` op does; ``via``: who asked ("SIGHUP"), shown in status."""
        return self.control.reread(via, now)

    def warnings(self) -> list[str]:
        """What an operator should fix in the set-up that runs, though the daemon serves."""
        return self.control.warnings()

    # --- the core: no sockets, testable with bytes ----------------------------------------------------
    def ingest(self, frame: bytes, now: float, mono: float) -> Engine | DispatchRecord | None:
        """decode → bound → observe → update one report; the engine (or DP-controller dispatcher) whose policy
        should be published, or None. Every frame is counted once: received, dispatch_received or rejected."""
        self.counters.frames += 1
        lim = self.settings.cfg.daemon
        try:
            r: IterationReport | DispatchReport = decode(frame, Telemetry, ACCEPTED_VERSIONS)
        except ProtocolError as e:
            self._reject(self.counters.rejected, e, "report")
            self._note_newer(frame, mono)
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
        eng.protocol, eng.plugin_version = r.v, r.plugin_version
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

    def _note_newer(self, frame: bytes, mono: float) -> None:
        """A report refused for a protocol version newer than this daemon's: keep its engine id (within
        ``daemon.max_engines`` ids) so that the shell sends it a stock policy of this daemon's version, which
        the plugin refuses, saying once which versions it and the daemon speak (docs/upgrade.md)."""
        v, engine_id = peek(frame)
        if (v is None or v <= PROTOCOL_VERSION or not engine_id or "\0" in engine_id or len(engine_id) > 128
                or (engine_id not in self.newer and len(self.newer) >= self.settings.cfg.daemon.max_engines)):
            return
        first = engine_id not in self.newer
        self.newer[engine_id] = (v, mono)
        if first:
            log.warning("engine %r reports in protocol version %d, newer than this daemon's %d: it runs stock "
                        "until the daemon is upgraded", engine_id, v, PROTOCOL_VERSION)

    def _keep(self, eng: Engine, r: IterationReport) -> None:
        """Keep ``r`` (without its finished list) among the engine's recent reports, within RECENT_REPORTS and
        ``daemon.recent_bytes``."""
        kept = msgspec.structs.replace(r, finished=()) if r.finished else r
        eng.recent.append(kept)
        eng.recent_bytes += bounds.kept_bytes(kept)
        while len(eng.recent) > RECENT_REPORTS or (eng.recent_bytes > self.settings.cfg.daemon.recent_bytes
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
        s = self.settings
        if len(self.engines) >= s.cfg.daemon.max_engines and not self._forget_gone(engine_id, mono):
            self._reject(self.counters.rejected, ProtocolError(
                f"engine {engine_id!r}: more than daemon.max_engines={s.cfg.daemon.max_engines} engines"),
                "report", "bound:engines")
            return None
        ctl = Controller(s.cfg.controller, s.costs, engine_id=engine_id, cost_source=s.cost_source,
                         predictive=bool(s.cfg.daemon.profile))  # the model ranks the arms (``predictor``)
        eng = self.engines[engine_id] = Engine(ctl, topic(engine_id), created=mono)
        log.info("new engine %r", engine_id)
        return eng

    def _forget_gone(self, newcomer: str, mono: float) -> bool:
        """Make room for ``newcomer`` at ``daemon.max_engines``: forget the engine silent the longest, with its
        forward times, if it is gone (silent for ``daemon.engine_gone_s``, ``fleet.gone``); True if one was.
        So a server restarted under a new name takes the slot of one that left, and the engines kept stay
        within ``daemon.max_engines``; a gone engine is kept, and shown gone, until its slot is needed."""
        eid, eng = min(self.engines.items(),
                       key=lambda kv: kv[1].last_report if math.isfinite(kv[1].last_report) else -math.inf)
        silent = mono - eng.last_report
        if not fleet.gone(silent, self.settings.cfg.daemon.engine_gone_s):
            return False
        del self.engines[eid]
        self.dispatch.forwards.pop(eid, None)
        log.info("engine %r forgotten (silent for %.0f s, daemon.max_engines=%d reached): its slot goes to %r",
                 eid, silent, self.settings.cfg.daemon.max_engines, newcomer)
        return True

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
            req: ControlRequest = decode(frames[0], ControlRequest, ACCEPTED_VERSIONS)
        except ProtocolError as e:
            c.control_errors += 1
            c.control_refused += 1
            self._reject(c.control_rejected, e, "control request")
            return ControlReply(ok=False, error=f"bad request: {e}")
        return for_version(self._control_op(req, now), req.v)  # the reply in the client's protocol version

    def _control_op(self, req: ControlRequest, now: float) -> ControlReply:
        c = self.counters
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
