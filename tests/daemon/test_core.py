"""The daemon's socket-free core (``Daemon.ingest`` / ``handle_control``) and its metrics registry."""

from __future__ import annotations

import json
import math
import time

import msgspec
import numpy as np
import pytest
from ebd_helpers import finished, report, wait_for, write_config

from ebctl import config, profiles
from ebctl.daemon import Daemon
from ebctl.link import EngineLink
from ebctl.protocol import CONTROL_OPS, BatchKind, ControlReply, ControlRequest, FinishedRequest, Mode, encode

TRUE = {"alpha_p": 2e-3, "beta_p": 3e-5, "alpha_d": 9e-3, "beta_d": 5e-5}


def control(d: Daemon, op: str, **args) -> ControlReply:
    return d.handle_control([encode(ControlRequest(op=op, args=args))], time.time())


def stream(d: Daemon, engine_id: str, n: int, rng, *, mean_out: float = 50.0, seq0: int = 0) -> None:
    """Decode and prefill iterations whose durations follow TRUE exactly (plus 1% noise)."""
    for s in range(seq0, seq0 + n):
        if s % 4 == 0:
            tok = int(rng.integers(200, 4000))
            r = report(engine_id, s, kind=BatchKind.PREFILL, decode_reqs=0, prefill_tokens=tok, prefill_reqs=1,
                       forward_s=(TRUE["alpha_p"] + TRUE["beta_p"] * tok) * rng.normal(1, 0.01))
        else:
            n_dec = int(rng.integers(8, 200))
            r = report(engine_id, s, finished(rng, mean_out, 1), decode_reqs=n_dec,
                       forward_s=(TRUE["alpha_d"] + TRUE["beta_d"] * n_dec) * rng.normal(1, 0.01))
        d.ingest(encode(r), time.time(), time.monotonic())


@pytest.fixture
def core(fast_cfg) -> Daemon:
    return Daemon(fast_cfg)


def test_ingest_counts_and_rejects_by_reason(core):
    good = report("e0", 0)
    eng = core.ingest(encode(good), 1.0, 1.0)
    assert eng is core.engines["e0"] and eng.controller.policy.version == 0  # the cold policy: publish it
    eng.published = 0  # (what the shell's publish does)
    assert core.ingest(encode(msgspec.structs.replace(good, seq=1)), 1.0, 1.0) is None  # unchanged: nothing new
    for frame in (b"\x00", b"", encode(msgspec.structs.replace(good, v=3)),
                  encode(msgspec.structs.replace(good, forward_s=math.nan)),
                  encode(msgspec.structs.replace(good, engine_id="a\0b")),
                  encode(ControlRequest(op="status"))):  # a valid message of the wrong kind
        assert core.ingest(frame, 1.0, 1.0) is None
    c = core.counters
    assert c.received == 2 and {k: n for k, n in c.rejected.items() if n} == {"malformed": 3, "version": 1,
                                                                                "validation": 2}
    assert c.frames == 8
    core.ingest(encode(msgspec.structs.replace(good, seq=5)), 1.0, 1.0)
    assert core.engines["e0"].seq_gaps == 3  # seqs 2, 3, 4 never arrived


