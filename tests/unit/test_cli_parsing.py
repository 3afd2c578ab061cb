"""The command line without a daemon: options, validation, exit codes and messages."""

import importlib.util
import json
import math
import os
import shutil
import signal
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


@pytest.mark.parametrize("key,suggested", [
    ("controller.windw", "controller.window"),  # a typo
    ("daemon.window", "controller.window"),  # the right name in the wrong section
    ("mode", "controller.mode"),  # the section left out
])
def test_unknown_key_suggests_the_closest_instead_of_listing_all(key, suggested, tmp_path):
    f = tmp_path / "e.toml"
    section, _, name = key.rpartition(".")
    f.write_text(f"[{section}]\n{name} = 1\n" if section else "")
    runs = [invoke("config", "show", "--set", f"{key}=1"), invoke("tune", "set", f"{key}=1")]
    if section:
        runs.append(invoke("config", "check", str(f)))
    for r in runs:
        assert r.exit_code == 2 and f"unknown key {key!r}: did you mean {suggested}" in r.stderr, r.stderr
        assert "daemon.curve_authorized" not in r.stderr  # not the whole list of keys
    nothing_close = invoke("config", "show", "--set", "zzz.qqq=1")
    assert "unknown key 'zzz.qqq'" in nothing_close.stderr and "ebctl config show" in nothing_close.stderr


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


@pytest.mark.parametrize("sets,needle", [
    (["daemon.profile=/nonexistent/p.json"], "daemon.profile='/nonexistent/p.json'"),  # the daemon's load_costs
    (["daemon.control_endpoint=tcp://0.0.0.0:5599"], "it needs CURVE keys"),  # security.check_endpoints
    (["daemon.runtime_dir=/tmp/" + "r" * 100], "unix socket paths are limited to 107 bytes"),  # the ipc path length
], ids=["profile", "endpoint", "ipc-path"])
def test_config_check_refuses_what_the_daemon_refuses_at_start(sets, needle, tmp_path):
    """`config check` (a file, or without one the configuration `ebctl daemon` would read) and the daemon
    itself refuse the same setting, each in one line, exit 2."""
    flags = [x for kv in sets for x in ("--set", kv)]
    f = tmp_path / "ok.toml"
    f.write_text('[controller]\nmode = "eb+"\n')
    for args in ([*flags, "config", "check"], ["config", "check", str(f), *flags]):
        r = invoke(*args)
        assert r.exit_code == 2 and r.stderr.startswith("invalid configuration:") and needle in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and r.stdout == ""
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"}
    d = subprocess.run([sys.executable, "-m", "ebctl", "daemon", *flags], capture_output=True, text=True,
                       timeout=60, env=env, cwd=tmp_path)
    assert d.returncode == 2 and "refusing to start" in d.stderr and needle in d.stderr, d.stderr


def test_config_check_without_a_file_checks_what_the_daemon_would_start_with(tmp_path):
    r = invoke("config", "check", "--set", "daemon.profile=qwen3-8b/h200")
    assert r.exit_code == 0 and r.stdout == "ok: built-in defaults + --set\n", r.output
    f = tmp_path / "e.toml"
    f.write_text('[daemon]\nprofile = "/nonexistent/p.json"\n')
    assert invoke("--config", str(f), "config", "check").exit_code == 2


def test_tune_calibrate_out_in_a_missing_directory_is_one_line_exit_2(tmp_path):
    """Refused before the daemon is asked (none runs here: asking would exit 1), and nothing written."""
    rd = tmp_path / "rt"
    for out, needle in ((tmp_path / "no" / "dir" / "p.json", f"no directory {tmp_path / 'no' / 'dir'}"),
                        (tmp_path, "is a directory")):
        r = invoke("tune", "calibrate", "--out", str(out), "--runtime-dir", str(rd))
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
    assert not (tmp_path / "no").exists() and sorted(tmp_path.iterdir()) == []


