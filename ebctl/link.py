"""The engine's end of the bus, and the CLI's (docs/design.md, "Failure semantics: everything fails open").

``EngineLink`` is what an engine embeds: ``report`` queues one iteration without ever blocking (a bounded
queue; when it is full the report is dropped and counted) and ``policy(now)`` returns the newest policy
for this engine, or None when none arrived or it expired. It works the same whether the daemon is up,
down, restarted or never started: ZeroMQ reconnects in the background and nothing here waits for it.

The engine's thread never touches a socket: ``report`` appends to a deque and ``policy`` pops from one.
A small I/O thread owns both sockets; it waits on the policy socket in C (the GIL released) until a policy
arrives or ``flush_s`` (``engine.report_flush_s``, 0.1 s) has passed, and then encodes and sends what was
queued. A ZeroMQ send after an idle period wakes ZeroMQ's own I/O thread from cold, and every wake of this
thread takes the scheduler process's GIL from the thread that plans and runs batches, so the engine's thread
only appends to a deque (well under a microsecond) and this thread wakes rarely; what each flush interval costs
sglang is measured in docs/results/ab_real.md. The daemon works on windows of seconds; a report 0.1 s late
changes nothing there.

``ControlClient`` is the CLI's request/reply client; a daemon that does not answer in time raises
``DaemonUnreachable`` and the socket is rebuilt (the "lazy pirate" pattern), so the client never wedges.

Wire format of a policy: one frame ``engine_id + b"\\0" + msgpack(Policy)``; the SUB socket subscribes
to ``engine_id + b"\\0"``, so a policy for "dp1" never reaches "dp10".
"""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from ebctl import security
from ebctl.protocol import (
    PROTOCOL_VERSION,
    ControlReply,
    ControlRequest,
    DispatchReport,
    IterationReport,
    Policy,
    ProtocolError,
    decode,
    encode,
    peek,
)

if TYPE_CHECKING:
    from ebctl.config import Config

log = logging.getLogger("ebctl.link")

_MAX_DRAIN = 64  # policy frames read per policy() call at most (bounds the call's cost)
_POLICY_RCVHWM = 64
_RECONNECT_IVL_MS = 100
_RECONNECT_IVL_MAX_MS = 1000
# The longest policy lifetime an engine accepts (s): one day, the most controller.ttl_s can be (config: above
# 600 s only with daemon.allow_long_ttl, and never above a day). A longer one comes from no configuration and
# would outlive a dead daemon: the engine refuses it and keeps what it runs.
MAX_TTL_S = 86_400.0


def package_version() -> str:
    """This package's installed version ("" when it is not installed): what reports carry as ``plugin_version``."""
    try:
        return importlib.metadata.version("ebctl")
    except importlib.metadata.PackageNotFoundError:
        return ""


def skew_warning(engine_id: str, daemon_v: int) -> str:
    """What an engine logs once when its daemon speaks another protocol version than it (docs/upgrade.md)."""
    if daemon_v < PROTOCOL_VERSION:
        return (f"engine {engine_id}: the ebctl daemon speaks protocol version {daemon_v}, this plugin "
                f"{PROTOCOL_VERSION}: running stock until the daemon is upgraded (upgrade the daemon first)")
    return (f"engine {engine_id}: the ebctl daemon speaks protocol version {daemon_v}, this plugin "
            f"{PROTOCOL_VERSION} (the daemon serves only its own version and the one before): running stock "
            "until this server is restarted with a newer plugin")


def topic(engine_id: str) -> bytes:
    """The PUB/SUB topic of an engine: its id and a NUL, so no id is a prefix of another's topic."""
    return engine_id.encode() + b"\0"


def reject_reason(err: ProtocolError) -> str:
    """'version', 'malformed' or 'validation': how a refused frame is counted."""
    text = str(err)
    if text.startswith("protocol version"):
        return "version"
    if text.startswith("malformed"):
        return "malformed"
    return "validation"


def policy_fault(p: Any, max_running: int = 0) -> str | None:
    """Why an engine refuses a policy that decoded and validated, or None to apply it: 'ttl' (lives longer
    than MAX_TTL_S), 'n_max' (above the engine's own cap on running requests; ``max_running`` 0: unknown,
    not checked), 'k' (more free slots to wait for than n_max). The first that applies; ``ttl_s`` is checked
    on any policy type, n_max and k on a :class:`Policy`."""
    if not p.ttl_s <= MAX_TTL_S:
        return "ttl"
    if isinstance(p, Policy):
        if max_running > 0 and p.n_max > max_running:
            return "n_max"
        if p.k > p.n_max:
            return "k"
    return None


