"""The hooks call by call, with stand-ins for sglang's objects (no sglang needed, runs everywhere).

What is proven here, for every hook: with no policy, an expired one or ``off``, the hook returns exactly
what the original returned, calls it exactly once with the same arguments, and changes no sglang
setting (the "off = stock" promise); an exception in the ebctl part calls the original exactly once
anyway, logs once with the traceback, restores the launch settings and leaves the plugin off.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from types import SimpleNamespace

import pytest
from fakes import Original, Sched, batch, new_state, req

from ebctl.gate import Phase, PhaseGate
from ebctl.protocol import Mode, Policy
from sglang_patch import hooks, lifecycle, reading, state
from sglang_patch.fault import Fault
from sglang_patch.state import PluginState
from sglang_patch.tracefile import TraceFile


@pytest.fixture
def st(monkeypatch) -> PluginState:
    monkeypatch.setattr(state, "POLICY_POLL_S", 0.0)  # read the policy at every step, however close
    s = new_state()
    monkeypatch.setattr(hooks, "STATE", s)
    return s


def eb(**kw) -> Policy:
    return Policy(engine_id="dp0", version=3, mode=kw.pop("mode", Mode.EB), k=kw.pop("k", 4),
                  n_max=kw.pop("n_max", 8), max_defer_s=1000.0, **kw)


def call_each_hook(sched):
    """Every hook once, with its original: (name, original, result, positional args after sched)."""
    plan = SimpleNamespace(batch_to_run=batch([req()], forward_iter=1), running_batch=sched.running_batch)
    state_out = SimpleNamespace(internal_state={})
    cases = [("next_batch", Original(plan), (), {"running_batch": sched.running_batch, "last_batch": None}),
             ("defer_prefill", Original(False), (sched.running_batch,), {}),
             ("allocatable", Original(11), (3,), {"running_batch": sched.running_batch}),
             ("run_batch", Original("result"), (plan.batch_to_run,), {}),
             ("batch_result", Original(None), (plan.batch_to_run, "result"), {}),
             ("abort_output", Original(None), ("abort", req("a", done=False)), {}),
             ("internal_state", Original(state_out), ("recv",), {})]
    out = []
    for name, orig, args, kwargs in cases:
        res = hooks.HOOKS[name](orig, sched, *args, **kwargs)
        out.append((name, orig, res, args, kwargs))
    return out


def status(st, sched) -> dict:
    """What GET /server_info shows under ``ebctl`` (the internal_state hook's part)."""
    out = SimpleNamespace(internal_state={})
    hooks.show(st, sched, out, None)
    return out.internal_state["ebctl"]


def settings(sched):
    return sched.is_mixed_chunk, sched.running_batch.batch_is_full, len(sched.waiting_queue)


@pytest.mark.parametrize("policy", [None, eb(mode=Mode.OFF)], ids=["no policy", "off"])
def test_without_a_policy_every_hook_is_pass_through(st, policy):
    st.link.p = policy
    sched = Sched()
    before = settings(sched)
    for name, orig, res, args, kwargs in call_each_hook(sched):
        assert orig.calls == [((sched, *args), kwargs)], name  # once, the same arguments
        assert res is orig.value, name  # the original's result, untouched
    assert settings(sched) == before
    assert st.cap is None and st.gate_policy is None and st.defers == st.capped == 0
    assert st.version == (-1 if policy is None else 3)


def test_defer_prefill_keeps_a_stock_deferral(st):
    st.link.p = eb()
    sched = Sched()
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    assert hooks.defer_prefill(Original(True), sched, batch([req()] * 2)) is True  # --prefill-decode-interval


def test_a_full_trace_disk_stops_the_trace_not_the_plugin(st, caplog):
    """engine.trace_dir on a full filesystem (/dev/full: every write is ENOSPC): the trace stops, said once,
    and the hooks go on steering; a diagnosis file must not cost the server its policy."""
    st.link.p = eb()
    st.trace = TraceFile("/dev/full")
    sched = Sched()
    with caplog.at_level(logging.WARNING, logger="ebctl"):
        hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
        assert hooks.defer_prefill(Original(False), sched, batch([req()] * 6)) is True  # 2 free < k = 4: held
        assert hooks.defer_prefill(Original(False), sched, batch([req()] * 4)) is False  # k free: refill
    assert st.on and not st.error
    assert "No space left on device" in st.trace.stopped
    assert sum("trace /dev/full stopped" in r.getMessage() for r in caplog.records) == 1
    assert not any("is now OFF" in r.getMessage() for r in caplog.records)


def test_eb_defers_below_k_free_slots_and_caps_at_n_max(st):
    st.link.p = eb()
    sched = Sched(is_mixed_chunk=True)
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    defer = lambda running: hooks.defer_prefill(Original(False), sched, batch([req()] * running))  # noqa: E731
    assert defer(6) is True  # 2 free < k = 4, requests waiting: keep decoding
    assert sched.is_mixed_chunk is False  # eb: no mixing this step
    assert defer(4) is False  # 4 free = k: refill
    assert defer(5) is False  # refill goes on until the slots are full
    assert defer(8) is True  # full
    assert defer(0) is False  # nothing runs: always admit
    assert hooks.allocatable(Original(10), sched, 6) == 2  # n_max 8 - 6 running
    assert hooks.allocatable(Original(1), sched, 6) == 1  # sglang's own budget is smaller
    assert st.defers == 2 and st.capped == 1


def test_a_chunk_in_flight_goes_on_alone_while_the_gate_holds(st):
    """Below k a chunked prefill must still go on (sglang cannot hold it back), but no waiting request may
    join it: the step's admission budget is 0; once the gate admits, the sticky batch_is_full sglang set
    while the chunk went alone is cleared."""
    st.link.p = eb()
    sched = Sched(chunked_req=req("chunk"))
    step = lambda: hooks.next_batch(  # noqa: E731
        Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    step()
    running = batch([req()] * 6)  # 2 free < k = 4
    assert hooks.defer_prefill(Original(False), sched, running) is False  # the chunk goes on
    assert hooks.allocatable(Original(10), sched, 6, running_batch=running) == 0  # ... alone
    running.batch_is_full = True  # what sglang does when the budget is 0 (scheduler.py:4226-4232)
    assert st.chunk_alone == 1 and st.gate.last.reason == "chunk_in_flight" and st.defers == 0
    step()  # the next step: the hold is per step
    sched.chunked_req = None
    assert hooks.defer_prefill(Original(False), sched, running) is True  # no chunk: held below k
    assert running.batch_is_full is True
    running.reqs = running.reqs[:4]  # two finished: 4 free = k
    assert hooks.defer_prefill(Original(False), sched, running) is False
    assert running.batch_is_full is False  # reopened: the refill may admit
    assert hooks.allocatable(Original(10), sched, 4, running_batch=running) == 4


def test_an_empty_queue_never_asks_the_gate(st):
    """sglang 0.5.23 asks ``_should_defer_prefill`` on every step; with nothing waiting the answer is "go"
    (nothing can form) and the gate only records that the queue emptied (``PhaseGate.rest``)."""

    class Counting(PhaseGate):
        asked = 0

        def decide(self, *a, **kw):
            Counting.asked += 1
            return super().decide(*a, **kw)

    st.link.p = eb()
    st.gate = Counting()
    sched = Sched(waiting_queue=[])
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    st.gate.phase, st.gate.defer_since = Phase.REFILL, 1.0
    assert hooks.defer_prefill(Original(False), sched, batch([req()] * 6)) is False  # 2 free < k: would defer
    assert (st.gate.phase, st.gate.defer_since, Counting.asked, st.defers) == (Phase.DECODE, None, 0, 0)
    sched.waiting_queue.append(req("w"))
    assert hooks.defer_prefill(Original(False), sched, batch([req()] * 6)) is True
    assert (Counting.asked, st.defers) == (1, 1)


def test_mb_mixes(st):
    st.link.p = eb(mode=Mode.MB)
    sched = Sched(is_mixed_chunk=True)
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    assert hooks.defer_prefill(Original(False), sched, batch([req()] * 6)) is False
    assert sched.is_mixed_chunk is True and st.setup.mixed_unavailable is False



def test_mb_on_a_server_that_cannot_mix_is_eb_and_says_so(st):
    st.link.p = eb(mode=Mode.MB)
    sched = Sched()  # launched without --enable-mixed-chunk
    st.setup = dataclasses.replace(st.setup,
                                   mixed_reason=reading.mixed_unavailable_reason(sched, allow_without_flag=False))
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    assert st.setup.mixed_unavailable is True and st.gate_policy.mode is Mode.EB
    assert "--enable-mixed-chunk" in st.setup.mixed_reason
    assert hooks.defer_prefill(Original(False), sched, batch([req()] * 6)) is True  # eb with k = 4
    assert sched.is_mixed_chunk is False


def test_a_raised_cap_or_no_policy_reopens_admission_and_restores_mixing(st):
    st.link.p = eb(n_max=8, mode=Mode.MB)
    sched = Sched()
    step = lambda: hooks.next_batch(  # noqa: E731
        Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    step()
    hooks.defer_prefill(Original(False), sched, batch([req()] * 3))
    assert sched.is_mixed_chunk is True
    sched.running_batch.batch_is_full = True  # sglang closed admission at our cap
    st.link.p = eb(n_max=6, mode=Mode.MB)
    step()
    assert sched.running_batch.batch_is_full is True  # a lower cap keeps it shut
    st.link.p = eb(n_max=12, mode=Mode.MB)
    step()
    assert sched.running_batch.batch_is_full is False  # the flag is sticky in sglang: reopened
    sched.running_batch.batch_is_full = True
    st.link.p = None  # expired
    step()
    assert sched.running_batch.batch_is_full is False and sched.is_mixed_chunk is False and st.cap is None


FAULTS = ["next_batch", "defer_prefill", "allocatable", "run_batch", "batch_result", "abort_output"]


@pytest.mark.parametrize("hook", [*FAULTS, "internal_state"])
def test_an_exception_in_a_hook_calls_the_original_once_and_turns_the_plugin_off(st, hook, caplog, monkeypatch):
    st.link.p = eb(mode=Mode.MB)
    sched = Sched()
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    hooks.defer_prefill(Original(False), sched, batch([req()] * 3))
    assert sched.is_mixed_chunk is True and st.cap == 8
    sched.running_batch.batch_is_full = True
    if hook == "internal_state":
        monkeypatch.setattr(lifecycle, "status", lambda st, s: 1 / 0)
    else:
        st.fault = Fault(hook)
    caplog.set_level(logging.ERROR, logger="ebctl.sglang")
    results = {name: (orig, res, args, kwargs) for name, orig, res, args, kwargs in call_each_hook(sched)}
    orig, res, args, kwargs = results[hook]
    assert orig.calls == [((sched, *args), kwargs)]  # exactly once, with the original arguments
    assert res is orig.value
    assert not st.on and st.error == f"exception in hook {hook}"
    assert sched.is_mixed_chunk is False and sched.running_batch.batch_is_full is False and st.cap is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and "plugin is now OFF" in errors[0].getMessage()
    assert st.link.closed
    # from then on: stock, silent
    sched.is_mixed_chunk = "launch"
    for name, orig, res, args, kwargs in call_each_hook(sched):
        assert orig.calls == [((sched, *args), kwargs)] and res is orig.value, name
    assert sched.is_mixed_chunk == "launch"
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def run_step(sched, b, plan_running):
    """One planned-and-processed step through the hooks, as an event loop does it."""
    plan = SimpleNamespace(batch_to_run=b, running_batch=plan_running)
    hooks.next_batch(Original(plan), sched)
    sched.forward_ct += 1
    b.forward_iter = sched.forward_ct
    hooks.run_batch(Original("res"), sched, b)
    hooks.batch_result(Original(None), sched, b, "res")


def test_reports_carry_the_batch_shape_and_each_completion_exactly_once(st):
    sched = Sched()
    r1, r2, hc = req("a", n_in=7), req("b", n_in=9), req("HEALTH_CHECK_1")
    prefill = batch([r1, r2, hc], mode="EXTEND", ext=19, extend_lens=[7, 9, 3], prefix_lens=[0, 0, 0])
    running = batch([])
    run_step(sched, prefill, running)
    r1.finished_output, r1.finished_reason = True, type("FINISH_MATCHED_TOKEN", (), {})()
    hc.finished_output, hc.finished_reason = True, type("FINISH_LENGTH", (), {})()
    dec = batch([r1, r2], mode="DECODE", lens=[8, 11])
    run_step(sched, dec, dec)
    # overlap: a finished request shows up once more. sglang's own seq_lens_sum is read where it is set (in
    # sglang it equals the sum of seq_lens_cpu; 30 here only shows which one was read)
    dec2 = batch([r1, r2], mode="DECODE", lens=[9, 12], lens_sum=30)
    run_step(sched, dec2, dec2)
    hooks.abort_output(Original(None), sched, "abort", req("q", n_out=0))  # aborted in the queue
    hooks.abort_output(Original(None), sched, "abort", r1)  # already reported: not again
    r2.finished_output, r2.finished_reason, r2.finished_len = True, type("FINISH_ABORT", (), {})(), 3
    # a chunk of 10 after 256 tokens of its prompt, then r2's decode row (mix_with_running appends it: 1 after 12)
    mixed = batch([req("c"), r2], mode="MIXED", decoding=[r2], ext=11, lens=[10, 13], extend_lens=[10, 1],
                  prefix_lens=[256, 12])
    run_step(sched, mixed, batch([]))
    sent = st.link.sent
    assert [r.kind for r in sent] == ["prefill", "decode", "decode", "mixed"]
    assert (sent[0].prefill_reqs, sent[0].prefill_tokens, sent[0].running) == (3, 19, 3)
    assert sent[0].prefill_ctx_tokens == 7 * 8 // 2 + 9 * 10 // 2 + 3 * 4 // 2 == 79  # e(e + 1)/2 each, no prefix
    assert sent[1].prefill_ctx_tokens == 0 and sent[3].prefill_ctx_tokens == 10 * 256 + 10 * 11 // 2 == 2615
    assert (sent[1].decode_reqs, sent[1].decode_ctx_tokens, sent[1].running) == (2, 19, 2)
    assert sent[2].decode_ctx_tokens == 30 and all(r.kv_used == 100 and r.kv_total == 1000 for r in sent)
    assert (sent[3].prefill_reqs, sent[3].prefill_tokens, sent[3].decode_reqs, sent[3].decode_ctx_tokens) == \
        (1, 10, 1, 13)
    finished = [(f.input_len, f.output_len, f.finish_reason) for r in sent for f in r.finished]
    assert finished == [(7, 5, "stop"), (10, 0, "abort"), (9, 3, "abort")]
    assert all(r.forward_s >= 0 and r.engine_id == "dp0" and r.max_running == 16 for r in sent)
    assert [r.seq for r in sent] == [0, 1, 2, 3]
    assert sent[1].finished[0].ttft_s == pytest.approx(0.5)


def test_an_idle_step_after_work_is_reported_once(st):
    sched = Sched(waiting_queue=[])
    idle = SimpleNamespace(batch_to_run=None, running_batch=batch([]))
    run_step(sched, batch([req()], mode="DECODE"), sched.running_batch)
    hooks.next_batch(Original(idle), sched)
    hooks.next_batch(Original(idle), sched)
    assert [r.kind for r in st.link.sent] == ["decode", "idle"]


@pytest.mark.parametrize(("ranks", "node", "prefix", "engine_id", "reporting"), [
    (reading.Ranks(0, True, 1), "", "", "dp0", True),
    (reading.Ranks(3, True, 1), "gpu-node-7", "", "gpu-node-7/dp3", True),
    (reading.Ranks(3, True, 1), "gpu-node-7", "launch-9", "launch-9/dp3", True),
    (reading.Ranks(2, True, 1), "gpu-node-7", "@qwen8b", "gpu-node-7/qwen8b/dp2", True),  # EBCTL_SERVER=qwen8b
    (reading.Ranks(0, True, 1), "", "@qwen8b", "qwen8b/dp0", True),
    (reading.Ranks(1, True, 2), "", "", "dp1", True),  # attention TP 2: the source rank reports
    (reading.Ranks(1, False, 2), "", "", "dp1", False),  # the second rank of that group: silent, steered
])
def test_start_names_the_engine_and_only_the_source_rank_talks(monkeypatch, tmp_path, caplog, ranks, node, prefix,
                                                               engine_id, reporting):
    cfg = tmp_path / "ebctl.toml"
    server = prefix.removeprefix("@") if prefix.startswith("@") else ""  # "@NAME": the server named, no prefix set
    prefix = "" if server else prefix
    cfg.write_text(f'[daemon]\nruntime_dir = "{tmp_path}"\nnode = "{node}"\n[engine]\nid_prefix = "{prefix}"\n')
    if server:
        monkeypatch.setenv("EBCTL_SERVER", server)
    else:
        monkeypatch.delenv("EBCTL_SERVER", raising=False)
    monkeypatch.setenv("EBCTL_CONFIG", str(cfg))
    monkeypatch.setattr(lifecycle.reading, "ranks", lambda: ranks)
    monkeypatch.setattr(lifecycle.reading, "batch_kinds", lambda: {})
    s = PluginState()
    caplog.set_level(logging.INFO, logger="ebctl.sglang")
    s.begin(Sched(is_mixed_chunk=True, chunked_prefill_size=64, max_running_requests=48, device="cuda"))
    try:
        u = s.setup
        assert (u.engine_id, u.reporting, u.group) == (engine_id, reporting, ranks.group)
        assert (u.launch_mixed, u.mixed_unavailable, u.max_running, u.sync_forward) == (True, False, 48, False)
        assert (s.link is not None) == reporting
        assert (s.inbox is not None) == (reporting and ranks.group > 1)  # followers' faults come in at the source
        assert lifecycle.status(s, Sched())["steering"] is True
    finally:
        lifecycle.close(s.link, s.inbox, None)


def test_a_new_policy_governs_the_steps_planned_after_it_arrived(st):
    """The policy is read after sglang planned a step (one hook call per iteration): a report says which
    policy its step was planned under."""
    sched = Sched()
    run_step(sched, batch([req()], mode="DECODE"), sched.running_batch)
    st.link.p = eb()
    run_step(sched, batch([req()], mode="DECODE"), sched.running_batch)  # planned before the policy was read
    assert st.cap == 8 and st.gate_policy is not None
    run_step(sched, batch([req()], mode="DECODE"), sched.running_batch)
    assert [r.policy_version for r in st.link.sent] == [-1, -1, 3]


def test_a_raised_cap_reopens_the_running_batch_the_plan_hands_on(st):
    """Inside get_next_batch_to_run the step's running batch is the plan's; the event loop stores it in
    ``sched.running_batch`` only afterwards, so that is the one whose sticky flag must be cleared."""
    st.link.p = eb(n_max=4)
    sched = Sched()
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    assert st.cap == 4
    handed_on = batch([req()] * 4)
    handed_on.batch_is_full = True  # sglang closed admission at our cap
    st.link.p = eb(n_max=8)
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=handed_on)), sched)
    assert st.cap == 8 and handed_on.batch_is_full is False


