"""The plugin against the pinned sglang, without a server: every hook target resolves with the parameters
the hooks name; the entry point loads through sglang's own ``load_plugins``; the version guard."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from harness import server_env

from sglang_patch import TESTED_SGLANG
from sglang_patch.hooks import HOOK_TARGETS
from sglang_patch.shutdown import TARGET as SHUTDOWN_TARGET

pytestmark = pytest.mark.sglang

# The parameters each hook takes by name after the scheduler (sglang may pass them as keywords).
EXPECTED_PARAMS = {
    "next_batch": ["self", "running_batch", "last_batch"],
    "defer_prefill": ["self", "running_batch"],
    "allocatable": ["self", "running_bs"],
    "run_batch": ["self", "batch"],
    "batch_result": ["self", "batch", "result"],
    "abort_output": ["self", "abort_req", "req"],
    "internal_state": ["self", "recv_req"],
    "loads": ["self"],  # SchedulerLoadInquirer.get_loads
}

# the scheduler's hooks, and the launcher's SIGTERM watch (the probe runs as a launcher: no multiprocessing parent)
ALL_TARGETS = sorted([*HOOK_TARGETS.values(), SHUTDOWN_TARGET])

PROBE = textwrap.dedent('''
    import dataclasses, inspect, json, os, pkgutil, sys
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang_patch
    from sglang_patch import reading
    from sglang_patch.hooks import HOOK_TARGETS
    out = {"version": sglang.__version__, "params": {}, "guard": {}}
    for name, target in HOOK_TARGETS.items():
        out["params"][name] = list(inspect.signature(pkgutil.resolve_name(target)).parameters)
    from sglang.srt.managers.schedule_batch import ScheduleBatch, NextBatchPlan
    out["batch_fields"] = sorted(f.name for f in dataclasses.fields(ScheduleBatch))
    out["plan_fields"] = sorted(NextBatchPlan.__struct_fields__)
    out["kinds"] = sorted(str(k) for k in reading.batch_kinds().values())
    real = sglang.__version__
    for label, version, cfg in (("tested", real, ""), ("other", "9.9.9", ""),
                                ("forced", "9.9.9", sys.argv[1])):
        HookRegistry.reset()
        sglang.__version__ = version
        os.environ["EBCTL_CONFIG"] = cfg
        sglang_patch.register()
        out["guard"][label] = sorted(HookRegistry._hooks)
    sglang.__version__ = real
    HookRegistry.reset()
    os.environ["EBCTL_CONFIG"] = ""
    from sglang.srt import plugins
    plugins.load_plugins()  # SGLANG_PLUGINS=ebctl: sglang's own discovery, register() and apply_hooks()
    out["patched"] = sorted(HookRegistry._patched)
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def probe(sglang_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    forced = tmp_path_factory.mktemp("cfg") / "forced.toml"
    forced.write_text("[engine]\nforce_version = true\n")
    env = {**server_env(), "SGLANG_PLUGINS": "ebctl"}
    env.pop("EBCTL_CONFIG", None)
    p = subprocess.run([str(sglang_venv / "bin" / "python"), "-c", PROBE, str(forced)], capture_output=True,
                       text=True, timeout=300, env=env, cwd=os.sep)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_pinned_sglang_is_the_tested_one(probe):
    assert probe[0]["version"] == TESTED_SGLANG


def test_every_hook_target_resolves_with_the_parameters_the_hooks_name(probe):
    params = probe[0]["params"]
    assert set(params) == set(HOOK_TARGETS)
    for name, expected in EXPECTED_PARAMS.items():
        assert params[name][:len(expected)] == expected, (name, params[name])


def test_the_sglang_fields_the_plugin_reads_exist(probe):
    fields = set(probe[0]["batch_fields"])
    assert {"reqs", "forward_mode", "decoding_reqs", "extend_num_tokens", "seq_lens_cpu", "forward_iter",
            "launch_ts", "batch_is_full"} <= fields
    assert probe[0]["plan_fields"] == ["batch_to_run", "running_batch"]
    assert probe[0]["kinds"] == sorted(["decode", "decode", "idle", "mixed", "prefill", "prefill", "prefill"])


def test_version_guard_stays_out_unless_forced(probe):
    guard, stderr = probe[0]["guard"], probe[1]
    assert guard["tested"] == ALL_TARGETS
    assert guard["other"] == []
    assert "sglang 9.9.9 is not the version this plugin was tested with (0.5.23): no hooks installed" in stderr
    assert guard["forced"] == ALL_TARGETS


def test_entry_point_loads_through_sglangs_plugin_loader(probe):
    assert probe[0]["patched"] == ALL_TARGETS