def test_status_has_every_field_the_cli_shows(core):
    stream(core, "dp0", 200, np.random.default_rng(0))
    rep = control(core, "status")
    assert rep.ok
    msgspec.msgpack.encode(rep)  # it must go over the wire
    e = rep.data["engines"]["dp0"]
    for k in ("version", "mode", "k", "n_max", "kv_reserve_frac", "ttl_s", "reason", "theta0", "delta_theta",
              "theta_star", "n_star", "p0", "eta", "fit_r2", "mu_l", "mu_o", "n_obs", "eb_lhs", "eb_rhs",
              "reports", "completions", "updates", "cost_fits", "costs", "seq_gaps", "last_report_age_s",
              "last_update_age_s"):
        assert k in e, k
    assert e["reports"] == 200 and e["version"] >= 1 and e["mode"] == "eb"
    for kind in ("prefill", "decode"):  # 1% noise on TRUE: both fits pass and are in use
        assert e["cost_fits"][kind]["in_use"] and e["cost_fits"][kind]["rel_err"] < 0.02, e["cost_fits"][kind]
    assert e["cost_fits"]["mixed"]["state"] == "waiting" and e["costs"]["source"] == "online"
    reg, lab = core.registry, {"engine": "dp0", "phase": "decode"}
    assert reg.get_sample_value("ebctl_cost_fit_rel_err", lab) == e["cost_fits"]["decode"]["rel_err"]
    assert reg.get_sample_value("ebctl_cost_fit_in_use", lab) == 1.0
    assert reg.get_sample_value("ebctl_cost_fit_in_use", {**lab, "phase": "mixed"}) == 0.0
    daemon = rep.data["daemon"]
    assert daemon["counters"]["received"] == 200 and daemon["engines"] == 1
    assert set(daemon["endpoints"]) == {"telemetry", "policy", "control"}


def test_calibrate_writes_a_profile_that_profiles_load_reads(core, tmp):
    assert "no engine" in control(core, "calibrate").error
    stream(core, "dp0", 10, np.random.default_rng(1))
    early = control(core, "calibrate", engine="dp0")
    assert not early.ok and "no good cost fit yet" in early.error
    stream(core, "dp0", 400, np.random.default_rng(2), seq0=10)
    assert "no engine 'nope'" in control(core, "calibrate", engine="nope").error
    rep = control(core, "calibrate", engine="", name="test/cpu", gpu="none")  # "": the busiest engine
    assert rep.ok, rep.error
    path = tmp / "profile.json"
    path.write_text(json.dumps(rep.data))
    prof = profiles.load(str(path))
    assert prof.name == "test/cpu" and prof.gpu == "none"
    for k, v in TRUE.items():
        assert getattr(prof.costs, k) == pytest.approx(v, rel=0.1), k
    assert not prof.costs.has_mixed  # no mixed iterations were seen


def test_control_ops_and_errors(core, tmp):
    assert set(CONTROL_OPS) == set(core._ops)  # every op of the protocol is served
    cfg = control(core, "config").data
    assert cfg["controller"]["ttl_s"] == 1.0 and cfg["path"] == core.cfg.path
    assert "ops: status, tune" in control(core, "nope").error
    assert core.handle_control([b"x", b"y"], 0.0).error.startswith("bad request")
    assert not control(core, "tune").ok
    assert "unknown key" in control(core, "tune", updates={"controller.nope": 1}).error
    assert "daemon.profile='no-such'" in control(core, "tune", updates={"daemon.profile": "no-such"}).error
    refused = control(core, "tune", updates={"engine.force_version": "true", "controller.ttl_s": "2"})
    assert "read by the engines at start-up" in refused.error and core.cfg.controller.ttl_s == 1.0
    assert core.cfg.daemon.profile == ""
    ok = control(core, "tune", updates={"daemon.profile": "qwen3-8b/h200", "controller.ttl_s": "3"})
    assert ok.ok and core.cost_source == "profile:qwen3-8b/h200" and core.cfg.controller.ttl_s == 3.0
    nofile = Daemon(config.load(None, {"daemon.runtime_dir": str(tmp / "x")}))
    assert "without a config file" in control(nofile, "reload").error
    assert control(core, "shutdown").ok and core._stop.is_set()
    assert core.counters.control_errors == 6 and nofile.counters.control_errors == 1


def test_tune_reaches_every_controller_and_the_published_policy(core):
    rng = np.random.default_rng(3)
    for eid in ("a", "b"):
        stream(core, eid, 100, rng)
    assert control(core, "tune", updates={"controller.mode": "mb", "controller.window": "150"}).ok
    for eng in core.engines.values():
        assert eng.controller.params.mode == "mb" and eng.controller.params.window == 150
        assert eng.controller.policy.mode is Mode.MB  # recomputed at once, published by the loop


