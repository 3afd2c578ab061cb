"""Read what a report needs from sglang 0.5.23's objects (tools/sglang_cpu/HOOKS.md, sections 2-5).

Plain functions of the objects they are given; nothing here writes to sglang or keeps state. What the
reports read is here; the few Scheduler attributes the control reads or sets (``is_mixed_chunk``,
``chunked_prefill_size``, ``chunked_req``, ``waiting_queue``, ``running_batch.batch_is_full``,
``forward_ct``, ``max_running_requests``, ``device``) are named in state.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ebctl.protocol import BatchKind, FinishedRequest

HEALTH_CHECK_PREFIX = "HEALTH_CHECK"  # sglang.srt.constants.HEALTH_CHECK_RID_PREFIX: not user traffic

# type(req.finished_reason).__name__ -> FinishedRequest.finish_reason (schedule_batch.py:279-345)
_REASONS = {"FINISH_MATCHED_TOKEN": "stop", "FINISH_MATCHED_STR": "stop", "FINISHED_MATCHED_REGEX": "stop",
            "FINISH_LENGTH": "length", "FINISH_ABORT": "abort"}


def batch_kinds() -> dict[Any, BatchKind]:
    """``ForwardMode`` → the kind a report gives it; modes not listed (PREBUILT, DRAFT_EXTEND_V2) run no
    forward of their own and are not reported."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as M

    return {M.EXTEND: BatchKind.PREFILL, M.SPLIT_PREFILL: BatchKind.PREFILL, M.DLLM_EXTEND: BatchKind.PREFILL,
            M.MIXED: BatchKind.MIXED, M.DECODE: BatchKind.DECODE, M.TARGET_VERIFY: BatchKind.DECODE,
            M.IDLE: BatchKind.IDLE}


def batch_shape(batch: Any, kind: BatchKind, seq_lens_sum: int | None = None) -> tuple[int, int, int, int]:
    """(prefill requests, prefill tokens, decode requests, decode context tokens) of an executed batch.

    ``seq_lens_sum``: the batch's ``seq_lens_sum`` as its forward left it (``ForwardBatch.init_new`` sets
    it), if known; else the batch's own attribute, else the sum of ``seq_lens_cpu`` (a tensor operation,
    ~1.5 µs: the reason to pass it). MIXED: ``mix_with_running`` appends the decode rows after the prefill
    rows and one token per decode row to ``extend_num_tokens``; ``seq_lens_cpu`` already counts the token
    being produced.
    """
    bs = len(batch.reqs)
    if kind is BatchKind.DECODE:
        ctx = batch.seq_lens_sum if seq_lens_sum is None else seq_lens_sum
        return 0, 0, bs, _total(batch.seq_lens_cpu) if ctx is None else ctx
    if kind is BatchKind.IDLE:
        return 0, 0, 0, 0
    n_dec = len(batch.decoding_reqs or ()) if kind is BatchKind.MIXED else 0
    tokens = (batch.extend_num_tokens or 0) - n_dec
    ctx = _total(batch.seq_lens_cpu[-n_dec:]) if n_dec and batch.seq_lens_cpu is not None else 0
    return bs - n_dec, max(tokens, 0), n_dec, ctx


def _total(lens: Any) -> int:
    """Sum of a small CPU int tensor: through a list below ~100 entries (5x cheaper there), else torch."""
    if lens is None:
        return 0
    return sum(lens.tolist()) if len(lens) < 96 else int(lens.sum())


def kv_tokens(sched: Any) -> tuple[int, int]:
    """(used, total) KV tokens, as sglang's "token usage" log counts them (evictable cache is free)."""
    return kv_used_reader(sched)(), sched.max_total_num_tokens


def kv_used_reader(sched: Any) -> Callable[[], int]:
    """A function of no arguments that returns the KV tokens in use now (as :func:`kv_tokens`). The
    allocator and the tree cache are built once in ``Scheduler.__init__`` (scheduler.py:610-615) and never
    replaced, so their bound methods are looked up here once, not every iteration."""
    total = sched.max_total_num_tokens
    available, evictable = sched.token_to_kv_pool_allocator.available_size, sched.tree_cache.evictable_size

    def used() -> int:
        u = total - available() - evictable()
        return u if u > 0 else 0

    return used


def finished_request(req: Any) -> FinishedRequest | None:
    """The report entry of a request that ended; None for sglang's own health checks."""
    rid = req.rid
    if isinstance(rid, str) and rid.startswith(HEALTH_CHECK_PREFIX):
        return None
    out = req.finished_len if req.finished_len is not None else len(req.output_ids)
    fr = req.finished_reason
    reason = "abort" if fr is None else _REASONS.get(type(fr).__name__) or _reason_json(fr)
    ts = req.time_stats
    first = ts.prefill_finished_time
    start = ts.scheduler_recv_time or ts.wait_queue_entry_time
    ttft = first - start if first > 0.0 and start > 0.0 else math.nan
    return FinishedRequest(len(req.origin_input_ids), out, reason, ttft)


def _reason_json(fr: Any) -> str:
    try:
        return str(fr.to_json().get("type") or "stop")
    except Exception:
        return "stop"


def ranks() -> tuple[int, int, int]:
    """(dp rank, attention-TP rank, width of the group that must take identical scheduling decisions).

    The dp rank is sglang's ``dp_rank`` (None without a DP controller), else the attention-DP rank (DP
    attention inside one TP group: each rank schedules its own requests), else 0. Attention-TP/CP and PP
    ranks run one scheduler each over the same requests and must form identical batches.
    """
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    dp = p.dp_rank if p.dp_rank is not None else (getattr(p, "attn_dp_rank", 0) or 0)
    width = int(p.attn_tp_size or 1) * int(getattr(p, "attn_cp_size", 1) or 1) * int(p.pp_size or 1)
    return int(dp), int(p.attn_tp_rank or 0), width
