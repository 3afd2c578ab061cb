"""The plugin's start, fail-open and status in one scheduler process, as functions of explicit arguments.

``start`` runs on the first ``get_next_batch_to_run`` of the scheduler: it reads the config, finds where this
rank sits (``reading.ranks``), and returns what it learned (:class:`Setup`, fixed from then on) with what it
opened (:class:`Started`): the link on the group's source rank only, the source's end of the follower-fault
channel (``group_fault.py``) in a group of several ranks, the trace file. ``restore``, ``close`` and ``note``
are the fail-open path's steps (docs/design.md §3; ``state.PluginState.stop`` takes them): sglang's launch
settings back on the scheduler and on the batch being planned, whatever start opened closed, the trace's last
line. ``status`` is what ``GET /server_info`` shows under ``internal_states[i]["ebctl"]``, a function of the
state.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ebctl import fleet
from sglang_patch import group_fault, reading
from sglang_patch.fault import Fault, parse
from sglang_patch.tracefile import TraceFile

log = logging.getLogger("ebctl.sglang")

TIMES = 4096  # per-iteration hook costs kept for status (ns)


def _no_kv() -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Setup:
    """What ``start`` learned about this scheduler; the defaults stand for a scheduler not yet started."""

    engine_id: str = ""
    reporting: bool = False  # the group's source rank: talks to the daemon (reports, reads policies)
    group: int = 1  # schedulers that must take identical decisions (attention TP × CP × PP)
    rank: int = 0  # this scheduler's place in its group (reading.Ranks.rank)
    launch_mixed: bool | None = None  # the server's is_mixed_chunk at launch
    launch_pd_interval: int | None = None  # the server's prefill_decode_interval at launch (None: it has none)
    mixed_reason: str = ""  # why mb cannot mix here ("" when it can)
    max_running: int = 0
    kv_total: int = 0  # the server's KV capacity in tokens (max_total_num_tokens)
    # sglang's allocator's available_size and tree cache's evictable_size, bound once: both objects are built in
    # Scheduler.__init__ (scheduler.py:610-615) and never replaced (kv_used)
    kv_free: Callable[[], int] = _no_kv
    kv_evictable: Callable[[], int] = _no_kv
    sync_forward: bool = False  # run_batch returns after the forward (CPU): time it there
    kinds: Mapping[Any, Any] = field(default_factory=dict)  # ForwardMode -> BatchKind (reading.batch_kinds)
    sched: Any = None  # the scheduler: the fail-open path's, where a hook does not have it
    channel: str = ""  # the group's follower-fault channel (group_fault.endpoint); "" alone
    mixed_unavailable: bool = field(init=False, default=False)  # bool(mixed_reason), read per report
    pd_interval_available: bool = field(init=False, default=False)  # a policy's pd_interval applies here
    leads: bool = field(init=False, default=False)  # the source of a group of several: sends the envelope

    def __post_init__(self) -> None:
        object.__setattr__(self, "mixed_unavailable", bool(self.mixed_reason))
        object.__setattr__(self, "pd_interval_available", self.launch_pd_interval is not None)
        object.__setattr__(self, "leads", self.reporting and self.group > 1)


def kv_used(s: Setup) -> int:
    """KV tokens in use now, as sglang's "token usage" log counts them (``reading.kv_tokens``)."""
    u = s.kv_total - s.kv_free() - s.kv_evictable()
    return u if u > 0 else 0


class Started(NamedTuple):
    """What ``start`` opened with what it learned: each is None where this rank has none."""

    setup: Setup
    link: Any  # ebctl.link.EngineLink: the source rank's
    inbox: group_fault.Inbox | None  # the source of a group of several: followers' faults come in here
    trace: Any  # engine.trace_dir: a line-buffered file of this rank's gate decisions
    fault: Fault | None  # engine.fault armed here


def learn(sched: Any, cfg: Any, where: reading.Ranks) -> Setup:
    """The :class:`Setup` of ``sched`` at ``where``, under config ``cfg``."""
    prefix = fleet.id_prefix(cfg.engine.id_prefix, cfg.daemon.node, os.environ.get(fleet.SERVER_ENV, ""))
    engine_id = f"{prefix}/dp{where.dp}" if prefix else f"dp{where.dp}"
    return Setup(
        engine_id=engine_id, reporting=where.source, group=where.group, rank=where.rank,
        launch_mixed=bool(sched.is_mixed_chunk),
        launch_pd_interval=_pd_interval(sched),
        mixed_reason=reading.mixed_unavailable_reason(sched, allow_without_flag=cfg.engine.mixed_without_flag),
        max_running=int(sched.max_running_requests), kv_total=int(sched.max_total_num_tokens),
        kv_free=sched.token_to_kv_pool_allocator.available_size, kv_evictable=sched.tree_cache.evictable_size,
        sync_forward=str(sched.device) == "cpu", kinds=reading.batch_kinds(), sched=sched,
        channel=group_fault.endpoint(cfg.daemon.runtime_dir, engine_id, os.getppid()) if where.group > 1 else "")