def test_metrics_registry_reads_the_controllers(inproc_daemon):
    d = inproc_daemon
    rng = np.random.default_rng(4)
    with EngineLink.from_config(d.cfg, "dp0") as link:
        seq = 0
        while not ((p := link.policy(time.monotonic())) and p.version >= 2):
            for _ in range(10):
                link.report(report("dp0", seq, finished(rng, 40.0, 2)))
                seq += 1
            wait_for(lambda n=seq: d.registry.get_sample_value("ebctl_reports_total", {"engine": "dp0"}) == n,
                     what=f"{seq} reports counted")  # the bound below then counts reports the daemon has seen
            assert seq < 2000
        wait_for(lambda: d.registry.get_sample_value("ebctl_reports_total", {"engine": "dp0"}) == seq,
                 what="all reports counted")
    reg, lab = d.registry, {"engine": "dp0"}
    pol = d.engines["dp0"].controller.policy
    est = pol.estimates
    assert reg.get_sample_value("ebctl_k", lab) == pol.k
    assert reg.get_sample_value("ebctl_n_max", lab) == pol.n_max
    assert reg.get_sample_value("ebctl_pd_interval", lab) == pol.pd_interval == 0  # no targets: the launch value
    for name in ("theta_star", "theta0", "p0", "mu_o", "mu_l", "n_star"):
        assert reg.get_sample_value(f"ebctl_{name}", lab) == pytest.approx(getattr(est, name)), name
    assert reg.get_sample_value("ebctl_mode", {**lab, "mode": "eb"}) == 1.0
    assert reg.get_sample_value("ebctl_mode", {**lab, "mode": "mb"}) == 0.0
    assert reg.get_sample_value("ebctl_policy_updates_total", lab) == d.engines["dp0"].controller.updates >= 1
    assert reg.get_sample_value("ebctl_cost", {**lab, "coef": "alpha_d"}) > 0
    assert reg.get_sample_value("ebctl_rejected_total", {"socket": "telemetry", "reason": "version"}) == 0
    assert reg.get_sample_value("ebctl_engines") == 1


def test_the_exporter_shows_the_latency_targets_and_their_attainment(tmp):
    """Targets TTFT ≤ 1 s and TPOT ≤ 50 ms. Over the reports after the horizon's first (t = 100 s), by hand:
    A (100 tokens, 0.5 s, 40 ms) meets both; B (50, 2.0 s, 10 ms) misses TTFT; C (30, 0.2 s, 90 ms) misses TPOT;
    D (20, 0.9 s, 50 ms) meets both, at the bounds' side. Judged 200 tokens: all 120 (0.60), TTFT 150 (0.75),
    TPOT 170 (0.85); goodput 120 tokens over the 2 s from the first report to the last: 60 tok/s."""
    cfg = config.load(str(write_config(tmp / "ebctl.toml", tmp / "rt",
                                       controller={"slo_ttft_s": 1.0, "slo_tpot_s": 0.05})))
    d = Daemon(cfg)
    reqs = {"A": FinishedRequest(100, 100, "stop", 0.5, 0.04), "B": FinishedRequest(100, 50, "stop", 2.0, 0.01),
            "C": FinishedRequest(100, 30, "stop", 0.2, 0.09), "D": FinishedRequest(100, 20, "length", 0.9, 0.05)}
    for seq, (wall, names) in enumerate(((100.0, ""), (101.0, "ABC"), (102.0, "D"))):
        r = msgspec.structs.replace(report("dp0", seq, tuple(reqs[n] for n in names)), wall_time=wall)
        d.ingest(encode(r), wall, wall)
    reg, lab = d.registry, {"engine": "dp0"}
    assert reg.get_sample_value("ebctl_slo_target_seconds", {**lab, "target": "ttft"}) == 1.0
    assert reg.get_sample_value("ebctl_slo_target_seconds", {**lab, "target": "tpot"}) == 0.05
    for which, share in (("all", 0.60), ("ttft", 0.75), ("tpot", 0.85)):
        assert reg.get_sample_value("ebctl_slo_attainment", {**lab, "which": which}) == pytest.approx(share), which
    assert reg.get_sample_value("ebctl_goodput_tokens_per_second", lab) == pytest.approx(60.0)
