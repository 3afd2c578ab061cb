"""Staggered batch scheduling in sglang's data-parallel controller, on the real sglang 0.5.23 with
``--dp-size 2`` (plain DP, two scheduler ranks) on CPU, the real daemon (``dispatch.mode = sbs``) and sglang's
own client. One server for the module; the tests run in file order (the last one kills the daemon).

Shown here: the dispatcher runs in the ``sglang::data_parallel_controller`` process; every request lands on
the rank the plugin chose (its trace, by request id, against the ``dp_rank`` sglang's answer carries); a
deliberate skew (rank 1 drained) shows up rank by rank; an abort of a held request is answered; kill -9 of
the daemon mid-load: the dispatcher goes stock within the policy's TTL and every request completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from harness import TP_TORCH_CORES, Rig, post_json, wait_for

pytestmark = pytest.mark.sglang

DP_ARGS = ["--dp-size", "2", "--load-balance-method", "round_robin", "--load-snapshot-publish-interval", "1"]
SBS = {"dispatch.mode": "sbs"}


@pytest.fixture(scope="module")
def rig(sglang_venv, tiny_model, module_workdir):
    traces = module_workdir / "traces"
    traces.mkdir()
    r = Rig(sglang_venv, tiny_model, module_workdir, DP_ARGS, daemon=SBS, engine={"engine.trace_dir": str(traces)},
            env=TP_TORCH_CORES)
    r.trace = traces / "dispatch.jsonl"
    yield r
    r.close()


def dispatcher(rig) -> dict:
    return rig.daemon.status()["dispatchers"].get("dispatch") or {}


def wait_state(rig, state: str = "sbs", **policy) -> dict:
    """Until the daemon publishes a policy with ``policy``'s fields and the dispatcher reports that it applied
    it (its report's policy version at least that one's) and is in ``state``."""
    def published():
        pol = dispatcher(rig).get("policy") or {}
        return all(pol.get(k) == v for k, v in policy.items()) and pol.get("version", -1) >= 0 and pol["version"]
    version = wait_for(published, 30, f"the daemon to publish {policy}", interval=0.1)

    def applied():
        st = dispatcher(rig)
        return st if st.get("state") == state and st.get("policy_version", -1) >= version else None
    return wait_for(applied, 30, f"the dispatcher to apply {policy} in state {state}", interval=0.1)


def events(rig) -> list[dict]:
    return [json.loads(x) for x in rig.trace.read_text().splitlines()] if rig.trace.exists() else []


def generate(url: str, rid: str, n_in: int = 12, max_new: int = 8, timeout: float = 120, rank: int | None = None
             ) -> dict:
    body = {"input_ids": [5 + i % 50 for i in range(n_in)], "rid": rid,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
    if rank is not None:  # sglang's own per-request routing: the dispatcher passes it through
        body["routed_dp_rank"] = rank
    return post_json(f"{url}/generate", body, timeout=timeout)["meta_info"]


def burst(url: str, rids: list[str], **kw) -> dict[str, dict]:
    """All at once, one thread each; rid → meta_info."""
    out: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda rid=rid, i=i: out.update({rid: generate(url, rid, 8 + i % 24, **kw)}))
               for i, rid in enumerate(rids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


@contextlib.contextmanager
def busy_ranks(rig):
    """Both ranks busy with one long request each (sent to its rank by ``routed_dp_rank``, so not held), with
    I_opt ≈ (T̄_fwd + 10 s)/2: no rank is ever quiescent and a new request is held for seconds. The long requests
    are aborted on the way out; their answers in the yielded dict."""
    long: dict = {}
    rids = [f"hog-{time.monotonic_ns()}-{r}" for r in range(2)]
    hogs = [threading.Thread(target=lambda rid=rid, r=r: long.update({rid: generate(rig.server.url, rid, 8, 1800,
                                                                                  rank=r)}))
            for r, rid in enumerate(rids)]
    try:
        for t in hogs:
            t.start()
        wait_for(lambda: all(r[3] >= 1 for r in dispatcher(rig)["rank"]), 10, "both ranks to run a long request")
        rig.daemon.tune(dispatch__l_net_s="10")
        wait_state(rig, l_net_s=10.0)
        yield long
    finally:
        for rid in rids:
            with contextlib.suppress(OSError):
                post_json(f"{rig.server.url}/abort_request", {"rid": rid})
        for t in hogs:
            t.join(60)
        if rig.daemon.proc.poll() is None:  # (the kill -9 test leaves it dead)
            rig.daemon.tune(dispatch__l_net_s="0.001")


def server_processes(rig) -> dict[int, tuple[str, bool]]:
    """The server's processes (its process group) by pid: (process title, holds the dispatcher's trace open)."""
    trace, out = str(rig.trace.resolve()), {}
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or os.getpgid(int(d.name)) != rig.server.proc.pid:
                continue
            title = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").split()[0]
            fds = set()
            for f in (d / "fd").iterdir():
                with contextlib.suppress(OSError):
                    fds.add(os.readlink(f))
            out[int(d.name)] = (title, trace in fds)
        except (OSError, IndexError):
            continue
    return out


def test_the_dispatcher_runs_in_the_dp_controller_and_requests_land_where_it_chose(rig):
    st = wait_state(rig)
    assert st["layout"] == "plain" and st["ranks"] == 2 and st["targets"] == 2
    rids = [f"p-{i}" for i in range(40)]
    metas = burst(rig.server.url, rids)
    assert len(metas) == 40
    ev = events(rig)
    chosen = {e["rid"]: e["rank"] for e in ev if e["how"] == "sbs"}
    held = {e["rid"] for e in ev if e["how"] == "held"}
    assert set(rids) <= held  # every one was held by the dispatcher ...
    assert {rid: metas[rid]["dp_rank"] for rid in rids} == {rid: chosen[rid] for rid in rids}  # ... and ran there
    procs = server_processes(rig)
    assert [title for title, holds in procs.values() if holds] == ["sglang::data_parallel_controller"], procs
    assert sum(title.startswith("sglang::scheduler") for title, _ in procs.values()) == 2, procs
    st = wait_for(lambda: (s := dispatcher(rig))["released"] >= 40 and s, 10, "the dispatcher's report")
    assert st["buffered"] == 0 and st["flushed"] == 0 and sum(r[1] for r in st["rank"]) == st["released"]
    # the daemon measured both ranks' T̄_fwd (rank 1's reports reach it up to engine.report_flush_s later, and
    # the policy that carries the figure after them)
    wait_for(lambda: {int(r) for r in dispatcher(rig)["policy"]["t_fwd_by_rank"]} == {0, 1}, 10,
             "both ranks' T̄_fwd in the dispatcher's policy")
    assert "ebctl: dispatcher dispatch active in the DP controller (plain, 2 ranks" in rig.server.log()


def test_a_drained_rank_gets_nothing_rank_by_rank(rig):
    """The deliberate skew: ``dispatch.drain_ranks = 1``: every request to rank 0 (round robin would split
    them), then undrained: rank 1 serves again."""
    before = {r[0]: r[1] for r in wait_state(rig)["rank"]}
    rig.daemon.tune(dispatch__drain_ranks="1")
    wait_state(rig, drain_ranks=[1])
    metas = burst(rig.server.url, [f"d-{i}" for i in range(30)])
    assert [m["dp_rank"] for m in metas.values()] == [0] * 30
    assert {e["rank"] for e in events(rig) if e["rid"].startswith("d-") and e["how"] == "sbs"} == {0}
    st = wait_for(lambda: (s := dispatcher(rig))["rank"][0][1] >= before[0] + 30 and s, 10, "the report")
    assert (st["rank"][0][1] - before[0], st["rank"][1][1] - before[1]) == (30, 0)
    rig.daemon.tune(dispatch__drain_ranks="")
    wait_state(rig, drain_ranks=[])
    metas = burst(rig.server.url, [f"u-{i}" for i in range(30)])
    assert {m["dp_rank"] for m in metas.values()} == {0, 1}


def test_an_abort_of_a_held_request_is_answered(rig):
    """Held about 5 s (``busy_ranks``), a request is aborted meanwhile: the dispatcher releases it at once and the
    abort follows it, so sglang answers it."""
    with busy_ranks(rig) as long:
        # A release is due I_opt after the last one, not after this request came: one that arrives late in that
        # interval is sent within moments. Such a request is not the case here; another one is sent instead.
        for attempt in range(5):
            rid, out = f"abort-me-{attempt}", {}
            t = threading.Thread(target=lambda rid=rid, out=out: out.update(generate(rig.server.url, rid, 8, 8)))
            t.start()
            wait_for(lambda rid=rid: any(e["rid"] == rid for e in events(rig)), 10, "the request to be held")
            post_json(f"{rig.server.url}/abort_request", {"rid": rid})
            t.join(30)
            hows = [e["how"] for e in events(rig) if e["rid"] == rid]
            if hows[:2] != ["held", "sbs"]:  # still held when the abort came
                break
        assert out["finish_reason"]["type"] == "abort", out
        assert hows == ["held", "abort"], hows
        assert wait_for(lambda: dispatcher(rig)["aborted"] >= 1, 10, "the abort in the report")
    assert {m["finish_reason"]["type"] for m in long.values()} == {"abort"}
    assert {m["dp_rank"] for m in long.values()} == {0, 1}
    wait_state(rig, l_net_s=0.001)


def test_kill9_of_the_daemon_mid_load_flushes_and_goes_stock_within_the_ttl(rig):
    """sglang's client sends its load; then requests are held for seconds (``busy_ranks``) and the daemon dies:
    its policy's expiry, ``controller.ttl_s`` after it arrived, flushes them through sglang's own dispatch; from
    then on every request goes there. Every request completes."""
    mark = len(events(rig))

    def waiting() -> int:
        ev = events(rig)[mark:]
        return sum(e["how"] == "held" for e in ev) - sum(e["how"] != "held" for e in ev)

    result: dict = {}
    load = threading.Thread(target=lambda: result.update(rig.bench(
        num_prompts=300, input_len=32, output_len=32, range_ratio=0.5, concurrency=24, seed=31)))
    load.start()
    wait_for(lambda: len(events(rig)) > mark + 20, 120, "the client's load to arrive")
    with busy_ranks(rig):
        wait_for(lambda: waiting() >= 5, 30, "requests to be held")
        ttl = float(rig.daemon.settings["controller.ttl_s"])
        t_kill = time.time()
        rig.daemon.kill9()
        time.sleep(ttl + 1.0)
    load.join(300)
    try:
        assert result.get("completed") == 300, result  # sglang's client completed every request
        ev = events(rig)[mark:]
        held = [e for e in ev if e["how"] == "held"]
        sent = [e for e in ev if e["how"] in ("sbs", "flush", "abort", "overload")]
        assert sorted(e["rid"] for e in held) == sorted(e["rid"] for e in sent)  # each held one sent, once
        flushed = [e["t"] for e in ev if e["how"] == "flush"]
        assert len(flushed) >= 5 and t_kill < min(flushed) and max(flushed) <= t_kill + ttl + 0.5  # at expiry
        assert max(e["t"] for e in held) <= t_kill + ttl + 0.5  # then stock: nothing held any more
        assert len(held) < 300  # the rest went through sglang's own dispatch
        assert rig.server.alive()
    finally:
        rig.daemon.start()
    wait_state(rig, l_net_s=0.001)  # a new daemon (its config file): the dispatcher holds again


def test_every_dispatch_hook_target_resolves_with_the_parameters_the_hooks_name(sglang_venv):
    import subprocess

    from harness import server_env
    probe = ("import inspect, json, pkgutil\n"
             "from sglang_patch.dispatch import DISPATCH_TARGETS\n"
             "print(json.dumps({n: list(inspect.signature(pkgutil.resolve_name(t)).parameters)"
             " for n, t in DISPATCH_TARGETS.items()}))")
    p = subprocess.run([str(sglang_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                       timeout=300, env=server_env(), cwd="/")
    assert p.returncode == 0, p.stderr[-3000:]
    params = json.loads(p.stdout.strip().splitlines()[-1])
    assert params == {"event_loop": ["self"], "dispatch": ["self", "req", "refresh_load_budget"],
                      "control": ["self", "obj"], "to_all": ["self", "obj"]}