def test_a_policy_above_the_servers_max_running_is_refused_counted_and_the_engine_stays_stock(monkeypatch, tmp_path):
    """``start`` hands the server's max_running_requests to the link: a policy above it never reaches the
    scheduler (stock goes on, the plugin stays on), and status shows the refusal with the link's others."""
    from time import monotonic

    from ebctl.link import topic
    from ebctl.protocol import encode

    cfg = tmp_path / "ebctl.toml"
    cfg.write_text(f'[daemon]\nruntime_dir = "{tmp_path}"\n')
    monkeypatch.setenv("EBCTL_CONFIG", str(cfg))
    monkeypatch.setattr(lifecycle.reading, "ranks", lambda: reading.Ranks(0, True, 1))
    monkeypatch.setattr(lifecycle.reading, "batch_kinds", lambda: {})
    s = PluginState()
    sched = Sched(max_running_requests=48)
    s.begin(sched)
    try:
        def arrive(**kw):  # what the link's I/O thread queues for the engine's thread
            s.link._inbox.append(topic("dp0") + encode(Policy(engine_id="dp0", ttl_s=60.0, mode=Mode.EB, **kw)))

        arrive(version=1, k=4, n_max=49)
        st = status(s, sched)
        assert (st["enabled"], st["policy_version"], s.cap, sched.is_mixed_chunk) == (True, -1, None, False)
        assert st["link"]["rejected"]["n_max"] == 1 and sum(st["link"]["rejected"].values()) == 1
        arrive(version=2, k=49, n_max=48)  # k above n_max
        arrive(version=3, k=4, n_max=48)  # at the server's limit: applied
        s.refresh(sched, monotonic())
        st = status(s, sched)
        assert (st["enabled"], st["policy_version"], st["n_max"], s.cap) == (True, 3, 48, 48)
        assert st["link"]["rejected"] == {"malformed": 0, "version": 0, "validation": 0, "engine_id": 0, "ttl": 0,
                                          "n_max": 1, "k": 1}
    finally:
        s.link.close()


