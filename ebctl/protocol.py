"""Wire types between engines, the daemon and the CLI (docs/design.md §2).

Pure: structs, one encoder, decoders built once, validation. No sockets here.
Every message carries ``v`` (protocol version); a decoder refuses a version outside the ones it is given
(by default this side's own) with ``ProtocolError`` so the shell can count it and drop the frame.

Version skew (docs/upgrade.md): the daemon accepts reports and control requests of ``ACCEPTED_VERSIONS`` (its own
and the one before) and answers each peer in the peer's version (:func:`for_version`): a policy for an engine that
reports in version 1 is encoded with ``v=1`` and only the fields version 1 has. An engine accepts policies of its
own version only, so a plugin newer than its daemon runs stock until the daemon is upgraded.

Version 2 added ``plugin_version`` (the plugin's package version) to both reports. A version-1 decoder ignores map
keys it does not know (msgspec's default for structs that are not ``array_like``), so what was added to a map
struct reads as absent there; fields added to a policy since a peer's version are left out by ``for_version``
(``_ADDED``).
"""

from __future__ import annotations

import enum
import math
from typing import Any

import msgspec

PROTOCOL_VERSION = 2
ACCEPTED_VERSIONS = (PROTOCOL_VERSION - 1, PROTOCOL_VERSION)  # what the daemon takes from engines and the CLI
MAX_SEQ = 1 << 53  # a report's seq counts iterations: beyond this it is not a counter (and not exact as a float)
MAX_PD_INTERVAL = 1024  # decode steps between prefills a policy may ask for (sglang's own flag has no bound)


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version (counted, then dropped)."""


class Mode(enum.StrEnum):
    """Batching mode the engine is asked to run."""

    EB = "eb"  # exclusive batching: prefill and decode in separate batches, refill at k idle slots
    MB = "mb"  # mixed batching: decode rows and prefill chunks in one batch
    OFF = "off"  # the engine's stock behaviour, untouched


class BatchKind(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"


class FinishedRequest(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One completed request: what the hazard and input-length estimators consume.

    ``gc=False`` here and on :class:`IterationReport`: numbers and strings only, so no reference cycle is
    possible, and untracked objects do not count towards the collector's thresholds: fewer collections
    start inside the scheduler's hooks (a generation-0 collection there costs tens of µs)."""

    input_len: int
    output_len: int
    finish_reason: str = "stop"  # "stop" (EOS / stop string), "length" (max_new_tokens), "abort"
    ttft_s: float = math.nan
    tpot_s: float = math.nan  # (last token − first token) / (output − 1); NaN for one token or unmeasured


class IterationReport(msgspec.Struct, frozen=True, tag="it", kw_only=True, gc=False):
    """What one scheduler iteration did (engine → daemon), with the requests it finished."""

    v: int = PROTOCOL_VERSION
    engine_id: str
    instance: str = ""  # the reporting process (a random token per link): two processes, one id → refused
    plugin_version: str = ""  # the reporting plugin's package version (set by the link; version 2 on)
    seq: int
    wall_time: float  # engine's wall clock, seconds since the epoch
    forward_s: float  # duration of the forward pass (or the iteration, if that is all it knows)
    kind: BatchKind
    prefill_reqs: int = 0
    prefill_tokens: int = 0
    decode_reqs: int = 0
    decode_ctx_tokens: int = 0  # sum of the decode requests' context lengths
    # the keys the prefill rows' queries attend to, summed: a chunk of e tokens after p of its prompt already in
    # the KV (a cached prefix, earlier chunks) counts e·p + e(e + 1)/2; decode_ctx_tokens is the same count for
    # decode rows (one query each). 0 from an engine that does not say (the cost fits then see no such term).
    prefill_ctx_tokens: int = 0
    running: int = 0  # running, waiting and kv_used: when the step was formed (its new tokens included)
    waiting: int = 0
    kv_used: int = 0
    kv_total: int = 0
    max_running: int = 0  # the engine's own cap on running requests (0: unknown)
    policy_version: int = -1  # -1: no policy applied (stock behaviour)
    mixed_unavailable: bool = False  # the engine cannot mix (mb falls back to eb): why, in the next field
    mixed_unavailable_reason: str = ""
    group_size: int = 1  # scheduler ranks that apply this engine's policy together (attention TP × CP × PP)
    pd_interval_available: bool = False  # the engine applies a policy's pd_interval (sglang's rule)
    gate_reasons: dict[str, int] = {}  # the phase gate's decisions by reason, counted since the engine started
    finished: tuple[FinishedRequest, ...] = ()


