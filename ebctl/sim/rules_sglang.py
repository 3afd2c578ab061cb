"""sglang 0.5.23's scheduling rules (``EngineConfig.rules = "sglang"``, the default), with the ebctl plugin.

Read from the installed source (paths under ``sglang/srt/``; line numbers of 0.5.23):

* **One step** (``managers/scheduler.py:3894`` ``get_next_batch_to_run``): a prefill batch if one forms,
  else a decode step over the running batch. The ebctl plugin answers ``_should_defer_prefill`` (1400) with
  the :class:`~ebctl.gate.PhaseGate` (``sglang_patch/state.py`` ``defer``: an empty queue skips the gate;
  while it holds and a chunk is in flight, the chunk goes on alone and nobody joins it) and caps running
  requests at ``n_max`` (``get_num_allocatable_reqs``, 4027; 0 while the chunk goes on alone); in ``eb``
  mode ``is_mixed_chunk`` is off, in ``mb`` on, without a policy it keeps its launch value (``mixed_chunk``).
* **Admission** (``_get_new_batch_prefill_raw``, 4079-4396; ``managers/schedule_policy.py`` ``PrefillAdder``,
  607-1700; ``mem_cache/prefill_budget.py`` ``PrefillBudget``, 62-168). Nothing is tried while
  ``batch_is_full`` (a sticky flag set when the slots or the KV ran out, cleared when a request leaves) or the
  queue is empty, unless a chunk is in flight. The budget starts from the KV available (finished requests'
  KV is free: the radix cache's evictable tokens count as available) minus a reservation for every running
  request of ``min(max_new_tokens − output so far, 4096) × ratio`` (``_get_running_request_total_token_offset``
  785: ratio = 1 for requests sent with ``ignore_eos``, else ``new_token_ratio``); with mixed chunking also
  minus one token per running request, and the chunk budget ``token_budget`` (``--chunked-prefill-size``)
  minus the same. The chunk in flight goes first (``add_chunked_req`` 1140). Then queued requests in order
  (FCFS) while the pass budget lasts (``budget_state`` 874) and slots remain: a request is admitted if
  prompt + ``min(max_new_tokens, 4096)`` + one page < the KV budget left (``check_prefill`` 126, else
  NO_TOKEN: the pass stops and ``batch_is_full`` is set); a prompt longer than the chunk budget left is cut to
  it (page-aligned) and becomes the one chunked request (``_select_prefill_admission`` 1592).
  ``--max-prefill-tokens`` bounds a pass's prompt tokens.
* **Mixed chunk** (4376-4396, ``schedule_batch.py:3267`` ``mix_with_running``): when a prefill batch formed,
  mixing is on and requests are running, the running batch's decode rows join it (if their next token fits in
  KV; otherwise they sit this step out).
* **Decode and retraction** (``update_running_batch`` 4459-4546; ``schedule_batch.py:3432``
  ``check_decode_mem``, 3451 ``retract_decode``, 3542 ``_get_decode_retraction_order``): when the decode
  rows' next tokens do not fit, requests are retracted (KV freed, re-queued at the tail, later re-prefilled
  with their output so far) fewest-output-first (ties: longest prompt first) until they fit, at least one,
  never the last; ``new_token_ratio`` becomes min(1, (Σ output + 20·n)/(Σ max_new_tokens + 1)) over the
  rest. A step without retraction decays the ratio by (init − min)/600 down to min = 0.14·init, init =
  min(0.7 × ``schedule_conservativeness``, 1) (``scheduler_components/new_token_ratio_tracker.py``,
  ``environ.py:646-649``); an idle engine resets it (``on_idle``, 5318).

* **``--min-free-slots-delay K``** (``managers/min_free_slots_delayer.py``; ``_get_new_batch_prefill_raw``
  4104-4115): the threshold is min(K, ``max_running``), disabled when that is ≤ 1 (``resolve_min_free_slots``).
  After the full-batch and empty-queue checks and with no chunk in flight, no prefill forms while requests
  are running and fewer than K slots are allocatable (``should_delay``): sglang's own EB(K), without a timer.
* **``--prefill-decode-interval N``** (``_should_defer_prefill`` 1400-1411, ``_arm_prefill_decode_interval``
  1413-1426, called at 3972 and 4015): a step that ran a prefill or mixed batch arms N; while armed, each
  scheduling round defers prefill (a chunk in flight too) and counts one down, unless the running batch holds
  fewer than ``--prefill-decode-interval-min-bs`` requests (default 0), which disarms it. The ebctl plugin asks
  this first and asks its gate only when it did not defer. With nothing running a deferred round is an empty
  loop iteration, costing no simulated time: the count is spent at once (with the overlap loop on, that round
  also waits for the previous batch's result, about one batch's scheduling time, not modelled).

Not modelled: the overlap loop's one-step lag in result processing, prefix (radix) cache hits, priorities and
other schedule policies than FCFS. A lone request that outgrows the whole KV is truncated (sglang aborts it).
"""

