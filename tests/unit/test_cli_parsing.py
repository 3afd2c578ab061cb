"""The command line without a daemon: options, validation, exit codes and messages."""

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebctl import cli, config
from ebctl.cli import common, run, view

runner = CliRunner()


def invoke(*args: str, **kw):
    return runner.invoke(cli.app, list(args), catch_exceptions=False, **kw)


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch):
    monkeypatch.delenv("EBCTL_CONFIG", raising=False)


def test_config_show_prints_toml_with_overrides_from_both_places():
    r = invoke("--set", "controller.mode=eb+", "config", "show", "--set", "controller.window=900",
               "--runtime-dir", "/tmp/ebctl-x")
    assert r.exit_code == 0, r.output
    doc = tomllib.loads(r.stdout)
    assert doc["controller"]["mode"] == "eb+" and doc["controller"]["window"] == 900
    assert doc["daemon"]["runtime_dir"] == "/tmp/ebctl-x"
    assert "# W: completions in the sliding windows" in r.stdout  # every key documented


def test_config_show_json_and_insecure_shortcut(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[controller]\nmode = "mb"\n')
    r = invoke("config", "show", "--json", "--config", str(f), "--insecure")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["controller"]["mode"] == "mb" and d["daemon"]["insecure"] is True and d["path"] == str(f)


def test_config_path_from_environment(tmp_path, monkeypatch):
    f = tmp_path / "e.toml"
    f.write_text('[controller]\nwindow = 777\n')
    monkeypatch.setenv("EBCTL_CONFIG", str(f))
    assert json.loads(invoke("config", "show", "--json").stdout)["controller"]["window"] == 777


@pytest.mark.parametrize("args,needle", [
    (["--set", "controller.mode=fast"], "controller.mode='fast'"),
    (["--set", "controller.window=3"], "allowed: int >= 10"),
    (["--set", "controller.nope=1"], "unknown key 'controller.nope'"),
    (["--set", "controller.mode"], "expected KEY=VALUE"),
])
def test_bad_set_exits_2_naming_key_value_and_allowed(args, needle):
    for where in ([*args, "config", "show"], ["config", "show", *args], ["status", *args]):
        r = invoke(*where)
        assert r.exit_code == 2, (where, r.output)
        assert needle in r.stderr


def test_bad_mode_names_the_allowed_values():
    r = invoke("config", "show", "--set", "controller.mode=fast")
    assert "allowed: one of eb, eb+, mb, off" in r.stderr


def test_usage_errors_exit_2():
    assert invoke("no-such-command").exit_code == 2
    assert invoke("status", "--no-such-flag").exit_code == 2
    assert invoke("start").exit_code == 2  # --engine is required
    assert invoke("start", "--engine", "vllm").exit_code == 2


def test_config_check(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[controller]\nmode = "eb+"\n')
    r = invoke("config", "check", str(good))
    assert r.exit_code == 0 and "ok" in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[controller]\nwindow = "big"\n')
    r = invoke("config", "check", str(bad))
    assert r.exit_code == 2 and "controller.window" in r.stderr and str(bad) in r.stderr
    r = invoke("config", "check", str(tmp_path / "missing.toml"))
    assert r.exit_code == 2 and "not found" in r.stderr


def test_config_check_ignores_a_broken_default_file(tmp_path):
    """Checking FILE must not depend on --config: a broken global config does not hide FILE's verdict."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[controller\n")
    good = tmp_path / "good.toml"
    good.write_text("")
    assert invoke("--config", str(broken), "config", "check", str(good)).exit_code == 0


def test_status_against_a_dead_endpoint_exits_1_and_names_it(tmp_path):
    rd = tmp_path / "rt"
    r = invoke("status", "--runtime-dir", str(rd))
    assert r.exit_code == 1
    assert f"ebctl daemon not reachable at ipc://{rd}/control.sock" in r.stderr
    assert "ebctl start / systemctl start ebctl" in r.stderr


def test_a_private_runtime_dir_says_whose_it_is(tmp_path, monkeypatch):
    real_exists = Path.exists

    def exists(self, *a, **kw):
        if self.name == "control.sock":
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *a, **kw)

    monkeypatch.setattr(Path, "exists", exists)
    r = invoke("status", "--runtime-dir", str(tmp_path))
    assert r.exit_code == 1 and f"{tmp_path} is private to the daemon's user" in r.stderr


def test_dead_tcp_endpoint_times_out_with_the_endpoint(monkeypatch):
    monkeypatch.setattr(common, "CONTROL_TIMEOUT_S", 0.3)
    ep = "tcp://127.0.0.1:9"  # discard port: nothing answers
    r = invoke("reload", "--insecure", "--set", f"daemon.control_endpoint={ep}")
    assert r.exit_code == 1 and f"not reachable at {ep}" in r.stderr


def test_tcp_without_keys_is_refused_with_exit_2():
    r = invoke("status", "--set", "daemon.control_endpoint=tcp://127.0.0.1:9")
    assert r.exit_code == 2 and "CURVE" in r.stderr


@pytest.mark.parametrize("assignment,needle", [
    ("controller.mode=fast", "allowed: one of eb, eb+, mb, off"),
    ("controller.nope=1", "unknown key"),
    ("controller.mode", "expected KEY=VALUE"),
])
def test_tune_set_validates_before_asking_the_daemon(tmp_path, assignment, needle):
    r = invoke("tune", "set", assignment, "--runtime-dir", str(tmp_path / "none"))
    assert r.exit_code == 2 and needle in r.stderr  # exit 2, not "unreachable" (1): the daemon was never asked


def test_keygen_writes_a_private_secret(tmp_path):
    d = tmp_path / "keys"
    r = invoke("keygen", "--dir", str(d), "--name", "daemon")
    assert r.exit_code == 0, r.output
    secret, public = d / "daemon.key_secret", d / "daemon.key"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert public.is_file() and str(secret) in r.stdout and "curve_server_key" in r.stdout
    again = invoke("keygen", "--dir", str(d), "--name", "daemon")
    assert again.exit_code == 1 and "exists" in again.stderr
    assert invoke("keygen", "--dir", str(d), "--name", "daemon", "--force").exit_code == 0


def test_start_sglang_missing_says_how_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    r = invoke("start", "--engine", "sglang", "--runtime-dir", str(tmp_path / "rt"), "--", "--model-path", "m")
    assert r.exit_code == 1
    assert "sglang is not installed: pip install 'ebctl[sglang]'" in r.stderr
    assert not (tmp_path / "rt").exists()  # nothing started, nothing created


def test_profiles_lists_the_presets():
    r = invoke("profiles", "--json")
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["qwen3-8b/h200"]["gpu"] == "H200" and d["qwen3-8b/h200"]["has_beta_mb"] is True
    assert d["qwen3-8b/h200"]["costs"]["alpha_d"] > 0
    table = invoke("profiles").stdout
    assert "qwen3-8b/h200" in table and "β_MB" in table


def test_sim_engine_command_passes_the_config_and_the_arguments():
    cmd = run._sim_engine_cmd("/run/x/start.toml", ["--engine-id", "e1", "--speed", "5"])
    assert cmd == [sys.executable, "-m", "ebctl.sim.live", "--config", "/run/x/start.toml",
                   "--engine-id", "e1", "--speed", "5"]


def test_status_view_renders_every_field_and_missing_values():
    st = {"mode": "eb", "k": 12, "n_max": 200, "theta_star": 0.31, "p0": float("nan"), "beta_p": 2.49e-5,
          "cost_source": "online", "reason": "hazard fit ok", "cost_fits": {"prefill": {"r2": 0.99, "n": 40}},
          "future_field": 3}
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(view.status_view({"daemon": {"reports": 10, "rejected": {"malformed": 1}}, "engines": {"e0": st}}))
    text = console.export_text()
    for needle in ("engine e0", "θ̂*", "0.31", "2.490e-05", "—", "hazard fit ok", "cost fit prefill", "r2=0.99",
                   "future_field", "rejected.malformed"):
        assert needle in text, needle


def test_json_output_has_no_nan():
    assert json.loads(json.dumps(view.jsonable({"a": [float("nan"), 1.5], "b": {"c": float("inf")}}))) == \
        {"a": [None, 1.5], "b": {"c": None}}


def test_default_config_is_what_config_show_prints():
    cfg = config.load(None)
    assert invoke("config", "show").stdout == config.to_toml(cfg)


# ---- systemd/ -----------------------------------------------------------------------------------------

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def test_example_config_is_the_defaults_with_the_runtime_dir_set():
    text = (SYSTEMD / "ebctl.toml.example").read_text()
    cfg = config.load(str(SYSTEMD / "ebctl.toml.example"))
    expected = config.Config().with_updates({"daemon.runtime_dir": "/run/ebctl"})
    assert cfg.as_dict() == expected.as_dict()
    body = text[text.index("\n[daemon]\n") + 1:]
    assert body == config.to_toml(cfg), ("systemd/ebctl.toml.example is stale: rewrite everything from [daemon] "
                                         "on with `ebctl config show --config systemd/ebctl.toml.example`")


def test_units_agree_with_the_example_config():
    daemon_unit = (SYSTEMD / "ebctl.service").read_text()
    engine_unit = (SYSTEMD / "sglang@.service").read_text()
    assert "RuntimeDirectory=ebctl\n" in daemon_unit and "RuntimeDirectoryMode=0700\n" in daemon_unit
    assert "Environment=EBCTL_CONFIG=/etc/ebctl/ebctl.toml\n" in engine_unit
    assert "Environment=SGLANG_PLUGINS=ebctl\n" in engine_unit
    user = [line for line in daemon_unit.splitlines() if line.startswith("User=")]
    assert user == [line for line in engine_unit.splitlines() if line.startswith("User=")] == ["User=ebctl"]


def _units_for_this_machine(tmp_path: Path) -> Path:
    """The units with /opt/ebctl/bin pointed at this virtual environment (verify checks ExecStart exists)."""
    bindir = Path(sys.executable).parent
    assert (bindir / "ebctl").exists(), "the ebctl console script is not installed next to this python"
    for name in ("ebctl.service", "sglang@.service"):
        text = (SYSTEMD / name).read_text().replace("/opt/ebctl/bin/", f"{bindir}/")
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian: apt-get install -y systemd)")
def test_systemd_analyze_verify(tmp_path):
    d = _units_for_this_machine(tmp_path)
    env = {**os.environ, "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_COLOR": "0"}
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(d / "ebctl.service"),
                        str(d / "sglang@test.service")], capture_output=True, text=True, env=env, timeout=60)
    ours = [line for line in (r.stdout + r.stderr).splitlines() if "ebctl" in line or "sglang@" in line]
    assert r.returncode == 0 and not ours, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None,
                    reason="systemd-sysusers is not installed (Debian: apt-get install -y systemd)")
def test_sysusers_file_parses():
    r = subprocess.run(["systemd-sysusers", "--dry-run", str(SYSTEMD / "ebctl.sysusers.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Unknown" not in r.stderr and "Failed" not in r.stderr, r.stderr