def start(sched: Any) -> Started:
    """First iteration of this scheduler: read the config, open what this rank needs. Opens all of it or,
    raising, nothing."""
    from ebctl import config
    from ebctl.link import EngineLink

    cfg = config.load(os.environ.get("EBCTL_CONFIG") or None)
    where = reading.ranks()
    s = learn(sched, cfg, where)
    armed = parse(cfg.engine.fault, s.rank)
    link = inbox = trace = None
    try:
        if s.leads:  # before the link: a group that cannot hear its followers is not steered at all
            inbox = group_fault.Inbox(s.channel)
        if s.reporting:
            # the link refuses a policy above this scheduler's own cap (counted in its stats' "rejected")
            link = EngineLink.from_config(cfg, s.engine_id, max_running=s.max_running)
        if cfg.engine.trace_dir:  # line-buffered: a test reads it while the server runs
            path = os.path.join(cfg.engine.trace_dir, f"trace.dp{where.dp}.r{where.rank}.jsonl")
            trace = TraceFile(path)
    except BaseException:
        close(link, inbox, None)
        raise
    log.info("ebctl: plugin active in this scheduler: engine %s (%s rank of a group of %d), telemetry %s, "
             "policy %s%s", s.engine_id, "source" if s.reporting else "follower", s.group,
             cfg.endpoint("telemetry"), cfg.endpoint("policy"),
             f"; mb unavailable: {s.mixed_reason}" if s.mixed_reason else "")
    if armed is not None:
        log.warning("ebctl: fault injection armed (engine.fault=%r): a hook will raise on purpose", cfg.engine.fault)
    return Started(s, link, inbox, trace, armed)


def _pd_interval(sched: Any) -> int | None:
    """``--prefill-decode-interval`` as this scheduler runs it (``init_chunked_prefill``, scheduler.py 1353: an
    attribute read by ``_arm_prefill_decode_interval`` at every planned batch, 1413-1426); None where this
    sglang has no such attribute."""
    if not hasattr(sched, "prefill_decode_interval"):
        return None
    v = sched.prefill_decode_interval
    return int(v or 0) if v is None or isinstance(v, int) else None


def set_pd_interval(sched: Any, launch: int | None, n: int) -> None:
    """Run sglang's own prefill-decode interval at ``n`` decode steps (0: the launch value). sglang arms its
    countdown from the attribute after each batch that prefilled and defers a prefill while it runs
    (``_should_defer_prefill``, 1400-1411): the rule is sglang's, only its N comes from the policy. Written only
    when N changes: the daemon re-sends a policy every ``republish_s``, and a re-sent N must leave a countdown
    running. A smaller N (0: none) cuts a longer countdown to it at once, instead of letting the old one run out."""
    if launch is None:
        return
    v = n if n > 0 else launch
    if getattr(sched, "prefill_decode_interval", None) != v:
        sched.prefill_decode_interval = v
        if getattr(sched, "_prefill_decode_interval_remaining", 0) > v:
            sched._prefill_decode_interval_remaining = v


def restore(sched: Any, running_batch: Any, launch_mixed: bool | None, reopen: bool,
            launch_pd_interval: int | None = None, pd_interval: int = 0) -> None:
    """sglang as launched on ``sched``: its launch mixing and prefill-decode interval (``pd_interval`` > 0: that
    interval instead, for a policy of mode off that sets one); with ``reopen`` (our cap or a chunk held alone may
    have set the sticky ``batch_is_full``), admission reopened on it and on ``running_batch``, the batch being
    planned when the failure is inside planning (not yet ``sched.running_batch``)."""
    if sched is None:
        return
    try:
        if launch_mixed is not None:
            sched.is_mixed_chunk = launch_mixed
        set_pd_interval(sched, launch_pd_interval, pd_interval)
        if reopen:
            sched.running_batch.batch_is_full = False
            if running_batch is not None:
                running_batch.batch_is_full = False
    except Exception:
        log.exception("ebctl: could not restore sglang's settings")


def close(link: Any, inbox: group_fault.Inbox | None, outbox: group_fault.Outbox | None) -> None:
    """Close what ``start`` (and a follower's fault) opened, each on its own: called on the fail-open path,
    nothing may escape into sglang from here."""
    for what, part in (("link", link), ("group channel", inbox), ("group channel", outbox)):
        if part is not None:
            try:
                part.close()
            except Exception:
                log.exception("ebctl: could not close the %s", what)


def note(trace: Any, **fields: Any) -> None:
    """One line of the trace (None: no trace) for a rare event, a JSON object of ``fields``; never raises (the
    fail-open path writes them; the per-step lines are formatted in place, ``state.py``)."""
    if trace is not None:
        try:
            trace.write(json.dumps(fields) + "\n")
        except Exception:
            log.exception("ebctl: could not write the trace")


def status(st: Any, sched: Any) -> dict[str, Any]:
    """The plugin's state (``state.PluginState``) for humans and tests."""
    s = st.setup
    p = st.policy
    n = min(st.n_times, TIMES)
    ns = sorted(st.times[:n])
    return {
        "enabled": st.on, "started": st.ready, "error": st.error, "engine_id": s.engine_id,
        "steering": st.on and st.ready, "reporting": s.reporting, "group_size": s.group,
        "policy_version": st.version, "group_generation": st.applied_gen,
        "mode": "none" if p is None else str(p.mode), "k": p.k if p else None,
        "n_max": p.n_max if p else None, "launch_mixed_chunk": s.launch_mixed,
        "pd_interval": getattr(sched, "prefill_decode_interval", None), "launch_pd_interval": s.launch_pd_interval,
        "is_mixed_chunk": bool(getattr(sched, "is_mixed_chunk", False)),
        "mixed_unavailable": s.mixed_unavailable, "mixed_unavailable_reason": s.mixed_reason,
        "iterations": st.iterations, "reports": st.reports, "finished": st.finished,
        "defers": st.defers, "capped": st.capped, "chunk_alone": st.chunk_alone,
        "mixed_steps": st.mixed_steps, "gate_reasons": {str(r): c for r, c in st.gate.counts.items() if c},
        "link": st.link.stats() if st.link is not None and st.on else None,
        "trace": None if st.trace is None else (st.trace.stopped or "writing"),
        "hook_ns": {"iterations": n, "p50": ns[n // 2] if n else None,
                    "p99": ns[min(n - 1, (99 * n) // 100)] if n else None, "max": ns[-1] if n else None},
    }