from __future__ import annotations

import numpy as np

from ebctl.protocol import FinishedRequest, Mode, Policy
from ebctl.sim.costs import Batch
from ebctl.sim.engine import Engine, EngineConfig

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (environ.py:650)
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


class SglangEngine(Engine):
    def __init__(self, config: EngineConfig, cost_model) -> None:
        super().__init__(config, cost_model)
        self.ratio_init = min(INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0)
        self.ratio_min = min(self.ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.ratio_init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.ratio_init
        self.batch_is_full = False
        self._held = False  # a chunk went on alone since the gate last admitted (the plugin's ``held``)
        mfs = min(config.min_free_slots_delay, config.max_running)  # resolve_min_free_slots
        self.min_free_slots = mfs if mfs > 1 else 0
        self.pd_interval_remaining = 0  # _prefill_decode_interval_remaining
        self.retractions = 0

    def _released(self) -> None:
        self.batch_is_full = False  # a request left: filter_batch shrank the batch (scheduler.py:3955, 3967)

    # --- one step -------------------------------------------------------------------------------------
    def _schedule(self, policy: Policy | None, now: float,
                  finished: list[FinishedRequest]) -> tuple[Batch, np.ndarray | None, list[int]]:
        cfg = self.cfg
        steer = policy is not None and policy.mode is not Mode.OFF
        mixed_chunk = policy.mode is Mode.MB if steer else cfg.mixed_chunk  # sglang_patch/state.py apply()
        cap = min(cfg.max_running, policy.n_max) if steer else cfg.max_running
        chunked = self._prefilling[0] if self._prefilling else None
        running_bs = self.running - (chunked is not None)  # the chunked request is not in the running batch
        defer = hold_new = False
        # the interval in force: a policy's pd_interval replaces the launch value (sglang_patch/state.py apply, in
        # any mode); a smaller one cuts a longer countdown to it (sglang_patch/lifecycle.py set_pd_interval)
        pdi = policy.pd_interval if policy is not None and policy.pd_interval else cfg.prefill_decode_interval
        self.pd_interval_remaining = min(self.pd_interval_remaining, pdi)
        if self.pd_interval_remaining:  # _should_defer_prefill, stock (scheduler.py:1400-1411): the plugin asks it
            # first and, when it defers, returns that without asking the gate (sglang_patch/hooks.py defer_prefill)
            if running_bs < cfg.prefill_decode_interval_min_bs or running_bs == 0:
                self.pd_interval_remaining = 0
            else:
                self.pd_interval_remaining -= 1
                defer = True
        if not defer and steer and self.queue:  # the plugin's gate (sglang_patch/state.py defer)
            kv_free = self.free_blocks / self.total_blocks if policy.kv_reserve_frac > 0 else 1.0
            d = self.gate.decide(policy, running=running_bs, waiting=len(self.queue), kv_free_frac=kv_free,
                                 now=now, chunk_in_flight=chunked is not None)
            defer = not d.allow_prefill
            hold_new = d.allow_prefill and d.admit_max == 0  # a chunk goes on alone: allocatable is 0
            if hold_new:
                self._held = True
            elif self._held:  # admitting again: the batch_is_full set while the chunk went on alone goes
                self._held = self.batch_is_full = False
        elif not defer and steer:
            self.gate.rest()
        batch, chunks = Batch(), []
        if not defer:
            self._prefill(batch, chunks, chunked, running_bs, 0 if hold_new else cap - running_bs, mixed_chunk,
                          now, finished)
        if chunks:
            if pdi:  # _arm_prefill_decode_interval: an extend or mixed batch ran
                self.pd_interval_remaining = pdi
            rows = None
            if mixed_chunk and running_bs and self._decode_fits(self.dec):
                rows = self._take_decode_pages(self.dec.copy())
            return batch, None if rows is None else self._decode_rows(rows, batch), chunks
        if not self.dec.any():
            if not self.running and not self.queue:
                self.new_token_ratio = self.ratio_init  # on_idle
            return batch, None, chunks
        self._update_running_batch(now, finished)
        return batch, self._decode_rows(self._take_decode_pages(self.dec.copy()), batch), chunks

    # --- admission: PrefillAdder --------------------------------------------------------------------
    def _prefill(self, batch: Batch, chunks: list[int], chunked: int | None, running_bs: int, allocatable: int,
                 mixed_chunk: bool, now: float, finished: list[FinishedRequest]) -> None:
        """``allocatable``: get_num_allocatable_reqs with the plugin's cap (n_max − running; 0 while a chunk
        goes on alone)."""
        cfg, page, req = self.cfg, self.page, self.req
        if running_bs == 0:
            self.batch_is_full = False
        if (self.batch_is_full or not self.queue) and chunked is None:
            return
        if chunked is None and running_bs > 0 and allocatable < self.min_free_slots:  # MinFreeSlotsDelayer
            return
        if chunked is None and allocatable <= 0:
            self.batch_is_full = True
            return
        mixed_tokens = running_bs if mixed_chunk else 0
        rem_input = cfg.max_prefill_tokens - mixed_tokens
        rem_chunk = cfg.token_budget - mixed_tokens
        avail = self.free_blocks * page
        ratio = 1.0 if cfg.max_new_tokens == 0 else self.new_token_ratio
        dec = self.dec
        reserved = float(np.minimum(self.max_new[dec] - self.out[dec], CLIP_MAX_NEW_TOKENS).sum()) * ratio
        total_off = cur_off = float(mixed_tokens)
        total_off += reserved
        admitted = 0

        def ceil(x: int) -> int:
            return -(-x // page) * page

        if chunked is not None:  # add_chunked_req
            rem = min(rem_chunk, int(avail - total_off))
            if rem <= 0:
                rem = rem_chunk
            if rem > 0:
                last = self.pf_left[chunked] <= rem
                take = self._chunk_with_pages(batch, chunks, chunked, rem)
                max_new = min(int(self.max_new[chunked]), CLIP_MAX_NEW_TOKENS) if last else 0
                total_off += ceil(take) + page + max_new
                cur_off += ceil(take) + page
                rem_input -= ceil(take)
                rem_chunk -= ceil(take)
        in_batch = len(chunks)
        while self.queue:
            if avail - total_off > 0 and avail - cur_off > 0 and (rem_input <= 0 or rem_chunk <= 0):
                break  # budget_state() == OTHER
            if in_batch + admitted >= allocatable:
                self.batch_is_full = True
                break
            r = self.queue[0]
            extend = req.input_len[r] + req.generated[r]
            full = max(cfg.max_new_tokens, req.output_len[r]) if cfg.max_new_tokens else req.output_len[r]
            capacity = self.total_blocks * page
            if extend + 2 * page >= capacity:  # can never fit (sglang rejects it up front)
                self.queue.popleft()
                self._abort(r, now, finished)
                continue
            # an empty pool must be able to take it (sglang clips max_new_tokens to that on arrival)
            check_new = min(max(full - req.generated[r], 0), CLIP_MAX_NEW_TOKENS, capacity - extend - 2 * page)
            max_new = min(full, CLIP_MAX_NEW_TOKENS)
            if not extend + check_new + page < avail - total_off:  # check_prefill: NO_TOKEN
                self.kv_refusals += 1
                self.batch_is_full = in_batch + admitted > 0 or running_bs > 0
                break
            if ceil(extend) > rem_chunk:  # chunked: cut page-aligned to what the chunk budget has left
                take_max = rem_chunk // page * page
                if take_max <= 0:
                    break
                max_new = 0
            else:
                take_max = extend
            self.queue.popleft()
            s = self._admit(r)
            take = self._chunk_with_pages(batch, chunks, s, take_max)
            admitted += 1
            total_off += ceil(take) + page + max_new
            cur_off += ceil(take) + page
            rem_input -= ceil(take)
            rem_chunk -= ceil(take)
            if not (avail - total_off > 0 and avail - cur_off > 0):  # add_one_req returned NO_TOKEN
                self.batch_is_full = True
                break

    def _chunk_with_pages(self, batch: Batch, chunks: list[int], s: int, budget: int) -> int:
        """A prompt chunk and the KV pages it fills (prepare_for_extend allocates the extend tokens)."""
        take = self._chunk(batch, chunks, s, budget)
        done = self.pf_total[s] - self.pf_left[s]
        need = -(-done // self.page) - int(self.blocks[s])
        self.blocks[s] += need
        self.free_blocks -= need
        return take

    # --- decode: update_running_batch ---------------------------------------------------------------
    def _decode_fits(self, rows: np.ndarray) -> bool:
        """check_decode_mem: one page for every row whose context sits on a page boundary."""
        return int(np.count_nonzero(rows & (self.ctx % self.page == 0))) <= self.free_blocks

    def _take_decode_pages(self, rows: np.ndarray) -> np.ndarray:
        needs = rows & (self.ctx % self.page == 0)
        self.blocks += needs
        self.free_blocks -= int(np.count_nonzero(needs))
        return rows

    def _update_running_batch(self, now: float, finished: list[FinishedRequest]) -> None:
        """Retract when the next decode tokens do not fit; otherwise decay new_token_ratio."""
        if self._decode_fits(self.dec):
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.ratio_min)
            return
        slots = np.flatnonzero(self.dec).tolist()
        inp = self.req.input_len
        # most-preferred to keep first; retraction pops from the end: fewest output, then longest prompt,
        # then the latest in batch order (sglang's stable reverse sort of the batch, admission order)
        slots.sort(key=lambda s: (-int(self.out[s]), inp[int(self.rid[s])], int(self.seq[s])))
        keep = np.zeros_like(self.dec)
        keep[slots] = True
        first = True
        while first or not self._decode_fits(keep):
            if len(slots) == 1:
                break
            first = False
            s = slots.pop()
            keep[s] = False
            self._requeue(s, now, front=False)
            self.retractions += 1
        if len(slots) == 1 and not self._decode_fits(keep):  # a lone request bigger than the whole cache
            s = slots[0]
            r = int(self.rid[s])
            self.truncated += 1
            self.req.output_len[r] = int(self.req.output_len[r] - self.left[s])
            self._finish(s, now, "length", finished)
        dec = self.dec
        if dec.any():
            self.new_token_ratio = min(1.0, float(self.out[dec].sum() + RETRACT_DECODE_STEPS * dec.sum())
                                       / float(self.max_new[dec].sum() + 1))
