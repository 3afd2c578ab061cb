"""What a new user mistyping ``ebctl start`` or reading ``--help`` is told: each message read as a user reads it.

Each test here failed before the fix it names: a misspelled option of ``start`` read as "Missing option
'--engine'"; an unknown option started the daemon and the engine and then failed in the engine; Ctrl-C
ended the demo on a raw dict; every flag in ``--help`` showed ``<bool>``; command summaries broke where
the docstrings wrapped."""

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebctl import cli
from ebctl.cli import common
from ebctl.sim import live

runner = CliRunner()
EBCTL = [sys.executable, "-m", "ebctl"]


def run_cli(*args: str, rundir: Path) -> subprocess.CompletedProcess:
    """``ebctl --runtime-dir RUNDIR ARGS`` as a process (nothing it would start can outlive the test: it must
    refuse before starting anything, and a timeout fails the test)."""
    return subprocess.run([*EBCTL, "--runtime-dir", str(rundir), *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def test_a_misspelled_option_of_start_is_named_with_the_right_one(tmp_path):
    r = run_cli("start", "--engnie", "sim", rundir=tmp_path / "rt")
    assert r.returncode == 2
    assert "No such option: --engnie" in r.stderr and "--engine" in r.stderr.split("--engnie", 1)[1]
    assert "Missing option" not in r.stderr
    assert not (tmp_path / "rt").exists()  # nothing started, nothing written


@pytest.mark.parametrize("args,needle", [
    (["start", "--engine", "sim", "--bogus"], "No such option: --bogus"),  # ebctl's own options
    (["start", "--engine", "sim", "--", "--bogus"], "unrecognized arguments: --bogus"),  # the engine's
    (["start", "--engine", "sim", "--", "--speed", "fast"], "--speed: invalid float value: 'fast'"),
])
def test_unknown_options_are_refused_before_anything_starts(tmp_path, args, needle):
    r = run_cli(*args, rundir=tmp_path / "rt")
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "usage: python -m ebctl.sim.live" not in r.stderr  # argparse's usage screen from the engine, before
    assert not (tmp_path / "rt").exists()  # no daemon, no engine, no runtime directory


def test_the_engine_takes_its_own_help_and_valid_arguments():
    assert live.args_error(["--speed", "50", "--workload", "azure-code"]) == ""
    assert live.args_error(["--help"]) == ""  # the engine prints its help itself
    assert "expected one argument" in live.args_error(["--speed"])


def test_the_demos_last_line_after_ctrl_c_is_a_sentence():
    stats = {"engine_id": "sim0", "sent": 88318, "queued": 0, "dropped": 2, "wakes": 10, "policies_received": 1171}
    line = live.stopped_line(stats, 13166.7)
    assert line == ("[sim] stopped at t=13,167 s (simulated): 88,318 reports sent to the daemon, 2 dropped, "
                    "1,171 policies received.")
    assert "{" not in line


def _help(*args: str) -> str:
    r = runner.invoke(cli.app, [*args, "--help"], terminal_width=100, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("args", [(), ("start",), ("status",), ("daemon",), ("keygen",), ("tune", "calibrate")])
def test_help_shows_no_value_type_beside_a_flag(args):
    out = _help(*args)
    assert "<bool>" not in out
    assert re.search(r"--help\s+Show this message", out)  # the flag itself is still listed
    if args == ("start",):
        assert re.search(r"--join\s+start only the engine", out)
        assert "<float range>" in out  # options that take a value keep their type


def _commands(group) -> list:
    out = []
    for cmd in group.commands.values():
        out += _commands(cmd) if hasattr(cmd, "commands") else [cmd]
    return out


def test_every_command_summary_is_one_unbroken_sentence():
    import typer.main

    commands = _commands(typer.main.get_command(cli.app))
    assert len(commands) >= 10
    for cmd in commands:
        first = (cmd.help or "").split("\n\n")[0]
        assert first and "\n" not in first, (cmd.name, first)
    # and as printed: each summary in the command list ends its sentence before the next command's row
    rows = _help().split("Commands", 1)[1]
    for name in ("daemon", "start", "status", "reload"):
        row = re.search(rf"│ {name}\s+(.*?)│\n(?:│\s{{6,}}(.*?)│\n)*", rows)
        assert row, name
    assert "What each engine runs, what it buys against stock, and why." in rows


def test_unwrapped_joins_the_lines_of_each_paragraph_and_keeps_paragraphs():
    doc = """First line
    goes on.

    Second paragraph
    here."""
    assert common.unwrapped(doc) == "First line goes on.\n\nSecond paragraph here."
    assert common.unwrapped(inspect.cleandoc("One.")) == "One."
