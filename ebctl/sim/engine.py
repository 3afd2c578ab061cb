"""The simulated engine: nano-vllm's ``step()`` (schedule → cost → postprocess) with simulated time passed in.

One iteration: the rules in force build the batch (asking the :class:`~ebctl.gate.PhaseGate` with numbers
the engine has, the same call the SGLang hook makes), a cost model prices it, every request in it advances,
and the :class:`~ebctl.protocol.IterationReport` a real engine would send comes out. No clock, no randomness:
the same requests and policies give the same run. The policy is injected between steps (``engine.policy = p``).

Two rule sets (``EngineConfig.rules``), each in its own module:

* ``sglang`` (default, :mod:`ebctl.sim.rules_sglang`): sglang 0.5.23's scheduler: prefill first, the
  ``PrefillAdder`` admission with its KV reservation, one chunked request, retraction when decode runs out
  of KV, ``--enable-mixed-chunk``. The engine ebctl steers.
* ``vllm`` (:mod:`ebctl.sim.rules_vllm`): vLLM's V0 (prefill first) and v1 (decode first, mixed chunked
  prefill) rules with a watermark and recompute preemption: the engine the paper measured on.

What both share (here): per-slot state in numpy arrays (a decode step is a few vector operations), KV in
pages of ``block_size`` tokens (a decode row takes a page when its context crosses a page boundary), the
postprocess (a prefill that completes a prompt produces its first token, each decode row one more, a request
leaves with its output length), the report. ``ebctl.sim.rules.make_engine(config, cost_model)`` builds the
rules' class.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ebctl.gate import PhaseGate
from ebctl.protocol import BatchKind, FinishedRequest, IterationReport, Policy
from ebctl.sim.costs import Batch, CostModel

ITL_KEEP = 8_000_000  # inter-token gaps kept for percentiles before thinning
RULES = ("sglang", "vllm")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    rules: str = "sglang"  # whose scheduler: sglang 0.5.23's or vLLM's (V0 stock, v1 mixed)
    max_running: int = 1024  # N: request slots (--max-running-requests, max_num_seqs)
    token_budget: int = 8192  # B: tokens per iteration (--chunked-prefill-size, max_num_batched_tokens)
    kv_tokens: int = 500_000  # C (--max-total-tokens)
    block_size: int = 0  # KV page in tokens; 0: the rules' default (sglang page_size 1, vLLM block 16)
    watermark: float = 0.01  # vLLM: share of KV blocks admission leaves free
    mixed_chunk: bool = False  # the launch setting used when the gate leaves mixing to the engine
    max_prefill_tokens: int = 16384  # sglang --max-prefill-tokens: prefill tokens of one batch
    max_new_tokens: int = 0  # sglang: 0 = each request's own output length, sent with ignore_eos;
    # > 0 = this max_new_tokens on every request, which stops at its own length (EOS): new_token_ratio applies
    schedule_conservativeness: float = 1.0  # sglang: initial new_token_ratio = min(0.7 × this, 1)
    min_free_slots_delay: int = 0  # sglang --min-free-slots-delay K (0: not given; ≤ 1 after the cap: disabled)
    prefill_decode_interval: int = 0  # sglang --prefill-decode-interval N (0: disabled)
    prefill_decode_interval_min_bs: int = 0  # sglang --prefill-decode-interval-min-bs
    engine_id: str = "sim"

    def __post_init__(self) -> None:
        if self.rules not in RULES:
            raise ValueError(f"rules={self.rules!r}: must be one of {', '.join(RULES)}")
        for name in ("max_running", "token_budget", "kv_tokens", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.block_size < 0 or self.max_new_tokens < 0:
            raise ValueError(f"block_size={self.block_size}, max_new_tokens={self.max_new_tokens}: must be >= 0")
        if self.kv_tokens < self.page:
            raise ValueError(f"kv_tokens={self.kv_tokens} is less than one page ({self.page})")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark={self.watermark}: must be in [0, 1)")
        knobs = (self.min_free_slots_delay, self.prefill_decode_interval, self.prefill_decode_interval_min_bs)
        if min(knobs) < 0:
            raise ValueError(f"min_free_slots_delay, prefill_decode_interval, prefill_decode_interval_min_bs = "
                             f"{knobs}: must be >= 0")
        if self.rules != "sglang" and (self.min_free_slots_delay or self.prefill_decode_interval):
            raise ValueError("min_free_slots_delay and prefill_decode_interval are sglang's flags: rules='sglang' only")
        if not self.schedule_conservativeness > 0:
            raise ValueError(f"schedule_conservativeness={self.schedule_conservativeness}: must be > 0")

    @property
    def page(self) -> int:
        """KV page (block) size in tokens."""
        return self.block_size or (1 if self.rules == "sglang" else 16)


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
        self.max_gap: list[float] = []  # the largest gap between two of its tokens so far (a preemption's included)
        self.preempted: list[int] = []
        self.reason: list[str] = []

    def __len__(self) -> int:
        return len(self.input_len)

    def add(self, input_len: int, output_len: int, arrival: float) -> int:
        for lst, v in ((self.input_len, input_len), (self.output_len, output_len), (self.arrival, arrival),
                       (self.enqueued, arrival), (self.first_token, math.nan), (self.finish, math.nan),
                       (self.generated, 0), (self.last_token, math.nan), (self.max_gap, 0.0), (self.preempted, 0),
                       (self.reason, "")):
            lst.append(v)
        return len(self.input_len) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k)) for k in
                ("input_len", "output_len", "arrival", "first_token", "finish", "generated", "preempted",
                 "reason", "max_gap")}


class Engine:
    """A continuous-batching engine over simulated time; ``step(now)`` runs one iteration.

    ``ebctl.sim.rules.make_engine(config, cost_model)`` builds the class of ``config.rules``; a rule set implements
    ``_schedule(policy, now, finished) -> (batch, decode rows or None, prefill chunk slots)``."""

    def __init__(self, config: EngineConfig, cost_model: CostModel) -> None:
        self.cfg = c = config
        self.cost = cost_model
        self.gate = PhaseGate()
        self.policy: Policy | None = None
        self.req = Requests()
        self.queue: deque[int] = deque()
        n = c.max_running
        self.page = c.page
        self.total_blocks = c.kv_tokens // self.page
        self.free_blocks = self.total_blocks
        self.rid = np.full(n, -1, dtype=np.int64)
        self.ctx = np.zeros(n, dtype=np.int64)  # tokens in KV (after prefill: the prompt; +1 per decode)
        self.left = np.zeros(n, dtype=np.int64)  # output tokens still to produce
        self.out = np.zeros(n, dtype=np.int64)  # output tokens produced so far (before preemptions too)
        self.max_new = np.zeros(n, dtype=np.int64)  # sglang: the request's max_new_tokens
        self.blocks = np.zeros(n, dtype=np.int64)
        self.seq = np.full(n, -1, dtype=np.int64)  # admission order, -1 on free slots
        self.last_tok = np.zeros(n, dtype=np.float64)
        self.gap_max = np.zeros(n, dtype=np.float64)  # per slot: its request's largest inter-token gap so far
        self.dec = np.zeros(n, dtype=bool)  # decoding rows
        self.pf_left = [0] * n
        self.pf_total = [0] * n
        self._free_slots = list(range(n - 1, -1, -1))
        self._prefilling: list[int] = []  # slots mid-prompt, in admission order
        self._admitted = 0
        self._last_kind = BatchKind.IDLE  # of the last non-idle iteration (the cost's ``switched``)
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
        return (self.total_blocks - self.free_blocks) * self.page

    def step(self, now: float) -> IterationReport:
        """Schedule → cost → postprocess; the iteration starts at ``now`` and ends at ``wall_time``."""
        policy = self.policy if self.policy is not None and not self.policy.expired(now) else None
        self.last_finished = []
        finished: list[FinishedRequest] = []
        batch, rows, chunks = self._schedule(policy, now, finished)
        running, waiting = self.running, len(self.queue)
        self.peak_kv_blocks = max(self.peak_kv_blocks, self.total_blocks - self.free_blocks)
        kv_used = self.kv_used
        kind = (BatchKind.MIXED if batch.prefill_tokens and rows is not None else
                BatchKind.PREFILL if batch.prefill_tokens else
                BatchKind.DECODE if rows is not None else BatchKind.IDLE)

        # cost
        dt = 0.0
        if kind is not BatchKind.IDLE:
            batch.switched = self._last_kind is not BatchKind.IDLE and kind is not self._last_kind
            self._last_kind = kind
            dt = float(self.cost.step_time(batch))
        t = now + dt

        # postprocess
        if rows is not None:
            self.left -= rows
            self.out += rows
            gaps = t - self.last_tok[rows]
            self._keep_itl(gaps)
            self.gap_max[rows] = np.maximum(self.gap_max[rows], gaps)
            np.putmask(self.last_tok, rows, t)
            self.tokens_out += batch.decode_ctx.size
            for s in np.flatnonzero(rows & (self.left == 0)).tolist():
                self._finish(s, t, "stop", finished)
        for s in chunks:
            if self.pf_left[s] == 0 and self.rid[s] >= 0:
                self._complete_prefill(s, t, finished)
        self.steps[kind] += 1
        self.busy_s += dt
        self.running_area += running * dt
        return IterationReport(
            engine_id=self.cfg.engine_id, seq=sum(self.steps.values()), wall_time=t, forward_s=dt, kind=kind,
            prefill_reqs=len(batch.chunk_lens), prefill_tokens=batch.prefill_tokens,
            decode_reqs=batch.decode_ctx.size, decode_ctx_tokens=int(batch.decode_ctx.sum()),
            prefill_ctx_tokens=batch.prefill_ctx_tokens, running=running, waiting=waiting, kv_used=kv_used,
            kv_total=self.total_blocks * self.page,
            max_running=self.cfg.max_running, pd_interval_available=self.cfg.rules == "sglang",
            policy_version=policy.version if policy is not None else -1, finished=tuple(finished))

    def _schedule(self, policy: Policy | None, now: float,
                  finished: list[FinishedRequest]) -> tuple[Batch, np.ndarray | None, list[int]]:
        raise NotImplementedError

    # --- shared pieces of scheduling ----------------------------------------------------------------
    def _admit(self, r: int) -> int:
        """Give queued request ``r`` a slot, its prompt (plus tokens made before a preemption) to prefill;
        its KV pages are taken by the rules (``blocks``/``free_blocks``). Returns the slot."""
        req = self.req
        s = self._free_slots.pop()
        p = req.input_len[r] + req.generated[r]
        self.rid[s], self.ctx[s], self.blocks[s] = r, 0, 0
        self.left[s] = req.output_len[r] - req.generated[r]
        self.out[s] = req.generated[r]
        self.max_new[s] = max(self.cfg.max_new_tokens, req.output_len[r]) if self.cfg.max_new_tokens \
            else req.output_len[r]
        self.seq[s] = self._admitted
        self.last_tok[s] = req.last_token[r]
        self.gap_max[s] = req.max_gap[r]
        self._admitted += 1
        self.pf_left[s] = self.pf_total[s] = p
        self._prefilling.append(s)
        return s

    def _chunk(self, batch: Batch, chunks: list[int], s: int, budget: int) -> int:
        """Put up to ``budget`` more tokens of slot ``s``'s prompt in the batch; returns how many."""
        take = min(self.pf_left[s], budget)
        batch.chunk_starts.append(self.pf_total[s] - self.pf_left[s])
        batch.chunk_lens.append(take)
        batch.prefill_tokens += take
        self.pf_left[s] -= take
        self.tokens_prefilled += take
        chunks.append(s)
        return take

    def _decode_rows(self, rows: np.ndarray, batch: Batch) -> np.ndarray | None:
        """The decode rows' contexts grow by the token they make; None when there are none."""
        if not rows.any():
            return None
        self.ctx += rows
        batch.decode_ctx = self.ctx[rows]
        return rows

    def _requeue(self, s: int, now: float, *, front: bool) -> None:
        """Take a running request out (preempted or retracted): its KV is freed, its progress kept (it
        re-prefills prompt + generated tokens on return)."""
        r = int(self.rid[s])
        req = self.req
        req.generated[r] = int(req.output_len[r] - self.left[s])
        req.last_token[r] = float(self.last_tok[s])
        req.max_gap[r] = float(self.gap_max[s])
        req.preempted[r] += 1
        req.enqueued[r] = now
        if s in self._prefilling:
            self._prefilling.remove(s)
            self.tokens_prefilled -= self.pf_total[s] - self.pf_left[s]  # that work is lost
            self.pf_left[s] = 0
        self._release(s)
        if front:
            self.queue.appendleft(r)
        else:
            self.queue.append(r)
        self.preemptions += 1

    # --- postprocess --------------------------------------------------------------------------------
    def _complete_prefill(self, s: int, t: float, finished: list[FinishedRequest]) -> None:
        """The prompt is in KV: its first (or, after a preemption, next) token comes out now."""
        self._prefilling.remove(s)
        r = int(self.rid[s])
        self.ctx[s] = self.pf_total[s]
        self.left[s] -= 1
        self.out[s] += 1
        self.tokens_out += 1
        if math.isnan(self.req.first_token[r]):
            self.req.first_token[r] = t
        else:
            gap = t - self.last_tok[s]
            self._keep_itl(np.array([gap]))
            self.gap_max[s] = max(self.gap_max[s], gap)
        self.last_tok[s] = t
        if self.left[s] == 0:
            self._finish(s, t, "stop", finished)
        else:
            self.dec[s] = True

    def _finish(self, s: int, t: float, reason: str, finished: list[FinishedRequest]) -> None:
        r = int(self.rid[s])
        req = self.req
        req.finish[r], req.reason[r] = t, reason
        req.max_gap[r] = float(self.gap_max[s])
        out = req.output_len[r]
        finished.append(FinishedRequest(req.input_len[r], out, reason, req.first_token[r] - req.arrival[r],
                                        (t - req.first_token[r]) / (out - 1) if out > 1 else math.nan))
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
        self.out[s] = self.max_new[s] = 0
        self.dec[s] = False
        self._free_slots.append(s)
        self._released()

    def _released(self) -> None:
        """A request left the running set (the rules may clear a sticky state)."""

    def _keep_itl(self, gaps: np.ndarray) -> None:
        """Store gaps (float32); past ITL_KEEP values keep every stride-th, doubling the stride (bounded memory)."""
        if self._itl_stride > 1:
            gaps = gaps[:: self._itl_stride]
        self.itl.append(gaps.astype(np.float32))
        self._itl_n += gaps.size
        if self._itl_n > ITL_KEEP:
            kept = np.concatenate(self.itl)[::2]
            self.itl, self._itl_n, self._itl_stride = [kept], kept.size, self._itl_stride * 2
