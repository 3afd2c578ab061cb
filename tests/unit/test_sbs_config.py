"""The [dispatch] config section: one spec per SbsParams field, values checked, errors named."""

import dataclasses

import pytest

from ebctl import config
from ebctl.config import ConfigError
from ebctl.sbs.types import SbsParams


def test_every_sbs_field_has_a_spec_and_the_defaults_are_sbs_params():
    names = {f.name for f in dataclasses.fields(SbsParams)}
    assert names == {k.split(".", 1)[1] for k in config.SPECS if k.startswith("dispatch.")}
    assert config.load(None).dispatch == SbsParams()


def test_file_and_overrides(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text('[dispatch]\nmode = "sbs"\nl_net_s = 0.002\n')
    cfg = config.load(str(f), {"dispatch.iqr_k": "3"})
    assert (cfg.dispatch.mode, cfg.dispatch.l_net_s, cfg.dispatch.iqr_k) == ("sbs", 0.002, 3.0)
    assert config.from_toml(config.to_toml(cfg)).as_dict() == cfg.as_dict()


@pytest.mark.parametrize("key,value,needle", [
    ("dispatch.mode", "eager", "allowed: one of off, sbs"),
    ("dispatch.watchdog_factor", "0.5", ">= 1.0"),
    ("dispatch.fwd_window", "0", "int >= 1"),
    ("dispatch.l_net_s", "inf", "not finite"),
])
def test_bad_values_name_key_value_and_allowed(key, value, needle):
    with pytest.raises(ConfigError) as e:
        config.load(None, {key: value})
    assert key in str(e.value) and needle in str(e.value) and repr(value) in str(e.value)
