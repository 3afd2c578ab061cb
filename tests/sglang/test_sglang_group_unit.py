"""The policy broadcast across the ranks of a scheduling group (sglang_patch/group.py), with stand-ins for
sglang's objects: what the source rank adds to sglang's request broadcast, what every rank takes out, that
two ranks given the same broadcasts take the same decisions at the same steps, and that a fault on either
rank takes both to stock at one iteration (a follower's over the real channel, sglang_patch/group_fault.py,
on a unix socket in a temporary directory; no sglang needed)."""

from __future__ import annotations

import logging
import os
import pickle
import time
from types import SimpleNamespace

import pytest
from fakes import Link, Original, Sched, batch, new_state, req

from ebctl.gate import Reason
from ebctl.protocol import Mode, Policy
from sglang_patch import fault, group, group_fault, hooks, lifecycle, reading


def eb(version=3, **kw) -> Policy:
    return Policy(engine_id="dp0", version=version, mode=kw.pop("mode", Mode.EB), k=kw.pop("k", 4),
                  n_max=kw.pop("n_max", 8), max_defer_s=kw.pop("max_defer_s", 1000.0), **kw)


class Rank:
    """One scheduler of a group: its plugin state, its scheduler stand-in; ``channel``: the group's follower-fault
    channel (the source binds it), "" for none."""

    def __init__(self, source: bool, channel: str = "") -> None:
        self.sched = Sched()
        self.st = new_state(group=2, reporting=source, rank=0 if source else 1, channel=channel, sched=self.sched)
        if not source:
            self.st.link = None
        elif channel:
            self.st.inbox = group_fault.Inbox(channel)
            self.st.notices = self.st.inbox.notices

    def close(self) -> None:
        lifecycle.close(None, self.st.inbox, self.st.outbox)


def broadcast(ranks: list[Rank], now: float, recv: list | None = None) -> None:
    """One iteration's request broadcast, as sglang does it: the source adds its local_reqs, the list is
    pickled to every rank (broadcast_pyobj), each rank's process_input_requests takes it."""
    src = next(r for r in ranks if r.st.setup.reporting)
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


@pytest.fixture
def pair(tmp_path):
    """A source and a follower joined by a real follower-fault channel."""
    channel = group_fault.endpoint(str(tmp_path / "rt"), "dp0", os.getpid())
    ranks = [Rank(True, channel), Rank(False, channel)]
    yield ranks
    for r in ranks:
        r.close()


def step(r: Rank) -> None:
    """The planning hooks of one iteration on rank ``r`` (the batch planned is none: only the decisions count)."""
    hooks.STATE = r.st
    hooks.next_batch(Original(SimpleNamespace(batch_to_run=None, running_batch=r.sched.running_batch)), r.sched)


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
    assert ranks[0].st.applied_gen == ranks[1].st.applied_gen == 2  # the farewell's generation, on both
    broadcast(ranks, 1.2)  # nothing more from an off source
    assert ranks[1].st.version == -1