class Estimates(msgspec.Struct, frozen=True, kw_only=True):
    """The numbers behind a policy, for status and metrics only (the engine never reads them)."""

    p0: float = math.nan
    eta: float = math.nan
    fit_r2: float = math.nan
    mu_l: float = math.nan
    mu_o: float = math.nan
    n_window: int = 0
    theta0: float = math.nan
    delta_theta: float = math.nan
    theta_star: float = math.nan
    n_star: int = 0
    n_obs: float = math.nan
    eb_lhs: float = math.nan  # Eq. 8 left side: beta_MB^e(r) - beta_EB^w
    eb_rhs: float = math.nan  # Eq. 8 right side, delta included
    alpha_p: float = math.nan
    beta_p: float = math.nan
    alpha_d: float = math.nan
    beta_d: float = math.nan
    cost_source: str = "default"


class Policy(msgspec.Struct, frozen=True, tag="policy", kw_only=True):
    """Daemon → engine: what to do until ``issued_at + ttl_s`` (then: stock behaviour)."""

    v: int = PROTOCOL_VERSION
    engine_id: str = ""
    version: int = 0
    issued_at: float = 0.0
    ttl_s: float = 10.0
    mode: Mode = Mode.OFF
    k: int = 1
    n_max: int = 1
    kv_reserve_frac: float = 0.0
    max_defer_s: float = 5.0
    # sglang's --prefill-decode-interval to run under this policy: after a batch that prefilled, the next this
    # many steps decode only (scheduler.py 1400-1426); 0: the engine's launch value. Applied where the engine
    # reports ``pd_interval_available``.
    pd_interval: int = 0
    reason: str = ""
    estimates: Estimates | None = None

    def expired(self, now: float) -> bool:
        return now >= self.issued_at + self.ttl_s


class DispatchPolicy(msgspec.Struct, frozen=True, tag="dispatch", kw_only=True):
    """Daemon → the DP controller's dispatcher (staggered batch scheduling, ``ebctl.sbs``): what to do until
    ``ttl_s`` after it arrived (then: sglang's own dispatch). Published under the dispatcher's id
    (``<prefix>/dispatch``, or ``dispatch``), like an engine's policy."""

    v: int = PROTOCOL_VERSION
    engine_id: str = ""  # the dispatcher's id
    version: int = 0
    issued_at: float = 0.0
    ttl_s: float = 10.0
    mode: str = "off"  # "sbs": buffer and release; "off": sglang's own --load-balance-method
    t_fwd_s: float = 0.1  # T̄_fwd: mean forward time of the ranks (Algorithm 1), from their reports
    t_fwd_by_rank: dict[int, float] = {}  # each rank's windowed mean (ranks that reported a forward)
    interval_s: float = math.nan  # I_opt = (T̄_fwd + L_net)/N_active for the dispatcher's last reported topology
    l_net_s: float = 0.001
    watchdog_factor: float = 5.0
    fixed_interval_s: float = 0.0
    chunk_tokens: int = 0  # C_chunk; 0: the engine's chunked prefill size
    n_limit: int = 10
    iqr_k: float = 1.5
    drain_ranks: tuple[int, ...] = ()
    poll_s: float = 0.001
    reason: str = ""


class RankDispatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One DP rank as the dispatcher sees it: what it sent there (cumulative) and the rank's latest snapshot."""

    rank: int
    sent_reqs: int = 0
    sent_tokens: int = 0
    running: int = 0
    waiting: int = 0
    queued_tokens: int = 0
    used_tokens: int = 0
    in_flight_tokens: int = 0


class DispatchReport(msgspec.Struct, frozen=True, tag="dispatch_report", kw_only=True):
    """The DP controller's dispatcher → daemon, every half second: its state for status and metrics."""

    v: int = PROTOCOL_VERSION
    engine_id: str  # the dispatcher's id
    instance: str = ""
    plugin_version: str = ""  # version 2 on
    seq: int = 0
    wall_time: float = 0.0
    state: str = "stock"  # "sbs": holding and releasing; "stock": sglang's own dispatch; "failed": plugin off
    reason: str = ""  # why stock (no policy, expired, off, no rank, ...) or the failure
    policy_version: int = -1
    layout: str = "plain"  # "plain" (a target per rank), "attention" (one lockstep target), "decode"
    ranks: int = 0
    targets: int = 0
    chunk_tokens: int = 0
    buffered: int = 0  # requests held now
    buffered_max: int = 0  # ... at most, since the previous report
    arrived: int = 0  # cumulative counts: buffered on arrival,
    released: int = 0  # sent by a release,
    releases: int = 0  # releases made,
    passed: int = 0  # sent by sglang's own dispatch without buffering (not SBS's, or SBS off),
    overloaded: int = 0  # left behind more than N_limit releases, then sent by sglang's own dispatch,
    flushed: int = 0  # sent by sglang's own dispatch when SBS stopped or before a control message,
    aborted: int = 0  # sent at once because an abort named them
    hold_mean_s: float = math.nan  # time in the buffer of the requests released since the previous report
    hold_max_s: float = math.nan
    interval_s: float = math.nan  # I_opt in force
    t_fwd_s: float = math.nan
    watchdog_fired: int = 0
    lost: int = 0  # targets in the watchdog's fixed-interval mode now
    load_spread: float = math.nan  # busiest rank's tokens sent over the mean rank's, since the previous report
    rank: tuple[RankDispatch, ...] = ()


