"""docs/grafana/ebctl.json against what the exporter really exports: every metric a query names is in the
exposition of a daemon fed by two engines, with the labels the query uses; and the panels cover what an
operator watches (mode, k, θ̂*, N̂*, fits, gate reasons, policy age, dropped reports, per engine)."""

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

from ebctl.daemon import Daemon
from ebctl.protocol import BatchKind, encode

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "ebctl.json"
METRIC = re.compile(r"\b(ebctl_[a-z0-9_]+)\b(\{[^}]*\})?")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture
def exported(fast_cfg) -> dict[str, set[str]]:
    """Sample name → label names, from the text exposition of a daemon that two engines have reported to."""
    d = Daemon(fast_cfg)
    rng = np.random.default_rng(1)
    for eid in ("node-a/dp0", "node-b/dp1"):
        for seq in range(120):
            gate = {"threshold": seq // 10, "starvation": 1, "chunk_in_flight": seq // 20}
            if seq % 3 == 0:
                r = report(eid, seq, kind=BatchKind.PREFILL, decode_reqs=0, prefill_tokens=512, prefill_reqs=1,
                           forward_s=2e-3 + 3e-5 * 512 * rng.normal(1, 0.01), gate_reasons=gate)
            else:
                r = report(eid, seq, finished(rng, 50.0, 1), gate_reasons=gate)
            d.ingest(encode(r), time.time(), time.monotonic())
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(d.registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    assert out["ebctl_gate_decisions_total"] >= {"engine", "reason"}  # the feed reached every family
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
            assert used <= exported[name], (title, name, used - exported[name])
            checked += 1
        available = set().union(*(exported[n] for n, _ in names))
        grouped = {lab.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for lab in by.split(",")}
        assert grouped <= available, (title, grouped - available)
        assert set(re.findall(r"\{\{(\w+)\}\}", legend)) <= available, (title, legend)
    assert checked >= 30


def test_panels_cover_what_an_operator_watches_per_engine(dashboard):
    exprs = [expr for _, expr, _ in queries(dashboard)]
    wanted = {  # what the issue asks for → a metric that shows it
        "mode": "ebctl_mode", "k": "ebctl_k", "θ̂*": "ebctl_theta_star", "N̂*": "ebctl_n_star",
        "hazard fit": "ebctl_eta", "cost fits": "ebctl_cost_fit_rel_err", "fit in use": "ebctl_cost_fit_in_use",
        "gate reasons": "ebctl_gate_decisions_total", "policy age": "ebctl_policy_version",
        "dropped reports": "ebctl_seq_gaps_total",
    }
    for what, metric in wanted.items():
        assert any(re.search(rf"\b{metric}\b", e) for e in exprs), what
    age = next(e for e in exprs if "ebctl_policy_version" in e)
    assert age.startswith("time() - ")  # an age in seconds, not the version number
    # per engine: an "engine" variable from the exporter's label, and every per-engine query filters by it
    var = next(v for v in dashboard["templating"]["list"] if v["name"] == "engine")
    assert "label_values(ebctl_k, engine)" in json.dumps(var["query"]) and var["multi"] and var["includeAll"]
    for e in exprs:
        for name, matchers in METRIC.findall(e):
            if name not in ("ebctl_rejected_total", "ebctl_received_total", "ebctl_published_total",
                            "ebctl_control_errors_total", "ebctl_handshake_failed_total", "ebctl_engines",
                            "ebctl_daemon_restarts_total"):  # the daemon-wide ones have no engine label
                assert 'engine=~"$engine"' in matchers, (name, e)


def test_layout_is_valid(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