def _background_context() -> zmq.Context:
    """A context whose I/O thread runs SCHED_BATCH (Linux): waking it to carry a report must not preempt
    the engine's thread on the same core (measured: halves ``report``'s cost after an idle period)."""
    ctx = zmq.Context()
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is not None:
        with contextlib.suppress(zmq.ZMQError, AttributeError):
            ctx.set(zmq.THREAD_SCHED_POLICY, policy)
    return ctx


class EngineLink:
    """Non-blocking telemetry out (PUSH) and newest-policy in (SUB) for one engine id."""

    def __init__(self, engine_id: str, *, telemetry_endpoint: str, policy_endpoint: str, queue: int = 1000,
                 curve_client_key: str = "", curve_server_public: str = "", insecure: bool = False,
                 context: zmq.Context | None = None, flush_s: float = 0.1,
                 policy_type: type = Policy, max_running: int = 0) -> None:
        """``policy_type``: what arrives under this id (``Policy``; the DP controller's dispatcher:
        ``DispatchPolicy``); any struct with ``engine_id``, ``version``, ``issued_at`` and ``ttl_s``.
        ``max_running``: the engine's own cap on running requests (0: unknown); a policy above it is refused
        (:func:`policy_fault`)."""
        if not engine_id or "\0" in engine_id or len(engine_id) > 128:
            raise ValueError(f"engine_id={engine_id!r}: 1..128 characters, no NUL")
        if queue < 1:
            raise ValueError(f"queue={queue}: must be >= 1")
        curve = [security.check_client(ep, curve_client_key=curve_client_key,
                                       curve_server_public=curve_server_public, insecure=insecure)
                 for ep in (telemetry_endpoint, policy_endpoint)]
        self.engine_id = engine_id
        self.instance = os.urandom(4).hex()  # this process's reports: the daemon refuses a second one on this id
        self.plugin_version = package_version()
        self.daemon_protocol: int | None = None  # the version of the last policy frame refused for its version
        self.telemetry_endpoint, self.policy_endpoint = telemetry_endpoint, policy_endpoint
        self._own_ctx = context is None
        self._ctx = _background_context() if context is None else context
        self._topic = topic(engine_id)
        self._encode = msgspec.msgpack.Encoder().encode
        made: list[zmq.Socket] = []
        try:  # a key file that cannot be read, a bad endpoint: nothing left behind
            self._push = self._socket(zmq.PUSH, curve[0], curve_client_key, curve_server_public, made)
            self._push.sndhwm = queue
            self._push.connect(telemetry_endpoint)
            self._sub = self._socket(zmq.SUB, curve[1], curve_client_key, curve_server_public, made)
            self._sub.rcvhwm = _POLICY_RCVHWM
            self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
            self._sub.connect(policy_endpoint)
        except BaseException:
            for s in made:
                s.close(linger=0)
            if self._own_ctx:
                self._ctx.term()
            raise
        self._policy_type = policy_type
        self.max_running = max_running
        self._policy: Any = None
        self._received_at = 0.0
        self._expires_at = 0.0
        self.sent = self.dropped = self.policies = self.unencodable = self.wakes = 0
        self.rejected = {"malformed": 0, "version": 0, "validation": 0, "engine_id": 0, "ttl": 0, "n_max": 0,
                         "k": 0}
        self._closed = False
        self._queue = queue
        self._outbox: collections.deque[IterationReport | DispatchReport | tuple] = collections.deque()
        self._inbox: collections.deque[bytes] = collections.deque(maxlen=_POLICY_RCVHWM)
        self._flush_ms = max(1, round(flush_s * 1000))
        self._stop = threading.Event()
        self._io = threading.Thread(target=self._io_loop, name=f"ebctl-link-{engine_id}", daemon=True)
        self._io.start()

    @classmethod
    def from_config(cls, cfg: Config, engine_id: str, *, policy_type: type = Policy,
                    max_running: int = 0) -> EngineLink:
        d = cfg.daemon
        return cls(engine_id, telemetry_endpoint=cfg.endpoint("telemetry"), policy_endpoint=cfg.endpoint("policy"),
                   curve_client_key=d.curve_client_key, curve_server_public=d.curve_server_key,
                   insecure=d.insecure, policy_type=policy_type, max_running=max_running,
                   flush_s=cfg.engine.report_flush_s)

    def _socket(self, kind: int, curve: bool, client_key: str, server_public: str, made: list[zmq.Socket]
                ) -> zmq.Socket:
        s = self._ctx.socket(kind)
        made.append(s)
        s.linger = 0
        s.reconnect_ivl, s.reconnect_ivl_max = _RECONNECT_IVL_MS, _RECONNECT_IVL_MAX_MS
        if curve:
            security.apply_client(s, client_key, server_public)
        return s

    def report(self, report: IterationReport | DispatchReport) -> bool:
        """Queue one report for the daemon; False (dropped, counted) if the queue is full."""
        if len(self._outbox) >= self._queue or self._closed:
            self.dropped += 1
            return False
        self._outbox.append(report)
        return True

    def policy(self, now: float) -> Policy | None:
        """The newest valid policy for this engine, or None if none arrived or it expired.

        ``now`` is the caller's clock (monotonic is best); a policy lives ``ttl_s`` from the ``now`` of the
        call that first saw it, so the daemon's clock never enters the expiry.
        """
        inbox = self._inbox
        while inbox:
            self._accept(inbox.popleft(), now)
        if self._policy is None or now >= self._expires_at:
            return None
        return self._policy

    def _io_loop(self) -> None:
        """The only code that touches the sockets: wait for policies, then send what the engine queued."""
        sub, push, out, encode = self._sub, self._push, self._outbox, self._encode
        while not self._stop.is_set():
            self.wakes += 1
            try:
                if sub.poll(self._flush_ms):
                    for _ in range(_MAX_DRAIN):
                        try:
                            self._inbox.append(sub.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                while out:
                    item = out[0]
                    try:
                        if not item.instance:
                            item = out[0] = msgspec.structs.replace(item, instance=self.instance,
                                                                    plugin_version=self.plugin_version)
                        frame = encode(item)
                    except Exception as e:  # an engine bug (an unencodable field): drop it, never wedge
                        out.popleft()
                        self.dropped += 1
                        self.unencodable += 1
                        if self.unencodable == 1:
                            log.warning("engine %s: a report that cannot be encoded was dropped (counted in "
                                        "dropped; logged once): %s", self.engine_id, e)
                        continue
                    try:
                        push.send(frame, zmq.NOBLOCK)
                    except zmq.Again:  # ZeroMQ's queue is full too (daemon slow, down or absent)
                        if len(out) < self._queue:
                            break  # keep it and retry at the next flush
                        out.popleft()
                        self.dropped += 1
                        continue
                    out.popleft()
                    self.sent += 1
            except zmq.ZMQError as e:
                if self._stop.is_set() or e.errno == zmq.ETERM:
                    return
                log.warning("engine %s: link I/O error (continuing): %s", self.engine_id, e)
                self._stop.wait(0.1)
            except Exception:  # never let the thread die silently; the engine keeps running regardless
                log.exception("engine %s: link I/O thread error (continuing)", self.engine_id)
                self._stop.wait(0.1)

    def _accept(self, frame: bytes, now: float) -> None:
        """Take one frame from the daemon: keep it if it is the newest valid policy, else drop and count it.
        Runs on the engine's thread, where an exception would switch the plugin off: whatever a frame makes
        the decoder raise is a refused frame, never an error."""
        self.policies += 1
        try:
            p = decode(memoryview(frame)[len(self._topic):], self._policy_type)
        except ProtocolError as e:
            reason = reject_reason(e)
            if reason == "version" and (v := peek(memoryview(frame)[len(self._topic):])[0]) is not None:
                self.daemon_protocol = v  # version skew: one warning that says which versions and what follows
                self._count_rejected(reason, None, skew_warning(self.engine_id, v))
                return
            self._count_rejected(reason, e)
            return
        except Exception as e:  # the decoder promises ProtocolError only; an engine must not depend on it
            self._count_rejected("malformed", repr(e))
            return
        if p.engine_id != self.engine_id:
            self._count_rejected("engine_id", f"policy for {p.engine_id!r} under topic {self.engine_id!r}")
            return
        fault = policy_fault(p, self.max_running)
        if fault is not None:
            self._count_rejected(fault, f"version {p.version}: k={getattr(p, 'k', None)}, "
                                        f"n_max={getattr(p, 'n_max', None)}, ttl_s={p.ttl_s} (engine: "
                                        f"max_running={self.max_running or 'unknown'}, ttl_s <= {MAX_TTL_S:g})")
            return
        cur = self._policy
        # Newest by version. Within one daemon versions never go back; a lower version issued later than
        # the one held comes from a restarted daemon (both times are the daemon's clock) and replaces it.
        if cur is None or p.version >= cur.version or p.issued_at > cur.issued_at or now >= self._expires_at:
            self._policy, self._received_at, self._expires_at = p, now, now + p.ttl_s

    def _count_rejected(self, reason: str, why: object, text: str = "") -> None:
        self.rejected[reason] += 1
        if self.rejected[reason] == 1:  # once per reason: the engine's log is not the place for a flood
            if text:
                log.warning("%s", text)
            else:
                log.warning("engine %s: ignoring a bad policy frame (%s): %s", self.engine_id, reason, why)

    def stats(self) -> dict[str, Any]:
        p = self._policy
        return {"engine_id": self.engine_id, "sent": self.sent, "queued": len(self._outbox), "dropped": self.dropped,
                "wakes": self.wakes,
                "unencodable": self.unencodable, "policies_received": self.policies, "rejected": dict(self.rejected),
                "protocol": PROTOCOL_VERSION, "daemon_protocol": self.daemon_protocol,
                "policy_version": None if p is None else p.version,
                "policy_received_at": self._received_at if p else None,
                "policy_expires_at": self._expires_at if p else None}

    def close(self) -> None:
        """Close both sockets at once (linger 0: queued reports are dropped, nothing waits)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._io.join(timeout=2.0)
        self._push.close(linger=0)
        self._sub.close(linger=0)
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> EngineLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaemonUnreachable(ConnectionError):
    """No reply from the daemon's control endpoint in time."""

    def __init__(self, endpoint: str, timeout_s: float | None = None) -> None:
        within = f" within {timeout_s:g} s" if timeout_s is not None else ""
        super().__init__(f"no reply from the ebctl daemon at {endpoint}{within} (is `ebctl daemon` running "
                         "with the same config?)")
        self.endpoint = endpoint


class ControlClient:
    """REQ client of the daemon's control API; one request at a time, never wedged by a dead daemon."""

    def __init__(self, endpoint: str, *, timeout_s: float = 3.0, curve_client_key: str = "",
                 curve_server_public: str = "", insecure: bool = False) -> None:
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self._curve = security.check_client(endpoint, curve_client_key=curve_client_key,
                                            curve_server_public=curve_server_public, insecure=insecure)
        self._keys = (curve_client_key, curve_server_public)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None

    @classmethod
    def from_config(cls, cfg: Config, *, timeout_s: float = 3.0) -> ControlClient:
        d = cfg.daemon
        return cls(cfg.endpoint("control"), timeout_s=timeout_s, curve_client_key=d.curve_client_key,
                   curve_server_public=d.curve_server_key, insecure=d.insecure)

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.REQ)
            s.linger = 0
            if self._curve:
                security.apply_client(s, *self._keys)
            s.connect(self.endpoint)
            self._sock = s
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def request(self, op: str, **args: Any) -> ControlReply:
        """Send ``op`` with ``args``; the daemon's reply (``ok`` False carries its error text).

        Raises DaemonUnreachable when no reply comes within ``timeout_s``. A reply that is not a valid
        ControlReply comes back as ``ok=False`` with the decoding error.
        """
        sock = self._socket()
        try:
            sock.send(encode(ControlRequest(op=op, args=args)), zmq.NOBLOCK)
            if not sock.poll(int(self.timeout_s * 1000), zmq.POLLIN):
                raise zmq.Again
            frames = sock.recv_multipart()
        except zmq.ZMQError:
            self._reset()  # a REQ socket that missed its reply can never send again: rebuild it
            raise DaemonUnreachable(self.endpoint, self.timeout_s) from None
        try:
            return decode(frames[0], ControlReply)
        except ProtocolError as e:
            return ControlReply(ok=False, error=f"bad reply from {self.endpoint}: {e}")

    def wait_ready(self, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
        """Poll ``status`` until the daemon answers; DaemonUnreachable after ``timeout_s`` or as soon as
        ``alive()`` says the daemon process is gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.request("status")
                return
            except DaemonUnreachable:
                if time.monotonic() > deadline or not alive():
                    raise

    def close(self) -> None:
        """Close the socket and the context. ``destroy`` also closes a socket that an interrupt (Ctrl-C)
        orphaned between ``ctx.socket()`` and ``self._sock``: ``term()`` alone would wait on it forever."""
        self._reset()
        self._ctx.destroy(linger=0)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
