"""The ``ebctl`` commands that need no daemon: ``profiles`` (the built-in cost profiles), ``keygen`` (CURVE
key pairs for tcp:// endpoints) and ``simulate`` (the simulator's command, when ``ebctl.sim`` imports).

Each imports what it computes with when it runs (the profiles and their cost model, zmq's key generation, the
simulator): registering the commands, which every ``ebctl`` command line does, loads no numpy or scipy.
"""

import math
import os
from pathlib import Path
from typing import Annotated

import typer

from ebctl import config
from ebctl.cli import view
from ebctl.cli.common import app, command, fail
from ebctl.cli.view import num, print_json


@command(app, "profiles")
def list_profiles(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """The built-in cost profiles (use one with --set daemon.profile=NAME)."""
    from rich import box
    from rich.table import Table

    from ebctl import profiles

    presets = profiles.builtin()
    if as_json:
        print_json({name: {"model": p.model, "gpu": p.gpu, "source": p.source,
                           "costs": {k: getattr(p.costs, k) for k in p.costs.__dataclass_fields__},
                           "has_beta_mb": math.isfinite(p.costs.c0)} for name, p in sorted(presets.items())})
        return
    wide = view._out.width >= 120  # the model and GPU columns only where they fit: the name says both anyway
    t = Table(title="built-in cost profiles", title_justify="left", box=box.SIMPLE, pad_edge=False,
              caption="α in s, β in s/token; β_MB: a measured mixed-batch cost curve" +
              ("" if wide else "; --json for the models"), caption_justify="left")
    for col in ("name", *(("model", "gpu") if wide else ()), "α_P", "β_P", "α_D", "β_D", "β_MB"):
        t.add_column(col, justify="left" if col in ("name", "model", "gpu") else "right", no_wrap=True)
    for name, p in sorted(presets.items()):
        c = p.costs
        t.add_row(name, *((p.model.split("/")[-1], p.gpu) if wide else ()), num(c.alpha_p), num(c.beta_p),
                  num(c.alpha_d), num(c.beta_d), "yes" if math.isfinite(c.c0) else "no")
    view._out.print(t)


def default_key_dir() -> Path:
    if os.geteuid() == 0:
        return Path(config.DEFAULT_PATH).parent / "keys"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "ebctl" / "keys"


@command(app)
def keygen(
    directory: Annotated[Path | None, typer.Option("--dir", "-d", show_default=False, help=(
        "where to write the pair (default: /etc/ebctl/keys as root, else ~/.config/ebctl/keys)"))] = None,
    name: Annotated[str, typer.Option("--name", "-n", help="file name stem, e.g. daemon or engine-1")] = "ebctl",
    force: Annotated[bool, typer.Option("--force", help="replace an existing pair (locks its peers out)")] = False,
) -> None:
    """Create a CURVE key pair for tcp:// endpoints (the secret file is readable by its owner only)."""
    from ebctl import security

    target = directory or default_key_dir()
    try:
        public, secret = security.keygen(target, name, force=force)
    except (OSError, security.SecurityError) as e:
        fail(f"ebctl keygen: {e}", 1)
    typer.echo(
        f"public key: {public}\nsecret key: {secret}\n\n"
        "In the daemon's config ([daemon]), when this pair is the daemon's:\n"
        f'  curve_server_key = "{secret}"\n'
        '  curve_authorized = "<a directory holding the public .key file of every client>"\n'
        "In a client's config (an engine, or the CLI on another host), with the client's own pair:\n"
        '  curve_client_key = "<the client\'s .key_secret file>"\n'
        '  curve_server_key = "<the daemon\'s public .key file>"')


# ``ebctl simulate``'s one-line help in ``ebctl --help``: ``ebctl.sim.cli.simulate``'s docstring (a test keeps
# them equal). The command's options are the simulator's own, read when it runs (``ebctl simulate --help``).
SIMULATE_HELP = "Simulate an engine under each policy on one workload and compare throughput and latency."


@app.command("simulate", help=SIMULATE_HELP, add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def simulate(ctx: typer.Context) -> None:
    """Run ``ebctl.sim.cli.simulate`` on the arguments after ``simulate`` (``--help`` included): the simulator,
    numpy and scipy load only here, not for every other command."""
    try:
        from ebctl.sim.cli import simulate as run_simulate
    except ImportError as e:
        fail(f"ebctl simulate is not available: {e}", 1)
    sim_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    sim_app.command("simulate")(run_simulate)
    # standalone: usage errors print and exit 2, the end exits with the command's code (SystemExit, as typer's)
    typer.main.get_command(sim_app).main(args=list(ctx.args), prog_name=ctx.command_path)
