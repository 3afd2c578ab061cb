"""The rest of ebctl.ab's pure parts and its command line, hand-worked: the datasets' lengths, the launch
arguments' endpoint, the device from nvidia-smi's lines, the time left, the policy changes the picture marks,
the pool file, the ``--`` that click drops, and tools/ab_real.py as the alias of ``ebctl ab --cpu-demo``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ebctl.ab import device, output, plot, pool, serve, sitting, workloads
from ebctl.cli.ab import AB_HELP, with_separator

REPO = Path(__file__).resolve().parents[2]


def test_sglangs_random_lengths_and_a_mooncake_trace():
    pairs = workloads.random_lengths(2000, 100, 10, 0.5, seed=1)
    # inputs uniform on [50, 100], outputs on [5, 10]: means 75 and 7.5
    assert all(50 <= i <= 100 and 5 <= o <= 10 for i, o in pairs)
    assert sum(i for i, _ in pairs) / 2000 == pytest.approx(75, abs=1.5)
    assert workloads.random_lengths(3, 8, 2, 1.0) == [(8, 2)] * 3  # ratio 1: the lengths themselves
    with pytest.raises(ValueError, match="--random-range-ratio 2"):
        workloads.random_lengths(3, 8, 2, 2)
    rows = ['{"timestamp": 0, "input_length": 700, "output_length": 12, "hash_ids": [1, 2]}', "",
            '{"timestamp": 5, "input_length": 9, "output_length": 3}']
    assert workloads.mooncake_lengths(rows) == [(700, 12), (9, 3)]
    with pytest.raises(ValueError, match=r"t\.jsonl, line 1: .*at least 1 token"):
        workloads.mooncake_lengths(['{"input_length": 0, "output_length": 3}'], "t.jsonl")
    assert sorted(workloads.sample([(1, 1), (2, 2), (3, 3)], 3)) == [(1, 1), (2, 2), (3, 3)]  # no repeats
    assert workloads.too_long([(2000, 60), (10, 10)], 2048) == 1  # 2,060 > 2,048


def test_the_launch_arguments_get_a_host_and_port_where_the_user_gave_none():
    args, url = serve.endpoint(["--model-path", "m"], 31000)
    assert args == ["--model-path", "m", "--host", "127.0.0.1", "--port", "31000"] and url == "http://127.0.0.1:31000"
    args, url = serve.endpoint(["--model-path", "m", "--host", "0.0.0.0", "--port=30000"], 31000)
    assert args == ["--model-path", "m", "--host", "0.0.0.0", "--port=30000"] and url == "http://127.0.0.1:30000"
    assert serve.option(["--tp", "1", "--tp", "2"], "--tp") == "2"


def test_the_servers_command_per_configuration(tmp_path):
    alone = serve.command("py", {"engine": "alone", "flags": ["--enable-mixed-chunk"], "sets": [], "env": {}},
                          ["--model-path", "m"], tmp_path)
    assert alone == (["py", "-m", "sglang.launch_server", "--model-path", "m", "--enable-mixed-chunk"],
                     {"SGLANG_PLUGINS": "none"})
    argv, env = serve.command("py", {"engine": "ebctl", "flags": [], "sets": ["controller.mode=eb"],
                                     "env": {"A": "1"}}, ["--model-path", "m"], tmp_path)
    assert argv == ["py", "-m", "ebctl", "--runtime-dir", str(tmp_path / "rt"), "--set", "controller.mode=eb",
                    "start", "--engine", "sglang", "--", "--model-path", "m"] and env == {"A": "1"}
    _, env = serve.command("py", {"engine": "plugin", "flags": [], "sets": ["engine.fault=next_batch:1"],
                                  "env": {}}, [], tmp_path)
    assert env["SGLANG_PLUGINS"] == "ebctl" and 'fault = "next_batch:1"' in Path(env["EBCTL_CONFIG"]).read_text()


def test_the_device_from_nvidia_smi_else_torch_else_none():
    rows = device.parse_nvidia_smi("NVIDIA H200, 143771 MiB, 560.35.03\nNVIDIA H200, 143771 MiB, 560.35.03\n")
    assert device.device(rows, None, "EPYC", 64)["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    assert device.device(None, ["NVIDIA A100-SXM4-80GB"], None, 8)["source"] == "torch"
    assert device.device(None, [], "EPYC", 2)["gpus"] == []
    assert device.nvidia_smi("/nonexistent/nvidia-smi") is None  # no GPU here: no error either
    assert device.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n") == "AMD EPYC 9R14"


def test_time_left_and_the_pictures_policy_changes():
    # 2 runs after this one, 60 s of starting and 120 s of load and 5 s of drain each, 30 s of load left now
    assert sitting.time_left(2, 30.0, duration=120.0, start_s=60.0) == 30 + 2 * 185
    run = {"status": [{"t": 10.0, "status": None},
                      {"t": 20.0, "status": {"engines": {"dp0": {"mode": "off", "k": 1, "n_max": 16}}}},
                      {"t": 30.0, "status": {"engines": {"dp0": {"mode": "off", "k": 1, "n_max": 16}}}},
                      {"t": 40.0, "status": {"engines": {"dp0": {"mode": "eb", "k": 4, "n_max": 16}}}}]}
    assert plot.changes(run) == [(20.0, "off k=1 N=16"), (40.0, "eb k=4 N=16")]


def test_the_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    run = {"config": "ebctl", "round": 1, "series": {"bin_s": 5.0, "tok_s": [900.0, 1000.0],
                                                     "ttft_p99": [0.3, None]},
           "status": [{"t": 6.0, "status": {"engines": {"dp0": {"mode": "eb", "k": 4, "n_max": 16}}}}]}
    doc = {"configs": ["alone", "ebctl"], "runs": [{**run, "config": "alone", "status": []}, run],
           "settings": {"runs": 1, "duration": 10.0, "loop": "open", "rate": 5.0}}
    plot.draw(doc, tmp_path / "ab.png")
    assert (tmp_path / "ab.png").read_bytes()[:4] == b"\x89PNG"


def test_a_sitting_appended_to_the_pool_file_pools_with_the_ones_before(tmp_path):
    def doc(x: float) -> dict:
        runs = [{"config": c, "round": 1, "records": [{"t": 0}], "summary": {"tok_s": v, "tok_s_last": v}}
                for c, v in (("alone", 100.0), ("ebctl", x))]
        return {"configs": ["alone", "ebctl"], "runs": runs, "settings": {"baseline": "alone", "duration": 1.0,
                                                                          "last": 1.0}, "environment": {}}
    path = tmp_path / "pool.jsonl"
    output.append_and_pool(path, doc(90.0))
    text = output.append_and_pool(path, doc(110.0))
    # as pool's hand-worked case: sqrt(0.9 * 1.1) = 0.995, the interval from the two sittings
    assert "| ebctl | 2 | 2 | 0.995 [0.900, 1.100] |" in text
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["sitting"] for x in lines] == [1, 2] and "records" not in lines[0]["runs"][0]
    assert len(pool.load_sittings(path)) == 2


def test_the_separator_click_drops_is_put_back():
    argv = ["ebctl", "ab", "--runs", "2", "--", "--model-path", "m"]
    assert with_separator(["--runs", "2", "--model-path", "m"], argv) == ["--runs", "2", "--", "--model-path", "m"]
    assert with_separator(["--runs", "2"], ["ebctl", "ab", "--runs", "2"]) == ["--runs", "2"]


def test_the_commands_help_and_the_alias():
    from ebctl.ab.cli import DESCRIPTION

    assert AB_HELP == DESCRIPTION
    listed = subprocess.run([sys.executable, "-m", "ebctl", "--help"], capture_output=True, text=True).stdout
    assert " ab " in listed
    helped = subprocess.run([sys.executable, str(REPO / "tools" / "ab_real.py"), "--help"], capture_output=True,
                            text=True)
    assert helped.returncode == 0 and "--cpu-demo" in helped.stdout
    refused = subprocess.run([sys.executable, "-m", "ebctl", "--set", "a.b=1", "ab", "--help"], capture_output=True,
                             text=True)
    assert refused.returncode == 2 and "ebctl ab reads no configuration" in refused.stderr
