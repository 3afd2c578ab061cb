"""``--policies``: a list whose policies carry comma-separated options of their own."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from ebctl.sim import cli, policies

app = typer.Typer()
app.command()(cli.simulate)
runner = CliRunner()


@pytest.mark.parametrize("text, specs", [
    ("v0,eb:theta=0.3,n=300", ["v0", "eb:theta=0.3,n=300"]),
    (" v0 , mb ,eb-auto:method=measured,delta=0.1,eb+", ["v0", "mb", "eb-auto:method=measured,delta=0.1", "eb+"]),
    ("eb:k=4,n=10,kv=0.1,defer=2,default", ["eb:k=4,n=10,kv=0.1,defer=2", "default"]),
    ("mb:n=8,stock", ["mb:n=8", "stock"]),
    ("v0,,mb,", ["v0", "mb"]),
])
def test_split_specs(text, specs):
    assert policies.split_specs(text) == specs


@pytest.mark.parametrize("text, message", [
    ("v0,foo", "unknown policy 'foo'"),
    ("v0,eb:theta=0.3,bogus", "unknown policy 'bogus'"),
    ("mb,n=300", "write mb:n=300"),
    ("n=3,v0", "option 'n=3' comes before any policy"),
])
def test_split_specs_names_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        policies.split_specs(text)


def test_fixed_theta():
    assert policies.fixed_theta("eb:theta=0.35,n=300") == 0.35
    assert policies.fixed_theta("eb:n=300,theta=0.1") == 0.1
    assert policies.fixed_theta("eb:k=4") is None and policies.fixed_theta("eb-auto:theta=0.2") is None


def test_a_policy_with_options_runs_from_the_command_line():
    r = runner.invoke(app, ["--workload", "uniform:L=100,O=20", "--requests", "40", "--concurrency", "16",
                            "--max-running", "32", "--no-progress", "--json",
                            "--policies", "v0,eb:theta=0.3,n=20"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [x["policy"] for x in out["results"]] == ["v0", "eb:theta=0.3,n=20"]
    assert out["results"][1]["mode_timeline"][0][1:] == ["eb", 6, 20]  # k = ⌊0.3 · 20⌋


@pytest.mark.parametrize("pl, message", [("v0,foo", "unknown policy 'foo'"), ("v0,eb:k=2,n=99", "n=99")])
def test_bad_policies_exit_2_with_the_reason(pl, message):
    r = runner.invoke(app, ["--requests", "10", "--max-running", "32", "--no-progress", "--policies", pl])
    assert r.exit_code == 2 and message in " ".join(r.output.split())
