"""The SBS dispatcher's state in sglang's data-parallel controller process (``dispatch.py`` calls it).

``DataParallelController`` (managers/data_parallel_controller.py) sends each request to a DP rank the moment
it arrives. With a ``DispatchPolicy`` of mode ``sbs`` from the daemon, this state holds generate requests
instead and releases them in batches: the shared core ``ebctl.sbs.dispatcher.Dispatcher`` decides when (the
dual trigger of Algorithm 1) and where (PBAA, Algorithm 2; Algorithm 3 on a decode server); a release sets
``req.routed_dp_rank`` and hands the request to sglang's own ``dispatching_with_trace``, which honours it
(``maybe_external_dp_rank_routing``, :865-878), so tracing, time stats and the rank checks stay sglang's.

What it reads, itself, on each tick (no round trip to the daemon on the dispatch path): every rank's
shared-memory ``LoadSnapshot`` through the controller's own reader (``load_snapshot_reader.read_all()``,
load_snapshot.py:509-520). A rank publishes one after each forward (``process_batch_result``,
scheduler.py:5082, every ``--load-snapshot-publish-interval`` decode steps; ``ebctl start`` sets 1 with SBS
on) and while idle (``on_idle``, :5241-5327), stamped with ``time.time()``; so this state runs on the wall
clock too. A snapshot reflects every request the rank received before its iteration began, i.e. everything
sent before the rank's previous snapshot: a send at t is acknowledged (U_flight) once a snapshot follows one
stamped after t + L_net. A send no snapshot showed within the watchdog's horizon (watchdog_factor·T̄_fwd) is
no longer counted: the rank is silent and §4.1.2 degrades to fixed-interval releases. A target is ready
(EndForward) when each of its ranks published after the target's last release; quiescent when the snapshots
show nothing running, waiting or queued and nothing is in flight to it.

What it does not hold: embeddings, health checks, requests that name their rank (``routed_dp_rank``), any
request under ``--load-balance-method follow_bootstrap_room`` (a disaggregated prefill server ties a request
to its bootstrap room's rank). Fail open: no policy, an expired one, ``off``, or every rank drained: the
buffer is flushed through sglang's own dispatch and every request goes there at once. ``fail`` (an
exception): the same, for good in this process. What ``arm`` learned is one record, ``setup``
(``dispatch_life.DispatchSetup``); the report is a function of this state (``dispatch_life.report_of``).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
from time import time as wall_clock
from typing import Any

from ebctl.protocol import DispatchPolicy
from ebctl.sbs.dispatcher import Dispatcher
from ebctl.sbs.types import RankLoad, SbsParams
from sglang_patch import dispatch_life
from sglang_patch.fault import Fault

log = logging.getLogger("ebctl.sglang")

POLICY_POLL_S = 0.02  # the link is asked for the newest policy at most this often (as the scheduler's plugin)
REPORT_S = 0.5  # a DispatchReport to the daemon this often
IDLE_WAIT_S = 0.05  # longest wait on the socket with nothing held or in flight
# Control messages that read state and change nothing: the buffer is not flushed before them.
READ_ONLY = frozenset({"GetInternalStateReq", "GetHiCacheL3LayoutReq"})


class DispatchState:
    """Per DP controller process. ``on`` False: disabled for good here (stock sglang dispatch).

    The methods a hook runs take ``(ctl, arg, answer)`` (``guard.guarded``): ``answer`` is what the hook
    answers when the method raises."""

    def __init__(self) -> None:
        self.on = True
        self.armed = False  # arm() ran (first event_loop call)
        self.error = ""
        self.setup = dispatch_life.DispatchSetup()  # what arm() learned about the controller
        self.link: Any = None
        self.trace: Any = None
        self.fault: Fault | None = None  # engine.fault armed here (a test switch)
        self.ranks: list[int] = []  # sglang's active DP ranks
        self.core: Dispatcher | None = None
        self.policy: DispatchPolicy | None = None
        self.holding = False  # SBS in force: generate requests are buffered
        self.reason = "not started"
        self.bypass = False  # sending through sglang's own dispatch: the hook passes everything
        self.reqs: dict[int, tuple[Any, float]] = {}  # buffered: id → (request, arrival wall time)
        self.next_jid = 0
        self.seen: dict[int, float] = {}  # rank → timestamp of its latest snapshot read
        self.loads: dict[int, RankLoad] = {}
        self.released_at: dict[int, float] = {}  # target → wall time of its last release
        self.next_poll = self.next_read = self.next_report = 0.0
        self.arrived = self.released = self.releases = self.passed = self.overloaded = self.flushed = 0
        self.aborted = self.seq = self.buffered_max = 0
        self.sent_reqs: dict[int, int] = {}
        self.sent_tokens: dict[int, int] = {}
        self.window_tokens: dict[int, int] = {}  # tokens released per rank since the last report
        self.holds: list[float] = []  # buffer times of the requests released since the last report

    # --- start, fail-open, exit, report, trace ------------------------------------------------------------
    def arm(self, ctl: Any, _arg: Any = None, _answer: Any = None) -> None:
        """First event_loop call of the DP controller (``dispatch_life.arm``): what it learned, what it opened."""
        self.armed = True
        self.setup, self.link, self.trace, self.fault = dispatch_life.arm(ctl)
        self.ranks = [r for r in ctl._active_workers if ctl.status[r]]
        atexit.register(self.at_exit)

    def fail(self, where: str, _running_batch: Any = None, _sched: Any = None) -> None:
        """From the guard's ``except`` block: log once with the traceback, flush the buffer through sglang's own
        dispatch, stay off (stock dispatch from here on, sglang's own event loop); a last report says so, then
        the link closes."""
        if not self.on:
            return
        self.on = self.holding = False
        self.error = self.reason = f"exception in dispatch hook {where}"
        log.exception("ebctl: exception in dispatch hook %s; the ebctl dispatcher is now OFF in the DP controller "
                      "(sglang's own dispatch from here on, the server keeps serving)", where)
        try:
            if self.setup.ctl is not None and self.reqs:
                self.flush("plugin off")
        except Exception:
            log.exception("ebctl: could not flush the dispatcher's buffer")
        if self.link is not None:
            try:
                self.report(wall_clock())
            except Exception:
                log.exception("ebctl: could not send the dispatcher's last report")
            dispatch_life.close_later(self.link)
        if self.trace is not None:
            try:  # called from the guard's except block: nothing may escape into sglang from here
                self.trace.write(json.dumps({"t": wall_clock(), "off": where}) + "\n")
            except Exception:
                log.exception("ebctl: could not write the trace")

    def at_exit(self, _ctl: Any = None, _arg: Any = None, _answer: Any = None) -> None:
        """Interpreter exit (not SIGKILL), or sglang's own dispatch raised: nothing buffered may be left behind."""
        try:
            if self.on and self.reqs and self.setup.ctl is not None:
                self.flush("exit")
        except Exception:
            log.exception("ebctl: could not flush the dispatcher's buffer at exit")

    def report(self, now: float) -> None:
        """Send the daemon what it shows for this dispatcher (``dispatch_life.report_of``); window stats reset."""
        if self.link is None:
            return
        rep = dispatch_life.report_of(self, now)
        self.seq += 1
        self.link.report(rep)
        self.window_tokens, self.holds, self.buffered_max = {}, [], len(self.reqs)

    def trace_event(self, how: str, rid: Any, rank: int | None = None) -> None:
        """engine.trace_dir: one JSON line per request the dispatcher held or sent, with the rank it chose."""
        self.trace.write(json.dumps({"t": wall_clock(), "rid": str(rid), "how": how, "rank": rank}) + "\n")

    # --- arrivals --------------------------------------------------------------------------------------
    def offer(self, ctl: Any, req: Any, held: bool = False) -> bool:
        """A request sglang is about to dispatch: True if it is held (the hook then returns)."""
        if self.fault is not None:
            self.fault.hit("dispatch")
        if not self.holding or type(req).__name__ != "TokenizedGenerateReqInput" or req.routed_dp_rank is not None \
                or self.setup.health_check(req):
            self.passed += 1
            return False
        jid = self.next_jid
        self.next_jid += 1
        self.reqs[jid] = (req, wall_clock())
        self.core.arrive(jid, len(req.input_ids))
        self.arrived += 1
        self.buffered_max = max(self.buffered_max, len(self.reqs))
        if self.trace is not None:
            self.trace_event("held", req.rid)
        return True

    # --- the loop's tick -----------------------------------------------------------------------------
    def tick(self, mono: float) -> float:
        """Between two looks at the socket: the policy, the snapshots, the releases, the report. Returns how
        long the loop may wait on its socket before the next tick (s)."""
        if self.fault is not None:
            self.fault.hit("tick")
        if mono >= self.next_poll:
            self.next_poll = mono + POLICY_POLL_S
            self.refresh(mono)
        core = self.core
        busy = core is not None and (core.buffered or any(core.in_flight.tokens(r) for r in core.queued))
        if busy and mono >= self.next_read:
            poll_s = self.policy.poll_s if self.policy is not None else 0.001
            self.next_read = mono + poll_s
            now = wall_clock()
            self.read(now)
            self.release(now)
        if mono >= self.next_report:
            self.next_report = mono + REPORT_S
            now = wall_clock()
            if core is not None and not busy:  # nothing held: read anyway, so the report's rank loads are
                self.read(now)  # fresh (requests sglang routed itself change them too); shared memory, cheap
            self.report(now)
        nxt = min(self.next_poll, self.next_report, self.next_read if busy else math.inf, mono + IDLE_WAIT_S)
        return max(0.0, nxt - mono)

    def refresh(self, mono: float) -> None:
        """The newest policy (None once expired) and sglang's active ranks: apply what changed."""
        p = self.link.policy(mono) if self.link is not None else None
        ctl = self.setup.ctl  # sglang's active ranks (:340-344, elastic EP) that ActiveRanksOutput left up (:280-304)
        ranks = [r for r in ctl._active_workers if ctl.status[r]]
        if p is self.policy and ranks == self.ranks:
            return
        self.policy, self.ranks = p, ranks
        if self.setup.never:
            self.stop(self.setup.never)
        elif p is None:
            self.stop("no policy from the daemon (none yet, or expired)")
        elif p.mode != "sbs":
            self.stop(p.reason or "dispatch.mode = off")
        else:
            self.apply(p)

    def apply(self, p: DispatchPolicy) -> None:
        """SBS with ``p``'s knobs; the dispatcher is rebuilt only when its targets or chunk change."""
        params = SbsParams(mode="sbs", t_default_s=p.t_fwd_s, l_net_s=p.l_net_s, watchdog_factor=p.watchdog_factor,
                           fixed_interval_s=p.fixed_interval_s, chunk_tokens=p.chunk_tokens, n_limit=p.n_limit,
                           iqr_k=p.iqr_k, poll_s=p.poll_s)
        live = [r for r in self.ranks if r not in p.drain_ranks]
        if not live:
            self.stop(f"every active rank is drained (dispatch.drain_ranks {list(p.drain_ranks)})")
            return
        layout = self.setup.layout
        instances = [[r] for r in live] if layout == "plain" else [live]
        chunk = p.chunk_tokens or self.setup.server_chunk
        old = self.core
        if old is None or old.instances != instances or old.chunk != chunk:
            new = Dispatcher(instances, chunk, params, decode=layout == "decode", evict_overloaded=True)
            if old is not None:  # carry the buffer and what is in flight over
                for j in old.pending:
                    new.arrive(j.id, j.tokens, j.waited)
                for j in old.new:
                    new.arrive(j.id, j.tokens)
                new.in_flight, new.reqs_in_flight = old.in_flight, old.reqs_in_flight
            for load in self.loads.values():
                new.observe(load)
            self.core, self.released_at = new, {}
        else:
            old.params = params
            clock = old.clock
            clock.l_net_s, clock.watchdog_factor, clock.fixed_interval_s = p.l_net_s, p.watchdog_factor, \
                p.fixed_interval_s
        self.core.clock.set_forward_time(p.t_fwd_s)
        self.holding, self.reason = True, ""

    def stop(self, why: str) -> None:
        """Stock from now on: flush the buffer through sglang's own dispatch."""
        self.holding, self.reason = False, why
        if self.reqs:
            self.flush(f"stock: {why}")

    def read(self, now: float) -> None:
        """Every rank's latest snapshot: R_queued, B and K, acknowledgements, readiness (module docstring)."""
        core = self.core
        l_net = core.clock.l_net_s
        for snap in self.setup.reader.read_all():
            r, ts = snap.dp_rank, snap.timestamp
            prev = self.seen.get(r, 0.0)
            if ts <= prev:
                continue
            self.seen[r] = ts
            load = self.loads[r] = RankLoad(r, ts, snap.num_running_reqs, snap.num_waiting_reqs,
                                            snap.num_waiting_uncached_tokens, snap.num_used_tokens,
                                            snap.num_total_tokens)
            core.observe(load)
            if prev > 0.0:
                core.ack(r, prev - l_net)
        horizon = now - core.clock.watchdog_factor * core.clock.t_fwd
        for t, ranks in enumerate(core.instances):
            for r in ranks:
                core.ack(r, horizon)
            since = self.released_at.get(t, 0.0)
            if all(self.seen.get(r, 0.0) > since for r in ranks):
                quiet = all(self.loads[r].quiescent and not core.in_flight.tokens(r) for r in ranks)
                core.ready(t, quiescent=quiet)

    def release(self, now: float) -> None:
        """The releases due now (at most one per target); overloaded requests go through sglang's dispatch."""
        if self.fault is not None:
            self.fault.hit("release")
        core = self.core
        for _ in range(len(core.instances)):
            rel = core.release(now)
            if rel.target is not None:
                self.released_at[rel.target] = now
                self.releases += 1
                for jid, rank in rel.sends:
                    self.send(jid, rank, now)
            for jid in rel.overloaded:
                self.overloaded += 1
                self.send_stock(jid, "overload")
            if rel.target is None:
                break

    # --- sends --------------------------------------------------------------------------------------------
    def send(self, jid: int, rank: int, now: float) -> None:
        """Release one request to ``rank`` through sglang's own dispatch (it honours ``routed_dp_rank``)."""
        req, arrived = self.reqs.pop(jid)
        req.routed_dp_rank = rank
        try:
            self.setup.ctl.dispatching_with_trace(req)
        except BaseException:
            req.routed_dp_rank = None  # not sent: back in the buffer, for the fail-open flush
            self.reqs[jid] = (req, arrived)
            raise
        self.released += 1
        tokens = len(req.input_ids)
        self.sent_reqs[rank] = self.sent_reqs.get(rank, 0) + 1
        self.sent_tokens[rank] = self.sent_tokens.get(rank, 0) + tokens
        self.window_tokens[rank] = self.window_tokens.get(rank, 0) + tokens
        self.holds.append(now - arrived)
        if self.trace is not None:
            self.trace_event("sbs", req.rid, rank)

    def send_stock(self, jid: int, how: str) -> None:
        """One buffered request through sglang's own dispatch (its --load-balance-method), at once."""
        req, _ = self.reqs.pop(jid)
        self.bypass = True
        try:
            self.setup.ctl.dispatching_with_trace(req)
        finally:
            self.bypass = False
        if self.trace is not None:
            self.trace_event(how, req.rid)

    def flush(self, why: str) -> None:
        """Every buffered request through sglang's own dispatch, in arrival order."""
        jids = sorted(self.reqs)
        if self.core is not None:
            self.core.take(jids)
        for jid in jids:
            self.flushed += 1
            self.send_stock(jid, "flush")
        log.debug("ebctl: dispatcher flushed %d requests (%s)", len(jids), why)

    def control(self, ctl: Any, obj: Any, _answer: Any = None) -> None:
        """Before sglang passes a control message to the ranks: an abort first releases the requests it names
        (``rid`` prefix, or all: Scheduler.abort_request, scheduler.py:5675-5689), so the rank answers it; any
        other message that can change state first flushes the buffer (it must not overtake them)."""
        if self.fault is not None:
            self.fault.hit("control")
        if not self.reqs:
            return
        name = type(obj).__name__
        if name == "AbortReq":
            rid = obj.rid or ""
            hit = sorted(jid for jid, (r, _) in self.reqs.items() if obj.abort_all or str(r.rid).startswith(rid))
            if self.core is not None:
                self.core.take(hit)
            for jid in hit:
                self.aborted += 1
                self.send_stock(jid, "abort")
        elif name not in READ_ONLY:
            self.flush(f"before {name}")
