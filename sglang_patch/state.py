"""The plugin's state in one SGLang scheduler process: the link, the gate, what is applied, counters.

``hooks.py`` runs each hook's ebctl part, one method of :class:`PluginState` (the request path and the status:
a few lines around one), under the fail-open guard (``guard.py``); every method here may raise, and the guard
then calls ``fail``. What ``start`` learned about the scheduler is one record, ``setup`` (``lifecycle.Setup``);
start, the fail-open path's steps and the status are functions in ``lifecycle.py``. Nothing here blocks, logs
or allocates per iteration beyond the report row (docs/design.md §4).

Where the policy comes from: a rank alone in its scheduling group reads the newest policy from its link
after planning each step (``end_step``); in a group of several ranks (TP/CP/PP) the source rank reads it
and every rank applies it from the envelope the source adds to sglang's request broadcast
(``group.py``), at the same iteration. The link hands on only policies this engine can run: one above its
``max_running_requests``, with k above n_max, or living longer than a day is refused there and counted
(``ebctl.link.policy_fault``; ``status()["link"]["rejected"]``), and what runs stays as it was.

What is applied (docs/design.md §2, tools/sglang_cpu/HOOKS.md sections 2-6):
- no policy, an expired one, ``off``, or a disabled plugin: ``is_mixed_chunk`` at its launch value, no
  cap, no deferral of ours: sglang as launched (``off`` with a ``pd_interval``: see the last item);
- ``eb``: ``is_mixed_chunk`` False; ``PhaseGate`` decides in ``_should_defer_prefill`` whether a prefill
  may form (never deferred while nothing runs); a chunked prefill in flight goes on alone while the gate
  holds (``get_num_allocatable_reqs`` answers 0 for that step, so no waiting request joins it);
- ``mb``: ``is_mixed_chunk`` True where sglang can mix (launched with ``--enable-mixed-chunk``, or the
  ``engine.mixed_without_flag`` opt-in where nothing rules mixing out: ``reading.mixed_unavailable_reason``);
  otherwise ``eb``, with ``mixed_unavailable`` and its reason reported;
- both: running requests capped at ``n_max`` in ``get_num_allocatable_reqs`` (the stock budget already
  stops at the server's ``max_running_requests``). The gate's ``admit_max`` is ``n_max − running`` in
  every decision that allows a prefill, so capping occupancy at ``n_max`` is the same cap;
- any mode, ``off`` included: a policy's ``pd_interval`` N > 0 sets sglang's ``prefill_decode_interval`` (its
  ``--prefill-decode-interval``: after a batch that prefilled, N decode-only steps), 0 its launch value.

A fault (``fail``): a rank alone, or a group's source, switches off for good (``stop``: stock settings back,
link closed); the source's last envelope takes every rank of its group to stock at that same iteration. A
follower tells its source instead (``group_fault.py``), keeps applying the group's policy, and switches off
when the source's stock envelope arrives: the whole group at one iteration (its generation).
"""

from __future__ import annotations

import logging
import math
from array import array
from itertools import compress
from operator import attrgetter
from time import monotonic
from time import time as wall_clock
from typing import Any

import msgspec

from ebctl.gate import PhaseGate
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode, Policy
from sglang_patch import group, group_fault, lifecycle, reading
from sglang_patch.fault import Fault
from sglang_patch.reading import batch_shape

log = logging.getLogger("ebctl.sglang")

_RING = 4  # steps between planning a batch and processing its result (overlap: 1) fit easily
_TIMES = lifecycle.TIMES
_NAN = math.nan
_FINISHED_OUTPUT = attrgetter("finished_output")  # True once sglang streamed the request's completion
COUNTS_EVERY = 16  # reports between two that carry the gate's (cumulative) decision counts
_NO_COUNTS: dict = {}  # never mutated
_MARK = "_ebctl_reported"  # set on a Req once its completion was reported: exactly once, whatever path
# The link is asked for the newest policy at most this often (s): policies change on a scale of seconds
# (republish_s, ttl_s), so a new one, or an expiry, takes effect at most 20 ms late; on short iterations
# (a few ms: CPU, small decode batches) this skips the check on most of them.
POLICY_POLL_S = 0.02
# An idle server reports this often (s), so that the daemon tells an idle engine from a dead one
# (daemon.engine_gone_s); on sglang's idle loop (scheduler.py 2050-2053) this costs a clock read per pass.
HEARTBEAT_S = 2.0


