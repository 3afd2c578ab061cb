"""The ebctl daemon: reports in, one Controller per engine id, policies out, a control API (DESIGN.md).

The loop reads like a sentence: poll → decode → ``controller.observe`` → ``update`` → encode → publish,
plus a timer that re-sends every engine's latest policy (with a fresh ``issued_at``) every
``daemon.republish_s`` so that, while the daemon lives, no engine's policy reaches its TTL.
``Daemon.ingest`` and ``Daemon.handle_control`` are the socket-free core; ``run`` is the shell around them.

Sockets (chosen once at start-up): telemetry PULL (bind), policy PUB (bind; one frame
``engine_id + b"\\0" + Policy``), control REP (bind; always answers, even garbage). Nothing a peer sends
can stop the loop: bad frames are counted (``status``) and logged, rate-limited.

Run it as ``ebctl daemon`` or ``python -m ebctl.daemon --config FILE [--set KEY=VALUE ...] [--insecure]``.
SIGTERM (or the ``shutdown`` op) stops it cleanly with exit code 0; SIGHUP re-reads the config file.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq
from prometheus_client import CollectorRegistry, start_http_server
from zmq.utils.monitor import recv_monitor_message

from ebctl import config, metrics, profiles, security
from ebctl.config import Config, ConfigError
from ebctl.controller import DEFAULT_COSTS, Controller
from ebctl.link import reject_reason, topic
from ebctl.model import Costs
from ebctl.protocol import (
    CONTROL_OPS,
    PROTOCOL_VERSION,
    ControlReply,
    ControlRequest,
    Estimates,
    IterationReport,
    ProtocolError,
    decode,
    encode,
)

log = logging.getLogger("ebctl.daemon")

MAX_ENGINES = 4096  # engine ids beyond this are refused (validation): a bounded daemon, whatever peers send
BATCH = 512  # telemetry frames per loop turn: control requests and the republish timer are never starved
POLL_MAX_S = 0.1  # longest sleep: how soon a signal or stop() is noticed
MAX_MSG_BYTES = 4 << 20
MAX_IPC_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
# daemon.* keys a running daemon can change; the rest (sockets, keys, exporter) need a restart
LIVE_DAEMON_KEYS = frozenset({"republish_s", "log_level", "profile", "node"})
_HANDSHAKE_EVENTS = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                     zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth"}


@dataclass(slots=True)
class Engine:
    """One engine id's controller and bookkeeping (monotonic times)."""

    controller: Controller
    topic: bytes
    created: float
    last_report: float = math.nan
    last_update: float = math.nan  # when the policy version last changed
    published: int = -1  # policy version last published
    last_seq: int = -1
    seq_gaps: int = 0  # reports missing from the seq sequence: dropped by the link's full queue, or coalesced


@dataclass(slots=True)
class Counters:
    received: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {"malformed": 0, "version": 0, "validation": 0})
    control_requests: int = 0
    control_errors: int = 0
    control_rejected: dict[str, int] = field(default_factory=lambda: {"malformed": 0, "version": 0,
                                                                       "validation": 0})
    published: int = 0
    republished: int = 0
    publish_errors: int = 0
    handshake_failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_HANDSHAKE_EVENTS.values(), 0))


def load_costs(profile: str) -> tuple[Costs | None, str]:
    """The seed costs of new controllers from ``daemon.profile`` ((None, "") when unset)."""
    if not profile:
        return None, ""
    try:
        p = profiles.load(profile)
    except profiles.ProfileError as e:
        raise ConfigError(f"daemon.profile={profile!r}: {e}") from None
    return p.costs, f"profile:{p.name}"