def test_the_sigterm_watch_hands_over_to_sglangs_once_the_flag_is_set():
    """sglang's watchdog sleeps 5 s between looks at ``gracefully_exit``; the hook looks every POLL_S and then
    runs the original exactly once, with the manager, and returns what it returned."""
    import asyncio

    from sglang_patch import shutdown

    manager = SimpleNamespace(gracefully_exit=False)
    calls: list[tuple[object, bool, float]] = []

    async def original(m):
        calls.append((m, m.gracefully_exit, loop.time()))
        return "drained"

    async def main():
        task = asyncio.ensure_future(shutdown.sigterm_watchdog(original, manager))
        await asyncio.sleep(0.35)
        assert not calls  # no flag yet: sglang's own watch has not started
        manager.gracefully_exit, t = True, loop.time()
        out = await asyncio.wait_for(task, 5)
        return out, t

    loop = asyncio.new_event_loop()
    try:
        out, flagged = loop.run_until_complete(main())
    finally:
        loop.close()
    assert out == "drained" and len(calls) == 1
    assert calls[0][0] is manager and calls[0][1] is True
    assert calls[0][2] - flagged <= 5 * shutdown.POLL_S  # not sglang's 5 s


def test_a_failing_sigterm_watch_falls_back_to_sglangs_own():
    """A manager whose flag cannot be read: the hook logs and runs sglang's watchdog as it was."""
    import asyncio

    from sglang_patch import shutdown

    class Broken:
        @property
        def gracefully_exit(self):
            raise RuntimeError("no flag")

    seen = []

    async def original(m):
        seen.append(m)
        return 7

    m = Broken()
    assert asyncio.run(shutdown.sigterm_watchdog(original, m)) == 7 and seen == [m]