class ControlRequest(msgspec.Struct, frozen=True, tag="req", kw_only=True):
    """CLI → daemon over REQ/REP. ``op`` in CONTROL_OPS; ``args`` depends on it."""

    v: int = PROTOCOL_VERSION
    op: str
    args: dict[str, Any] = {}


class ControlReply(msgspec.Struct, frozen=True, tag="rep", kw_only=True):
    v: int = PROTOCOL_VERSION
    ok: bool
    error: str = ""
    data: Any = None


CONTROL_OPS = ("status", "tune", "reload", "calibrate", "shutdown", "config")

Message = IterationReport | Policy | ControlRequest | ControlReply | DispatchPolicy | DispatchReport
Telemetry = IterationReport | DispatchReport  # what arrives on the daemon's telemetry socket

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {
    t: msgspec.msgpack.Decoder(t) for t in (IterationReport, Policy, ControlRequest, ControlReply, DispatchPolicy,
                                            DispatchReport)
}
_decoders[Telemetry] = msgspec.msgpack.Decoder(Telemetry)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


# The fields each version added to the messages the daemon sends (a peer of an older version gets none of them).
_ADDED: dict[int, dict[type, tuple[str, ...]]] = {2: {Policy: (), DispatchPolicy: (), ControlReply: ()}}


def for_version(msg: Policy | DispatchPolicy | ControlReply, v: int) -> Policy | DispatchPolicy | ControlReply:
    """``msg`` as a peer of protocol version ``v`` (one of ``ACCEPTED_VERSIONS``) decodes it: ``v`` set, and the
    fields added after ``v`` back at their defaults, which the encoder still writes but an older decoder ignores
    (an unknown map key). Any other ``v``: ``msg`` unchanged (this side's own version)."""
    if v == PROTOCOL_VERSION or v not in ACCEPTED_VERSIONS:
        return msg
    added = [f for later in range(v + 1, PROTOCOL_VERSION + 1) for f in _ADDED.get(later, {}).get(type(msg), ())]
    defaults = {f.name: f.default_factory() if f.default is msgspec.NODEFAULT else f.default
                for f in msgspec.structs.fields(type(msg)) if f.name in added}
    return msgspec.structs.replace(msg, v=v, **defaults)


def _finite_nonneg(name: str, x: float) -> None:
    if not (math.isfinite(x) and x >= 0):
        raise ProtocolError(f"{name}={x!r}: must be finite and >= 0")


def _validate_report(r: IterationReport) -> None:
    for name in ("seq", "prefill_reqs", "prefill_tokens", "decode_reqs", "decode_ctx_tokens", "prefill_ctx_tokens",
                 "running", "waiting", "kv_used", "kv_total", "max_running"):
        if getattr(r, name) < 0:
            raise ProtocolError(f"{name}={getattr(r, name)}: must be >= 0")
    if r.seq > MAX_SEQ:
        raise ProtocolError(f"seq={r.seq}: must be <= 2**53")
    _finite_nonneg("forward_s", r.forward_s)
    if not math.isfinite(r.wall_time):
        raise ProtocolError("wall_time must be finite")
    if not r.engine_id or len(r.engine_id) > 128:
        raise ProtocolError("engine_id must be 1..128 characters")
    if r.group_size < 1:
        raise ProtocolError(f"group_size={r.group_size}: must be >= 1")
    if len(r.gate_reasons) > 64 or any(n < 0 for n in r.gate_reasons.values()):
        raise ProtocolError("gate_reasons: at most 64 reasons, each count >= 0")
    for f in r.finished:
        if f.input_len < 0 or f.output_len < 0:
            raise ProtocolError(f"finished request with negative length ({f.input_len}, {f.output_len})")