# Ctrl-C at a chosen point: this child sends itself SIGINT (the signal a terminal sends) when it first imports
# TARGET, then runs the console script's entry point, ``ebctl.cli:app``. With HOW "importerror", the interrupt
# surfaces as the ImportError an interrupted C extension raises ("initialization failed").
INTERRUPTED = """
import importlib.abc, os, signal, sys
target, how = sys.argv[1], sys.argv[2]
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target_=None):
        if name == target:
            sys.meta_path.remove(self)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # the handler runs here
                    pass
            except KeyboardInterrupt:
                if how == "importerror":
                    raise ImportError("initialization failed") from None
                raise
        return None
sys.meta_path.insert(0, Interrupt())
from ebctl.cli import app
sys.exit(app(sys.argv[3:], prog_name="ebctl"))
"""


@pytest.mark.parametrize("target,how", [
    ("typer", "interrupt"),  # while `ebctl.cli` is imported, before any command runs
    ("ebctl.link", "interrupt"),  # inside `ebctl status`, as it first asks the daemon
    ("zmq", "importerror"),  # inside the command too, surfacing as an ImportError
])
def test_ctrl_c_anywhere_is_one_line_and_exit_130(target, how, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EBCTL_CONFIG"}
    r = subprocess.run([sys.executable, "-c", INTERRUPTED, target, how, "status", "--runtime-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (r.returncode, r.stderr, r.stdout) == (130, "interrupted\n", "")


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


def test_version():
    import importlib.metadata

    from sglang_patch import TESTED_SGLANG

    for args in (["--version"], ["--version", "status"]):  # eager: before any command runs
        r = invoke(*args)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(f"ebctl {importlib.metadata.version('ebctl')} ")
        assert f"sglang {TESTED_SGLANG}" in r.stdout


@pytest.mark.parametrize("args", [
    ["profiles", "--set", "controller.mode=mb"], ["--set", "controller.mode=mb", "profiles"],
    ["keygen", "--config", "x.toml"], ["--runtime-dir", "/tmp/x", "keygen"],
    ["--insecure", "simulate", "--requests", "10"],
])
def test_commands_that_read_no_config_refuse_the_global_options(args):
    r = invoke(*args)
    assert r.exit_code == 2 and "reads no configuration" in r.stderr, r.output
    flag = next(a for a in args if a.startswith("--") and a != "--requests")
    assert f"{flag} would change nothing" in r.stderr


def test_simulate_after_its_name_has_no_global_options():
    r = invoke("simulate", "--set", "controller.mode=mb")
    assert r.exit_code == 2 and "No such option: --set" in r.output


def test_ebctl_config_from_the_environment_does_not_break_commands_without_config(monkeypatch, tmp_path):
    monkeypatch.setenv("EBCTL_CONFIG", str(tmp_path / "missing.toml"))  # ambient, not given on this command
    assert invoke("profiles", "--json").exit_code == 0


def narrow(monkeypatch, width: int):
    from rich.console import Console

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    monkeypatch.setattr(view, "_out", console)  # what every view prints on (local's profiles table too)
    return console


def test_profiles_table_is_whole_at_80_columns(monkeypatch):
    from ebctl import profiles

    console = narrow(monkeypatch, 80)
    assert invoke("profiles").exit_code == 0
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for name, p in profiles.builtin().items():
        row = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert float(row.split()[1]) == pytest.approx(p.costs.alpha_p, rel=5e-3)  # 3 significant digits
        assert row.split()[-1] == ("yes" if math.isfinite(p.costs.c0) else "no")


def test_simulate_table_splits_instead_of_cutting_at_80_columns():
    from rich.console import Console

    from ebctl.sim import cli as sim_cli

    result = {"policy": "eb:theta=0.35", "tok_per_s": 4053.2, "total_tok_per_s": 8156.7, "req_per_s": 7.81,
              "ttft_s": {"p50": 0.02, "p99": 0.81}, "tpot_s": {"p50": 0.0142, "p99": 0.0146},
              "itl_s": {"p99": 0.0324}, "goodput_frac": 0.97, "preemptions": 12, "peak_kv_frac": 0.07,
              "mode_share": {"eb": 0.6, "off": 0.4}, "final_policy": {"k": 103, "n_max": 794}}
    header = {"profile": "qwen3-8b/h200", "workload": "balanced", "requests": 300, "concurrency": "64"}
    for width in (80, 200):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        sim_cli.render(header, [result, {**result, "policy": "mb", "mode_share": {"mb": 1.0}}], console)
        text = console.export_text()
        assert "…" not in text and max(map(len, text.splitlines())) <= width
        for needle in ("out tok/s", "total tok/s", "TTFT p50/p99 s", "TPOT p50/p99 ms", "ITL p99 ms", "goodput",
                       "preempt", "peak KV", "mode / k·N", "4,053", "8,157", "0.02/0.81", "14.2/14.6", "32.4",
                       "97%", "12", "eb 60% off 40% k=103 N=794"):
            assert needle in text, (width, needle)
        tables = text.count("┏")
        assert tables == 1 if width == 200 else tables >= 2
        assert text.count("eb:theta=0.35") == tables  # each part led by the policy


def test_sim_engine_command_passes_the_config_and_the_arguments():
    cmd = run._sim_engine_cmd("/run/x/start.toml", ["--engine-id", "e1", "--speed", "5"])
    assert cmd == [sys.executable, "-m", "ebctl.sim.live", "--config", "/run/x/start.toml",
                   "--engine-id", "e1", "--speed", "5"]


def render(renderable, width: int, height: int | None = None) -> str:
    from rich.console import Console

    console = Console(width=width, height=height or 1000, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_status_view_all_renders_every_field_and_missing_values():
    st = {"mode": "eb", "k": 12, "n_max": 200, "theta_star": 0.31, "p0": float("nan"), "beta_p": 2.49e-5,
          "cost_source": "online", "reason": "hazard fit ok", "cost_fits": {"prefill": {"r2": 0.99, "n": 40}},
          "future_field": 3}
    text = render(view.status_view({"daemon": {"reports": 10, "rejected": {"malformed": 1}}, "engines": {"e0": st}},
                                   full=True), 200)
    for needle in ("engine e0", "θ̂*", "0.31", "2.490e-05", "—", "hazard fit ok", "cost fit prefill", "r2=0.99",
                   "future_field", "rejected.malformed"):
        assert needle in text, needle


# Two engines as the daemon reports them (keys of ebctl.daemon.control._engine_status), with numbers chosen so
# that their compact forms are known by hand: 3 significant digits, signs on Δθ and η̂, ages in s.
ENGINE_A = {"mode": "eb", "k": 59, "n_max": 339, "n_limit": 1024, "version": 22, "ttl_s": 10.0, "reason": "ok",
            "theta0": 0.0412, "delta_theta": 0.135, "theta_star": 0.1762, "n_star": 339, "p0": 0.00251,
            "eta": 1.18e-05, "fit_r2": 0.0247, "mu_l": 1113.28, "mu_o": 218.56, "n_window": 500, "n_obs": 256.0,
            "kv_reserve_frac": 0.074, "eb_lhs": None, "eb_rhs": None, "reports": 2952, "last_report_age_s": 0.01,
            "last_update_age_s": 3.21, "cost_source": "online(prefill,decode)",
            "costs": {"alpha_p": 0.0044, "beta_p": 5.04e-05, "alpha_d": 0.016, "beta_d": 1.49e-4, "c0": None,
                      "source": "online(prefill,decode)"},
            "cost_fits": {"prefill": {"state": "in use", "in_use": True, "rel_err": 0.0023, "n": 1064,
                                      "coef": {"intercept_s": 0.0046}},
                          "decode": {"state": "in use", "in_use": True, "rel_err": 8.9e-05, "n": 1882},
                          "mixed": {"state": "waiting", "in_use": False, "reason": "too few", "n": 0}},
            "gate_reasons": {"threshold": 120, "starvation": 3}, "group_size": 2, "unknown_new_field": 7}
ENGINE_B = {**ENGINE_A, "mode": "mb", "k": 7, "n_max": 128, "theta0": 0.105, "delta_theta": -0.02,
            "theta_star": 0.085, "n_star": 128, "p0": 0.0512, "eta": -0.000354, "last_update_age_s": 75.0,
            "cost_source": "profile:qwen3-8b/h200", "costs": {"alpha_p": 0.00128, "source": "profile:qwen3-8b/h200"}}
DAEMON = {"pid": 4242, "uptime_s": 3700.0, "engines": 2, "config_path": "/etc/ebctl/ebctl.toml",
          "profile": "qwen3-8b/h200", "endpoints": {"control": "ipc:///run/ebctl/control.sock"},
          "restarts": 1, "tuned": {"controller.mode": "eb+"},
          "counters": {"received": 123456, "published": 40, "republished": 900, "control_requests": 5,
                       "rejected": {"malformed": 2, "version": 0}, "publish_errors": 0}}


def test_status_view_fits_80x24_with_the_controller_of_two_engines():
    text = render(view.status_view({"daemon": DAEMON, "engines": {"node-a/dp0": ENGINE_A, "node-b/dp1": ENGINE_B}},
                                   height=24), 80, 24)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80, text
    a, b = text.split("engine node-a/dp0")[1].split("engine node-b/dp1")
    # mode, k, N, θ̂0, Δθ, θ̂*, N̂*, p̂0, η̂, the costs and fits in use, the policy's age: per engine
    for block, needles in ((a, ["eb", "59", "339/1,024", "0.0412", "+0.135", "0.176", "0.00251", "+1.18e-5",
                                "3.2 s", "fitted online from this engine (prefill,decode)",
                                "prefill ✓ err 0.2% · decode ✓ err < 0.1% · mixed waiting (too few)",
                                "threshold 120", "starvation 3", "1,113", "219", "group of 2"]),
                           (b, ["mb", "7", "128/1,024", "0.105", "-0.02", "0.085", "0.0512", "-3.54e-4", "75 s",
                                "profile qwen3-8b/h200"])):
        for label in ("mode", "k", "N", "age", "θ̂0", "Δθ", "θ̂*", "N̂*", "p̂0", "η̂", "costs", "fits"):
            assert f" {label} " in block, label
        for needle in needles:
            assert needle in block, (needle, block)
    assert "unknown_new_field" not in text  # extra fields: --all only
    assert "problems daemon restarts 1 · rejected.malformed 2\n" in text  # only counters that are not zero
    assert "up 62 min" in text and "123,456 reports" in text
    assert "tuned live controller.mode=eb+" in text


def test_status_view_too_many_engines_for_the_height_is_one_row_each():
    engines = {f"n{i}/dp0": ENGINE_A for i in range(4)}
    text = render(view.status_view({"daemon": DAEMON, "engines": engines}, height=24), 80, 24)
    assert len(text.splitlines()) <= 24 and max(map(len, text.splitlines())) <= 80
    rows = [line for line in text.splitlines() if line.startswith("n")]
    assert len(rows) == 4 and all(row.split()[1:5] == ["eb", "59", "339", "0.0412"] for row in rows)
    # without a height (status once, or piped) every engine gets its block
    assert render(view.status_view({"daemon": DAEMON, "engines": engines}), 80).count("  θ̂0 ") == 4


@pytest.mark.parametrize("x,signed,expected", [
    (0.0363414, False, "0.0363"), (1113.28, False, "1,113"), (2.5149e-3, False, "0.00251"),
    (1.1848e-05, True, "+1.18e-5"), (-3.54e-4, True, "-3.54e-4"), (0, True, "0"), (339, False, "339"),
    (float("nan"), False, "—"), (None, False, "—"), (12345678.0, False, "1.23e7"),
])
def test_compact_numbers(x, signed, expected):
    assert view.num(x, signed=signed) == expected


def test_json_output_has_no_nan():
    assert json.loads(json.dumps(view.jsonable({"a": [float("nan"), 1.5], "b": {"c": float("inf")}}))) == \
        {"a": [None, 1.5], "b": {"c": None}}


def _key_lines_are_documented(text: str) -> list[str]:
    """The ``key = value`` lines of a TOML text, each checked to have a comment line (its doc) right above it."""
    lines = text.splitlines()
    keys = [i for i, line in enumerate(lines) if line.strip() and not line.startswith(("#", "["))]
    undocumented = [lines[i] for i in keys if not lines[i - 1].startswith("# ")]
    assert not undocumented, undocumented
    return [lines[i].split("=", 1)[0].strip() for i in keys]


def test_default_config_is_what_config_show_prints_and_it_says_whose(tmp_path):
    """Without a file, `config show` prints TOML that a TOML parser (tomllib, not ebctl's reader) reads back as the
    defaults, the paper's own among them (paper-notes.md: W = 500, T_upd = 100, W_min = 30, θ_default = 0.70,
    θ_min = 0.01, θ_max = 0.80, ε = 0.01), every key once with a doc comment above it; its first line is a
    comment that says where the values come from (the built-in defaults; with --config, that file) and how to
    see the running daemon's instead."""
    out = invoke("config", "show").stdout
    assert tomllib.loads(out) == config.Config().as_dict()
    c = tomllib.loads(out)["controller"]
    assert (c["window"], c["update_every"], c["min_window"], c["theta_default"], c["theta_min"], c["theta_max"],
            c["eps"]) == (500, 100, 30, 0.7, 0.01, 0.8, 0.01)
    assert len(_key_lines_are_documented(out)) == len(config.SPECS)
    first = out.split("\n", 1)[0]
    assert first.startswith("# ") and "built-in defaults" in first and "ebctl config show --daemon" in first
    mine = tmp_path / "mine.toml"
    mine.write_text("[controller]\nwindow = 200\n")
    out = invoke("--config", str(mine), "config", "show").stdout
    first = out.split("\n", 1)[0]
    assert first.startswith("# ") and str(mine) in first and "built-in defaults" not in first
    assert tomllib.loads(out) == config.Config().with_updates({"controller.window": 200}).as_dict()


# ---- systemd/ -----------------------------------------------------------------------------------------

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def test_example_config_is_the_defaults_with_the_runtime_dir_set():
    """The example promises every key with its default value, except daemon.runtime_dir = "/run/ebctl", each
    documented: read by ebctl it is those defaults; read by a plain TOML parser it lists each known key exactly
    once (a key the defaults would fill in silently, or one ebctl no longer knows, is stale) with that value."""
    text = (SYSTEMD / "ebctl.toml.example").read_text()
    cfg = config.load(str(SYSTEMD / "ebctl.toml.example"))
    expected = config.Config().with_updates({"daemon.runtime_dir": "/run/ebctl"})
    assert cfg.as_dict() == expected.as_dict()
    listed = {f"{s}.{k}": v for s, table in tomllib.loads(text).items() for k, v in table.items()}
    want = {f"{s}.{k}": v for s, table in expected.as_dict().items() for k, v in table.items()}
    differ = {k for k in listed.keys() & want.keys() if listed[k] != want[k]}
    stale = sorted((listed.keys() ^ want.keys()) | differ)  # missing, unknown, or another value
    assert not stale, (f"systemd/ebctl.toml.example is stale ({', '.join(stale)}): rewrite everything from "
                       "[daemon] on with `ebctl config show --runtime-dir /run/ebctl`")
    assert sorted(_key_lines_are_documented(text)) == sorted(k.split(".", 1)[1] for k in want)


def test_units_agree_with_the_example_config():
    daemon_unit = (SYSTEMD / "ebctl.service").read_text()
    engine_unit = (SYSTEMD / "sglang@.service").read_text()
    assert "RuntimeDirectory=ebctl\n" in daemon_unit and "RuntimeDirectoryMode=0700\n" in daemon_unit
    assert "Environment=EBCTL_CONFIG=/etc/ebctl/ebctl.toml\n" in engine_unit
    assert "Environment=SGLANG_PLUGINS=ebctl\n" in engine_unit
    assert "Environment=EBCTL_SERVER=%i\n" in engine_unit  # one node daemon, several servers: ids of their own
    user = [line for line in daemon_unit.splitlines() if line.startswith("User=")]
    assert user == [line for line in engine_unit.splitlines() if line.startswith("User=")] == ["User=ebctl"]


def test_the_sglang_example_launches_a_server_that_can_mix():
    """mb and eb+ need sglang started with --enable-mixed-chunk (the plugin says so when it is missing);
    a node set up from the example must not report "mb unavailable"."""
    from types import SimpleNamespace

    from sglang_patch import reading

    lines = (SYSTEMD / "sglang.env.example").read_text().splitlines()
    args = next(line for line in lines if line.startswith("SGLANG_ARGS=")).removeprefix("SGLANG_ARGS=").split(" ")
    assert "--enable-mixed-chunk" in args
    plain = SimpleNamespace(is_mixed_chunk=False, chunked_prefill_size=8192, server_args=SimpleNamespace())
    assert "--enable-mixed-chunk" in reading.mixed_unavailable_reason(plain, allow_without_flag=False)
    launched_with_it = SimpleNamespace(**{**vars(plain), "is_mixed_chunk": True})  # sglang sets it from the flag
    assert reading.mixed_unavailable_reason(launched_with_it, allow_without_flag=False) == ""


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