def test_a_follower_fault_takes_the_whole_group_to_stock_at_one_generation(pair, caplog):
    """The follower's hook raises: it tells the source and keeps applying the group's policy (both ranks still
    decide alike); at the next broadcast the source switches off and its stock envelope takes both ranks to
    stock, each off for good, at the same generation. One error logged on each rank."""
    src, fol = pair
    src.st.link.p = eb()
    broadcast(pair, 1.0)
    assert [r.st.version for r in pair] == [3, 3] and [r.st.applied_gen for r in pair] == [1, 1]
    caplog.set_level(logging.ERROR, logger="ebctl.sglang")
    fol.st.fault = fault.Fault("run_batch")
    hooks.STATE = fol.st
    b = batch([req()], forward_iter=1)
    assert hooks.run_batch(Original("result"), fol.sched, b) == "result"
    assert fol.st.on and fol.st.cap == 8 and fol.st.error == "exception in hook run_batch"  # still following
    deadline = time.monotonic() + 5
    while not src.st.notices and time.monotonic() < deadline:  # the notice crosses the socket
        time.sleep(0.005)
    assert src.st.notices and src.st.on and src.st.cap == 8  # not read before the next broadcast
    for r in pair:
        step(r)
    answers = []
    for r in pair:
        hooks.STATE = r.st
        answers.append(hooks.defer_prefill(Original(False), r.sched, batch([req()] * 6)))
    assert answers == [True, True]  # the same decision on both ranks while the notice is on its way
    broadcast(pair, 1.1)
    assert [r.st.on for r in pair] == [False, False] and [r.st.cap for r in pair] == [None, None]
    assert [r.st.applied_gen for r in pair] == [2, 2] and [r.st.version for r in pair] == [-1, -1]
    assert src.st.error == "follower rank 1: exception in hook run_batch" and not src.st.farewell
    assert fol.st.error == "exception in hook run_batch"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and errors[0].exc_info is not None and "follower rank 1" in errors[1].getMessage()
    assert src.st.link.closed
    broadcast(pair, 1.2)  # nothing more: both stock for good
    hooks.STATE = fol.st
    assert hooks.defer_prefill(Original(False), fol.sched, batch([req()] * 6)) is False


def test_a_follower_planning_fault_answers_stock_for_that_call_only(pair, caplog):
    """The residual window: a fault inside a planning decision (here the gate) has no group answer to give,
    so that one call answers stock; the follower's next decisions are the group's again until the farewell."""
    src, fol = pair
    src.st.link.p = eb()
    broadcast(pair, 1.0)
    caplog.set_level(logging.ERROR, logger="ebctl.sglang")
    fol.st.fault = fault.Fault("defer_prefill")
    answers = []
    for _ in range(2):
        for r in pair:
            step(r)
        for r in pair:
            hooks.STATE = r.st
            answers.append(hooks.defer_prefill(Original(False), r.sched, batch([req()] * 6)))
    assert answers == [True, False, True, True]  # the faulting call: stock ("go"); the next: the group's
    assert fol.st.on and len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_a_follower_that_cannot_tell_its_source_goes_stock_alone(pair, monkeypatch, caplog):
    src, fol = pair
    src.st.link.p = eb()
    broadcast(pair, 1.0)

    def refused(*a):
        raise OSError("no channel")
    monkeypatch.setattr(group_fault, "Outbox", refused)
    caplog.set_level(logging.ERROR, logger="ebctl.sglang")
    fol.st.fault = fault.Fault("batch_result")
    hooks.STATE = fol.st
    hooks.batch_result(Original(None), fol.sched, batch([req()]), "res")
    assert not fol.st.on and fol.st.cap is None and src.st.on and src.st.cap == 8
    assert "goes stock alone" in caplog.records[-1].getMessage()


@pytest.mark.parametrize(("spec", "rank", "armed"), [
    ("", 0, None), ("batch_result:40", 0, ("batch_result", 40)), ("batch_result:40", None, ("batch_result", 40)),
    ("run_batch", 3, ("run_batch", 1)), ("run_batch:30@1", 1, ("run_batch", 30)), ("run_batch:30@1", 0, None),
    ("run_batch:30@1", None, None),  # the DP controller has no rank
])
def test_a_fault_spec_arms_the_rank_it_names(spec, rank, armed):
    f = fault.parse(spec, rank)
    assert (None if f is None else (f.hook, f.at)) == armed


def test_the_channel_path_is_short_and_per_server(tmp_path):
    a = group_fault.endpoint("/run/ebctl", "gpu-node-7/dp3", 4242)
    assert a == "ipc:///run/ebctl/group-4242-gpu-node-7_dp3.sock"
    assert group_fault.endpoint("/run/ebctl", "gpu-node-7/dp3", 4243) != a  # another server's launcher
    long = group_fault.endpoint("/r/" + "x" * 60, "y" * 100, 1)
    assert len(long) - len("ipc://") <= 100


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
    st.fault = fault.Fault("defer_prefill")
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
