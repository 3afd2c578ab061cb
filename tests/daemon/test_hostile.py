"""What a hostile or broken peer sends must not take the daemon down, grow it without bound, or poison what it
publishes (each test here failed before the bounds it checks existed). Expected values are hand-counted."""

from __future__ import annotations

import os
import signal

import msgspec
import numpy as np
import pytest
import zmq
from ebd_helpers import finished, report, wait_for, write_config

from ebctl import bounds, config
from ebctl.config import ConfigError
from ebctl.controller import Controller
from ebctl.daemon import Daemon
from ebctl.protocol import (
    ControlReply,
    ControlRequest,
    DispatchPolicy,
    DispatchReport,
    FinishedRequest,
    IterationReport,
    Policy,
    ProtocolError,
    Telemetry,
    decode,
    encode,
)

KINDS = (Telemetry, IterationReport, DispatchReport, Policy, DispatchPolicy, ControlRequest, ControlReply)


def test_a_decoder_raises_nothing_but_protocol_error():
    """Random bytes, and frames that are valid msgpack with invalid UTF-8 in a key (what once escaped as a
    UnicodeDecodeError and killed the daemon): every decoder returns a message or raises ProtocolError (a map
    of unknown keys is a Policy of defaults, which the link refuses for its empty engine id)."""
    rng = np.random.default_rng(25)
    frames = [b"\xa1\xff", b"\x81\xa1\xff\x01", b"\x81\xa2v\xff\x01"]
    frames += [rng.bytes(int(n)) for n in rng.integers(1, 2000, 3000)]
    refused = 0
    for kind in KINDS:
        for f in frames:
            try:
                decode(f, kind)
            except ProtocolError:
                refused += 1
    assert refused >= len(KINDS) * (len(frames) - 3)
    with pytest.raises(ProtocolError, match="malformed"):
        decode(b"\xa1\xff", Telemetry)


def test_each_bound_refuses_its_report_and_counts_it(fast_cfg):
    core = Daemon(fast_cfg.with_updates({"daemon.max_string": 200, "daemon.max_finished": 10,
                                         "daemon.max_running_limit": 4096, "daemon.max_kv_tokens": 1 << 30}))
    good = report("e0", 0)
    r = msgspec.structs.replace
    one = FinishedRequest(10, 10)
    refused = {
        "bound:string": [r(good, mixed_unavailable_reason="x" * 201), r(good, instance="i" * 201),
                         r(good, gate_reasons={"y" * 201: 1}), r(good, finished=(FinishedRequest(1, 1, "z" * 201),))],
        "bound:finished": [r(good, finished=(one,) * 11)],
        "bound:requests": [r(good, max_running=2**64 - 1), r(good, waiting=4097), r(good, group_size=1 << 17)],
        "bound:tokens": [r(good, kv_total=(1 << 30) + 1), r(good, finished=(FinishedRequest(1 << 31, 1),)),
                         r(good, prefill_tokens=2, prefill_ctx_tokens=(2 << 30) + 1)],  # 2 tokens, each ≤ 2^30 keys
        "validation": [r(good, seq=2**63 - 1), r(good, prefill_ctx_tokens=-1)],
    }
    for frames in refused.values():
        for rep in frames:
            assert core.ingest(encode(rep), 1.0, 1.0) is None
    c = core.counters
    assert {k: n for k, n in c.rejected.items() if n} == {k: len(v) for k, v in refused.items()}
    assert c.received == 0 and not core.engines and not core.dispatch.forwards  # refused: no state at all
    # at the bounds themselves: accepted
    for seq, rep in enumerate((r(good, mixed_unavailable_reason="x" * 200), r(good, finished=(one,) * 10),
                               r(good, max_running=4096, kv_total=1 << 30),
                               r(good, prefill_tokens=2, prefill_ctx_tokens=2 << 30))):
        core.ingest(encode(r(rep, seq=seq)), 1.0, 1.0)
    assert c.received == 4 and c.frames == 4 + sum(map(len, refused.values()))


