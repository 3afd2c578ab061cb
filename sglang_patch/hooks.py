"""Where ebctl touches SGLang: every hook target in one constant, each hook a few lines.

All hooks are AROUND hooks on ``Scheduler`` methods, and one on sglang's request receiver
(tools/sglang_cpu/HOOKS.md says why each one; ``group.py`` why the two on the request path). A hook calls
the original exactly once, with the arguments it was given (the request path: less ebctl's own envelope),
and runs the ebctl part, a method of ``STATE`` (one :class:`~sglang_patch.state.PluginState` per process)
or a function below, under the fail-open guard (``guard.guarded``): any exception there switches the plugin
off in this process (a follower rank of a group: in its whole group, ``state.py``), logged once, stock
settings restored, and the hook returns what the original returned.

``STATE.ns`` adds up the time of the guarded parts of an iteration (``perf_counter_ns``, status:
``hook_ns``); ``allocatable``'s part (a subtraction and a comparison, called once per candidate request while
sglang forms a prefill) is left out: timing it would cost more than it does. tools/bench_hook.py's replay
times every hook whole.
"""

from __future__ import annotations

import math
from time import monotonic, thread_time_ns
from typing import Any, Final

from sglang_patch import group, lifecycle
from sglang_patch.guard import guarded
from sglang_patch.state import PluginState

SCHEDULER: Final = "sglang.srt.managers.scheduler.Scheduler"
RECEIVER: Final = "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver"
INQUIRER: Final = "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer"

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
    "loads": f"{INQUIRER}.get_loads",  # /v1/loads (what smg polls) shows the running cap in force
}

STATE = PluginState()

# The parts the hooks run, looked up once: a module global is read faster than a class attribute.
END_STEP, DEFER, ALLOCATABLE, RAN = PluginState.end_step, PluginState.defer, PluginState.allocatable, PluginState.ran
BEFORE_RESULT, AFTER_RESULT, ABORTED = PluginState.before_result, PluginState.after_result, PluginState.aborted


def broadcast(original, receiver, recv_reqs, local_reqs=None, *args, **kwargs):
    st = STATE
    if st.setup.leads:
        if st.on:
            local_reqs = guarded(st, "broadcast", outgoing, None, None, local_reqs, None, True)
        if st.farewell:  # switched off, in this hook or since the last: every rank goes stock with this one
            local_reqs = guarded(st, "broadcast", farewell, None, None, local_reqs, None, True)
    return original(receiver, recv_reqs, local_reqs, *args, **kwargs)


def outgoing(st: PluginState, _sched: Any, _arg: Any, local_reqs: list | None) -> list | None:
    """The source's ``local_reqs`` (they ride the broadcast) with this iteration's envelope."""
    env = st.envelope(monotonic())
    return local_reqs if env is None else [*(local_reqs or ()), env]


def farewell(st: PluginState, _sched: Any, _arg: Any, local_reqs: list | None) -> list:
    return [*(local_reqs or ()), st.farewell_envelope(monotonic())]


def process_input(original, sched, recv_reqs, *args, **kwargs):
    st = STATE
    if recv_reqs and st.setup.group > 1:  # a group of one never sees an envelope
        reqs = guarded(st, "process_input", take, sched, recv_reqs, None, None, True)
        recv_reqs = guarded(st, "process_input", strip, sched, recv_reqs, recv_reqs, None, False) \
            if reqs is None else reqs
    return original(sched, recv_reqs, *args, **kwargs)


def take(st: PluginState, sched: Any, recv_reqs: list, _: Any) -> list:
    """The requests without the envelope, which every rank (the source too) applies first."""
    recv_reqs, env = group.split(recv_reqs)
    if env is not None and st.on:
        st.receive(sched, env)
    return recv_reqs


def strip(_st: PluginState, _sched: Any, recv_reqs: list, _: Any) -> list:
    """The requests without envelopes, after ``take`` raised: sglang never sees one."""
    return [r for r in recv_reqs if not group.is_envelope(r)]


def next_batch(original, sched, *args, **kwargs):
    plan = original(sched, *args, **kwargs)
    st = STATE
    if st.on:
        guarded(st, "next_batch", END_STEP, sched, plan, None, plan.running_batch, True)
    return plan


