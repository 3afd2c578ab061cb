"""Read what a report needs from sglang 0.5.23's objects (tools/sglang_cpu/HOOKS.md, sections 2-5).

Plain functions of the objects they are given; nothing here writes to sglang or keeps state. What the
reports read is here; the few Scheduler attributes the control reads or sets (``is_mixed_chunk``,
``chunked_prefill_size``, ``chunked_req``, ``waiting_queue``, ``running_batch.batch_is_full``,
``forward_ct``, ``max_running_requests``, ``device``) are named in state.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import mul
from time import perf_counter
from typing import Any, NamedTuple

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


def batch_shape(batch: Any, kind: BatchKind, seq_lens_sum: int | None = None) -> tuple[int, int, int, int, int]:
    """(prefill requests, prefill tokens, decode requests, decode context tokens, prefill context tokens) of an
    executed batch.

    ``seq_lens_sum``: the batch's ``seq_lens_sum`` as its forward left it (``ForwardBatch.init_new`` sets
    it), if known; else the batch's own attribute, else the sum of ``seq_lens_cpu`` (a tensor operation,
    ~1.5 µs: the reason to pass it). MIXED: ``mix_with_running`` appends the decode rows after the prefill
    rows and one token per decode row to ``extend_num_tokens``; ``seq_lens_cpu`` already counts the token
    being produced. Prefill context: each prefill row's ``extend_lens`` e and ``prefix_lens`` p (lists that
    ``prepare_for_extend`` sets, schedule_batch.py:2885-2886, ``mix_with_running`` extends with the decode rows,
    3358-3359, and ``copy`` keeps for result processing, 4000-4001), e·p + e(e + 1)/2 summed.
    """
    bs = len(batch.reqs)
    if kind is BatchKind.DECODE:
        ctx = batch.seq_lens_sum if seq_lens_sum is None else seq_lens_sum
        return 0, 0, bs, _total(batch.seq_lens_cpu) if ctx is None else ctx, 0
    if kind is BatchKind.IDLE:
        return 0, 0, 0, 0, 0
    n_dec = len(batch.decoding_reqs or ()) if kind is BatchKind.MIXED else 0
    tokens = (batch.extend_num_tokens or 0) - n_dec
    ctx = _total(batch.seq_lens_cpu[-n_dec:]) if n_dec and batch.seq_lens_cpu is not None else 0
    return bs - n_dec, max(tokens, 0), n_dec, ctx, prefill_ctx(batch.extend_lens, batch.prefix_lens, bs - n_dec)


def prefill_ctx(extend_lens: list[int] | None, prefix_lens: list[int] | None, rows: int) -> int:
    """Σ e·p + e(e + 1)/2 over the first ``rows`` rows (the prefill rows: a mixed batch's decode rows come after
    them); 0 where sglang did not set the lists."""
    if not extend_lens or not prefix_lens:
        return 0
    e, p = extend_lens[:rows], prefix_lens[:rows]
    # map(mul) over lists: 1.2 µs for 8 rows, 65 µs for 1,000 (a prefill batch's rows share its token budget)
    return sum(map(mul, e, p)) + (sum(map(mul, e, e)) + sum(e)) // 2


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
    """The report entry of a request that ended; None for sglang's own health checks. Its times come from the
    request's ``time_stats`` (``observability/req_time_stats.py`` 612-660, ``time.perf_counter``): TTFT from the
    scheduler's receipt to the end of its prefill, TPOT from there to its completion over the tokens after the first."""
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
    # the last token: completion_time, stamped while the batch that made it is processed (batch_result_processor),
    # as prefill_finished_time was for the first; else now, on the same clock (perf_counter)
    end = ts.completion_time if ts.completion_time > 0.0 else perf_counter()
    tpot = (end - first) / (out - 1) if first > 0.0 and out > 1 and reason != "abort" else math.nan
    return FinishedRequest(len(req.origin_input_ids), out, reason, ttft, tpot)


def _reason_json(fr: Any) -> str:
    try:
        return str(fr.to_json().get("type") or "stop")
    except Exception:
        return "stop"