def test_replayed_and_out_of_order_reports_are_counted_not_ingested(fast_cfg):
    core = Daemon(fast_cfg)
    rng = np.random.default_rng(0)
    reps = [report("e0", s, finished(rng, 50, 2)) for s in range(10)]
    for rep in reps:
        core.ingest(encode(rep), 1.0, 1.0)
    eng = core.engines["e0"]
    seen = eng.controller.seen.completions
    assert seen == 20
    for rep in (reps[3], reps[9], reps[0]):  # a replay, the last one again, an old one
        assert core.ingest(encode(rep), 1.0, 1.0) is None
    assert eng.controller.seen.completions == seen and eng.replayed == 3 and core.counters.rejected["replayed"] == 3
    core.ingest(encode(report("e0", 12, finished(rng, 50, 1))), 1.0, 1.0)  # later seqs go on
    assert eng.controller.seen.completions == 21 and eng.seq_gaps == 2
    core.ingest(encode(report("e0", 12 + (1 << 40))), 1.0, 1.0)  # a jump: not 2**40 lost reports
    assert eng.seq_gaps == 2 and eng.seq_jumps == 1


def test_engine_ids_beyond_the_cap_leave_no_state(fast_cfg):
    core = Daemon(fast_cfg.with_updates({"daemon.max_engines": 3}))
    for i in range(100):
        core.ingest(encode(report(f"e{i}", 0)), 1.0, 1.0)
    assert sorted(core.engines) == ["e0", "e1", "e2"] and sorted(core.dispatch.forwards) == ["e0", "e1", "e2"]
    assert core.counters.rejected["bound:engines"] == 97 and core.counters.received == 3


def test_a_gone_engine_gives_its_slot_to_a_new_id_so_renamed_servers_stay_within_the_cap(fast_cfg):
    """A server restarted under a new name, again and again: at daemon.max_engines (3) each new id takes the slot
    of the engine silent the longest once it is gone (engine_gone_s, 10 s), never a live one's, and the engines
    kept (and their forward times) stay at the cap: the last three ids, however many came."""
    core = Daemon(fast_cfg.with_updates({"daemon.max_engines": 3, "daemon.engine_gone_s": 10.0}))
    for eid in ("a", "b", "c"):
        core.ingest(encode(report(eid, 0)), 1.0, 0.0)
    core.ingest(encode(report("b", 1)), 1.0, 5.0)
    core.ingest(encode(report("c", 1)), 1.0, 5.0)
    assert core.ingest(encode(report("d", 0)), 1.0, 9.0) is None  # a silent for 9 s: not gone, d refused
    assert core.counters.rejected["bound:engines"] == 1 and sorted(core.engines) == ["a", "b", "c"]
    assert core.ingest(encode(report("d", 0)), 1.0, 10.0) is not None  # a silent for 10 s: gone, d takes its slot
    assert sorted(core.engines) == ["b", "c", "d"] and sorted(core.dispatch.forwards) == ["b", "c", "d"]
    ids = [f"s{i}/dp0" for i in range(50)]  # one new name every 11 s: the one before it is gone by then
    for i, eid in enumerate(ids):
        core.ingest(encode(report(eid, 0)), 1.0, 30.0 + 11.0 * i)
        assert len(core.engines) == 3
    assert sorted(core.engines) == sorted(ids[-3:]) and sorted(core.dispatch.forwards) == sorted(ids[-3:])
    assert core.counters.rejected["bound:engines"] == 1 and core.counters.received == 5 + 1 + 50


def test_recent_reports_are_kept_within_their_bytes_without_finished_lists(fast_cfg):
    core = Daemon(fast_cfg.with_updates({"daemon.recent_bytes": 1 << 16}))
    rng = np.random.default_rng(1)
    for s in range(2000):
        core.ingest(encode(report("e0", s, finished(rng, 50, 3), mixed_unavailable_reason="m" * 1000)), 1.0, 1.0)
    eng = core.engines["e0"]
    per = 400 + 1000  # bounds.kept_bytes by hand: the struct, and its one long string (no instance, no reasons)
    assert len(eng.recent) == (1 << 16) // per and eng.recent_bytes == len(eng.recent) * per
    assert all(not k.finished for k in eng.recent) and eng.recent[-1].seq == 1999
    assert eng.controller.seen.completions == 6000  # what the controller saw is whole