class Planned:
    """One planned step, from planning to its result: what the report says of the step when it was planned
    (occupancy, waiting, KV used), the forward's time and ``seq_lens_sum`` (CPU: right after it ran), and the
    policy version it ran under. The ring reuses ``_RING`` of these, filled in place."""

    __slots__ = ("forward_iter", "forward_s", "kv_used", "running", "seq_lens_sum", "version", "waiting")

    def __init__(self) -> None:
        self.forward_iter, self.running, self.waiting, self.kv_used = -1, 0, 0, 0
        self.forward_s: float = math.nan
        self.seq_lens_sum: int | None = None
        self.version = -1


class PluginState:
    """Per scheduler process. ``on`` False: disabled for good here (stock sglang from then on).

    Every method a hook runs takes ``(sched, arg, answer)`` (``guard.guarded``): ``answer`` is what sglang
    answered where the hook decides something, returned unchanged when the method raises."""

    def __init__(self) -> None:
        self.on = True
        self.ready = False  # begin() ran (first get_next_batch_to_run)
        self.error = ""  # why the plugin is off here, or the fault a follower told its source of
        self.setup = lifecycle.Setup()  # what begin() learned about the scheduler
        self.link: Any = None
        self.trace: Any = None  # engine.trace_dir: a line-buffered file of this rank's gate decisions
        self.fault: Fault | None = None  # engine.fault armed here (a test switch)
        self.inbox: group_fault.Inbox | None = None  # a group's source: where followers' faults come in
        self.notices: Any = ()  # ... and what came in (inbox.notices; empty on every other rank)
        self.outbox: group_fault.Outbox | None = None  # a follower that told its source of its fault
        self.gate = PhaseGate()
        self.policy: Policy | None = None  # the policy applied (compared by identity)
        self.gate_policy: Policy | None = None  # policy handed to the gate (eb/mb); None: stock
        self.cap: int | None = None  # running requests at most this many; None: stock
        self.hold_new = False  # this step: a chunk goes on alone, admit nobody (get_num_allocatable_reqs: 0)
        self.held = False  # a chunk went on alone since the gate last admitted (batch_is_full may be ours)
        self.version = -1  # policy version applied (reported)
        self.seq = 0
        self.busy = False  # the last planned step ran a batch
        self.next_poll = 0.0  # monotonic time of the next policy poll
        self.next_beat = 0.0  # monotonic time of the next idle report (HEARTBEAT_S)
        self.t_result = 0.0  # monotonic time the last result was ready (GPU timing)
        self._t_prev = 0.0  # ... and the one before
        # group: the source's generation of the policy it applied last (bumped on change), what it sent;
        # every rank: the generation applied and the source's clock from the last envelope
        self.gen = 0
        self.sent_gen = -1
        self.applied_gen = -1
        self.group_now = 0.0
        self.farewell = False  # the source switched off: one last "stock" envelope to send
        # per planned step, slot forward_iter % _RING: one object the hooks touch, not seven (their cost is
        # mostly cache misses)
        self.ring = [Planned() for _ in range(_RING)]
        self.pending: list[FinishedRequest] = []  # completions not yet sent (ended outside a reported step)
        self.iterations = self.reports = self.defers = self.capped = self.mixed_steps = self.finished = 0
        self.chunk_alone = 0  # steps where a chunked prefill went on alone while the gate held
        self.ns = 0  # hook work in the current iteration
        self.times = array("q", bytes(8 * _TIMES))
        self.n_times = 0

    def begin(self, sched: Any) -> None:
        """First iteration of this scheduler (``lifecycle.start``): what it learned, what it opened."""
        self.ready = True
        self.setup, self.link, self.inbox, self.trace, self.fault = lifecycle.start(sched)
        if self.inbox is not None:
            self.notices = self.inbox.notices

    # --- the fail-open path ---------------------------------------------------------------------------
    def fail(self, where: str, running_batch: Any = None, sched: Any = None) -> None:
        """From the guard's ``except`` block (an exception in hook ``where``). ``running_batch``: the batch
        being planned when the failure is inside planning (not yet ``sched.running_batch``): admission is
        reopened on it and on the scheduler's. ``sched``: the scheduler, when the hook has it.

        Alone or on a group's source: logged once with the traceback, off for good (``stop``). A follower
        tells its source (``group_fault.py``) and keeps applying the group's policy until the source's stock
        envelope (``receive``); its later faults change nothing. A follower that cannot tell goes stock alone."""
        if not self.on or self.outbox is not None:
            return
        why = f"exception in hook {where}"
        s = self.setup
        if s.channel and not s.reporting:
            log.exception("ebctl: exception in hook %s on follower rank %d of engine %s; its group's source is told, "
                          "and the whole group goes stock together (this rank keeps applying the group's policy "
                          "until then)", where, s.rank, s.engine_id)
            self.error = why
            try:
                self.outbox = group_fault.Outbox(s.channel, group_fault.Notice(s.rank, why, self.applied_gen))
            except Exception:
                log.exception("ebctl: could not tell the group's source: this rank goes stock alone")
            else:
                lifecycle.note(self.trace, it=self.iterations, fault=why, gen=self.applied_gen)
                return
        else:
            log.exception("ebctl: exception in hook %s; the ebctl plugin is now OFF in this scheduler process "
                          "(stock sglang from here on, the server keeps serving)", where)
        self.stop(why, running_batch, sched)

    def stop(self, why: str, running_batch: Any = None, sched: Any = None) -> None:
        """Off for good here: stock settings back (no policy: version -1), what start opened closed; a group's
        source owes its followers one last, stock envelope (``farewell``), whose generation the trace's last line
        gives."""
        self.on = False
        self.error = why
        self.farewell = self.setup.leads
        self.policy, self.version = None, -1
        self.unapply(running_batch, sched)
        lifecycle.close(self.link, self.inbox, self.outbox)
        lifecycle.note(self.trace, it=self.iterations, off=why, gen=self.gen + 1 if self.farewell else self.applied_gen)

    def unapply(self, running_batch: Any = None, sched: Any = None, pd_interval: int = 0) -> None:
        """Back to sglang as launched: launch mixing, no cap, no gate; admission reopened if we closed it. Its
        prefill-decode interval too, unless a policy of mode off sets one (``pd_interval`` > 0: pdi@N)."""
        reopen = self.cap is not None or self.hold_new or self.held
        self.cap, self.gate_policy, self.hold_new, self.held = None, None, False, False
        lifecycle.restore(sched or self.setup.sched, running_batch, self.setup.launch_mixed, reopen,
                          self.setup.launch_pd_interval, pd_interval)

    # --- where the policy comes from ------------------------------------------------------------------
    def refresh(self, sched: Any, now: float, running_batch: Any = None) -> None:
        """Alone in the group: read the newest policy (None once expired) and apply it if it changed."""
        if self.link is not None:
            p = self.link.policy(now)
            if p is not self.policy:
                self.apply(sched, p, sched.running_batch if running_batch is None else running_batch)

    def envelope(self, now: float) -> group.Envelope | None:
        """The group's source, before sglang broadcasts this iteration's requests: what every rank must apply
        (``group.py``). Reads the link at most every POLICY_POLL_S; the payload only on a change. A follower's
        fault notice switches this rank off instead (None: the hook sends the farewell in its place)."""
        if self.notices:
            n = self.notices[0]
            log.error("ebctl: follower rank %d of engine %s reported: %s; the ebctl plugin is now OFF in the whole "
                      "group (stock sglang on every rank from this iteration on)", n.rank, self.setup.engine_id,
                      n.where)
            self.stop(f"follower rank {n.rank}: {n.where}")
            return None
        if self.link is not None and now >= self.next_poll:
            self.next_poll = now + POLICY_POLL_S
            p = self.link.policy(now)
            if p is not self.policy or self.sent_gen < 0:
                self.policy = p
                self.gen += 1
        if self.gen != self.sent_gen:
            self.sent_gen = self.gen
            return group.envelope(self.gen, now, group.payload_of(self.policy))
        return group.envelope(self.gen, now, None)

    def farewell_envelope(self, now: float) -> group.Envelope:
        """The last envelope of a source that switched off: stock, one generation on, for every rank at once."""
        self.farewell = False
        self.gen += 1
        self.applied_gen = self.gen
        return group.envelope(self.gen, now, group.STOCK)

    def receive(self, sched: Any, env: group.Envelope) -> None:
        """Every rank of a group (the source too), before the iteration is planned: the source's clock,
        and its policy when it changed. A follower that told its source of a fault switches off at its
        stock envelope, with the rest of the group."""
        _, gen, now, payload = env
        self.group_now = now
        if payload is not None and gen != self.applied_gen:
            self.applied_gen = gen
            if self.outbox is not None and not payload:
                self.stop(self.error, None, sched)
            else:
                self.apply(sched, group.policy_of(payload), sched.running_batch, keep=self.setup.reporting)

    def apply(self, sched: Any, p: Policy | None, running_batch: Any, *, keep: bool = False) -> None:
        """A new policy (or none): set what it asks for; only here do the settings change.
        ``running_batch``: the batch the next step starts from (the plan's, inside get_next_batch_to_run:
        the event loop stores it in ``sched.running_batch`` only after the hook returns). ``keep``: the
        group's source keeps ``self.policy`` as read from the link (identity), applying its decoded copy."""
        if not keep:
            self.policy = p
        old_cap = self.cap
        if p is None or p.mode is Mode.OFF:
            self.unapply(running_batch, sched, 0 if p is None else p.pd_interval)
        else:
            mb_fallback = p.mode is Mode.MB and self.setup.mixed_unavailable
            self.gate_policy = msgspec.structs.replace(p, mode=Mode.EB) if mb_fallback else p
            self.cap = p.n_max
            # The gate's ``mixed`` is a function of the mode alone (mb: True, eb: False), and nothing in
            # sglang 0.5.23 writes is_mixed_chunk after __init__: set once here, not on every step.
            sched.is_mixed_chunk = self.gate_policy.mode is Mode.MB
            if old_cap is not None and self.cap > old_cap:
                running_batch.batch_is_full = False  # sticky flag: a raised cap must reopen admission
            # eb and mb too: sglang's own deferral comes before the gate (``defer``); 0: the launch value
            lifecycle.set_pd_interval(sched, self.setup.launch_pd_interval, p.pd_interval)
        self.version = -1 if p is None else p.version

    # --- get_next_batch_to_run ----------------------------------------------------------------------
    def end_step(self, sched: Any, plan: Any, _: Any = None) -> None:
        """After sglang planned a step: keep what the report of its batch will need, then (alone in the
        group) read the policy.

        A new policy (or an expiry) is applied here, after the step was planned, so it governs the steps
        planned from the next one on: one hook call per iteration instead of two, for at most one step's
        delay on a policy that changes on a scale of seconds."""
        if self.busy:  # a new iteration: close the last one's hook time (status: hook_ns)
            self.times[self.n_times % _TIMES] = self.ns
            self.n_times += 1
        self.ns = 0
        self.hold_new = False
        if not self.ready:
            self.begin(sched)
        if self.fault is not None:
            self.fault.hit("next_batch")
        if self.trace is not None:
            self.trace_plan(plan)
        self.iterations += 1
        if self.link is not None:
            batch = plan.batch_to_run
            if batch is None:
                if self.busy or self.pending:
                    self._report_idle(sched, plan)
                    self.next_beat = monotonic() + HEARTBEAT_S
                elif (now := monotonic()) >= self.next_beat:  # idle: a beat says this server is alive
                    self.next_beat = now + HEARTBEAT_S
                    self._report_idle(sched, plan)
                self.busy = False
            else:
                self.busy = True
                key = sched.forward_ct + 1  # run_batch numbers the batch forward_ct + 1 (forward_iter)
                # KV is read here, right after sglang planned the step (and checked its KV itself, so those
                # objects are in cache): the KV the step holds, its new tokens included.
                e = self.ring[key % _RING]  # filled in place: no allocation (and no GC pressure) per step
                e.forward_iter = key
                running = plan.running_batch
                # occupancy: the running batch, plus the batch to run when it is a separate one (a prefill's
                # new requests; a MIXED step, whose running batch was handed over whole and is empty)
                e.running = len(running.reqs) if batch is running else len(running.reqs) + len(batch.reqs)
                e.waiting = len(sched.waiting_queue)
                s = self.setup  # lifecycle.kv_used(s), inline: one call less per step
                u = s.kv_total - s.kv_free() - s.kv_evictable()
                e.kv_used = u if u > 0 else 0
                e.forward_s = _NAN
                e.seq_lens_sum = None
                e.version = self.version
        if self.setup.group == 1:
            now = monotonic()
            if now >= self.next_poll:
                self.next_poll = now + POLICY_POLL_S
                self.refresh(sched, now, plan.running_batch)

    # --- _should_defer_prefill, get_num_allocatable_reqs --------------------------------------------
    def defer(self, sched: Any, running_batch: Any, stock: bool) -> bool:
        """The gate's answer for this step: True keeps a prefill from forming. Stock's own deferral
        (``--prefill-decode-interval``) and no policy: ``stock``, traced. While the gate holds and a chunked
        prefill is in flight, the chunk goes on alone (``hold_new``)."""
        if stock or self.gate_policy is None:
            if self.trace is not None:
                self.trace_decision("stock", len(running_batch.reqs), len(sched.waiting_queue))
            return stock
        if self.fault is not None:
            self.fault.hit("defer_prefill")
        waiting = len(sched.waiting_queue)
        if not waiting:  # sglang 0.5.23 asks on every step; with nothing to admit, "go" changes nothing
            self.gate.rest()
            if self.trace is not None:
                self.trace_decision("queue_empty", len(running_batch.reqs), 0, sched.chunked_req is not None)
            return False
        p = self.gate_policy
        s = self.setup
        running = len(running_batch.reqs)
        kv_free = 1.0
        if p.kv_reserve_frac > 0.0 and s.kv_total:  # no reserve: the gate's KV test always passes
            kv_free = 1.0 - lifecycle.kv_used(s) / s.kv_total
        d = self.gate.decide(p, running=running, waiting=waiting, kv_free_frac=kv_free,
                             now=monotonic() if s.group == 1 else self.group_now,
                             chunk_in_flight=sched.chunked_req is not None)
        if self.trace is not None:
            self.trace_decision(d.reason, running, waiting, sched.chunked_req is not None)
        if not d.allow_prefill:
            self.defers += 1
            return True
        if d.admit_max == 0:  # Reason.CHUNK_IN_FLIGHT: the chunk continues, nobody joins it
            self.hold_new = self.held = True
            self.chunk_alone += 1
        elif self.held:  # admitting again: a batch_is_full set while the chunk went on alone must not stick
            self.held = False
            running_batch.batch_is_full = False
        return False

    def trace_decision(self, reason: str, running: int, waiting: int, chunk: bool = False) -> None:
        """engine.trace_dir: one JSON line per gate decision (or stock step), to compare ranks."""
        self.trace.write(f'{{"it":{self.iterations},"v":{self.version},"gen":{self.applied_gen},'
                         f'"running":{running},"waiting":{waiting},"chunk":{"true" if chunk else "false"},'
                         f'"reason":"{reason}"}}\n')

    def trace_plan(self, plan: Any) -> None:
        """engine.trace_dir: the step just planned (its batch kind and requests), under the same ``it`` as the
        gate decision taken while planning it."""
        b = plan.batch_to_run
        kind = "none" if b is None else str(self.setup.kinds.get(b.forward_mode, "other"))
        self.trace.write(f'{{"it":{self.iterations},"planned":"{kind}","reqs":{0 if b is None else len(b.reqs)},'
                         f'"running":{len(plan.running_batch.reqs)}}}\n')

    def allocatable(self, sched: Any, running_bs: int, n: int) -> int:
        """sglang's admission budget ``n`` for ``running_bs`` running, capped at n_max running; 0 while a
        chunk goes on alone (the chunked request itself needs no budget: scheduler.py:4121-4129, 4181)."""
        if self.fault is not None:
            self.fault.hit("allocatable")
        if self.hold_new:
            return 0
        room = self.cap - running_bs
        if n <= room:
            return n
        self.capped += 1
        return room

    # --- run_batch, process_batch_result, send_abort_output ----------------------------------------
    def ran(self, sched: Any, batch: Any, seconds: float) -> None:
        """run_batch returned: keep the batch's context sum (``seq_lens_sum``, which ``ForwardBatch.init_new``
        has just computed; the overlap loop's ``batch.copy()`` for result processing drops it) and, on CPU
        where run_batch returns after the forward, its duration: the scheduler thread's CPU time over the
        forward (torch computes on this thread), equal to the wall time on a dedicated machine; on a shared one
        the wall time also holds whatever other process (the HTTP server, the tokenizer, a load client) took the
        core meanwhile, which is not the engine's cost and made the cost fits fail (a decode fit's held-out
        error 21-22% on wall time against 12% on CPU time, same run). The whole iteration's wall time is in
        the reports anyway (``wall_time``): the simulator's calibration uses that."""
        if self.fault is not None:
            self.fault.hit("run_batch")
        key = batch.forward_iter
        e = self.ring[key % _RING]
        if e.forward_iter == key:
            e.forward_s = seconds
            e.seq_lens_sum = batch.seq_lens_sum

    def before_result(self, sched: Any, result: Any, _: Any = None) -> None:
        """GPU: wait for the batch's results (the original does it first too) and note when they were ready."""
        if self.link is not None:
            done = getattr(result, "copy_done", None)
            if done is not None:
                done.synchronize()
            self.t_result, self._t_prev = monotonic(), self.t_result

    def after_result(self, sched: Any, batch: Any, _: Any = None) -> None:
        """The batch's results were processed: report it with the requests that finished in it.

        The report is the wire record itself (``protocol.IterationReport``), filled here by name; the link's I/O
        thread only encodes it. Every read here is an attribute, a ``len`` or a bound method looked up once at
        start: this is the largest part of the per-iteration hook time (docs/design.md §4)."""
        if self.fault is not None:
            self.fault.hit("batch_result")
        if self.link is None:
            return
        s = self.setup
        finished: tuple[FinishedRequest, ...] = ()
        reqs = batch.reqs
        for req in compress(reqs, map(_FINISHED_OUTPUT, reqs)):  # the scan runs in C: ~15 ns a request
            if _MARK not in req.__dict__:  # once: the overlap loop shows a finished request in one more batch
                req.__dict__[_MARK] = True
                f = reading.finished_request(req)
                if f is not None:
                    finished = (*finished, f)
        kind = s.kinds.get(batch.forward_mode)
        if kind is None:  # no forward of its own (PREBUILT, ...): its completions go with the next report
            self.pending.extend(finished)
            return
        key = batch.forward_iter
        e = self.ring[key % _RING]
        if e.forward_iter == key:
            running, waiting, kv_used, run_s, ctx, version = (e.running, e.waiting, e.kv_used, e.forward_s,
                                                               e.seq_lens_sum, e.version)
        else:  # not planned through our hook (cannot happen in 0.5.23's loops): read what is there now
            running, waiting, kv_used = len(sched.running_batch.reqs), len(sched.waiting_queue), lifecycle.kv_used(s)
            run_s, ctx, version = math.nan, None, self.version
        if s.sync_forward:
            forward_s = run_s if run_s == run_s else max(monotonic() - (batch.launch_ts or 0.0), 0.0)
        else:
            forward_s = max(self.t_result - max(batch.launch_ts or 0.0, self._t_prev), 0.0)
        if self.pending:
            finished, self.pending = (*self.pending, *finished), []
        if kind is BatchKind.DECODE and ctx is not None:  # most steps: batch_shape's answer, without the call
            p_reqs, p_tokens, d_reqs, d_ctx, p_ctx = 0, 0, len(reqs), ctx, 0
        else:
            p_reqs, p_tokens, d_reqs, d_ctx, p_ctx = batch_shape(batch, kind, ctx)
            if kind is BatchKind.MIXED:
                self.mixed_steps += 1
        seq = self.seq  # what _send does, inline on this per-step path (a call costs ~0.5 µs cold)
        self.seq = seq + 1
        self.reports += 1
        if finished:
            self.finished += len(finished)
        self.link.report(IterationReport(
            engine_id=s.engine_id, instance=self.link.instance, seq=seq, wall_time=wall_clock(), forward_s=forward_s,
            kind=kind, prefill_reqs=p_reqs, prefill_tokens=p_tokens, decode_reqs=d_reqs, decode_ctx_tokens=d_ctx,
            prefill_ctx_tokens=p_ctx, running=running, waiting=waiting, kv_used=kv_used, kv_total=s.kv_total,
            max_running=s.max_running,
            policy_version=version, mixed_unavailable=s.mixed_unavailable, mixed_unavailable_reason=s.mixed_reason,
            group_size=s.group, gate_reasons=self._counts(seq) if seq % COUNTS_EVERY == 0 else _NO_COUNTS,
            pd_interval_available=s.pd_interval_available, finished=finished))

    def aborted(self, sched: Any, req: Any, _: Any = None) -> None:
        """A request ended outside the output stream (aborted while queued, rejected, retract failure)."""
        if self.fault is not None:
            self.fault.hit("abort_output")
        if self.link is not None and _MARK not in req.__dict__:
            req.__dict__[_MARK] = True
            f = reading.finished_request(req)
            if f is not None:
                self.pending.append(f)

    def _report_idle(self, sched: Any, plan: Any) -> None:
        finished, self.pending = tuple(self.pending), []
        s = self.setup
        self._send(IterationReport(
            engine_id=s.engine_id, instance=self.link.instance, seq=self.seq, wall_time=wall_clock(), forward_s=0.0,
            kind=BatchKind.IDLE, prefill_reqs=0, prefill_tokens=0, decode_reqs=0, decode_ctx_tokens=0,
            running=len(plan.running_batch.reqs), waiting=len(sched.waiting_queue), kv_used=lifecycle.kv_used(s),
            kv_total=s.kv_total, max_running=s.max_running, policy_version=self.version,
            mixed_unavailable=s.mixed_unavailable, mixed_unavailable_reason=s.mixed_reason, group_size=s.group,
            gate_reasons=self._counts(0), pd_interval_available=s.pd_interval_available, finished=finished))

    def _counts(self, seq: int) -> dict:
        """The gate's decision counts for report ``seq``: cumulative, so every COUNTS_EVERY-th report carries
        them (the daemon keeps the last it got) and the others an empty dict (a copy and its encoding per
        report cost a few µs of the per-iteration budget; ``after_result`` tests ``seq`` itself, sparing the
        call); an idle report (``seq`` 0 here) always does, so the daemon has the final counts once a load
        ends."""
        if seq % COUNTS_EVERY:
            return _NO_COUNTS
        return {str(r): n for r, n in self.gate.counts.items() if n}

    def _send(self, report: IterationReport) -> None:
        """Hand a report to the link; never blocks: a full queue drops it, counted in link.stats()."""
        self.seq += 1
        self.reports += 1
        if report.finished:
            self.finished += len(report.finished)
        self.link.report(report)
