"""Where ebctl touches SGLang: every hook target in one constant, each hook a few lines.

``STATE.ns`` adds up the time spent in the ebctl parts of an iteration (``perf_counter_ns``, status:
``hook_ns``); the one-line part of ``allocatable`` (a subtraction and a comparison, called once per
candidate request while sglang forms a prefill) is left out: timing it would cost more than it does.
tools/bench_hook.py's replay times every hook whole.

All hooks are AROUND hooks on ``Scheduler`` methods, and one on sglang's request receiver
(tools/sglang_cpu/HOOKS.md says why each one; ``group.py`` why the two on the request path). A hook calls
the original exactly once, with the arguments it was given (the request path: less ebctl's own envelope),
and asks ``STATE`` (one :class:`~sglang_patch.state.PluginState` per process) for the ebctl part. sglang
catches nothing a hook raises (the scheduler, and with it the server, would die), so every ebctl part runs
under ``try``: any exception switches the plugin off in this process (logged once, stock settings
restored) and the hook returns what the original returned.
"""

from __future__ import annotations

import math
from time import monotonic, perf_counter_ns, thread_time_ns
from typing import Final

from sglang_patch import group
from sglang_patch.state import PluginState

SCHEDULER: Final = "sglang.srt.managers.scheduler.Scheduler"
RECEIVER: Final = "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver"

HOOK_TARGETS: Final[dict[str, str]] = {
    "broadcast": f"{RECEIVER}._broadcast_reqs_across_ranks",  # the group's source adds the policy envelope
    "input": f"{SCHEDULER}.process_input_requests",  # every rank of a group takes the envelope out, applies it
    "next_batch": f"{SCHEDULER}.get_next_batch_to_run",  # note the planned step; read + apply the policy
    "defer_prefill": f"{SCHEDULER}._should_defer_prefill",  # the gate: may a prefill form now?
    "allocatable": f"{SCHEDULER}.get_num_allocatable_reqs",  # admission cap: n_max running
    "run_batch": f"{SCHEDULER}.run_batch",  # forward time (CPU: run_batch is synchronous); seq_lens_sum
    "batch_result": f"{SCHEDULER}.process_batch_result",  # report the step and its finished requests
    "abort_output": f"{SCHEDULER}.send_abort_output",  # requests ended outside the output stream
    "internal_state": f"{SCHEDULER}.get_internal_state",  # status in GET /server_info
}

STATE = PluginState()


def broadcast(original, receiver, recv_reqs, local_reqs=None, *args, **kwargs):
    st = STATE
    if st.group > 1 and st.reporting and (st.on or st.farewell):
        now = monotonic()
        try:
            env = st.envelope(now)
        except Exception:
            st.fail("broadcast")
            env = st.envelope(now)  # the farewell: the whole group goes stock with this rank, this iteration
        if env is not None:
            local_reqs = [*(local_reqs or ()), env]  # local_reqs ride the broadcast from the source rank
    return original(receiver, recv_reqs, local_reqs, *args, **kwargs)


def process_input(original, sched, recv_reqs, *args, **kwargs):
    st = STATE
    if recv_reqs and st.group > 1:  # a group of one never sees an envelope
        try:
            recv_reqs, env = group.split(recv_reqs)
            if env is not None and st.on:
                st.receive(sched, env)
        except Exception:
            recv_reqs = [r for r in recv_reqs if not group.is_envelope(r)]
            st.fail("process_input", None, sched)
    return original(sched, recv_reqs, *args, **kwargs)


def next_batch(original, sched, *args, **kwargs):
    plan = original(sched, *args, **kwargs)
    st = STATE
    if st.on:
        t = perf_counter_ns()
        try:
            st.end_step(sched, plan)
        except Exception:
            st.fail("next_batch", getattr(plan, "running_batch", None), sched)
        st.ns += perf_counter_ns() - t
    return plan


def defer_prefill(original, sched, running_batch, *args, **kwargs):
    stock = original(sched, running_batch, *args, **kwargs)
    st = STATE
    if stock or st.gate_policy is None:  # stock defers (--prefill-decode-interval), or no policy: stock
        if st.trace is not None and st.on:
            try:
                st.trace_decision("stock", len(running_batch.reqs), len(sched.waiting_queue))
            except Exception:
                st.fail("defer_prefill", running_batch, sched)
        return stock
    t = perf_counter_ns()
    try:
        stock = st.defer(sched, running_batch)
    except Exception:
        st.fail("defer_prefill", running_batch, sched)
    st.ns += perf_counter_ns() - t
    return stock


def allocatable(original, sched, running_bs, *args, **kwargs):
    n = original(sched, running_bs, *args, **kwargs)
    st = STATE
    if st.cap is None:
        return n
    try:
        return st.allocatable(running_bs, n)
    except Exception:
        st.fail("allocatable", kwargs.get("running_batch"), sched)
    return n


def run_batch(original, sched, batch, *args, **kwargs):
    st = STATE
    if not st.on:
        return original(sched, batch, *args, **kwargs)
    if st.sync_forward:  # CPU: the forward runs on this thread; its CPU time leaves out other processes' turns
        c = thread_time_ns()
        result = original(sched, batch, *args, **kwargs)
        spent = (thread_time_ns() - c) * 1e-9
    else:  # GPU: run_batch only launches; the forward is timed at result time (batch_result)
        result = original(sched, batch, *args, **kwargs)
        spent = math.nan
    t1 = perf_counter_ns()
    try:
        st.ran(batch, spent)
    except Exception:
        st.fail("run_batch", None, sched)
    st.ns += perf_counter_ns() - t1
    return result


def batch_result(original, sched, batch, result, *args, **kwargs):
    st = STATE
    if st.on and not st.sync_forward:  # GPU: the forward's end is when its results are ready
        t = perf_counter_ns()
        try:
            st.before_result(result)
        except Exception:
            st.fail("batch_result", None, sched)
        st.ns += perf_counter_ns() - t
    out = original(sched, batch, result, *args, **kwargs)
    if st.on:
        t = perf_counter_ns()
        try:
            st.after_result(sched, batch)
        except Exception:
            st.fail("batch_result", None, sched)
        st.ns += perf_counter_ns() - t
    return out


def abort_output(original, sched, abort_req, req, *args, **kwargs):
    out = original(sched, abort_req, req, *args, **kwargs)
    st = STATE
    if st.on:
        try:
            st.aborted(req)
        except Exception:
            st.fail("abort_output", None, sched)
    return out


def internal_state(original, sched, *args, **kwargs):
    out = original(sched, *args, **kwargs)
    try:
        out.internal_state["ebctl"] = STATE.status(sched)
    except Exception:
        STATE.fail("internal_state", None, sched)
    return out


HOOKS: Final = {"broadcast": broadcast, "input": process_input, "next_batch": next_batch,
                "defer_prefill": defer_prefill, "allocatable": allocatable, "run_batch": run_batch,
                "batch_result": batch_result, "abort_output": abort_output, "internal_state": internal_state}


def install() -> None:
    """Register every hook with SGLang's HookRegistry (applied by ``load_plugins`` right after)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name, target in HOOK_TARGETS.items():
        HookRegistry.register(target, HOOKS[name], HookType.AROUND)
