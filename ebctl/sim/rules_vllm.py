"""vLLM's scheduling rules (``EngineConfig.rules = "vllm"``): the engine the paper measured on.

* KV in blocks of ``block_size`` (16); admission keeps ``watermark`` of the blocks free (vLLM's watermark).
  When a decode step cannot get its blocks the newest admitted request is preempted (recompute: it re-queues
  at the front and later re-prefills prompt + generated tokens); a queue head that does not fit is refused
  until KV frees (counted). A prompt larger than the whole cache is aborted; a lone request that outgrows
  the cache is truncated (finish reason "length").
* Token budget ``token_budget`` per iteration with chunked prefill. A prompt, once started, is finished
  before anything else is admitted (partial chunks go first in every prefill or mixed iteration).
* Non-mixed iterations (EB, and stock = vLLM V0's prefill-first): a prefill iteration whenever a prompt is
  mid-way or the gate allows prefill and the queue head can be admitted; otherwise a decode iteration over
  every decoding request.
* Mixed iterations (gate ``mixed``, or ``mixed_chunk`` without a policy = vLLM v1): every decode row first,
  then the rest of the budget in prefill chunks (v1's decode-first rule); an iteration that had to preempt
  admits nothing new. Decode rows are never cut by the budget (``max_running`` ≤ ``token_budget`` assumed).
"""

from __future__ import annotations

import numpy as np

from ebctl.protocol import FinishedRequest, Mode, Policy
from ebctl.sim.costs import Batch
from ebctl.sim.engine import Engine


class VllmEngine(Engine):
    def _schedule(self, policy: Policy | None, now: float,
                  finished: list[FinishedRequest]) -> tuple[Batch, np.ndarray | None, list[int]]:
        cfg = self.cfg
        d = self.gate.decide(policy, running=self.running, waiting=len(self.queue),
                             kv_free_frac=self.free_blocks / self.total_blocks, now=now)
        cap = cfg.max_running
        if policy is not None and policy.mode is not Mode.OFF:
            cap = min(cap, policy.n_max)
        admit_max = d.admit_max if d.admit_max is not None else cfg.max_running
        mixed = d.mixed if d.mixed is not None else cfg.mixed_chunk
        batch, chunks = Batch(), []
        rows = None
        if mixed:
            preempted = self.preemptions
            rows = self._grow_kv(now, finished)
            budget = cfg.token_budget - int(np.count_nonzero(rows))
            if budget > 0:  # no new admissions in an iteration that had to preempt (vLLM v1's rule)
                self._prefill(batch, chunks, budget, d.allow_prefill and self.preemptions == preempted,
                              admit_max, cap, now, finished)
        else:
            self._prefill(batch, chunks, cfg.token_budget, d.allow_prefill, admit_max, cap, now, finished)
            if not batch.prefill_tokens:
                rows = self._grow_kv(now, finished)
        return batch, None if rows is None else self._decode_rows(rows, batch), chunks

    def _prefill(self, batch: Batch, chunks: list[int], budget: int, allow_new: bool, admit_max: int,
                 cap: int, now: float, finished: list[FinishedRequest]) -> None:
        """Partial prompts first, then (if allowed) new admissions from the queue head."""
        for s in list(self._prefilling):
            if budget <= 0:
                break
            budget -= self._chunk(batch, chunks, s, budget)
        if not allow_new:
            return
        b, req, admitted = self.page, self.req, 0
        watermark = int(self.cfg.watermark * self.total_blocks)
        while self.queue and budget > 0 and admitted < admit_max and self.running < cap:
            r = self.queue[0]
            need = -(-(req.input_len[r] + req.generated[r]) // b)
            if need > self.free_blocks - (watermark if self.running else 0):
                if self.running == 0 and need > self.total_blocks:
                    self.queue.popleft()
                    self._abort(r, now, finished)
                    continue
                self.kv_refusals += 1
                break
            self.queue.popleft()
            s = self._admit(r)
            self.blocks[s] = need
            self.free_blocks -= need
            admitted += 1
            budget -= self._chunk(batch, chunks, s, budget)

    def _grow_kv(self, now: float, finished: list[FinishedRequest]) -> np.ndarray:
        """Decode rows of this iteration, their new KV blocks taken; preempts (newest first) when short."""
        rows = self.dec.copy()
        needs = rows & (self.ctx % self.page == 0)
        need = int(np.count_nonzero(needs))
        while need > self.free_blocks:
            s = int(np.argmax(self.seq))
            if self.running == 1:  # one request bigger than the whole cache: stop it where it is
                r = int(self.rid[s])
                self.truncated += 1
                self.req.output_len[r] = int(self.req.output_len[r] - self.left[s])
                self._finish(s, now, "length", finished)
            else:
                self._requeue(s, now, front=True)
            rows[s] = needs[s] = False
            need = int(np.count_nonzero(needs))
        self.blocks += needs
        self.free_blocks -= need
        return rows