def test_the_sigterm_watch_is_registered_only_in_the_launcher():
    """A process started by multiprocessing (a scheduler, the detokenizer) registers nothing: the target would
    import tokenizer_manager there."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(_install_in_child) is False


def _install_in_child() -> bool:
    from sglang_patch import shutdown

    return shutdown.install()


def test_a_finished_requests_tpot_is_its_decode_time_over_the_tokens_after_the_first():
    # time_stats on sglang's clock (perf_counter): prefill ended 0.4 s ago, 5 tokens out → 4 gaps of 0.1 s
    from time import perf_counter
    r = req("t", n_out=5, done=True)
    r.time_stats.prefill_finished_time = perf_counter() - 0.4
    f = reading.finished_request(r)
    assert f.tpot_s == pytest.approx(0.1, abs=0.01) and f.output_len == 5
    one = req("u", n_out=1, done=True)
    assert math.isnan(reading.finished_request(one).tpot_s)  # one token: no TPOT
    aborted = req("v", n_out=3)
    assert math.isnan(reading.finished_request(aborted).tpot_s)  # finished_reason None: an abort
    stamped = req("w", n_out=11, done=True)  # sglang stamped its completion: 2.0 → 3.0 s over 10 tokens
    stamped.time_stats.completion_time = 3.0
    assert reading.finished_request(stamped).tpot_s == pytest.approx(0.1)


def test_an_idle_server_beats_every_heartbeat(st, monkeypatch):
    """After the idle report that ends a load, an idle scheduler (sglang calls get_next_batch_to_run on every
    pass of its idle loop) reports again only once HEARTBEAT_S has passed: the daemon tells idle from gone."""
    clock = [100.0]
    monkeypatch.setattr(state, "monotonic", lambda: clock[0])
    sched = Sched(waiting_queue=[])
    idle = SimpleNamespace(batch_to_run=None, running_batch=batch([]))
    run_step(sched, batch([req()], mode="DECODE"), sched.running_batch)
    for t in (100.0, 100.5, 101.9, 102.0, 103.0, 103.99, 104.0):  # HEARTBEAT_S = 2: beats at 102 and 104
        clock[0] = t
        hooks.next_batch(Original(idle), sched)
    assert state.HEARTBEAT_S == 2.0
    assert [r.kind for r in st.link.sent] == ["decode", "idle", "idle", "idle"]


def test_v1_loads_shows_the_running_cap_in_force(st):
    """sglang's /v1/loads snapshot (what smg polls) says max_running_requests = n_max while a policy caps the
    running batch below the server's flag; without a policy, or with a cap above it, sglang's own value."""
    snapshot = lambda: SimpleNamespace(max_running_requests=16, num_waiting_reqs=5)  # noqa: E731
    assert hooks.loads(Original(snapshot()), "inquirer").max_running_requests == 16  # no policy yet
    st.link.p = eb(n_max=8)
    sched = Sched(is_mixed_chunk=True)
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    got = hooks.loads(Original(snapshot()), "inquirer")
    assert (got.max_running_requests, got.num_waiting_reqs) == (8, 5)
    frozen = SimpleNamespace()  # a snapshot the part cannot read: the hook answers sglang's, the plugin goes off
    assert hooks.loads(Original(frozen), "inquirer") is frozen
    assert not st.on and st.error == "exception in hook loads"


def _plan_step(sched):
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)


def test_a_policys_pd_interval_sets_sglangs_and_every_way_out_puts_the_launch_value_back(monkeypatch):
    """Launched with --prefill-decode-interval 2: a policy's pd_interval 8 (in any mode) sets sglang's
    attribute to 8, 0 means the launch value, and an expired policy, a fault or a sglang without the
    attribute leave or put back sglang's own."""
    monkeypatch.setattr(state, "POLICY_POLL_S", 0.0)
    s = new_state(launch_pd_interval=2)
    monkeypatch.setattr(hooks, "STATE", s)
    assert s.setup.pd_interval_available
    sched = Sched(prefill_decode_interval=2)
    for policy, want in ((eb(mode=Mode.OFF, pd_interval=8), 8), (eb(pd_interval=0), 2), (eb(pd_interval=16), 16),
                         (None, 2), (eb(mode=Mode.MB, pd_interval=4), 4)):
        s.link.p = policy
        _plan_step(sched)
        assert sched.prefill_decode_interval == want, policy
    assert status(s, sched)["pd_interval"] == 4 and status(s, sched)["launch_pd_interval"] == 2
    s.fault = Fault("defer_prefill")
    hooks.defer_prefill(Original(False), sched, batch([req()] * 3))
    assert not s.on and sched.prefill_decode_interval == 2  # the fault path restores it
    # a sglang without the attribute: nothing set, and the reports say the engine does not apply it
    bare = new_state()
    monkeypatch.setattr(hooks, "STATE", bare)
    old = Sched()
    bare.link.p = eb(mode=Mode.OFF, pd_interval=8)
    _plan_step(old)
    assert not hasattr(old, "prefill_decode_interval") and not bare.setup.pd_interval_available
    assert lifecycle._pd_interval(Sched(prefill_decode_interval=None)) == 0  # sglang's "or 0"
    assert lifecycle._pd_interval(Sched()) is None