class Daemon:
    """``Daemon(cfg).run()`` serves until SIGTERM, ``shutdown`` or ``stop()``; returns the exit code."""

    def __init__(self, cfg: Config, *, overrides: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.overrides = dict(overrides or {})  # re-applied on reload: flags beat the file, as at start
        self.costs, self.cost_source = load_costs(cfg.daemon.profile)
        self.engines: dict[str, Engine] = {}
        self.counters = Counters()
        self.started = time.monotonic()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(metrics.DaemonCollector(self))
        self._stop = threading.Event()
        self._reload_requested = False
        self._pub: zmq.Socket | None = None
        self._ops: dict[str, Callable[[dict[str, Any], float], ControlReply]] = {
            "status": self._op_status, "tune": self._op_tune, "reload": self._op_reload,
            "calibrate": self._op_calibrate, "config": self._op_config, "shutdown": self._op_shutdown}

    # --- the core: no sockets, testable with bytes ----------------------------------------------------
    def ingest(self, frame: bytes, now: float, mono: float) -> Engine | None:
        """decode → observe → update one report; the engine whose policy should be published, or None."""
        try:
            r: IterationReport = decode(frame, IterationReport)
        except ProtocolError as e:
            self._reject(self.counters.rejected, e, "report")
            return None
        eng = self.engines.get(r.engine_id) or self._new_engine(r.engine_id, mono)
        if eng is None:
            return None
        self.counters.received += 1
        if r.seq > eng.last_seq + 1 and eng.last_seq >= 0:
            eng.seq_gaps += r.seq - eng.last_seq - 1
        eng.last_seq, eng.last_report = r.seq, mono
        try:
            eng.controller.observe(r)
            version = eng.controller.update(now).version
        except Exception:  # the controller promises not to raise; if it ever does, the daemon lives on
            log.exception("controller of engine %r failed on a report", r.engine_id)
            return None
        return eng if version != eng.published else None

    def _new_engine(self, engine_id: str, mono: float) -> Engine | None:
        if "\0" in engine_id or len(self.engines) >= MAX_ENGINES:
            why = "NUL in engine id" if "\0" in engine_id else f"more than {MAX_ENGINES} engines"
            self._reject(self.counters.rejected, ProtocolError(f"engine {engine_id!r}: {why}"), "report")
            return None
        ctl = Controller(self.cfg.controller, self.costs, engine_id=engine_id, cost_source=self.cost_source)
        eng = self.engines[engine_id] = Engine(ctl, topic(engine_id), created=mono)
        log.info("new engine %r", engine_id)
        return eng

    def _reject(self, counts: dict[str, int], err: ProtocolError, what: str) -> None:
        reason = reject_reason(err)
        counts[reason] += 1
        n = counts[reason]
        if n <= 5 or n % 1000 == 0:  # logged, but a flood of garbage cannot flood the log
            log.warning("rejected %s (%s, %d so far): %s", what, reason, n, err)

    def handle_control(self, frames: list[bytes], now: float) -> ControlReply:
        """One control request → its reply. Never raises: garbage gets ``ok=False`` and is counted."""
        c = self.counters
        c.control_requests += 1
        try:
            if len(frames) != 1:
                raise ProtocolError(f"malformed ControlRequest: {len(frames)} frames, expected 1")
            req: ControlRequest = decode(frames[0], ControlRequest)
        except ProtocolError as e:
            c.control_errors += 1
            self._reject(c.control_rejected, e, "control request")
            return ControlReply(ok=False, error=f"bad request: {e}")
        op = self._ops.get(req.op)
        if op is None:
            c.control_errors += 1
            return ControlReply(ok=False, error=f"unknown op {req.op!r}; ops: {', '.join(CONTROL_OPS)}")
        try:
            reply = op(req.args, now)
        except Exception as e:  # a bug in an op must still answer, and must not stop the daemon
            log.exception("control op %r failed", req.op)
            reply = ControlReply(ok=False, error=f"{req.op} failed: {type(e).__name__}: {e}")
        if not reply.ok:
            c.control_errors += 1
            log.warning("control %s refused: %s", req.op, reply.error)
        return reply

    def _op_status(self, args: dict[str, Any], now: float) -> ControlReply:
        mono = time.monotonic()
        d = self.cfg.daemon
        daemon = {"pid": os.getpid(), "uptime_s": mono - self.started, "protocol": PROTOCOL_VERSION,
                  "config_path": self.cfg.path, "node": d.node, "profile": d.profile or "(default costs)",
                  "endpoints": {w: self.cfg.endpoint(w) for w in security.ENDPOINTS},
                  "metrics": f"http://{d.metrics_host}:{d.metrics_port}/metrics" if d.metrics_port else "",
                  "counters": dataclasses.asdict(self.counters), "engines": len(self.engines)}
        engines = {eid: self._engine_status(eng, mono) for eid, eng in self.engines.items()}
        return ControlReply(ok=True, data={"daemon": daemon, "engines": engines})

    def _engine_status(self, eng: Engine, mono: float) -> dict[str, Any]:
        ctl = eng.controller
        pol = msgspec.to_builtins(ctl.policy)
        est = pol.pop("estimates", None) or msgspec.to_builtins(Estimates())
        for k in ("v", "type"):
            pol.pop(k, None)
        costs, source = ctl.costs()
        return {**pol, **est, **ctl.status(), "costs": {**dataclasses.asdict(costs), "source": source},
                "seq_gaps": eng.seq_gaps, "last_report_age_s": mono - eng.last_report,
                "last_update_age_s": mono - eng.last_update, "published_version": eng.published}

    def _op_tune(self, args: dict[str, Any], now: float) -> ControlReply:
        updates = args.get("updates")
        if not isinstance(updates, dict) or not updates:
            return ControlReply(ok=False, error="tune needs args {'updates': {'section.key': value, ...}}")
        try:
            new = self.cfg.with_updates(updates)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"{e}; nothing changed")
        engine_side = sorted(k for k in updates if k.startswith("engine."))
        if engine_side:  # read by each engine's plugin at its start, never sent over the bus
            return ControlReply(ok=False, error=f"{', '.join(engine_side)}: read by the engines at start-up, "
                                "not by the daemon (edit the config and restart the engine); nothing changed")
        fixed = sorted(k for k in updates if k.startswith("daemon.") and k[7:] not in LIVE_DAEMON_KEYS)
        if fixed:
            return ControlReply(ok=False, error=f"{', '.join(fixed)}: cannot change while the daemon runs "
                                "(edit the config and restart it); nothing changed")
        return self._apply(new, now)

    def _op_reload(self, args: dict[str, Any], now: float) -> ControlReply:
        return self.reload(now)

    def reload(self, now: float) -> ControlReply:
        """Re-read ``cfg.path`` (plus the start-up overrides); a bad file leaves the running config alone."""
        if not self.cfg.path:
            return ControlReply(ok=False, error="the daemon was started without a config file: nothing to "
                                "reload (use tune, or restart with --config)")
        try:
            new = config.load(self.cfg.path, self.overrides)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"reload refused, the running config stays: {e}")
        fixed = {f.name: getattr(self.cfg.daemon, f.name) for f in dataclasses.fields(self.cfg.daemon)
                 if f.name not in LIVE_DAEMON_KEYS and getattr(new.daemon, f.name) != getattr(self.cfg.daemon, f.name)}
        new = dataclasses.replace(new, daemon=dataclasses.replace(new.daemon, **fixed))
        try:
            new.check()
        except ConfigError as e:
            return ControlReply(ok=False, error=f"reload refused, the running config stays: {e}")
        reply = self._apply(new, now)
        if reply.ok and fixed:
            reply.data["needs_restart"] = sorted(f"daemon.{k}" for k in fixed)
        return reply

    def _apply(self, new: Config, now: float) -> ControlReply:
        """Make ``new`` the running config, atomically: everything that can fail happens first."""
        old = self.cfg
        try:
            costs, source = load_costs(new.daemon.profile) if new.daemon.profile != old.daemon.profile \
                else (self.costs, self.cost_source)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"{e}; nothing changed")
        changed = {f"{s}.{k}": [v, new.get(f"{s}.{k}")] for s, vals in old.as_dict().items()
                   for k, v in vals.items() if new.get(f"{s}.{k}") != v}
        self.cfg, self.costs, self.cost_source = new, costs, source
        logging.getLogger("ebctl").setLevel(new.daemon.log_level.upper())
        if new.controller != old.controller or "daemon.profile" in changed:
            for eng in self.engines.values():
                if "daemon.profile" in changed:
                    eng.controller.base_costs = costs or DEFAULT_COSTS
                    eng.controller.base_cost_source = source or "default"
                eng.controller.set_params(new.controller)
                eng.controller.update(now)  # recomputes now if the window allows; published by the shell
        log.info("config changed: %s", ", ".join(f"{k}={v[1]!r}" for k, v in changed.items()) or "nothing")
        return ControlReply(ok=True, data={"changed": changed})

    def _op_calibrate(self, args: dict[str, Any], now: float) -> ControlReply:
        """A cost profile (the JSON ``profiles.load`` reads) from one engine's recent iterations."""
        eid = str(args.get("engine") or "")
        if not self.engines:
            return ControlReply(ok=False, error="no engine has reported yet")
        if not eid:
            eid = max(self.engines, key=lambda e: self.engines[e].controller.reports)
        if eid not in self.engines:
            return ControlReply(ok=False, error=f"no engine {eid!r}; engines: {', '.join(sorted(self.engines))}")
        ctl = self.engines[eid].controller
        fits = {"prefill": ctl.prefill_fit.fit(), "decode": ctl.decode_fit.fit(), "mixed": ctl.mixed_fit.fit()}
        min_r2 = ctl.params.min_cost_r2

        def good(f: Any) -> bool:
            return f.ok and f.r2 >= min_r2 and all(math.isfinite(c) for c in f.coef)

        bad = [f"{k}: {f.reason if not f.ok else f'R²={f.r2:.3f} < min_cost_r2={min_r2}'}"
               for k, f in fits.items() if k != "mixed" and not good(f)]
        if not bad and fits["decode"].coef[0] <= 0:
            bad.append("decode: alpha_d fitted as 0")
        if bad:
            return ControlReply(ok=False, error=f"no good cost fit yet for engine {eid!r}: {'; '.join(bad)}")
        p, d, m = fits["prefill"].coef, fits["decode"].coef, fits["mixed"]
        mixed = dict(zip(("alpha_mb", "c0", "c1", "c2"), m.coef, strict=True)) if good(m) else {}
        costs = Costs(alpha_p=p[0], beta_p=p[1], alpha_d=d[0], beta_d=d[1], **mixed)
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        prof = profiles.Profile(name=str(args.get("name") or f"calibrated-{eid}"), model=str(args.get("model", "")),
                                gpu=str(args.get("gpu", "")), costs=costs,
                                source=f"ebctl calibrate: online fit of engine {eid} at {when}")
        data = json.loads(prof.to_json())
        data["fit"] = {k: {"r2": f.r2, "n": f.n, "used": good(f)} for k, f in fits.items()}
        return ControlReply(ok=True, data=data)

    def _op_config(self, args: dict[str, Any], now: float) -> ControlReply:
        return ControlReply(ok=True, data={"path": self.cfg.path, **self.cfg.as_dict()})

    def _op_shutdown(self, args: dict[str, Any], now: float) -> ControlReply:
        log.info("shutdown requested over the control socket")
        self._stop.set()
        return ControlReply(ok=True, data={"bye": os.getpid()})

    # --- the shell: sockets, timers, signals ------------------------------------------------------------
    def stop(self) -> None:
        """Ask ``run`` to return (thread-safe; noticed within POLL_MAX_S)."""
        self._stop.set()

    def run(self) -> int:
        """Serve until stopped. 0: clean stop; 2: refused (security/config); 1: could not start."""
        try:
            self._prepare()
        except (security.SecurityError, ConfigError) as e:
            log.error("refusing to start: %s", e)
            return 2
        except OSError as e:
            log.error("cannot start: %s", e)
            return 1
        restore = self._install_signals()
        sockets: list[zmq.Socket] = []
        bound: list[Path] = []
        ctx = zmq.Context()
        auth, http = None, None
        try:
            auth = security.start_authenticator(ctx, self.cfg)
            tel, self._pub, ctl = (self._bind(ctx, kind, which, sockets, bound) for kind, which in
                                   ((zmq.PULL, "telemetry"), (zmq.PUB, "policy"), (zmq.REP, "control")))
            monitors = {s.get_monitor_socket(sum(_HANDSHAKE_EVENTS)): s for s in (tel, self._pub, ctl)}
            sockets.extend(monitors)
            if self.cfg.daemon.metrics_port:
                http = start_http_server(self.cfg.daemon.metrics_port, addr=self.cfg.daemon.metrics_host,
                                         registry=self.registry)[0]
            log.info("serving: telemetry %s, policy %s, control %s%s", *(self.cfg.endpoint(w) for w in
                     security.ENDPOINTS), f", metrics :{self.cfg.daemon.metrics_port}" if http else "")
            self._loop(tel, ctl, monitors)
        except (zmq.ZMQError, OSError) as e:
            log.error("cannot serve: %s", e)
            return 1
        finally:
            for s in sockets:
                s.close(linger=500 if s.type == zmq.REP else 0)  # let the last reply (shutdown) leave
            for path in bound:
                path.unlink(missing_ok=True)  # libzmq leaves ipc socket files behind
            if auth is not None:
                auth.stop()
            ctx.term()
            if http is not None:
                http.shutdown()
                http.server_close()
            restore()
            self._unlock()
        log.info("stopped")
        return 0

    def _prepare(self) -> None:
        security.check_endpoints(self.cfg)
        run_dir = security.ensure_runtime_dir(self.cfg.daemon.runtime_dir)
        for which in security.ENDPOINTS:
            path = security.ipc_path(self.cfg.endpoint(which))
            if path is not None and len(os.fsencode(path)) > MAX_IPC_PATH:
                raise ConfigError(f"{self.cfg.endpoint(which)!r}: unix socket paths are limited to {MAX_IPC_PATH} "
                                  "bytes; choose a shorter daemon.runtime_dir")
            if path is not None and path.parent != run_dir:
                if self.cfg.daemon.insecure:
                    path.parent.mkdir(parents=True, exist_ok=True)
                else:
                    security.ensure_runtime_dir(path.parent)
        self._lock_fd = os.open(run_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise OSError(f"another ebctl daemon is running with runtime_dir {run_dir}") from None

    def _unlock(self) -> None:
        os.close(self._lock_fd)

    def _bind(self, ctx: zmq.Context, kind: int, which: str, sockets: list[zmq.Socket], bound: list[Path]
              ) -> zmq.Socket:
        s = ctx.socket(kind)
        sockets.append(s)
        s.linger = 0
        s.maxmsgsize = MAX_MSG_BYTES
        ep = self.cfg.endpoint(which)
        if security.needs_curve(ep) and self.cfg.daemon.curve_server_key:
            security.apply_server(s, self.cfg.daemon.curve_server_key)
        if kind == zmq.PULL:
            s.rcvhwm = 100_000
        s.bind(ep)
        if (path := security.ipc_path(ep)) is not None:
            bound.append(path)
        return s

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())  # Ctrl-C: the same clean stop
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_reload_requested", True))

        def restore() -> None:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return restore

    def _loop(self, tel: zmq.Socket, ctl: zmq.Socket, monitors: dict[zmq.Socket, zmq.Socket]) -> None:
        poller = zmq.Poller()
        for s in (tel, ctl, *monitors):
            poller.register(s, zmq.POLLIN)
        next_republish = time.monotonic() + self.cfg.daemon.republish_s
        while not self._stop.is_set():
            wait = min(max(next_republish - time.monotonic(), 0.0), POLL_MAX_S)
            ready = dict(poller.poll(wait * 1000))
            now, mono = time.time(), time.monotonic()
            if tel in ready:
                self._drain(tel, now, mono)
            if ctl in ready:
                reply = self.handle_control(ctl.recv_multipart(), now)
                ctl.send(self._encode_reply(reply))
                self._publish_changed(now, mono)
            for m in monitors:
                if m in ready:
                    self._count_handshake(m)
            if self._reload_requested:
                self._reload_requested = False
                reply = self.reload(now)
                log.info("SIGHUP reload: %s", "ok" if reply.ok else reply.error)
                self._publish_changed(now, mono)
            if mono >= next_republish:
                self._republish(now, mono)
                next_republish = mono + self.cfg.daemon.republish_s

    def _drain(self, sock: zmq.Socket, now: float, mono: float) -> None:
        for _ in range(BATCH):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            eng = self.ingest(frame, now, mono)
            if eng is not None:
                self._publish(eng, now, mono)

    def _publish(self, eng: Engine, now: float, mono: float) -> None:
        """Send the engine's current policy, issued now, with the TTL in force now."""
        ctl = eng.controller
        pol = msgspec.structs.replace(ctl.policy, issued_at=now, ttl_s=ctl.params.ttl_s)
        try:
            frame = eng.topic + encode(pol)
        except (TypeError, msgspec.EncodeError):
            self.counters.publish_errors += 1
            log.exception("cannot encode the policy of %r", ctl.engine_id)
            return
        self._pub.send(frame)  # PUB never blocks: a subscriber that is not keeping up loses old policies
        if pol.version != eng.published:
            eng.published, eng.last_update = pol.version, mono
            self.counters.published += 1
        else:
            self.counters.republished += 1

    def _publish_changed(self, now: float, mono: float) -> None:
        for eng in self.engines.values():
            if eng.controller.policy.version != eng.published:
                self._publish(eng, now, mono)

    def _republish(self, now: float, mono: float) -> None:
        for eng in self.engines.values():
            self._publish(eng, now, mono)

    def _count_handshake(self, monitor: zmq.Socket) -> None:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        kind = _HANDSHAKE_EVENTS.get(event["event"])
        if kind is not None:
            self.counters.handshake_failed[kind] += 1
            log.warning("handshake failed (%s) on %s", kind, event.get("endpoint", b"").decode(errors="replace"))

    def _encode_reply(self, reply: ControlReply) -> bytes:
        try:
            return encode(reply)
        except (TypeError, msgspec.EncodeError) as e:
            self.counters.control_errors += 1
            return encode(ControlReply(ok=False, error=f"reply not encodable: {e}"))


def main(cfg: Config, *, overrides: dict[str, Any] | None = None) -> int:
    """``ebctl daemon``: log to stderr at ``daemon.log_level`` and serve until stopped."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("ebctl").setLevel(cfg.daemon.log_level.upper())
    try:
        daemon = Daemon(cfg, overrides=overrides)
    except ConfigError as e:
        log.error("refusing to start: %s", e)
        return 2
    return daemon.run()


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ebctl.daemon", description="Run the ebctl daemon.")
    ap.add_argument("--config", default=None, help=f"TOML file (default {config.DEFAULT_PATH} if it exists)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--insecure", action="store_true", help="allow plaintext tcp:// endpoints")
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
    return main(cfg, overrides=overrides)


if __name__ == "__main__":
    sys.exit(_cli())