class Ranks(NamedTuple):
    """Where this scheduler sits. ``dp``: the data-parallel rank the engine id carries (sglang's ``dp_rank``,
    else the attention-DP rank, else 0); ``source``: this rank originates the group's requests (attention-TP
    rank 0, attention-CP rank 0, PP stage 0: ``SchedulerRequestReceiver._pull_raw_reqs``,
    scheduler_components/request_receiver.py:113-160); ``group``: the number of schedulers that must take
    identical scheduling decisions (attention TP × attention CP × PP: they run one scheduler each over the
    same requests and form the same batches); ``rank``: this scheduler's place (PP stage × TP size + TP rank),
    for traces."""

    dp: int
    source: bool
    group: int
    rank: int = 0


def ranks() -> Ranks:
    """This scheduler's :class:`Ranks`, read from sglang's runtime context."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    dp = p.dp_rank if p.dp_rank is not None else (getattr(p, "attn_dp_rank", 0) or 0)
    cp_size, cp_rank = int(getattr(p, "attn_cp_size", 1) or 1), int(getattr(p, "attn_cp_rank", 0) or 0)
    group = int(p.attn_tp_size or 1) * cp_size * int(p.pp_size or 1)
    source = int(p.attn_tp_rank or 0) == 0 and cp_rank == 0 and int(p.pp_rank or 0) == 0
    rank = int(p.pp_rank or 0) * int(p.tp_size or 1) + int(p.tp_rank or 0)
    return Ranks(int(dp), source, group, rank)


def mixing_blockers(sched: Any) -> list[str]:
    """What in this server's configuration rules out mixed batches even if ``is_mixed_chunk`` were set at
    run time. sglang turns ``--enable-mixed-chunk`` off, or refuses it, for these (0.5.23):
    speculative decoding (arg_groups/speculative_hook.py:596, 1002, 1108, 1307; validation_hook.py:231),
    diffusion LLMs (dllm_hook.py:115), HiSparse (hisparse_hook.py:83), megamoe layernorm SP
    (layernorm_sp_hook.py:46), the DSA/NSA attention backend (layers/attention/dsa_backend.py:688) and
    prefill CUDA graphs (model_executor/runner/prefill_cuda_graph_runner.py:315, which need a padded graph
    backend when mixing) — and mixing needs chunked prefill (scheduler.py:1376)."""
    args = sched.server_args
    out = []
    if sched.chunked_prefill_size is None:
        out.append("chunked prefill is off")
    if getattr(args, "speculative_algorithm", None):
        out.append(f"speculative decoding ({args.speculative_algorithm})")
    if getattr(args, "dllm_algorithm", None):
        out.append(f"diffusion LLM ({args.dllm_algorithm})")
    if getattr(args, "enable_hisparse", False):
        out.append("HiSparse")
    if getattr(args, "enable_megamoe_for_layernorm_sp", False):
        out.append("megamoe layernorm SP")
    backends = {getattr(args, a, None) for a in ("attention_backend", "prefill_attention_backend")}
    if backends & {"dsa", "nsa"}:
        out.append("DSA attention backend")
    runner = getattr(getattr(getattr(sched, "tp_worker", None), "model_runner", None), "prefill_cuda_graph_runner",
                     None)
    if runner is not None and type(runner).__name__ != "EagerRunner":
        out.append("prefill CUDA graphs")
    return out


def mixed_unavailable_reason(sched: Any, *, allow_without_flag: bool) -> str:
    """Why ``mb`` cannot mix on this server ("" when it can). Mixing is on only where sglang itself set
    ``is_mixed_chunk`` at launch (scheduler.py:1376: ``--enable-mixed-chunk`` with chunked prefill, not turned
    off by sglang for a configuration it cannot mix), or, with ``engine.mixed_without_flag``, where none of
    :func:`mixing_blockers` applies."""
    if sched.is_mixed_chunk:
        return ""
    blockers = mixing_blockers(sched)
    if blockers:
        return "cannot mix here: " + ", ".join(blockers)
    if allow_without_flag:
        return ""
    return "server started without --enable-mixed-chunk (engine.mixed_without_flag = true allows mb anyway)"
