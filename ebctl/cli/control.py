"""The ``ebctl`` commands that read and steer a running daemon: ``status`` (once, ``--json`` or
``--watch``), ``tune set``, ``tune calibrate``, ``reload``, and ``config show`` / ``config check`` (the
effective configuration, this one's or the daemon's). Each is a control request and a print.
"""

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from ebctl import config
from ebctl.cli.common import Globals, app, ask, command, config_app, fail, say, tune_app, unreachable_message
from ebctl.cli.view import _out, jsonable, print_changes, print_json, status_view
from ebctl.config import Config, ConfigError


@command(app)
def status(
    cfg: Config,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes with --watch", min=0.1)] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the raw status as JSON")] = False,
) -> None:
    """The daemon's counters and, per engine, the policy and the estimates behind it."""
    data = ask(cfg, "status")
    if not watch:
        if as_json:
            print_json(data)
        else:
            _out.print(status_view(data))
        return
    with contextlib.suppress(KeyboardInterrupt):
        if as_json:
            while True:  # one JSON document per line
                print_json(data, indent=None)
                time.sleep(interval)
                data = _status_or_error(cfg)
        from rich.live import Live

        with Live(status_view(data), console=_out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                data = _status_or_error(cfg)
                view = Text(data["error"], style="red") if "error" in data else status_view(data)
                live.update(view, refresh=True)


def _status_or_error(cfg: Config) -> dict[str, Any]:
    """Status for --watch: an unreachable daemon becomes ``{"error": ...}`` on screen, not an exit."""
    try:
        return ask(cfg, "status")
    except ConnectionError:
        return {"error": unreachable_message(cfg) + " (retrying)"}


@command(tune_app, "set")
def tune_set(
    cfg: Config,
    assignments: Annotated[list[str], typer.Argument(metavar="KEY=VALUE...", help="e.g. controller.mode=eb+")],
) -> None:
    """Change settings of the running daemon (checked here first, then by the daemon as a whole)."""
    updates: dict[str, Any] = {}
    try:
        for item in assignments:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ConfigError(f"{item!r}: expected KEY=VALUE, e.g. controller.mode=eb+")
            if key not in config.SPECS:
                raise ConfigError(f"unknown key {key!r} (known: {', '.join(sorted(config.SPECS))})")
            updates[key] = config.coerce(key, value.strip())
    except ConfigError as e:
        fail(f"invalid value: {e}", 2)
    print_changes(ask(cfg, "tune", refused=2, updates=updates), updates)


@command(tune_app)
def calibrate(
    cfg: Config,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write the profile here (default: stdout)")] = None,
    engine: Annotated[str, typer.Option(help="engine id (default: the daemon picks)")] = "",
) -> None:
    """Export the daemon's fitted costs as a profile file (use it with --set daemon.profile=FILE)."""
    data = ask(cfg, "calibrate", engine=engine)
    text = data if isinstance(data, str) else json.dumps(jsonable(data), indent=1)
    if out is None:
        sys.stdout.write(text.rstrip("\n") + "\n")
        return
    out.write_text(text.rstrip("\n") + "\n")
    say(f'wrote {out}; use it with --set daemon.profile={out} (or profile = "{out}" in [daemon])')


@command(app)
def reload(cfg: Config) -> None:
    """Re-read the daemon's config file; a broken file is refused (exit 2) and the running config stays."""
    data = ask(cfg, "reload", refused=2)
    typer.echo("reloaded" + ("" if isinstance(data, dict) and data.get("changed") else ": nothing changed"))
    print_changes(data)


@command(config_app, "show")
def config_show(
    g: Globals,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of TOML")] = False,
    from_daemon: Annotated[bool, typer.Option("--daemon", help="the running daemon's config, not this one")] = False,
) -> None:
    """Print the effective configuration (file + --set), every key with its doc and allowed values."""
    cfg = g.load()
    if from_daemon:
        try:
            data = ask(cfg, "config")
        except ConnectionError:
            fail(unreachable_message(cfg), 1)
        if as_json or not isinstance(data, dict):
            print_json(data)
            return
        flat = {f"{s}.{k}": v for s, table in data.items() if isinstance(table, dict) for k, v in table.items()}
        try:
            cfg = Config().with_updates({k: v for k, v in flat.items() if k in config.SPECS})
        except ConfigError:
            print_json(data)
            return
    if as_json:
        print_json({**cfg.as_dict(), "path": cfg.path})
    else:
        sys.stdout.write(config.to_toml(cfg))


@command(config_app, "check")
def config_check(g: Globals, file: Annotated[Path, typer.Argument(help="the TOML file to check")]) -> None:
    """Validate a config file (with any --set applied): prints "ok" (exit 0) or the error (exit 2)."""
    g.load(str(file))
    typer.echo(f"ok: {file}")