def _validate_policy(p: Policy) -> None:
    if p.k < 1 or p.n_max < 1:
        raise ProtocolError(f"k={p.k}, n_max={p.n_max}: both must be >= 1")
    if not (0.0 <= p.kv_reserve_frac < 1.0):
        raise ProtocolError(f"kv_reserve_frac={p.kv_reserve_frac}: must be in [0, 1)")
    if not 0 <= p.pd_interval <= MAX_PD_INTERVAL:
        raise ProtocolError(f"pd_interval={p.pd_interval}: must be in [0, {MAX_PD_INTERVAL}]")
    _finite_nonneg("ttl_s", p.ttl_s)
    _finite_nonneg("max_defer_s", p.max_defer_s)
    if not math.isfinite(p.issued_at):
        raise ProtocolError("issued_at must be finite")


def _validate_dispatch_policy(p: DispatchPolicy) -> None:
    if p.mode not in ("off", "sbs"):
        raise ProtocolError(f"mode={p.mode!r}: must be 'off' or 'sbs'")
    for name in ("ttl_s", "l_net_s", "fixed_interval_s", "iqr_k"):
        _finite_nonneg(name, getattr(p, name))
    if not (math.isfinite(p.t_fwd_s) and p.t_fwd_s > 0) or not (math.isfinite(p.poll_s) and p.poll_s > 0):
        raise ProtocolError(f"t_fwd_s={p.t_fwd_s!r}, poll_s={p.poll_s!r}: both must be finite and > 0")
    if not (math.isfinite(p.watchdog_factor) and p.watchdog_factor >= 1):
        raise ProtocolError(f"watchdog_factor={p.watchdog_factor!r}: must be >= 1")
    if p.chunk_tokens < 0 or p.n_limit < 0 or any(r < 0 for r in p.drain_ranks):
        raise ProtocolError(f"chunk_tokens={p.chunk_tokens}, n_limit={p.n_limit}, drain_ranks={p.drain_ranks}: "
                            "must be >= 0")
    if not math.isfinite(p.issued_at):
        raise ProtocolError("issued_at must be finite")


def _validate_dispatch_report(r: DispatchReport) -> None:
    if not r.engine_id or len(r.engine_id) > 128:
        raise ProtocolError("engine_id must be 1..128 characters")
    if len(r.rank) > 4096:
        raise ProtocolError(f"{len(r.rank)} ranks: at most 4096")
    for name in ("seq", "ranks", "targets", "buffered", "arrived", "released", "releases", "passed",
                 "overloaded", "flushed", "aborted", "watchdog_fired", "lost"):
        if getattr(r, name) < 0:
            raise ProtocolError(f"{name}={getattr(r, name)}: must be >= 0")


def _validate_telemetry(m: IterationReport | DispatchReport) -> None:
    (_validate_report if type(m) is IterationReport else _validate_dispatch_report)(m)


_VALIDATORS = {IterationReport: _validate_report, Policy: _validate_policy, DispatchPolicy: _validate_dispatch_policy,
               DispatchReport: _validate_dispatch_report, Telemetry: _validate_telemetry}


def decode(data: bytes, kind: Any, versions: tuple[int, ...] = (PROTOCOL_VERSION,)) -> Any:
    """Decode and validate one frame as ``kind`` (a message type, or ``Telemetry``: either report) of one of
    ``versions``; raise ProtocolError on anything wrong (a version outside them: "protocol version N ...")."""
    try:
        msg = _decoders[kind].decode(data)
    except Exception as e:  # msgspec's errors, and whatever else a hostile frame can provoke: never past here
        # A frame of a newer (or older) version may not even fit the struct: say which version it was.
        v = peek(data)[0]
        if v is not None and v not in versions:
            raise ProtocolError(f"protocol version {v} (this side speaks {_speaks(versions)})") from e
        raise ProtocolError(f"malformed {getattr(kind, '__name__', 'telemetry frame')}: {e}") from e
    if msg.v not in versions:
        raise ProtocolError(f"protocol version {msg.v} (this side speaks {_speaks(versions)})")
    validate = _VALIDATORS.get(kind)
    if validate is not None:
        validate(msg)
    return msg


def _speaks(versions: tuple[int, ...]) -> str:
    return " and ".join(map(str, versions))


def peek(data: bytes | memoryview) -> tuple[int | None, str | None]:
    """The ``v`` and ``engine_id`` of a frame, whatever its version, if it is a map with an int ``v`` (and a
    string ``engine_id``); None for what is missing. Anything the untyped decoder raises means neither (invalid
    UTF-8 in a key raises ``UnicodeDecodeError``, not ``DecodeError``)."""
    try:
        obj = msgspec.msgpack.decode(data)
    except Exception:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    v, eid = obj.get("v"), obj.get("engine_id")
    return (v if type(v) is int else None), (eid if isinstance(eid, str) else None)

