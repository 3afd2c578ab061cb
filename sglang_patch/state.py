"""The plugin's state in one SGLang scheduler process: the link, the gate, what is applied, counters.

``hooks.py`` calls one method of :class:`PluginState` per hook and nothing else; every method here may
raise, and the hook then calls :meth:`PluginState.fail` (log once, restore stock settings, stay off).
Nothing here blocks, logs or allocates per iteration beyond the report struct (DESIGN.md budgets).

What is applied (DESIGN.md "Per-iteration contract", HOOKS.md sections 2-6):
- no policy, an expired one, ``off``, or a disabled plugin: ``is_mixed_chunk`` at its launch value, no
  cap, no deferral: sglang as launched;
- ``eb``: ``is_mixed_chunk`` False; ``PhaseGate`` decides in ``_should_defer_prefill`` whether a prefill
  may form (never deferred while nothing runs or a chunked prefill is in flight);
- ``mb``: ``is_mixed_chunk`` True, or, when the server has no chunked prefill (it cannot mix), ``eb`` with
  ``mixed_unavailable`` reported;
- both: running requests capped at ``n_max`` in ``get_num_allocatable_reqs`` (the stock budget already
  stops at the server's ``max_running_requests``). The gate's ``admit_max`` is ``n_max − running`` in
  every decision that allows a prefill, so capping occupancy at ``n_max`` is the same cap.
"""

from __future__ import annotations

import logging
import math
import os
from array import array
from itertools import compress
from operator import attrgetter
from time import monotonic
from time import time as wall_clock
from typing import Any

import msgspec

from ebctl.gate import PhaseGate
from ebctl.protocol import BatchKind, FinishedRequest, Mode, Policy
from sglang_patch import reading
from sglang_patch.reading import batch_shape

log = logging.getLogger("ebctl.sglang")

_RING = 4  # steps between planning a batch and processing its result (overlap: 1) fit easily
_FINISHED_OUTPUT = attrgetter("finished_output")  # True once sglang streamed the request's completion
_MARK = "_ebctl_reported"  # set on a Req once its completion was reported: exactly once, whatever path
_TIMES = 4096  # per-iteration hook costs kept for status (ns)
# The link is asked for the newest policy at most this often (s): policies change on a scale of seconds
# (republish_s, ttl_s), so a new one, or an expiry, takes effect at most 20 ms late; on short iterations
# (a few ms: CPU, small decode batches) this skips the check on most of them.
POLICY_POLL_S = 0.02


