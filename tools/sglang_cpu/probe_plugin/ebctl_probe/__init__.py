"""Throwaway SGLang plugin probe for ebctl (test infrastructure, not part of ebctl).

Registers hooks on the hook points ebctl's plugin means to use and appends one JSON line per event to
$EBCTL_PROBE_OUT, so a test can check the claims in tools/sglang_cpu/HOOKS.md against the real
sglang 0.5.23. $EBCTL_PROBE_MODE (comma-separated) adds interventions:

  defer:K  AROUND Scheduler._should_defer_prefill: also defer while 0 < running and free slots < K
  cap:C    AROUND Scheduler.get_num_allocatable_reqs: at most C running requests
  mix:alt  set Scheduler.is_mixed_chunk True on even iterations, False on odd ones
  mix:on / mix:off   set it every iteration
  drop:N   (unsafe on purpose) every N-th prefill batch formed while decodes run, return no batch
  raise:N  raise RuntimeError in the get_next_batch_to_run hook at iteration N
  regraise raise RuntimeError inside register(), after registering the hooks
  badtarget  also register a hook on a method that does not exist
The first iteration also logs one INFO and one WARNING line through logging.getLogger("ebctl_probe").
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

SCHED = "sglang.srt.managers.scheduler.Scheduler"
STREAMER = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"

logger = logging.getLogger("ebctl_probe")
_out = None
_iter = 0
_idle = 0
_prefills_seen = 0


def _modes() -> dict[str, str]:
    out = {}
    for item in filter(None, os.environ.get("EBCTL_PROBE_MODE", "").split(",")):
        key, _, val = item.partition(":")
        out[key.strip()] = val.strip()
    return out


MODES = _modes()


def _emit(rec: dict) -> None:
    global _out
    if _out is None:
        path = os.environ.get("EBCTL_PROBE_OUT", f"/tmp/ebctl_probe.{os.getpid()}.jsonl")
        _out = open(path, "a", buffering=1)  # noqa: SIM115 -- kept open for the process
    rec.setdefault("pid", os.getpid())
    rec.setdefault("t", time.monotonic())
    _out.write(json.dumps(rec) + "\n")


def _kv(s) -> dict:
    avail = s.token_to_kv_pool_allocator.available_size()
    evict = s.tree_cache.evictable_size()
    return {"kv_total": s.max_total_num_tokens, "kv_avail": avail, "kv_evictable": evict,
            "kv_used": s.max_total_num_tokens - avail - evict}


def _req_summary(req) -> dict:
    ts = req.time_stats
    fr = req.finished_reason
    return {
        "rid": req.rid,
        "input_len": len(req.origin_input_ids),
        "output_len": len(req.output_ids),
        "finished_len": req.finished_len,
        "reason": type(fr).__name__ if fr is not None else None,
        "reason_json": fr.to_json() if fr is not None else None,
        "ttft_s": (ts.prefill_finished_time - ts.wait_queue_entry_time)
        if ts.prefill_finished_time and ts.wait_queue_entry_time else None,
        "ttft_recv_s": (ts.prefill_finished_time - ts.scheduler_recv_time)
        if ts.prefill_finished_time and ts.scheduler_recv_time else None,
        "ts": {k: getattr(ts, k) for k in ("scheduler_recv_time", "wait_queue_entry_time",
                                           "forward_entry_time", "prefill_finished_time",
                                           "completion_time", "last_decode_finish_time")},
        "retractions": req.retraction_count,
    }


def _batch_summary(batch) -> dict:
    if batch is None:
        return {"mode": None}
    mode = batch.forward_mode
    decoding = batch.decoding_reqs or []
    d = {"mode": mode.name, "bs": batch.batch_size()}
    if mode.is_decode():
        d["n_decode"] = batch.batch_size()
        d["decode_ctx_sum"] = int(batch.seq_lens_cpu.sum()) if batch.seq_lens_cpu is not None else None
        d["n_prefill"], d["prefill_tokens"] = 0, 0
    elif mode.is_extend():
        n_dec = len(decoding) if mode.is_mixed() else 0
        d["n_prefill"] = batch.batch_size() - n_dec
        d["prefill_tokens"] = int(batch.extend_num_tokens) - n_dec
        d["n_decode"] = n_dec
        d["decode_ctx_sum"] = (int(batch.seq_lens_cpu[-n_dec:].sum())
                               if n_dec and batch.seq_lens_cpu is not None else 0)
        d["chunked"] = batch.chunked_req is not None if hasattr(batch, "chunked_req") else None
    return d


# ---- hooks -------------------------------------------------------------------------------------

def around_get_next_batch_to_run(original, self, *args, **kwargs):
    global _iter, _idle, _prefills_seen
    _iter += 1
    if _iter == 1:
        logger.info("ebctl_probe: INFO from inside the scheduler hook")
        logger.warning("ebctl_probe: WARNING from inside the scheduler hook")
    if "raise" in MODES and _iter == int(MODES["raise"]):
        raise RuntimeError("ebctl_probe: deliberate failure inside a hook")
    mix = MODES.get("mix")
    if mix == "alt":
        self.is_mixed_chunk = _iter % 2 == 0
    elif mix == "on":
        self.is_mixed_chunk = True
    elif mix == "off":
        self.is_mixed_chunk = False
    if "cap" in MODES:  # a raised cap must reopen admission (batch_is_full is sticky)
        self.running_batch.batch_is_full = False

    t0 = time.perf_counter()
    plan = original(self, *args, **kwargs)
    t_sched = time.perf_counter() - t0

    batch = plan.batch_to_run
    dropped = False
    if "drop" in MODES and batch is not None and batch.forward_mode.is_extend() \
            and not plan.running_batch.is_empty():
        _prefills_seen += 1
        if _prefills_seen % int(MODES["drop"]) == 0:
            dropped = True
            plan = type(plan)(batch_to_run=None, running_batch=plan.running_batch)
    if batch is None and not dropped:
        _idle += 1
        return plan
    rec = {"ev": "iter", "iter": _iter, "idle_before": _idle, "overlap": self.enable_overlap,
           "sched_s": t_sched, "running": plan.running_batch.batch_size(),
           "waiting": len(self.waiting_queue), "is_mixed_chunk": self.is_mixed_chunk,
           "chunked_prefill_size": self.chunked_prefill_size,
           "max_running_requests": self.max_running_requests, "dropped": dropped,
           "kwargs": sorted(kwargs), "nargs": len(args), **_kv(self), **_batch_summary(batch)}
    _idle = 0
    _emit(rec)
    return plan


def around_run_batch(original, self, batch, *args, **kwargs):
    t0 = time.perf_counter()
    result = original(self, batch, *args, **kwargs)
    _emit({"ev": "run", "forward_iter": batch.forward_iter, "mode": batch.forward_mode.name,
           "bs": batch.batch_size(), "run_s": time.perf_counter() - t0})
    return result


def around_process_batch_result(original, self, batch, result, *args, **kwargs):
    pending = [r for r in batch.reqs if not r.finished_output]
    t0 = time.perf_counter()
    out = original(self, batch, result, *args, **kwargs)
    t1 = time.perf_counter()
    done = [r for r in pending if r.finished_output]
    _emit({"ev": "result", "forward_iter": getattr(batch, "forward_iter", None),
           "mode": batch.forward_mode.name, "bs": batch.batch_size(), "process_s": t1 - t0,
           # batch.copy() (overlap loop) keeps launch_ts and forward_iter
           "launch_to_done_s": (time.monotonic() - batch.launch_ts)
           if getattr(batch, "launch_ts", None) else None,
           "finished": [_req_summary(r) for r in done], **_kv(self)})
    return out


def around_stream_output(original, self, reqs, *args, **kwargs):
    skip = kwargs.get("skip_req", args[1] if len(args) > 1 else None)
    newly = [r for r in reqs if r is not skip and r.finished() and not r.finished_output]
    out = original(self, reqs, *args, **kwargs)
    rids = [r.rid for r in newly if r.finished_output]
    if rids:
        _emit({"ev": "stream_fin", "rids": rids})
    return out


def around_send_abort_output(original, self, abort_req, req, *args, **kwargs):
    _emit({"ev": "abort_output", "rid": req.rid, "input_len": len(req.origin_input_ids),
           "output_len": len(req.output_ids), "finished_output": req.finished_output,
           "finished": req.finished()})
    return original(self, abort_req, req, *args, **kwargs)


def around_should_defer_prefill(original, self, running_batch):
    if original(self, running_batch):
        return True
    k = int(MODES["defer"])
    running = running_batch.batch_size()
    free = self.max_running_requests - running
    defer = running > 0 and free < k and self.chunked_req is None
    if defer:
        _emit({"ev": "defer", "running": running, "free": free, "waiting": len(self.waiting_queue)})
    return defer


def around_get_num_allocatable_reqs(original, self, running_bs, *args, **kwargs):
    res = original(self, running_bs, *args, **kwargs)
    return min(res, int(MODES["cap"]) - running_bs)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _emit({"ev": "register", "argv0": sys.argv[0], "modes": MODES,
           "scheduler_imported": "sglang.srt.managers.scheduler" in sys.modules,
           "proctitle": _proctitle()})
    reg = HookRegistry.register
    reg(f"{SCHED}.get_next_batch_to_run", around_get_next_batch_to_run, HookType.AROUND)
    reg(f"{SCHED}.run_batch", around_run_batch, HookType.AROUND)
    reg(f"{SCHED}.process_batch_result", around_process_batch_result, HookType.AROUND)
    reg(f"{STREAMER}.stream_output", around_stream_output, HookType.AROUND)
    reg(f"{SCHED}.send_abort_output", around_send_abort_output, HookType.AROUND)
    if "defer" in MODES:
        reg(f"{SCHED}._should_defer_prefill", around_should_defer_prefill, HookType.AROUND)
    if "cap" in MODES:
        reg(f"{SCHED}.get_num_allocatable_reqs", around_get_num_allocatable_reqs, HookType.AROUND)
    if "badtarget" in MODES:
        reg(f"{SCHED}.no_such_method", around_run_batch, HookType.AROUND)
    logger.warning("ebctl_probe: register() ran in pid %d", os.getpid())
    if "regraise" in MODES:
        raise RuntimeError("ebctl_probe: deliberate failure inside register()")


def _proctitle() -> str | None:
    try:
        import setproctitle

        return setproctitle.getproctitle()
    except Exception:
        return None