def test_a_policy_never_exceeds_the_engines_reported_limit(fast_cfg):
    """n_max_limit above the engine's own max_running: the controller caps at the engine's; the daemon's last
    check refuses anything beyond it (hand-worked: 16 slots)."""
    assert bounds.policy_fault(Policy(k=4, n_max=16), 16) is None
    assert bounds.policy_fault(Policy(k=4, n_max=17), 16) == "n_max=17 above the engine's max_running=16"
    assert bounds.policy_fault(Policy(k=4, n_max=17), 0) is None  # unknown limit
    assert bounds.policy_fault(Policy(k=5, n_max=4), 0) == "k=5 above n_max=4"
    ctl = Controller(fast_cfg.controller.__class__(n_max_limit=1024, cold_mode="eb"), None, engine_id="e0")
    ctl.observe(report("e0", 0, max_running=16))
    assert ctl.policy.n_max == 16 and ctl.policy.k <= 16


def test_config_files_that_cannot_be_read_are_refused_with_the_byte(tmp):
    bad = tmp / "bad.toml"
    bad.write_bytes(b"[controller]\nmode = \"eb\"\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 \(byte 0xe9 at offset 30, line 3\)"):
        config.load(str(bad))
    base = config.Config()
    for updates, what in (({"controller.tune_min_pairs": 9, "controller.tune_max_pairs": 2}, "tune_min_pairs"),
                          ({"controller.k_override": 9, "controller.n_override": 4}, "k_override"),
                          ({"controller.ttl_s": 86400}, "allow_long_ttl")):
        with pytest.raises(ConfigError, match=what):
            base.with_updates(updates)
    assert base.with_updates({"controller.ttl_s": 86400, "daemon.allow_long_ttl": True}).controller.ttl_s == 86400


def test_a_daemon_keeps_its_config_through_a_sighup_of_garbage_and_says_why(spawn, tmp):
    cfg_path = write_config(tmp / "ebctl.toml", tmp / "rt", daemon={"metrics_port": 0})
    d = spawn(cfg_path)
    ctx = zmq.Context()
    try:
        req = ctx.socket(zmq.REQ)
        req.rcvtimeo = 3000
        req.connect(d.cfg.endpoint("control"))
        req.send(b"\xa1\xff")  # the two bytes that once killed it
        assert not decode(req.recv(), ControlReply).ok
        cfg_path.write_bytes(b"[controller]\nttl_s = 2.0\n\xff\xfe\n")
        d.proc.send_signal(signal.SIGHUP)
        st = wait_for(lambda: (s := d.status())["daemon"]["last_reload"] and s, what="the reload noted")
        assert d.proc.poll() is None and st["daemon"]["last_reload"]["ok"] is False
        assert "not UTF-8" in st["daemon"]["last_reload"]["error"]
        assert any("reload (SIGHUP) was refused" in w for w in st["daemon"]["warnings"])
        assert d.client().request("config").data["controller"]["ttl_s"] == 1.0  # the running config stays
    finally:
        ctx.destroy(linger=0)


def test_a_daemon_whose_runtime_dir_is_deleted_exits_for_a_restart(spawn, tmp):
    d = spawn()
    os.unlink(d.cfg.endpoint("control").removeprefix("ipc://"))
    assert wait_for(lambda: d.proc.poll() is not None, 15, "the daemon to exit")
    assert d.proc.returncode == 1 and "disappeared" in d.log()


def test_status_warns_of_an_exporter_off_this_host(fast_cfg):
    core = Daemon(fast_cfg.with_updates({"daemon.metrics_host": "0.0.0.0", "daemon.metrics_port": 9464}))
    assert any("metrics_host='0.0.0.0'" in w for w in core.warnings())
    core = Daemon(fast_cfg.with_updates({"daemon.metrics_host": "::1", "daemon.metrics_port": 9464}))
    assert core.warnings() == []
