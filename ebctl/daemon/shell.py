"""The daemon's shell: start-up checks and the runtime-dir lock, the three sockets (and their handshake
monitors), the poll loop, publishing and republishing policies, signals, and the metrics HTTP server.

``Shell(core, stop).run()`` serves a socket-free core (``Core``: what ``core.Daemon`` offers) until ``stop``
is set or SIGTERM/SIGINT arrives: telemetry frames go to ``core.ingest``, control requests to
``core.handle_control``, SIGHUP to ``core.reload``; the engines and dispatchers whose policy changed are published
from ``core.engines`` and ``core.dispatch``. The shell owns the sockets, the lock and the timers, and counts its own
events (publishes, handshakes, faults) in ``core.counters``. Once a minute, on the republish tick, freed heap goes
back to the system (``ebctl.daemon.trim``: after a stopped daemon's backlog glibc would keep its peak).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import zmq
from prometheus_client import CollectorRegistry, start_http_server
from zmq.utils.monitor import recv_monitor_message

from ebctl import bounds, security
from ebctl.config import Config, ConfigError
from ebctl.daemon.control import preflight
from ebctl.daemon.dispatch import DispatchRecord, DispatchSide
from ebctl.daemon.predictor import Predictor
from ebctl.daemon.records import HANDSHAKE_EVENTS, Counters, Engine
from ebctl.daemon.trim import Trimmer
from ebctl.protocol import PROTOCOL_VERSION, ControlReply, Mode, Policy, encode, for_version

log = logging.getLogger("ebctl.daemon")

BATCH = 512  # telemetry frames per loop turn: control requests and the republish timer are never starved
POLL_MAX_S = 0.1  # longest sleep: how soon a signal or stop() is noticed
MAX_MSG_BYTES = 4 << 20
RUN_DIR_CHECK_S = 1.0  # how often the loop checks that its runtime directory and sockets still exist


class Core(Protocol):
    """The socket-free daemon the shell serves (``core.Daemon``)."""

    engines: dict[str, Engine]
    newer: dict[str, tuple[int, float]]  # engines reporting in a newer protocol version: id → (version, mono)
    dispatch: DispatchSide
    counters: Counters
    registry: CollectorRegistry

    @property
    def cfg(self) -> Config: ...

    def ingest(self, frame: bytes, now: float, mono: float) -> Engine | DispatchRecord | None: ...

    def handle_control(self, frames: list[bytes], now: float) -> ControlReply: ...

    def reload(self, via: str, now: float) -> ControlReply: ...

    def warnings(self) -> list[str]: ...


class Shell:
    """Sockets, timers and signals around ``core``; ``stop``: set it (the ``shutdown`` op, ``Daemon.stop``), or
    send SIGTERM/SIGINT (``_signalled``), and ``run`` returns within POLL_MAX_S."""

    def __init__(self, core: Core, stop: threading.Event) -> None:
        self.core, self._stop = core, stop
        self._reload_requested = False  # set by SIGHUP, acted on by the loop
        # Set by SIGTERM/SIGINT. A bool, not ``stop.set()``: a handler runs on the main thread, which may be inside
        # that Event's lock (the ``shutdown`` op sets it there), and would wait for itself (cpython#126434).
        self._signalled = False
        self._pub: zmq.Socket | None = None
        self._lock_fd = -1
        self.exit_code = 0  # what ``run`` returns after a clean stop (1: the runtime directory disappeared)
        self.predictor = Predictor()  # the model's rankings, in a worker process (``ebctl.daemon.predictor``)
        self.trimmer = Trimmer()  # freed heap back to the system after a burst (``ebctl.daemon.trim``)

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
        cfg = self.core.cfg  # the sockets and the exporter are set up once: their keys need a restart
        try:
            auth = security.start_authenticator(ctx, cfg)
            tel, self._pub, ctl = (self._bind(ctx, kind, which, sockets, bound) for kind, which in
                                   ((zmq.PULL, "telemetry"), (zmq.PUB, "policy"), (zmq.REP, "control")))
            monitors = {s.get_monitor_socket(sum(HANDSHAKE_EVENTS)): s for s in (tel, self._pub, ctl)}
            sockets.extend(monitors)
            if cfg.daemon.metrics_port:
                http = start_http_server(cfg.daemon.metrics_port, addr=cfg.daemon.metrics_host,
                                         registry=self.core.registry)[0]
            log.info("serving: telemetry %s, policy %s, control %s%s", *(cfg.endpoint(w) for w in
                     security.ENDPOINTS), f", metrics :{cfg.daemon.metrics_port}" if http else "")
            for warning in self.core.warnings():
                log.warning("%s", warning)
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
            self.predictor.close()
            ctx.term()
            if http is not None:
                http.shutdown()
                http.server_close()
            restore()
            self._unlock()
        log.info("stopped")
        return self.exit_code

    def _prepare(self) -> None:
        cfg = self.core.cfg
        preflight(cfg)  # what `ebctl config check` checks too
        run_dir = security.ensure_runtime_dir(cfg.daemon.runtime_dir)
        for which in security.ENDPOINTS:
            path = security.ipc_path(cfg.endpoint(which))
            if path is not None and path.parent != run_dir:
                if cfg.daemon.insecure:
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
        cfg = self.core.cfg
        ep = cfg.endpoint(which)
        if security.needs_curve(ep) and cfg.daemon.curve_server_key:
            security.apply_server(s, cfg.daemon.curve_server_key)
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
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_signalled", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "_signalled", True))  # Ctrl-C: the same clean stop
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_reload_requested", True))

        def restore() -> None:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return restore

    def _loop(self, tel: zmq.Socket, ctl: zmq.Socket, monitors: dict[zmq.Socket, zmq.Socket]) -> None:
        poller = zmq.Poller()
        for s in (tel, ctl, *monitors):
            poller.register(s, zmq.POLLIN)
        next_republish = time.monotonic() + self.core.cfg.daemon.republish_s
        next_check = time.monotonic() + RUN_DIR_CHECK_S
        while not (self._stop.is_set() or self._signalled):
            wait = min(max(next_republish - time.monotonic(), 0.0), POLL_MAX_S)
            ready = dict(poller.poll(wait * 1000))
            now, mono = time.time(), time.monotonic()
            if tel in ready:
                self._drain(tel, now, mono)
            if ctl in ready:
                frames = ctl.recv_multipart()
                reply = self._contained("control request", self.core.handle_control, frames, now)
                ctl.send(self._encode_reply(reply or ControlReply(ok=False, error="internal error (logged)")))
                self._contained("publish", self._publish_changed, now, mono)
            for m in monitors:
                if m in ready:
                    self._count_handshake(m)
            if self._reload_requested:
                self._reload_requested = False
                reply = self._contained("reload", self.core.reload, "SIGHUP", now)
                log.info("SIGHUP reload: %s", "internal error (logged)" if reply is None else
                         "ok" if reply.ok else reply.error)
                self._contained("publish", self._publish_changed, now, mono)
            if mono >= next_republish:
                self._contained("republish", self._republish, now, mono)
                self._contained("ranking", self.predictor.poll, self.core.engines, self.core.cfg.daemon.profile,
                                mono)
                next_republish = mono + self.core.cfg.daemon.republish_s
                if self.trimmer.due(mono):
                    self._contained("trim", self.trimmer.trim)
            if mono >= next_check:
                next_check = mono + RUN_DIR_CHECK_S
                if (gone := self._run_dir_gone()) is not None:
                    log.error("%s disappeared: stopping so that a supervisor restarts the daemon on a fresh "
                              "runtime directory (engines reconnect on their own)", gone)
                    self.exit_code = 1
                    return

    def _contained(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None after counting and logging a bug in it: one request, frame or reload that trips a
        bug costs that one, never the daemon."""
        try:
            return fn(*args)
        except Exception:
            c = self.core.counters
            c.faults += 1
            if c.faults <= 20 or c.faults % 1000 == 0:
                log.exception("fault %d, in a %s (the daemon goes on)", c.faults, what)
            return None

    def _run_dir_gone(self) -> Path | None:
        """The runtime directory or one of its socket files, if it was deleted under the daemon (then the
        CLI and new engines could not find it, and a second daemon could start beside it)."""
        cfg = self.core.cfg
        run_dir = Path(cfg.daemon.runtime_dir)
        if not run_dir.is_dir():
            return run_dir
        for which in security.ENDPOINTS:
            path = security.ipc_path(cfg.endpoint(which))
            if path is not None and not path.exists():
                return path
        return None

    def _drain(self, sock: zmq.Socket, now: float, mono: float) -> None:
        for _ in range(BATCH):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            eng = self._contained("report", self.core.ingest, frame, now, mono)
            if eng is not None:
                self._contained("publish", self._publish, eng, now, mono)

    def _publish(self, eng: Engine | DispatchRecord, now: float, mono: float) -> None:
        """Send the engine's current policy, issued now, with the TTL in force now."""
        if type(eng) is DispatchRecord:
            self._publish_dispatch(eng, now, mono)
            return
        ctl, c = eng.controller, self.core.counters
        pol = msgspec.structs.replace(ctl.policy, issued_at=now, ttl_s=ctl.params.ttl_s)
        if (fault := bounds.policy_fault(pol, ctl.seen.engine_limit)) is not None:
            c.policies_refused += 1
            if c.policies_refused <= 5 or c.policies_refused % 1000 == 0:
                log.error("policy %d of engine %r not sent (%s): stock instead", pol.version, ctl.engine_id, fault)
            pol = msgspec.structs.replace(pol, mode=Mode.OFF, k=1, n_max=1, kv_reserve_frac=0.0, pd_interval=0,
                                          reason=f"stock: the daemon refused its own policy ({fault})")
        try:
            frame = eng.topic + encode(for_version(pol, eng.protocol))  # in the version the engine speaks
        except (TypeError, msgspec.EncodeError):
            c.publish_errors += 1
            log.exception("cannot encode the policy of %r", ctl.engine_id)
            return
        self._pub.send(frame)  # PUB never blocks: a subscriber that is not keeping up loses old policies
        if pol.version != eng.published:
            eng.published, eng.last_update = pol.version, mono
            c.published += 1
        else:
            c.republished += 1

    def _publish_dispatch(self, rec: DispatchRecord, now: float, mono: float) -> None:
        """Send a DP controller's SBS policy (``dispatch.py``), computed now from the ranks' forward times."""
        c = self.core.counters
        old = rec.policy.version if rec.policy is not None else None
        try:
            pol = self.core.dispatch.policy(rec, self.core.cfg, now)
            frame = rec.topic + encode(for_version(pol, rec.report.v if rec.report is not None else PROTOCOL_VERSION))
        except (TypeError, ValueError, msgspec.EncodeError):
            c.publish_errors += 1
            log.exception("cannot encode the dispatch policy of %r", rec.dispatcher_id)
            return
        self._pub.send(frame)
        rec.policy, rec.published_at = pol, mono
        if pol.version != old:
            c.published += 1
        else:
            c.republished += 1

    def _publish_changed(self, now: float, mono: float) -> None:
        for eng in self.core.engines.values():
            if eng.controller.policy.version != eng.published:
                self._publish(eng, now, mono)
        cfg = self.core.cfg
        for rec in self.core.dispatch.dispatchers.values():  # after a tune or reload of [dispatch] or the TTL
            if rec.published_cfg != (cfg.dispatch, cfg.controller.ttl_s):
                self._publish_dispatch(rec, now, mono)

    def _republish(self, now: float, mono: float) -> None:
        for eng in self.core.engines.values():
            self._publish(eng, now, mono)
        self._publish_newer(now, mono)
        for rec in self.core.dispatch.dispatchers.values():  # T̄_fwd moves with every report: refreshed here
            self._publish_dispatch(rec, now, mono)

    def _publish_newer(self, now: float, mono: float) -> None:
        """A stock policy of this daemon's version to each engine whose reports are of a newer version: the
        plugin refuses it and says once why it runs stock. An engine silent for ``daemon.engine_gone_s`` is
        forgotten."""
        newer, cfg = self.core.newer, self.core.cfg
        for engine_id, (v, last) in list(newer.items()):
            if mono - last > cfg.daemon.engine_gone_s:
                del newer[engine_id]
                continue
            pol = Policy(engine_id=engine_id, issued_at=now, ttl_s=cfg.controller.ttl_s, mode=Mode.OFF,
                         reason=f"stock: the plugin speaks protocol {v}, this daemon {PROTOCOL_VERSION}")
            self._pub.send(engine_id.encode() + b"\0" + encode(pol))
            self.core.counters.republished += 1

    def _count_handshake(self, monitor: zmq.Socket) -> None:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        kind = HANDSHAKE_EVENTS.get(event["event"])
        if kind is not None:
            failed = self.core.counters.handshake_failed
            failed[kind] += 1
            n = sum(failed.values())
            if n <= 5 or n % 1000 == 0:  # a crowd of strangers cannot flood the log
                log.warning("handshake failed (%s) on %s (%d so far; every 1000th is logged)", kind,
                            event.get("endpoint", b"").decode(errors="replace"), n)

    def _encode_reply(self, reply: ControlReply) -> bytes:
        try:
            return encode(reply)
        except (TypeError, msgspec.EncodeError) as e:
            c = self.core.counters
            c.control_errors += 1
            c.faults += 1  # the daemon's own reply: not the client's mistake
            return encode(ControlReply(ok=False, error=f"reply not encodable: {e}"))
