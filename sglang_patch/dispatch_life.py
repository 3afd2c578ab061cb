"""The dispatcher's start and report in the DP controller process, as functions of explicit arguments.

``arm`` runs on the first ``DataParallelController.event_loop`` call, so only in that process: it reads the
config, names the dispatcher (``<engine.id_prefix or daemon.node>/dispatch``, else ``dispatch``: the daemon
pairs it with the ranks ``<prefix>/dp<N>``), reads the layout from sglang's runtime context and opens the
link; what it learned is one record (:class:`DispatchSetup`), held by ``dispatch_state.DispatchState``.
``report_of`` is the state the daemon shows (``ebctl status``), a function of that state; ``close_later`` is
the fail-open path's last step: the link closes once the last report had time to leave.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ebctl import fleet
from ebctl.protocol import DispatchPolicy, DispatchReport, RankDispatch
from sglang_patch.fault import Fault, parse
from sglang_patch.tracefile import TraceFile

log = logging.getLogger("ebctl.sglang")

LINK_CLOSE_DELAY_S = 1.0  # after a failure: time for the last report to leave before the link closes


def _never_health_check(req: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class DispatchSetup:
    """What ``arm`` learned about the DP controller; the defaults stand for one not yet armed."""

    ctl: Any = None  # sglang's DataParallelController
    dispatcher_id: str = ""
    layout: str = "plain"  # plain: a target per rank; attention: one lockstep target; decode: Algorithm 3
    never: str = ""  # why this server is never held (follow_bootstrap_room), if so
    server_chunk: int = 0
    reader: Any = None  # the controller's load_snapshot_reader
    health_check: Callable[[Any], bool] = _never_health_check  # sglang's is_health_check_generate_req


class Armed(NamedTuple):
    """What ``arm`` opened with what it learned."""

    setup: DispatchSetup
    link: Any  # ebctl.link.EngineLink
    trace: Any  # engine.trace_dir: dispatch.jsonl, line-buffered
    fault: Fault | None  # engine.fault armed here (a test switch)


def learn(ctl: Any, cfg: Any) -> DispatchSetup:
    """The :class:`DispatchSetup` of ``ctl`` (DataParallelController, data_parallel_controller.py:158-267, fully
    built by the first event_loop call) under config ``cfg``."""
    from sglang.srt.managers.utils import is_health_check_generate_req
    from sglang.srt.runtime_context import get_disagg, get_parallel

    prefix = fleet.id_prefix(cfg.engine.id_prefix, cfg.daemon.node, os.environ.get(fleet.SERVER_ENV, ""))
    layout = "plain"
    if get_disagg().disaggregation_mode == "decode":
        layout = "decode"
    elif get_parallel().attn_dp_enabled:
        layout = "attention"
    never = ""
    if ctl.load_balance_method.name == "FOLLOW_BOOTSTRAP_ROOM":
        never = "--load-balance-method follow_bootstrap_room: each request's rank follows its bootstrap room"
    args = ctl.server_args
    chunk = getattr(args, "chunked_prefill_size", None) or 0
    return DispatchSetup(ctl=ctl, dispatcher_id=f"{prefix}/dispatch" if prefix else "dispatch", layout=layout,
                         never=never,
                         server_chunk=chunk if chunk > 0 else int(getattr(args, "max_prefill_tokens", 0) or 16384),
                         reader=ctl.load_snapshot_reader, health_check=is_health_check_generate_req)


def arm(ctl: Any) -> Armed:
    """First event_loop call of the DP controller: config, id, layout, link. Opens all of it or, raising,
    nothing."""
    from ebctl import config
    from ebctl.link import EngineLink

    cfg = config.load(os.environ.get("EBCTL_CONFIG") or None)
    s = learn(ctl, cfg)
    armed = parse(cfg.engine.fault, None, "dispatch hook")
    link = EngineLink.from_config(cfg, s.dispatcher_id, policy_type=DispatchPolicy)
    try:
        trace = None
        if cfg.engine.trace_dir:  # line-buffered: a test reads it while the server runs
            trace = TraceFile(os.path.join(cfg.engine.trace_dir, "dispatch.jsonl"))
    except BaseException:
        link.close()
        raise
    ranks = sum(1 for r in ctl._active_workers if ctl.status[r])
    log.info("ebctl: dispatcher %s active in the DP controller (%s, %d ranks, chunk %d tokens%s), telemetry %s, "
             "policy %s", s.dispatcher_id, s.layout, ranks, s.server_chunk,
             f"; never held: {s.never}" if s.never else "", cfg.endpoint("telemetry"), cfg.endpoint("policy"))
    if armed is not None:
        log.warning("ebctl: fault injection armed (engine.fault=%r): a hook will raise on purpose", cfg.engine.fault)
    return Armed(s, link, trace, armed)


def close_later(link: Any) -> None:
    """Close ``link`` after LINK_CLOSE_DELAY_S, on a timer thread: the last report leaves first."""
    t = threading.Timer(LINK_CLOSE_DELAY_S, link.close)
    t.daemon = True
    t.start()


def report_of(st: Any, now: float) -> DispatchReport:
    """What the daemon shows for the dispatcher ``st`` (``dispatch_state.DispatchState``) at wall time ``now``:
    counters, the clock, each rank, and the window since the last report."""
    core = st.core
    live = [r for ranks in core.instances for r in ranks] if core is not None and st.holding else []
    window = [st.window_tokens.get(r, 0) for r in live]
    mean = sum(window) / len(window) if window else 0.0
    holds = st.holds
    ranks = tuple(RankDispatch(r, st.sent_reqs.get(r, 0), st.sent_tokens.get(r, 0), *(_load_fields(st.loads.get(r))),
                               core.in_flight.tokens(r) if core is not None else 0) for r in st.ranks)
    return DispatchReport(
        engine_id=st.setup.dispatcher_id, seq=st.seq, wall_time=now,
        state="failed" if not st.on else "sbs" if st.holding else "stock", reason=st.reason,
        policy_version=st.policy.version if st.policy is not None else -1, layout=st.setup.layout,
        ranks=len(st.ranks), targets=len(core.instances) if core is not None else 0,
        chunk_tokens=core.chunk if core is not None else st.setup.server_chunk, buffered=len(st.reqs),
        buffered_max=st.buffered_max, arrived=st.arrived, released=st.released, releases=st.releases,
        passed=st.passed, overloaded=st.overloaded, flushed=st.flushed, aborted=st.aborted,
        hold_mean_s=sum(holds) / len(holds) if holds else math.nan, hold_max_s=max(holds, default=math.nan),
        interval_s=core.clock.interval if core is not None else math.nan,
        t_fwd_s=core.clock.t_fwd if core is not None else math.nan,
        watchdog_fired=core.clock.watchdog_fired if core is not None else 0,
        lost=len(core.clock.lost) if core is not None else 0,
        load_spread=max(window) / mean if mean > 0 else math.nan, rank=ranks)


def _load_fields(load: Any) -> tuple[int, int, int, int]:
    """(running, waiting, queued tokens, used tokens) of a rank's latest snapshot (zeros before the first)."""
    if load is None:
        return 0, 0, 0, 0
    return load.running, load.waiting, load.queued_tokens, load.used_tokens