def test_a_resent_policy_leaves_sglangs_countdown_running(monkeypatch):
    """The daemon re-sends its policy every republish_s: an equal policy, a new object. Launched with no interval,
    pdi@8 (mode off, pd_interval 8) re-sent while sglang's countdown has 5 decode steps left keeps them (a reset
    let a prefill in right after one, as the real server showed); back to an interval of 0, in mode off or eb,
    the countdown stops with it; a smaller interval cuts it to its own length."""
    monkeypatch.setattr(state, "POLICY_POLL_S", 0.0)
    s = new_state(launch_pd_interval=0)
    monkeypatch.setattr(hooks, "STATE", s)
    sched = Sched(prefill_decode_interval=0, _prefill_decode_interval_remaining=0)
    for back in (eb(mode=Mode.OFF, pd_interval=0), eb(pd_interval=0)):
        s.link.p = eb(mode=Mode.OFF, pd_interval=8)
        _plan_step(sched)
        assert sched.prefill_decode_interval == 8
        sched._prefill_decode_interval_remaining = 5  # sglang armed it after a prefill and ran 3 decode steps
        s.link.p = eb(mode=Mode.OFF, pd_interval=8)  # re-sent
        _plan_step(sched)
        assert s.policy is s.link.p and sched._prefill_decode_interval_remaining == 5
        s.link.p = back
        _plan_step(sched)
        assert (sched.prefill_decode_interval, sched._prefill_decode_interval_remaining) == (0, 0), back
    # a smaller N cuts a longer countdown to it: 16 with 12 steps left, then 8: 8 left
    s.link.p = eb(mode=Mode.OFF, pd_interval=16)
    _plan_step(sched)
    sched._prefill_decode_interval_remaining = 12
    s.link.p = eb(mode=Mode.OFF, pd_interval=8)
    _plan_step(sched)
    assert (sched.prefill_decode_interval, sched._prefill_decode_interval_remaining) == (8, 8)
    # launched with --prefill-decode-interval 8: back to it (no policy), a countdown within 8 runs on as sglang's
    # own would; one of 16's beyond 8 is cut to 8
    s = new_state(launch_pd_interval=8)
    monkeypatch.setattr(hooks, "STATE", s)
    sched = Sched(prefill_decode_interval=8, _prefill_decode_interval_remaining=0)
    for left, want in ((5, 5), (12, 8)):
        s.link.p = eb(mode=Mode.OFF, pd_interval=16)
        _plan_step(sched)
        sched._prefill_decode_interval_remaining = left
        s.link.p = None
        _plan_step(sched)
        assert (sched.prefill_decode_interval, sched._prefill_decode_interval_remaining) == (8, want), left