class PluginState:
    """Per scheduler process. ``on`` False: disabled for good here (stock sglang from then on)."""

    def __init__(self) -> None:
        self.on = True
        self.ready = False  # start() ran (first get_next_batch_to_run)
        self.error = ""  # why the plugin is off, if it is
        self.engine_id = ""
        self.link: Any = None
        self.control = False  # may change scheduling: the sole member of its scheduling group
        self.reporting = False  # sends reports: attention-TP rank 0
        self.gate = PhaseGate()
        self.policy: Policy | None = None  # what link.policy() returned last (compared by identity)
        self.gate_policy: Policy | None = None  # policy handed to the gate (eb/mb); None: stock
        self.cap: int | None = None  # running requests at most this many; None: stock
        self.version = -1  # policy version applied (reported)
        self.launch_mixed: bool | None = None  # the server's is_mixed_chunk at launch
        self.mixed_unavailable = False
        self.max_running = 0
        self.kv_total = 0  # the server's KV capacity in tokens (max_total_num_tokens)
        self._kv_used: Any = None  # () -> KV tokens in use now (reading.kv_used_reader)
        self.sync_forward = False  # run_batch returns after the forward (CPU): time it there
        self.kinds: dict[Any, BatchKind] = {}
        self.seq = 0
        self.busy = False  # the last planned step ran a batch
        self.next_poll = 0.0  # monotonic time of the next policy poll
        self.t_result = 0.0  # monotonic time the last result was ready (GPU timing)
        self._t_prev = 0.0  # ... and the one before
        # Per planned step, slot forward_iter % _RING: [forward_iter, running, waiting, KV used (all three
        # when the step was planned), forward seconds (CPU), seq_lens_sum right after the forward, policy
        # version it was planned under]. One list per step: the hooks touch one object, not seven (their
        # cost is mostly cache misses).
        self.ring: list[list] = [[-1, 0, 0, 0, math.nan, None, -1] for _ in range(_RING)]
        self.pending: list[FinishedRequest] = []  # completions not yet sent (ended outside a reported step)
        self.iterations = self.reports = self.defers = self.capped = self.mixed_steps = self.finished = 0
        self.ns = 0  # hook work in the current iteration
        self.times = array("q", bytes(8 * _TIMES))
        self.n_times = 0
        self.fault_hook = ""
        self.fault_at = 0
        self.fault_calls = 0

    # --- start and stop ---------------------------------------------------------------------------
    def start(self, sched: Any) -> None:
        """First iteration of this scheduler: read the config, open the link (no sglang setting changes)."""
        from ebctl import config
        from ebctl.link import EngineLink

        self.ready = True
        cfg = config.load(os.environ.get("EBCTL_CONFIG") or None)
        self._parse_fault(cfg.engine.fault)
        dp, attn_tp_rank, group = reading.ranks()
        node = cfg.daemon.node
        self.engine_id = f"{node}/dp{dp}" if node else f"dp{dp}"
        self.reporting = attn_tp_rank == 0
        self.control = group == 1
        self.launch_mixed = bool(sched.is_mixed_chunk)
        self.mixed_unavailable = sched.chunked_prefill_size is None
        self.max_running = int(sched.max_running_requests)
        self.kv_total = int(sched.max_total_num_tokens)
        self._kv_used = reading.kv_used_reader(sched)
        self.sync_forward = str(sched.device) == "cpu"
        self.kinds = reading.batch_kinds()
        if self.reporting:
            self.link = EngineLink.from_config(cfg, self.engine_id)
        if not self.control:
            log.warning("ebctl: %d scheduler ranks share each scheduling decision here (attention TP/CP or "
                        "PP > 1); the plugin only reports, it does not steer this engine", group)
        log.info("ebctl: plugin active in this scheduler: engine %s, telemetry %s, policy %s", self.engine_id,
                 cfg.endpoint("telemetry"), cfg.endpoint("policy"))

    def fail(self, where: str, sched: Any, running_batch: Any = None) -> None:
        """Called in an ``except`` block: log once with the traceback, restore stock settings, stay off.
        ``running_batch``: the plan's running batch when the failure is inside get_next_batch_to_run (not
        yet ``sched.running_batch``): admission is reopened on both."""
        if not self.on:
            return
        self.on = False
        self.error = f"exception in hook {where}"
        log.exception("ebctl: exception in hook %s; the ebctl plugin is now OFF in this scheduler process "
                      "(stock sglang from here on, the server keeps serving)", where)
        capped, self.cap, self.gate_policy = self.cap is not None, None, None
        try:
            if self.launch_mixed is not None:
                sched.is_mixed_chunk = self.launch_mixed
            if capped:  # our cap may have closed admission: reopen it
                sched.running_batch.batch_is_full = False
                if running_batch is not None:
                    running_batch.batch_is_full = False
        except Exception:
            log.exception("ebctl: could not restore sglang's settings")
        try:
            if self.link is not None:
                self.link.close()
        except Exception:
            log.exception("ebctl: could not close the link")

    def _parse_fault(self, spec: str) -> None:
        if spec:
            hook, _, n = spec.partition(":")
            self.fault_hook, self.fault_at = hook.strip(), int(n or 1)
            log.warning("ebctl: fault injection armed (engine.fault=%r): a hook will raise on purpose", spec)

    def fault(self, hook: str) -> None:
        """Raise at the configured call of ``hook`` (engine.fault, a test switch)."""
        if hook == self.fault_hook:
            self.fault_calls += 1
            if self.fault_calls == self.fault_at:
                raise RuntimeError(f"ebctl: injected fault in hook {hook} (engine.fault)")

    # --- get_next_batch_to_run ----------------------------------------------------------------------
    def refresh(self, sched: Any, now: float, running_batch: Any = None) -> None:
        """Read the newest policy (None once expired) and apply it if it changed."""
        if self.control and self.link is not None:
            p = self.link.policy(now)
            if p is not self.policy:
                self.apply(sched, p, sched.running_batch if running_batch is None else running_batch)

    def apply(self, sched: Any, p: Policy | None, running_batch: Any) -> None:
        """A new policy object (or none): set what it asks for; only here do the settings change.
        ``running_batch``: the batch the next step starts from (the plan's, inside get_next_batch_to_run:
        the event loop stores it in ``sched.running_batch`` only after the hook returns)."""
        self.policy, old_cap = p, self.cap
        self.mixed_unavailable = sched.chunked_prefill_size is None
        if p is None or p.mode is Mode.OFF:
            self.gate_policy, self.cap = None, None
            sched.is_mixed_chunk = self.launch_mixed
        else:
            mb_fallback = p.mode is Mode.MB and self.mixed_unavailable
            self.gate_policy = msgspec.structs.replace(p, mode=Mode.EB) if mb_fallback else p
            self.cap = p.n_max
            # The gate's ``mixed`` is a function of the mode alone (mb: True, eb: False), and nothing in
            # sglang 0.5.23 writes is_mixed_chunk after __init__: set once here, not on every step.
            sched.is_mixed_chunk = self.gate_policy.mode is Mode.MB
        self.version = -1 if p is None else p.version
        if old_cap is not None and (self.cap is None or self.cap > old_cap):
            running_batch.batch_is_full = False  # sticky flag: a raised cap must reopen admission

    def end_step(self, sched: Any, plan: Any) -> None:
        """After sglang planned a step: keep what the report of its batch will need, then read the policy.

        A new policy (or an expiry) is applied here, after the step was planned, so it governs the steps
        planned from the next one on: one hook call per iteration instead of two, for at most one step's
        delay on a policy that changes on a scale of seconds."""
        if self.busy:  # a new iteration: close the last one's hook time (status: hook_ns)
            self.times[self.n_times % _TIMES] = self.ns
            self.n_times += 1
        self.ns = 0
        if not self.ready:
            self.start(sched)
        if self.fault_hook:
            self.fault("next_batch")
        self.iterations += 1
        if self.link is not None:
            batch = plan.batch_to_run
            if batch is None:
                if self.busy or self.pending:
                    self._report_idle(sched, plan)
                self.busy = False
            else:
                self.busy = True
                key = sched.forward_ct + 1  # run_batch numbers the batch forward_ct + 1 (forward_iter)
                # KV is read here, right after sglang planned the step (and checked its KV itself, so those
                # objects are in cache): the KV the step holds, its new tokens included.
                e = self.ring[key % _RING]  # filled in place: no allocation (and no GC pressure) per step
                e[0] = key
                running = plan.running_batch
                # occupancy: the running batch, plus the batch to run when it is a separate one (a prefill's
                # new requests; a MIXED step, whose running batch was handed over whole and is empty)
                e[1] = len(running.reqs) if batch is running else len(running.reqs) + len(batch.reqs)
                e[2] = len(sched.waiting_queue)
                e[3] = self._kv_used()
                e[4] = math.nan
                e[5] = None
                e[6] = self.version
        now = monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLICY_POLL_S
            self.refresh(sched, now, plan.running_batch)

    # --- _should_defer_prefill, get_num_allocatable_reqs --------------------------------------------
    def defer(self, sched: Any, running_batch: Any) -> bool:
        """The gate's answer for this step (stock said "go"): True keeps a prefill from forming."""
        if self.fault_hook:
            self.fault("defer_prefill")
        waiting = len(sched.waiting_queue)
        if not waiting:  # sglang 0.5.23 asks on every step; with nothing to admit, "go" changes nothing
            self.gate.rest()
            return False
        p = self.gate_policy
        running = len(running_batch.reqs)
        kv_free = 1.0
        if p.kv_reserve_frac > 0.0 and self.kv_total:  # no reserve: the gate's KV test always passes
            kv_free = 1.0 - self._kv_used() / self.kv_total
        d = self.gate.decide(p, running=running, waiting=waiting, kv_free_frac=kv_free, now=monotonic())
        if d.allow_prefill or running == 0 or sched.chunked_req is not None:
            return False
        self.defers += 1
        return True

    def allocatable(self, running_bs: int, n: int) -> int:
        """sglang's admission budget ``n`` for ``running_bs`` running, capped at n_max running."""
        if self.fault_hook:
            self.fault("allocatable")
        room = self.cap - running_bs
        if n <= room:
            return n
        self.capped += 1
        return room

    # --- run_batch, process_batch_result, send_abort_output ----------------------------------------
    def ran(self, batch: Any, seconds: float) -> None:
        """run_batch returned: keep the batch's context sum (``seq_lens_sum``, which ``ForwardBatch.init_new``
        has just computed; the overlap loop's ``batch.copy()`` for result processing drops it) and, on CPU
        where run_batch returns after the forward, its duration."""
        if self.fault_hook:
            self.fault("run_batch")
        key = batch.forward_iter
        e = self.ring[key % _RING]
        if e[0] == key:
            e[4] = seconds
            e[5] = batch.seq_lens_sum

    def before_result(self, result: Any) -> None:
        """GPU: wait for the batch's results (the original does it first too) and note when they were ready."""
        if self.link is not None:
            done = getattr(result, "copy_done", None)
            if done is not None:
                done.synchronize()
            self.t_result, self._t_prev = monotonic(), self.t_result

    def after_result(self, sched: Any, batch: Any) -> None:
        """The batch's results were processed: report it with the requests that finished in it.

        The report leaves as a plain tuple (``protocol.REPORT_ROW`` order); the link's I/O thread builds the
        struct. Every read here is an attribute, a ``len`` or a bound method looked up once at start: this is
        the largest part of the per-iteration budget (DESIGN.md: p50 ≤ 10 µs for all hooks together)."""
        if self.fault_hook:
            self.fault("batch_result")
        if self.link is None:
            return
        finished: tuple[FinishedRequest, ...] = ()
        reqs = batch.reqs
        for req in compress(reqs, map(_FINISHED_OUTPUT, reqs)):  # the scan runs in C: ~15 ns a request
            if _MARK not in req.__dict__:  # once: the overlap loop shows a finished request in one more batch
                req.__dict__[_MARK] = True
                f = reading.finished_request(req)
                if f is not None:
                    finished = (*finished, f)
        kind = self.kinds.get(batch.forward_mode)
        if kind is None:  # no forward of its own (PREBUILT, ...): its completions go with the next report
            self.pending.extend(finished)
            return
        key = batch.forward_iter
        e = self.ring[key % _RING]
        if e[0] == key:
            _, running, waiting, kv_used, run_s, ctx, version = e
        else:  # not planned through our hook (cannot happen in 0.5.23's loops): read what is there now
            running, waiting, kv_used = len(sched.running_batch.reqs), len(sched.waiting_queue), self._kv_used()
            run_s, ctx, version = math.nan, None, self.version
        if self.sync_forward:
            forward_s = run_s if run_s == run_s else max(monotonic() - (batch.launch_ts or 0.0), 0.0)
        else:
            forward_s = max(self.t_result - max(batch.launch_ts or 0.0, self._t_prev), 0.0)
        if self.pending:
            finished, self.pending = (*self.pending, *finished), []
        if kind is BatchKind.DECODE and ctx is not None:  # most steps: batch_shape's answer, without the call
            p_reqs, p_tokens, d_reqs, d_ctx = 0, 0, len(reqs), ctx
        else:
            p_reqs, p_tokens, d_reqs, d_ctx = batch_shape(batch, kind, ctx)
            if kind is BatchKind.MIXED:
                self.mixed_steps += 1
        seq = self.seq  # what _send does, inline on this per-step path (a call costs ~0.5 µs cold)
        self.seq = seq + 1
        self.reports += 1
        if finished:
            self.finished += len(finished)
        self.link.report_row((seq, wall_clock(), forward_s, kind, p_reqs, p_tokens, d_reqs, d_ctx, running, waiting,
                              kv_used, self.kv_total, self.max_running, version, self.mixed_unavailable, finished))

    def aborted(self, req: Any) -> None:
        """A request ended outside the output stream (aborted while queued, rejected, retract failure)."""
        if self.fault_hook:
            self.fault("abort_output")
        if self.link is not None and _MARK not in req.__dict__:
            req.__dict__[_MARK] = True
            f = reading.finished_request(req)
            if f is not None:
                self.pending.append(f)

    def _report_idle(self, sched: Any, plan: Any) -> None:
        finished, self.pending = tuple(self.pending), []
        self._send((self.seq, wall_clock(), 0.0, BatchKind.IDLE, 0, 0, 0, 0, len(plan.running_batch.reqs),
                    len(sched.waiting_queue), self._kv_used(), self.kv_total, self.max_running, self.version,
                    self.mixed_unavailable, finished))

    def _send(self, row: tuple) -> None:
        """Hand a report row (``protocol.REPORT_ROW`` order, ``finished`` last) to the link; never blocks: a
        full queue drops it, counted in link.stats()."""
        self.seq += 1
        self.reports += 1
        if row[-1]:
            self.finished += len(row[-1])
        self.link.report_row(row)

    # --- status (GET /server_info → internal_states[i]["ebctl"]) ------------------------------------
    def status(self, sched: Any) -> dict[str, Any]:
        """The plugin's state for humans and tests; refreshes the policy first (an idle engine does not)."""
        if self.on and self.ready:
            self.refresh(sched, monotonic())
        p = self.policy
        n = min(self.n_times, _TIMES)
        ns = sorted(self.times[:n])
        link = self.link.stats() if self.link is not None and self.on else None
        return {
            "enabled": self.on, "started": self.ready, "error": self.error, "engine_id": self.engine_id,
            "control": self.control, "reporting": self.reporting, "policy_version": self.version,
            "mode": "none" if p is None else str(p.mode), "k": p.k if p else None,
            "n_max": p.n_max if p else None, "launch_mixed_chunk": self.launch_mixed,
            "is_mixed_chunk": bool(getattr(sched, "is_mixed_chunk", False)),
            "mixed_unavailable": self.mixed_unavailable, "iterations": self.iterations, "reports": self.reports,
            "finished": self.finished, "defers": self.defers, "capped": self.capped,
            "mixed_steps": self.mixed_steps, "link": link,
            "hook_ns": {"iterations": n, "p50": ns[n // 2] if n else None,
                        "p99": ns[min(n - 1, (99 * n) // 100)] if n else None, "max": ns[-1] if n else None},
        }