def defer_prefill(original, sched, running_batch, *args, **kwargs):
    stock = original(sched, running_batch, *args, **kwargs)
    st = STATE
    if st.gate_policy is not None or (st.trace is not None and st.on):  # no policy, no trace: stock untouched
        return guarded(st, "defer_prefill", DEFER, sched, running_batch, stock, running_batch, True)
    return stock


def allocatable(original, sched, running_bs, *args, **kwargs):
    n = original(sched, running_bs, *args, **kwargs)
    st = STATE
    if st.cap is None:
        return n
    return guarded(st, "allocatable", ALLOCATABLE, sched, running_bs, n, kwargs.get("running_batch"), False)


def run_batch(original, sched, batch, *args, **kwargs):
    st = STATE
    if not st.on:
        return original(sched, batch, *args, **kwargs)
    if st.setup.sync_forward:  # CPU: the forward runs on this thread; its CPU time leaves out other processes' turns
        c = thread_time_ns()
        result = original(sched, batch, *args, **kwargs)
        spent = (thread_time_ns() - c) * 1e-9
    else:  # GPU: run_batch only launches; the forward is timed at result time (batch_result)
        result = original(sched, batch, *args, **kwargs)
        spent = math.nan
    guarded(st, "run_batch", RAN, sched, batch, spent, None, True)
    return result


def batch_result(original, sched, batch, result, *args, **kwargs):
    st = STATE
    if st.on and not st.setup.sync_forward:  # GPU: the forward's end is when its results are ready
        guarded(st, "batch_result", BEFORE_RESULT, sched, result, None, None, True)
    out = original(sched, batch, result, *args, **kwargs)
    if st.on:
        guarded(st, "batch_result", AFTER_RESULT, sched, batch, None, None, True)
    return out


def abort_output(original, sched, abort_req, req, *args, **kwargs):
    out = original(sched, abort_req, req, *args, **kwargs)
    st = STATE
    if st.on:
        guarded(st, "abort_output", ABORTED, sched, req, None, None, False)
    return out


def internal_state(original, sched, *args, **kwargs):
    out = original(sched, *args, **kwargs)
    guarded(STATE, "internal_state", show, sched, out, None, None, False)
    return out


def show(st: PluginState, sched: Any, out: Any, _: Any) -> None:
    """The status in ``GET /server_info``. A rank alone in its group refreshes the policy first (an idle
    engine does not); in a group only the broadcast changes it (ranks must not diverge)."""
    if st.on and st.ready and st.setup.group == 1:
        st.refresh(sched, monotonic())
    out.internal_state["ebctl"] = lifecycle.status(st, sched)


def loads(original, inquirer, *args, **kwargs):
    snapshot = original(inquirer, *args, **kwargs)
    st = STATE
    if st.cap is not None:
        guarded(st, "loads", capped_loads, None, snapshot, None, None, False)
    return snapshot


def capped_loads(st: PluginState, _sched: Any, snapshot: Any, _: Any) -> None:
    """This rank's load snapshot (``LoadSnapshot``, a mutable msgspec Struct; built by load_inquirer.py
    109-250, published by scheduler.py 884, read by ``GET /v1/loads``) says the running cap ebctl applies,
    N̂*, where it is below sglang's ``--max-running-requests``: a gateway reading ``max_running_requests``
    sees the capacity the server has under the policy. The waiting counts need nothing: requests the gate or
    the cap holds stay in ``waiting_queue``, which sglang counts."""
    cap = st.cap
    if cap is not None and cap < snapshot.max_running_requests:
        snapshot.max_running_requests = cap


HOOKS: Final = {"broadcast": broadcast, "input": process_input, "next_batch": next_batch,
                "defer_prefill": defer_prefill, "allocatable": allocatable, "run_batch": run_batch,
                "batch_result": batch_result, "abort_output": abort_output, "internal_state": internal_state,
                "loads": loads}


def install() -> None:
    """Register every hook with SGLang's HookRegistry (applied by ``load_plugins`` right after)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name, target in HOOK_TARGETS.items():
        HookRegistry.register(target, HOOKS[name], HookType.AROUND)
