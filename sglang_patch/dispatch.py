"""Where ebctl touches sglang's data-parallel controller: every hook target in one constant (as ``hooks.py``
for the schedulers), each hook a few lines; the state is ``dispatch_state.DispatchState``.

The controller process (``sglang::data_parallel_controller``, data_parallel_controller.py:948-1012) runs
``load_plugins()``; ``sglang_patch.register`` installs these hooks there (and in the launcher, which imports
the module but never runs the loop). They arm on the first ``event_loop`` call, so only in that process.

* ``event_loop`` (AROUND): sglang's loop (:927-935) spins on a non-blocking receive and has no timer, but
  releases must happen on an interval while no message arrives. While armed the plugin owns the loop: the
  same steps (feed the soft watchdog, receive, ``_request_dispatcher``) with a wait on the socket bounded by
  the next tick, and the tick (``DispatchState.tick``) between. When the plugin switches off, sglang's own
  loop takes over for good. An exception raised by sglang's own dispatch ends the loop, the buffer is flushed,
  and it escapes as it would from stock.
* ``dispatch`` (AROUND ``dispatching_with_trace``, :363-383): a generate request without ``routed_dp_rank``
  is held (not passed on); everything else, and every release (``routed_dp_rank`` set), goes to the
  original.
* ``control`` (AROUND ``send_control_message``, :274-278, the dispatcher's fallback for every other message,
  aborts included) and ``to_all`` (AROUND ``send_to_all_workers``, :269-272: block, profile): an abort first
  releases the requests it names; any other message that can change state first flushes the buffer.

sglang catches nothing a hook raises inside its loop (the controller would die and take the server with it),
so every ebctl part runs under the fail-open guard (``guard.guarded``, as in the schedulers): an exception
switches the dispatcher off in this process (logged once, buffer flushed through sglang's own dispatch) and the
hook goes on as stock.
"""

from __future__ import annotations

from time import monotonic
from typing import Any, Final

from sglang_patch.dispatch_state import DispatchState
from sglang_patch.guard import guarded

MODULE: Final = "sglang.srt.managers.data_parallel_controller"
DPC: Final = f"{MODULE}.DataParallelController"

DISPATCH_TARGETS: Final[dict[str, str]] = {
    "event_loop": f"{DPC}.event_loop",  # own the loop while armed: receive with a bounded wait, then tick
    "dispatch": f"{DPC}.dispatching_with_trace",  # hold a generate request (SBS), or pass it on
    "control": f"{DPC}.send_control_message",  # aborts release what they name; other messages flush first
    "to_all": f"{DPC}.send_to_all_workers",  # block / profile: flush first
}

STATE = DispatchState()


def event_loop(original, ctl, *args, **kwargs):
    st = STATE
    if st.on and not st.armed:
        guarded(st, "event_loop", DispatchState.arm, ctl, None, None, None, False)
    if st.on:
        raised = guarded(st, "event_loop", run, ctl, None, None, None, False)
        if raised is not None:  # sglang's own dispatch raised: flush what we hold, then die as stock would
            guarded(st, "event_loop", DispatchState.at_exit, ctl, None, None, None, False)
            raise raised
    return original(ctl, *args, **kwargs)


def run(st: DispatchState, ctl: Any, _arg: Any, _answer: Any) -> Exception | None:
    """sglang's event loop (data_parallel_controller.py:927-935) with a bounded wait and the tick; returns
    when the dispatcher switches off (None), or the exception sglang's own dispatch raised."""
    import zmq
    from sglang.srt.managers import data_parallel_controller as dpc

    sock, recv, dispatch, feed = ctl.recv_from_tokenizer, dpc.sock_recv, ctl._request_dispatcher, \
        ctl.soft_watchdog.feed
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    wait = 0.0
    while st.on:
        feed()
        if poller.poll(max(1, round(wait * 1e3)) if wait > 0 else 0):
            while True:
                feed()
                try:
                    req = recv(sock, flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                try:
                    dispatch(req)
                except Exception as e:  # sglang's, not ebctl's: not a fault of the plugin
                    return e
        wait = st.tick(monotonic())
    return None


def dispatch(original, ctl, req, *args, **kwargs):
    st = STATE
    if st.armed and st.on and not st.bypass and guarded(st, "dispatch", DispatchState.offer, ctl, req, False, None,
                                                         False):
        return None
    return original(ctl, req, *args, **kwargs)


def control(original, ctl, obj, *args, **kwargs):
    st = STATE
    if st.armed and st.on and not st.bypass:
        guarded(st, "control", DispatchState.control, ctl, obj, None, None, False)
    return original(ctl, obj, *args, **kwargs)


HOOKS: Final = {"event_loop": event_loop, "dispatch": dispatch, "control": control, "to_all": control}


def install() -> None:
    """Register the DP controller's hooks with sglang's HookRegistry (applied by ``load_plugins`` right after)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name, target in DISPATCH_TARGETS.items():
        HookRegistry.register(target, HOOKS[name], HookType.AROUND)
