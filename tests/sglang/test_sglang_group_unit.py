"""The policy broadcast across the ranks of a scheduling group (sglang_patch/group.py), with stand-ins for
sglang's objects: what the source rank adds to sglang's request broadcast, what every rank takes out, and
that two ranks given the same broadcasts take the same decisions at the same steps (no sglang needed)."""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace

import pytest
from fakes import Link, Original, Sched, batch, new_state, req

from ebctl.gate import Reason
from ebctl.protocol import Mode, Policy
from sglang_patch import group, hooks, reading


def eb(version=3, **kw) -> Policy:
    return Policy(engine_id="dp0", version=version, mode=kw.pop("mode", Mode.EB), k=kw.pop("k", 4),
                  n_max=kw.pop("n_max", 8), max_defer_s=kw.pop("max_defer_s", 1000.0), **kw)


class Rank:
    """One scheduler of a group: its plugin state, its scheduler stand-in."""

    def __init__(self, source: bool) -> None:
        self.st = new_state()
        self.st.group, self.st.reporting = 2, source
        if not source:
            self.st.link = None
        self.sched = Sched()


def broadcast(ranks: list[Rank], now: float, recv: list | None = None) -> None:
    """One iteration's request broadcast, as sglang does it: the source adds its local_reqs, the list is
    pickled to every rank (broadcast_pyobj), each rank's process_input_requests takes it."""
    src = next(r for r in ranks if r.st.reporting)
    hooks.STATE = src.st
    hooks.monotonic = lambda: now  # the source's clock (restored by the fixture)
    sent = hooks.broadcast(lambda self, reqs, local: [*(reqs or []), *(local or [])], "receiver",
                           list(recv or []), None)
    wire = pickle.dumps(sent)
    for r in ranks:
        hooks.STATE = r.st
        got = Original(None)
        hooks.process_input(got, r.sched, pickle.loads(wire))
        (args, _), = got.calls
        assert not any(group.is_envelope(x) for x in args[1])  # sglang never sees an envelope
        assert len(args[1]) == len(recv or [])


@pytest.fixture(autouse=True)
def restore_state(monkeypatch):
    monkeypatch.setattr(hooks, "STATE", hooks.STATE)
    monkeypatch.setattr(hooks, "monotonic", hooks.monotonic)
    monkeypatch.setattr("sglang_patch.state.POLICY_POLL_S", 0.0)


def test_every_rank_applies_the_sources_policy_at_the_same_iteration():
    ranks = [Rank(True), Rank(False)]
    src = ranks[0]
    broadcast(ranks, 10.0, recv=["req-a"])
    assert [r.st.version for r in ranks] == [-1, -1]  # no policy yet: stock everywhere
    src.st.link.p = eb(version=7)
    broadcast(ranks, 10.1)
    assert [r.st.version for r in ranks] == [7, 7]
    assert all(r.st.cap == 8 and r.st.gate_policy.k == 4 for r in ranks)
    assert ranks[1].st.policy == src.st.link.p  # the follower decoded the same policy
    broadcast(ranks, 10.2)  # no change: a clock-only envelope
    assert [r.st.group_now for r in ranks] == [10.2, 10.2]
    src.st.link.p = None  # the policy expired at the source: the whole group goes stock, together
    broadcast(ranks, 20.0)
    assert [r.st.version for r in ranks] == [-1, -1] and all(r.st.cap is None for r in ranks)


def test_the_gate_clock_of_every_rank_is_the_sources():
    """The anti-starvation clock decides with the source's time, so a follower whose own clock runs
    differently forces the refill at the same step."""
    ranks = [Rank(True), Rank(False)]
    ranks[0].st.link.p = eb(max_defer_s=5.0)
    decisions = []
    for now in (100.0, 102.0, 104.9, 105.0):
        broadcast(ranks, now)
        for r in ranks:
            hooks.STATE = r.st
            hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=r.sched.running_batch)),
                             r.sched)
        step = []
        for r in ranks:
            hooks.STATE = r.st
            step.append((hooks.defer_prefill(Original(False), r.sched, batch([req()] * 6)), r.st.gate.last.reason))
        decisions.append(step)
    assert decisions[0] == decisions[1] == decisions[2] == [(True, Reason.WAIT_K)] * 2
    assert decisions[3] == [(False, Reason.STARVATION)] * 2  # 5 s of the source's clock, on both ranks


