"""The simulated engine: nano-vllm's ``step()`` (schedule → cost → postprocess) with simulated time passed in.

One iteration: ask the :class:`~ebctl.gate.PhaseGate` with numbers the engine has (the same call the SGLang
hook makes), build the batch, price it with a cost model, advance every request in it, and return the
:class:`~ebctl.protocol.IterationReport` a real engine would send. No clock, no randomness: the same requests
and policies give the same run. The policy is injected between steps (``engine.policy = p``).

Model of the engine (SGLang/vLLM-like):

* ``max_running`` request slots; a request holds its slot from admission (its prompt's KV allocated in
  full) to completion. Per-slot state lives in numpy arrays, so a decode step is a few vector operations.
* Paged KV of ``kv_tokens`` tokens in blocks of ``block_size``; a decode row takes a new block when its
  context crosses a block boundary. Admission keeps ``watermark`` of the blocks free (vLLM's watermark).
  When a decode step cannot get its blocks the newest admitted request is preempted (recompute: it
  re-queues at the front and later re-prefills prompt + generated tokens); a queue head that does not
  fit is refused until KV frees (counted). A prompt larger than the whole cache is aborted; a lone request
  that outgrows the cache is truncated (finish reason "length").
* Token budget ``token_budget`` per iteration with chunked prefill. A prompt, once started, is finished
  before anything else is admitted (partial chunks go first in every prefill or mixed iteration).
* Non-mixed iterations (EB, stock): a prefill iteration whenever a prompt is mid-way or the gate allows
  prefill and the queue head can be admitted; otherwise a decode iteration over every decoding request.
  Stock behaviour (no policy): prefill first, up to ``max_running`` (SGLang's default, EB with k = 1).
* Mixed iterations (gate ``mixed``): every decode row first, then the rest of the budget in prefill
  chunks (vLLM v1's decode-first rule); an iteration that had to preempt admits nothing new. Decode rows
  are never cut by the budget (``max_running`` ≤ ``token_budget`` is assumed, as in the defaults).
* The prefill that completes a prompt produces its first token (TTFT); each decode row produces one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ebctl.gate import PhaseGate
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Mode, Policy
from ebctl.sim.costs import Batch, CostModel

ITL_KEEP = 8_000_000  # inter-token gaps kept for percentiles before thinning


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_running: int = 1024  # N: request slots
    token_budget: int = 8192  # B: tokens per iteration (chunked prefill)
    kv_tokens: int = 500_000  # C
    block_size: int = 16  # b
    watermark: float = 0.01  # share of KV blocks admission leaves free
    mixed_chunk: bool = False  # the launch setting used when the gate leaves mixing to the engine
    engine_id: str = "sim"

    def __post_init__(self) -> None:
        for name in ("max_running", "token_budget", "kv_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens={self.kv_tokens} is less than one block ({self.block_size})")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark={self.watermark}: must be in [0, 1)")


class Requests:
    """Every request the engine has seen, by id (lists: touched one at a time, at admission and exit)."""

    def __init__(self) -> None:
        self.input_len: list[int] = []
        self.output_len: list[int] = []
        self.arrival: list[float] = []
        self.enqueued: list[float] = []
        self.first_token: list[float] = []
        self.finish: list[float] = []
        self.generated: list[int] = []  # tokens produced before a preemption (re-prefilled on return)
        self.last_token: list[float] = []
        self.preempted: list[int] = []
        self.reason: list[str] = []

    def __len__(self) -> int:
        return len(self.input_len)

    def add(self, input_len: int, output_len: int, arrival: float) -> int:
        for lst, v in ((self.input_len, input_len), (self.output_len, output_len), (self.arrival, arrival),
                       (self.enqueued, arrival), (self.first_token, math.nan), (self.finish, math.nan),
                       (self.generated, 0), (self.last_token, math.nan), (self.preempted, 0),
                       (self.reason, "")):
            lst.append(v)
        return len(self.input_len) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k)) for k in
                ("input_len", "output_len", "arrival", "first_token", "finish", "generated", "preempted",
                 "reason")}


class Engine:
    """A continuous-batching engine over simulated time; ``step(now)`` runs one iteration."""

    def __init__(self, config: EngineConfig, cost_model: CostModel) -> None:
        self.cfg = c = config
        self.cost = cost_model
        self.gate = PhaseGate()
        self.policy: Policy | None = None
        self.req = Requests()
        self.queue: deque[int] = deque()
        n = c.max_running
        self.total_blocks = c.kv_tokens // c.block_size
        self.free_blocks = self.total_blocks
        self._watermark = int(c.watermark * self.total_blocks)
        self.rid = np.full(n, -1, dtype=np.int64)
        self.ctx = np.zeros(n, dtype=np.int64)  # tokens in KV (after prefill: the prompt; +1 per decode)
        self.left = np.zeros(n, dtype=np.int64)  # output tokens still to produce
        self.blocks = np.zeros(n, dtype=np.int64)
        self.seq = np.full(n, -1, dtype=np.int64)  # admission order, -1 on free slots
        self.last_tok = np.zeros(n, dtype=np.float64)
        self.dec = np.zeros(n, dtype=bool)  # decoding rows
        self.pf_left = [0] * n
        self.pf_total = [0] * n
        self._free_slots = list(range(n - 1, -1, -1))
        self._prefilling: list[int] = []  # slots mid-prompt, in admission order
        self._admitted = 0
        self.itl: list[np.ndarray] = []  # inter-token gaps; thinned to every ``_itl_stride``-th past ITL_KEEP
        self._itl_n = 0
        self._itl_stride = 1
        self.last_finished: list[int] = []
        self.steps = {k: 0 for k in BatchKind}
        self.busy_s = 0.0
        self.running_area = 0.0  # ∫ running dt
        self.preemptions = self.kv_refusals = self.aborted = self.truncated = 0
        self.tokens_out = self.tokens_prefilled = 0
        self.peak_kv_blocks = 0

    # --- verbs --------------------------------------------------------------------------------------
    def add(self, input_len: int, output_len: int, arrival: float) -> int:
        """Queue a request (FIFO); returns its id."""
        if input_len < 1 or output_len < 1:
            raise ValueError(f"request lengths must be >= 1, got ({input_len}, {output_len})")
        rid = self.req.add(int(input_len), int(output_len), float(arrival))
        self.queue.append(rid)
        return rid

    @property
    def running(self) -> int:
        return self.cfg.max_running - len(self._free_slots)

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.running > 0

    @property
    def kv_used(self) -> int:
        return (self.total_blocks - self.free_blocks) * self.cfg.block_size

    def step(self, now: float) -> IterationReport:
        """Schedule → cost → postprocess; the iteration starts at ``now`` and ends at ``wall_time``."""
        policy = self.policy if self.policy is not None and not self.policy.expired(now) else None
        self.last_finished = []
        finished: list[FinishedRequest] = []
        d = self.gate.decide(policy, running=self.running, waiting=len(self.queue),
                             kv_free_frac=self.free_blocks / self.total_blocks,
                             now=now)
        cap = self.cfg.max_running
        if policy is not None and policy.mode is not Mode.OFF:
            cap = min(cap, policy.n_max)
        admit_max = d.admit_max if d.admit_max is not None else self.cfg.max_running
        mixed = d.mixed if d.mixed is not None else self.cfg.mixed_chunk

        # schedule
        batch, chunks = Batch(), []
        rows = None
        if mixed:
            preempted = self.preemptions
            rows = self._grow_kv(now, finished)
            budget = self.cfg.token_budget - int(np.count_nonzero(rows))
            if budget > 0:  # no new admissions in an iteration that had to preempt (vLLM v1's rule)
                self._schedule_prefill(batch, chunks, budget, d.allow_prefill and
                                                  self.preemptions == preempted, admit_max, cap, now, finished)
        else:
            self._schedule_prefill(batch, chunks, self.cfg.token_budget, d.allow_prefill,
                                              admit_max, cap, now, finished)
            if not batch.prefill_tokens:
                rows = self._grow_kv(now, finished)
        if rows is not None and rows.any():
            self.ctx += rows
            batch.decode_ctx = self.ctx[rows]
        else:
            rows = None
        running, waiting = self.running, len(self.queue)
        self.peak_kv_blocks = max(self.peak_kv_blocks, self.total_blocks - self.free_blocks)
        kv_used = self.kv_used

        # cost
        dt = float(self.cost.step_time(batch)) if batch.prefill_tokens or rows is not None else 0.0
        t = now + dt

        # postprocess
        if rows is not None:
            self.left -= rows
            self._keep_itl(t - self.last_tok[rows])
            np.putmask(self.last_tok, rows, t)
            n_dec = batch.decode_ctx.size
            self.tokens_out += n_dec
            for s in np.flatnonzero(rows & (self.left == 0)).tolist():
                self._finish(s, t, "stop", finished)
        for s in chunks:
            if self.pf_left[s] == 0:
                self._complete_prefill(s, t, finished)
        kind = (BatchKind.MIXED if batch.prefill_tokens and rows is not None else
                BatchKind.PREFILL if batch.prefill_tokens else
                BatchKind.DECODE if rows is not None else BatchKind.IDLE)
        self.steps[kind] += 1
        self.busy_s += dt
        self.running_area += running * dt
        return IterationReport(
            engine_id=self.cfg.engine_id, seq=sum(self.steps.values()), wall_time=t, forward_s=dt, kind=kind,
            prefill_reqs=len(batch.chunk_lens), prefill_tokens=batch.prefill_tokens,
            decode_reqs=batch.decode_ctx.size, decode_ctx_tokens=int(batch.decode_ctx.sum()),
            running=running, waiting=waiting, kv_used=kv_used, kv_total=self.total_blocks * self.cfg.block_size,
            max_running=self.cfg.max_running,
            policy_version=policy.version if policy is not None else -1, finished=tuple(finished))

    # --- schedule -----------------------------------------------------------------------------------
    def _schedule_prefill(self, batch: Batch, chunks: list[int], budget: int, allow_new: bool, admit_max: int,
                          cap: int, now: float, finished: list[FinishedRequest]) -> int:
        """Partial prompts first, then (if allowed) new admissions from the queue head; returns admissions."""
        for s in self._prefilling:
            if budget <= 0:
                break
            budget -= self._chunk(batch, chunks, s, budget)
        admitted = 0
        if not allow_new:
            return 0
        b, req = self.cfg.block_size, self.req
        while self.queue and budget > 0 and admitted < admit_max and self.running < cap:
            r = self.queue[0]
            p = req.input_len[r] + req.generated[r]
            need = -(-p // b)
            running = self.running
            if need > self.free_blocks - (self._watermark if running else 0):
                if running == 0 and need > self.total_blocks:
                    self.queue.popleft()
                    self._abort(r, now, finished)
                    continue
                self.kv_refusals += 1
                break
            self.queue.popleft()
            s = self._free_slots.pop()
            self.rid[s], self.ctx[s], self.blocks[s] = r, 0, need
            self.left[s] = req.output_len[r] - req.generated[r]
            self.seq[s] = self._admitted
            self.last_tok[s] = req.last_token[r]
            self._admitted += 1
            self.free_blocks -= need
            self.pf_left[s] = self.pf_total[s] = p
            self._prefilling.append(s)
            admitted += 1
            budget -= self._chunk(batch, chunks, s, budget)
        return admitted

    def _chunk(self, batch: Batch, chunks: list[int], s: int, budget: int) -> int:
        take = min(self.pf_left[s], budget)
        batch.chunk_starts.append(self.pf_total[s] - self.pf_left[s])
        batch.chunk_lens.append(take)
        batch.prefill_tokens += take
        self.pf_left[s] -= take
        self.tokens_prefilled += take
        chunks.append(s)
        return take

    def _grow_kv(self, now: float, finished: list[FinishedRequest]) -> np.ndarray:
        """Decode rows of this iteration, their new KV blocks taken; preempts (newest first) when short."""
        rows = self.dec.copy()
        b = self.cfg.block_size
        needs = rows & (self.ctx % b == 0)
        need = int(np.count_nonzero(needs))
        while need > self.free_blocks:
            s = int(np.argmax(self.seq))
            if self.running == 1:  # one request bigger than the whole cache: stop it where it is
                r = int(self.rid[s])
                self.truncated += 1
                self.req.output_len[r] = int(self.req.output_len[r] - self.left[s])
                self._finish(s, now, "length", finished)
            else:
                self._preempt(s, now)
            rows[s] = needs[s] = False
            need = int(np.count_nonzero(needs))
        self.blocks += needs
        self.free_blocks -= need
        return rows

    def _preempt(self, s: int, now: float) -> None:
        r = int(self.rid[s])
        req = self.req
        req.generated[r] = int(req.output_len[r] - self.left[s])
        req.last_token[r] = float(self.last_tok[s])
        req.preempted[r] += 1
        req.enqueued[r] = now
        if s in self._prefilling:
            self._prefilling.remove(s)
            self.tokens_prefilled -= self.pf_total[s] - self.pf_left[s]  # that work is lost
            self.pf_left[s] = 0
        self._release(s)
        self.queue.appendleft(r)
        self.preemptions += 1

    # --- postprocess --------------------------------------------------------------------------------
    def _complete_prefill(self, s: int, t: float, finished: list[FinishedRequest]) -> None:
        """The prompt is in KV: its first (or, after a preemption, next) token comes out now."""
        self._prefilling.remove(s)
        r = int(self.rid[s])
        self.ctx[s] = self.pf_total[s]
        self.left[s] -= 1
        self.tokens_out += 1
        if math.isnan(self.req.first_token[r]):
            self.req.first_token[r] = t
        else:
            self._keep_itl(np.array([t - self.last_tok[s]]))
        self.last_tok[s] = t
        if self.left[s] == 0:
            self._finish(s, t, "stop", finished)
        else:
            self.dec[s] = True

    def _finish(self, s: int, t: float, reason: str, finished: list[FinishedRequest]) -> None:
        r = int(self.rid[s])
        req = self.req
        req.finish[r], req.reason[r] = t, reason
        finished.append(FinishedRequest(req.input_len[r], req.output_len[r], reason,
                                        req.first_token[r] - req.arrival[r]))
        self.last_finished.append(r)
        self._release(s)

    def _abort(self, r: int, t: float, finished: list[FinishedRequest]) -> None:
        req = self.req
        req.finish[r], req.reason[r] = t, "abort"
        self.aborted += 1
        finished.append(FinishedRequest(req.input_len[r], 0, "abort", math.nan))
        self.last_finished.append(r)

    def _release(self, s: int) -> None:
        self.free_blocks += int(self.blocks[s])
        self.rid[s], self.seq[s], self.blocks[s], self.ctx[s], self.left[s] = -1, -1, 0, 0, 0
        self.dec[s] = False
        self._free_slots.append(s)

    def _keep_itl(self, gaps: np.ndarray) -> None:
        """Store gaps (float32); past ITL_KEEP values keep every stride-th, doubling the stride (bounded memory)."""
        if self._itl_stride > 1:
            gaps = gaps[:: self._itl_stride]
        self.itl.append(gaps.astype(np.float32))
        self._itl_n += gaps.size
        if self._itl_n > ITL_KEEP:
            kept = np.concatenate(self.itl)[::2]
            self.itl, self._itl_n, self._itl_stride = [kept], kept.size, self._itl_stride * 2

