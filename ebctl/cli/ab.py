"""``ebctl ab``: the user's A/B on their own server (``ebctl.ab.cli``, whose options are its own, read when it
runs: ``ebctl ab --help``). Registering it loads nothing of ``ebctl.ab``."""

import sys

import typer

from ebctl.cli.common import _explicit_globals, _refuse_globals, app

# ``ebctl ab``'s one-line help in ``ebctl --help``: ``ebctl.ab.cli.DESCRIPTION`` (a test keeps them equal).
AB_HELP = "The A/B on your own server: sglang alone, its flags and ebctl, interleaved, each run fresh."


@app.command("ab", help=AB_HELP, add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def ab(ctx: typer.Context) -> None:
    """Run ``ebctl.ab.cli.main`` on the arguments after ``ab`` (``--help`` and ``-- <launch args>`` included);
    its exit code is the command's (130 when interrupted)."""
    if ctx.parent is not None:
        _refuse_globals("ab", _explicit_globals(ctx.parent))
    from ebctl.ab.cli import main

    raise typer.Exit(main(with_separator(list(ctx.args), sys.argv)))


def with_separator(args: list[str], argv: list[str]) -> list[str]:
    """``args`` with the ``--`` put back where the command line had it (click drops it, and it is what tells
    ``ebctl ab``'s options from sglang's): the last words of ``args`` are those after ``argv``'s first ``--``."""
    if "--" not in argv:
        return args
    launch = argv[argv.index("--") + 1:]
    if launch and args[len(args) - len(launch):] == launch:
        return [*args[:len(args) - len(launch)], "--", *launch]
    return [*args, "--"] if not launch else args
