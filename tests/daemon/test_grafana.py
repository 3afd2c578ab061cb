"""docs/grafana/ebctl.json against what the exporter really exports: every metric a query names is in the
exposition of daemons fed by engines (the paper's controller and the default one), with the labels and label
values the query uses; and the panels cover what an operator watches (throughput and the gain against stock,
the default controller's tuner and probes, mode, k, θ̂*, N̂*, fits, gate reasons, policy age, dropped reports,
per engine; the daemon's faults and refusals)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from ebd_helpers import finished, report
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ebctl import config
from ebctl.daemon import Daemon
from ebctl.protocol import BatchKind, encode

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "ebctl.json"
METRIC = re.compile(r"\b(ebctl_[a-z0-9_]+)\b(\{[^}]*\})?")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
EQUALS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)"')  # label="value": an exact match
DAEMON_WIDE = {"ebctl_rejected_total", "ebctl_received_total", "ebctl_published_total", "ebctl_control_errors_total",
               "ebctl_handshake_failed_total", "ebctl_engines", "ebctl_daemon_restarts_total", "ebctl_faults_total",
               "ebctl_policies_refused_total", "ebctl_control_refused_total"}  # no engine label


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def feed(d: Daemon, *engine_ids: str) -> None:
    rng = np.random.default_rng(1)
    for eid in engine_ids:
        for seq in range(120):
            gate = {"threshold": seq // 10, "starvation": 1, "chunk_in_flight": seq // 20}
            if seq % 3 == 0:
                r = report(eid, seq, kind=BatchKind.PREFILL, decode_reqs=0, prefill_tokens=512, prefill_reqs=1,
                           forward_s=2e-3 + 3e-5 * 512 * rng.normal(1, 0.01), gate_reasons=gate)
            else:
                r = report(eid, seq, finished(rng, 50.0, 1), gate_reasons=gate)
            d.ingest(encode(r), time.time(), time.monotonic())


@pytest.fixture
def exported(fast_cfg, tmp) -> dict[str, dict[str, set[str]]]:
    """Sample name → label name → values, from the text exposition (what a scrape of the exporter reads) of
    two daemons: one with the paper's controller (the fast test config) fed by two engines, one with the
    default controller (eb+, measured θ: the only one with tuner series) fed by a third."""
    paper = Daemon(fast_cfg)
    default = Daemon(config.load(None, {"daemon.runtime_dir": str(tmp / "rt-default")}))
    assert default.cfg.controller.theta_method == "measured"  # what an operator gets without a config file
    feed(paper, "node-a/dp0", "node-b/dp1")
    feed(default, "node-c/dp2")
    out: dict[str, dict[str, set[str]]] = {}
    for d in (paper, default):
        for family in text_string_to_metric_families(generate_latest(d.registry).decode()):
            for s in family.samples:
                labels = out.setdefault(s.name, {})
                for k, v in s.labels.items():
                    labels.setdefault(k, set()).add(v)
    assert out["ebctl_gate_decisions_total"].keys() >= {"engine", "reason"}  # the feed reached every family
    assert out["ebctl_tuner_arm"]["engine"] == {"node-c/dp2"}  # the default controller's own series
    return out


def queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every target, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out += [(p["title"], t["expr"], t.get("legendFormat", "")) for t in p.get("targets", [])]
    return out


def test_every_query_names_exported_metrics_with_their_labels(dashboard, exported):
    checked = 0
    for title, expr, legend in queries(dashboard):
        names = METRIC.findall(expr)
        assert names, (title, expr)
        for name, matchers in names:
            assert name in exported, f"panel {title!r}: {name} is not exported (exported: {sorted(exported)})"
            used = set(LABEL.findall(matchers or ""))
            assert used <= exported[name].keys(), (title, name, used - exported[name].keys())
            for label, value in EQUALS.findall(matchers or ""):  # a value the exporter never gives matches nothing
                assert value in exported[name][label] or value.startswith("$"), (title, name, label, value)
            checked += 1
        available = set().union(*(exported[n].keys() for n, _ in names))
        grouped = {lab.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for lab in by.split(",")}
        assert grouped <= available, (title, grouped - available)
        assert set(re.findall(r"\{\{(\w+)\}\}", legend)) <= available, (title, legend)
    assert checked >= 40


def test_panels_cover_what_an_operator_watches_per_engine(dashboard):
    exprs = [expr for _, expr, _ in queries(dashboard)]
    wanted = {  # what the issue asks for → a metric that shows it
        "mode": "ebctl_mode", "k": "ebctl_k", "θ̂*": "ebctl_theta_star", "N̂*": "ebctl_n_star",
        "hazard fit": "ebctl_eta", "cost fits": "ebctl_cost_fit_rel_err", "fit in use": "ebctl_cost_fit_in_use",
        "gate reasons": "ebctl_gate_decisions_total", "policy age": "ebctl_policy_version",
        "dropped reports": "ebctl_seq_gaps_total", "throughput": "ebctl_output_tokens_per_second",
        "gain against stock": "ebctl_gain_vs_stock", "exploration cost": "ebctl_exploration_cost_share",
        "daemon faults": "ebctl_faults_total", "policies refused": "ebctl_policies_refused_total",
        "refused frames": "ebctl_rejected_total", "engines up": "ebctl_engine_up",
        "node and server": "ebctl_engine_info",
    }
    for what, metric in wanted.items():
        assert any(re.search(rf"\b{metric}\b", e) for e in exprs), what
    age = next(e for e in exprs if "ebctl_policy_version" in e)
    assert age.startswith("time() - ")  # an age in seconds, not the version number
    # per engine: an "engine" variable from the exporter's label, and every per-engine query filters by it
    # a fleet: node and server variables from the exporter's info metric narrow the engine variable
    var = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "label_values(ebctl_engine_info, node)" in json.dumps(var["node"]["query"])
    assert 'ebctl_engine_info{node=~\\"$node\\"}, server)' in json.dumps(var["server"]["query"])
    assert 'node=~\\"$node\\",server=~\\"$server\\"}, engine)' in json.dumps(var["engine"]["query"])
    assert all(var[n]["multi"] and var[n]["includeAll"] for n in ("node", "server", "engine"))
    for e in exprs:
        for name, matchers in METRIC.findall(e):
            if name not in DAEMON_WIDE:
                assert 'engine=~"$engine"' in matchers, (name, e)
    # refused frames by reason: some panel keeps the reason apart
    assert any("ebctl_rejected_total" in e and re.search(r"by \([^)]*\breason\b", e) for e in exprs)


def family(sample: str) -> str:
    return re.sub(r"_(total|created)$", "", sample)


def test_every_series_of_the_default_controllers_search_and_probes_has_a_panel(dashboard, exported):
    """The tuner (measured θ) and the eb+ probes are what the default controller does on its own: each of
    their metric families, as the exporter names them, is in some panel's query."""
    own = {family(n) for n in exported if n.startswith(("ebctl_tuner_", "ebctl_probes", "ebctl_probe_"))}
    assert {"ebctl_tuner_theta", "ebctl_tuner_arm", "ebctl_tuner_trials", "ebctl_probes"} <= own  # not vacuous
    shown = {family(name) for _, expr, _ in queries(dashboard) for name, _ in METRIC.findall(expr)}
    assert own <= shown, f"no panel for {sorted(own - shown)}"


def test_layout_is_valid(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
