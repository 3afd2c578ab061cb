"""Configuration: file + overrides, every error names the key, the value and what is allowed."""

import pytest

from ebctl import config
from ebctl.config import ConfigError
from ebctl.controller import ControllerParams


def test_defaults_come_from_controller_params():
    cfg = config.load(None)
    assert cfg.controller == ControllerParams()
    assert cfg.endpoint("telemetry").startswith("ipc://") and cfg.endpoint("telemetry").endswith("telemetry.sock")


def test_file_then_overrides(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('[controller]\nmode = "eb+"\nwindow = 800\n[daemon]\nmetrics_port = 9400\n')
    cfg = config.load(str(f), {"controller.window": "900", "controller.delta": "1e-6"})
    assert (cfg.controller.mode, cfg.controller.window, cfg.controller.delta) == ("eb+", 900, 1e-6)
    assert cfg.daemon.metrics_port == 9400 and cfg.path == str(f)


@pytest.mark.parametrize("key,value,needle", [
    ("controller.window", "-3", "allowed: int >= 10"),
    ("controller.mode", "fast", "allowed: one of eb, eb+, mb, off"),
    ("controller.eps", "nan", "not finite"),
    ("controller.cost_online", "maybe", "true or false"),
    ("daemon.metrics_port", "70000", "<= 65535"),
    ("controller.nope", "1", "unknown key"),
])
def test_bad_values_name_key_value_and_allowed(key, value, needle):
    with pytest.raises(ConfigError) as e:
        config.load(None, {key: value})
    assert key in str(e.value) and needle in str(e.value)
    if "unknown" not in needle:
        assert repr(value) in str(e.value)


def test_removed_cost_key_is_refused_naming_its_replacement(tmp_path):
    """controller.min_cost_r2 (R², dropped for the held-out error test): an old file stops with the new key's
    name rather than silently meaning something else; --set and tune say the same."""
    f = tmp_path / "old.toml"
    f.write_text("[controller]\nmin_cost_r2 = 0.8\n")
    with pytest.raises(ConfigError) as e:
        config.load(str(f))
    assert "controller.min_cost_r2=0.8: removed" in str(e.value) and "controller.cost_max_rel_err" in str(e.value)
    assert str(f) in str(e.value)
    with pytest.raises(ConfigError, match=r"use controller\.cost_max_rel_err"):
        config.load(None, {"controller.min_cost_r2": "0.5"})
    assert config.load(None, {"controller.cost_max_rel_err": "0.3"}).controller.cost_max_rel_err == 0.3


def test_cross_key_rules():
    with pytest.raises(ConfigError, match="theta_min"):
        config.load(None, {"controller.theta_min": "0.5", "controller.theta_max": "0.4"})
    with pytest.raises(ConfigError, match="republish_s"):
        config.load(None, {"daemon.republish_s": "20", "controller.ttl_s": "10"})


def test_broken_files(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[controller\nmode=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(str(f))
    f.write_text("[controler]\nmode='eb'\n")
    with pytest.raises(ConfigError, match=r"unknown section \[controler\]"):
        config.load(str(f))
    f.write_text("[controller]\nwindow = 'big'\n")
    with pytest.raises(ConfigError, match=f"controller.window.*{f}"):
        config.load(str(f))
    with pytest.raises(ConfigError, match="not found"):
        config.load(str(tmp_path / "missing.toml"))


def test_toml_round_trip():
    cfg = config.load(None, {"controller.mode": "eb+", "daemon.node": 'gpu "7"', "controller.eps": "0.001"})
    again = config.from_toml(config.to_toml(cfg))
    assert again.as_dict() == cfg.as_dict()
    assert "# " in config.to_toml(cfg)  # every key carries its doc


def test_every_controller_field_has_a_spec():
    import dataclasses
    names = {f.name for f in dataclasses.fields(ControllerParams)}
    assert names == {k.split(".", 1)[1] for k in config.SPECS if k.startswith("controller.")}


def test_reference_documents_every_key_with_its_default():
    text = config.reference_markdown()
    cfg = config.Config()
    for key in config.SPECS:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{key}` |")), None)
        assert line is not None, f"the configuration reference lacks {key}"
        if key != "daemon.runtime_dir":
            default = cfg.get(key)
            shown = f'"{default}"' if isinstance(default, str) else repr(default)
            assert f"| {shown} |" in line, (key, shown, line)
    for key in config.REMOVED_KEYS:
        assert f"- `{key}`: " in text


def test_configuration_doc_is_generated_from_the_specs():
    from pathlib import Path
    doc = Path(__file__).resolve().parents[2] / config.REFERENCE_PATH
    assert doc.is_file() and doc.read_text() == config.reference_markdown(), (
        f"{config.REFERENCE_PATH} is stale: regenerate it with `{config.REFERENCE_COMMAND}`")


def test_pd_interval_override_is_bounded_as_the_policy_is():
    from ebctl.protocol import MAX_PD_INTERVAL

    assert config.SPECS["controller.pd_interval_override"].hi == MAX_PD_INTERVAL
