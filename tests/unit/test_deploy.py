"""deploy/kubernetes: the manifests parse, and the pieces meet as docs/fleet.md says (the same socket directory
and uid for the node daemon and the sglang pods, the plugin switched on and the server named, the daemon's
config valid for ebctl, the gateway with the settings tools/fleet_real.py measured)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ebctl import config

yaml = pytest.importorskip("yaml")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))


def docs(name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / name).read_text())}


def pod(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def test_the_node_daemon_and_the_servers_share_the_socket_directory_and_the_uid():
    node, servers = docs("ebctl-node.yaml"), docs("sglang.yaml")
    d, s = pod(node["DaemonSet"]), pod(servers["Deployment"])
    run = {v["name"]: v for v in d["volumes"]}["run"]["hostPath"]["path"]
    assert run == {v["name"]: v for v in s["volumes"]}["run"]["hostPath"]["path"]
    cfg = config.from_toml(node["ConfigMap"]["data"]["ebctl.toml"])  # what ebctl reads: valid, and the same dir
    assert cfg.daemon.runtime_dir == run
    for p in (d, s):
        mounts = {m["name"]: m["mountPath"] for m in p["containers"][0]["volumeMounts"]}
        assert mounts["run"] == run and mounts["config"] == "/etc/ebctl"
    assert d["securityContext"] == s["securityContext"]  # the runtime dir is private (0700) to one uid
    env = {e["name"]: e for e in s["containers"][0]["env"]}
    assert env["SGLANG_PLUGINS"]["value"] == "ebctl"
    assert env["EBCTL_CONFIG"]["value"] == "/etc/ebctl/ebctl.toml"
    assert env["EBCTL_SERVER"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"]["value"] == "0"
    cmd = d["containers"][0]["command"]
    assert cmd[:2] == ["ebctl", "daemon"] and "daemon.node=$(NODE_NAME)" in cmd


def test_the_gateway_finds_the_servers_with_the_measured_settings():
    import fleet_real

    smg = docs("smg.yaml")
    cmd = pod(smg["Deployment"])["containers"][0]["command"]
    servers = docs("sglang.yaml")["Deployment"]
    assert cmd[cmd.index("--selector") + 1] == "app=" + servers["spec"]["template"]["metadata"]["labels"]["app"]
    port = pod(servers)["containers"][0]["ports"][0]["containerPort"]
    assert cmd[cmd.index("--service-discovery-port") + 1] == str(port)
    joined = " ".join(cmd)
    assert " ".join(fleet_real.RECOMMENDED) in joined and "--policy least_load" in joined
    assert smg["Role"]["rules"][0]["verbs"] == ["get", "list", "watch"]