def test_a_failing_source_takes_the_group_to_stock_in_the_same_broadcast(caplog):
    ranks = [Rank(True), Rank(False)]
    ranks[0].st.link.p = eb()
    broadcast(ranks, 1.0)
    assert [r.st.version for r in ranks] == [3, 3]

    def boom(now):
        raise RuntimeError("link broke")
    ranks[0].st.link.policy = boom
    caplog.set_level(logging.ERROR, logger="ebctl.sglang")
    broadcast(ranks, 1.1)
    assert not ranks[0].st.on and ranks[0].st.cap is None
    assert ranks[1].st.on and ranks[1].st.cap is None and ranks[1].st.version == -1  # stock with it, at once
    broadcast(ranks, 1.2)  # nothing more from an off source
    assert ranks[1].st.version == -1


def test_split_keeps_the_newest_clock_and_the_newest_policy():
    a, b, c = group.envelope(1, 1.0, b"x"), group.envelope(2, 2.0, None), group.envelope(3, 3.0, None)
    rest, env = group.split(["r1", a, "r2", b, c])
    assert rest == ["r1", "r2"] and env == (group.TAG, 3, 3.0, b"x")
    assert group.split(["r"]) == (["r"], None)
    assert group.policy_of(b"not msgpack") is None and group.policy_of(group.STOCK) is None
    assert group.policy_of(group.payload_of(eb(version=9))).version == 9


def test_a_failing_hook_reopens_the_batch_being_planned(monkeypatch):
    """fail() from _should_defer_prefill / get_num_allocatable_reqs clears batch_is_full on the batch sglang
    is planning (not only on sched.running_batch, which the event loop has not updated yet)."""
    st = new_state()
    monkeypatch.setattr(hooks, "STATE", st)
    st.link = Link(eb())
    sched = Sched()
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=sched.running_batch)), sched)
    planned = batch([req()] * 8)
    planned.batch_is_full = True
    st.fault_hook, st.fault_at = "defer_prefill", 1
    hooks.defer_prefill(Original(False), sched, planned)
    assert not st.on and planned.batch_is_full is False and sched.running_batch.batch_is_full is False


@pytest.mark.parametrize(("args", "extra", "allow", "reason"), [
    ({}, {"is_mixed_chunk": True}, False, ""),
    ({}, {}, False, "server started without --enable-mixed-chunk"),
    ({}, {}, True, ""),  # the opt-in, nothing rules mixing out
    ({}, {"chunked_prefill_size": None}, True, "chunked prefill is off"),
    ({"speculative_algorithm": "EAGLE"}, {}, True, "speculative decoding (EAGLE)"),
    ({"dllm_algorithm": "LowConfidence"}, {}, True, "diffusion LLM"),
    ({"enable_hisparse": True}, {}, True, "HiSparse"),
    ({"attention_backend": "dsa"}, {}, True, "DSA attention backend"),
])
def test_mixing_is_available_only_where_sglang_could_mix(args, extra, allow, reason):
    sched = Sched(server_args=SimpleNamespace(**args), **extra)
    got = reading.mixed_unavailable_reason(sched, allow_without_flag=allow)
    assert (reason in got) if reason else got == ""


def test_prefill_cuda_graphs_rule_out_mixing_without_the_flag():
    runner = type("PrefillCudaGraphRunner", (), {})()
    sched = Sched(tp_worker=SimpleNamespace(model_runner=SimpleNamespace(prefill_cuda_graph_runner=runner)))
    assert reading.mixing_blockers(sched) == ["prefill CUDA graphs"]
    sched.tp_worker.model_runner.prefill_cuda_graph_runner = type("EagerRunner", (), {})()
    assert reading.mixing_blockers(sched) == []
