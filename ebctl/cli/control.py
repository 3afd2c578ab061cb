"""The ``ebctl`` commands that read and steer a running daemon: ``status`` (once, ``--json`` or
``--watch``), ``tune set``, ``tune calibrate``, ``reload``, and ``config show`` / ``config check`` (the
effective configuration, this one's or the daemon's). Each is a control request and a print; ``reload``
finding no daemon asks the ``ebctl start`` that holds the runtime directory, if any, to start one.
"""

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ebctl import config
from ebctl.cli import view
from ebctl.cli.common import Globals, answers, app, ask, command, config_app, fail, say, tune_app, unreachable_message
from ebctl.cli.view import jsonable, print_changes, print_json, status_view
from ebctl.config import Config, ConfigError


@command(app)
def status(
    cfg: Config,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="refresh until Ctrl-C; piped or to a file: one view per refresh")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes with --watch", min=0.1)] = 1.0,
    as_json: Annotated[bool, typer.Option(
        "--json", help="the raw status as JSON (with --watch: one document per line)")] = False,
    show_all: Annotated[bool, typer.Option(
        "--all", "-a", help="every daemon counter and engine field instead of the compact view")] = False,
    engines: Annotated[list[str] | None, typer.Option(
        "--engine", "-e", show_default=False, help="only this engine id (repeatable; one the daemon does not "
        "know: exit 1, naming those it knows; with --watch it may come later)")] = None,
    daemons: Annotated[list[str] | None, typer.Option(
        "--daemon", "-d", show_default=False, help="a daemon of the fleet, [NAME=]ENDPOINT (repeatable; keys "
        "from daemon.curve_client_key and daemon.curve_server_key): one view of them all")] = None,
    fleet_file: Annotated[Path | None, typer.Option(
        "--fleet", help="a TOML file listing the fleet's daemons ([[daemon]] control, name, server_key; "
        "client_key): one view of them all")] = None,
    per_node: Annotated[bool, typer.Option(
        "--nodes", help="with --daemon/--fleet: a row per node (the view does so by itself above 40 engines)")
    ] = False,
    explain: Annotated[bool, typer.Option(
        "--explain", help="after the view: what each row and symbol means, and each engine's reasons in full")
    ] = False,
) -> None:
    """What each engine runs, what it buys against stock, and why.

    Per engine: the policy (mode, k, N) and its age, the measured gain against stock with its 95% interval, the
    estimates behind it (θ̂0, Δθ, θ̂*, N̂*, p̂0, η̂, μ̂_L, μ̂_O: --explain says what each is), the costs and
    where they come from, the gate's decisions and why; the daemon in two lines (every counter with --all).
    With --daemon or --fleet: the fleet, a row per engine grouped by node and server (exit 1 if none
    answers)."""
    if daemons or fleet_file is not None:
        return _fleet_status(cfg, daemons or [], fleet_file, watch, interval, as_json, per_node or None,
                             set(engines or ()))
    only = set(engines or ())

    def fetch(first: bool = False) -> dict[str, Any]:
        data = ask(cfg, "status") if first else _status_or_error(cfg)
        if only and isinstance(data.get("engines"), dict):
            known = data["engines"]
            if first and not watch and (missing := sorted(only - known.keys())):
                fail(f"ebctl status: no engine {', '.join(map(repr, missing))}; engines: "
                     f"{', '.join(sorted(known)) or 'none has reported yet'}", 1)
            data["engines"] = {k: v for k, v in known.items() if k in only}
        return data

    data = fetch(first=True)  # unreachable at the start: exit 1 (in --watch, later misses show on screen)
    if not watch:
        print_json(data) if as_json else view._out.print(status_view(data, full=show_all))
        if explain and not as_json:
            view._out.print(view.explain_view(data))
        return
    with contextlib.suppress(KeyboardInterrupt):
        if as_json or not view._out.is_terminal:  # a pipe or a file: stream, a document or a view per refresh
            while True:
                if as_json:
                    print_json(data, indent=None)
                else:
                    view._out.rule(time.strftime("%Y-%m-%d %H:%M:%S"), align="left", style="dim")
                    view._out.print(_watch_view(data, show_all, None))
                    view._out.file.flush()
                time.sleep(interval)
                data = fetch()
        from rich.live import Live

        out = view._out
        with Live(_watch_view(data, show_all, out.size.height), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(_watch_view(fetch(), show_all, out.size.height), refresh=True)


def _fleet_status(cfg: Config, daemons: list[str], fleet_file: Path | None, watch: bool, interval: float,
                  as_json: bool, per_node: bool | None, only: set[str]) -> None:
    from ebctl.cli import fleet

    try:
        members = fleet.members(cfg, daemons, fleet_file)
    except ConfigError as e:
        fail(f"ebctl status: {e}", 2)

    def fetch() -> list[tuple[fleet.Member, dict[str, Any] | str]]:
        answers = fleet.ask_all(cfg, members, timeout_s=2.0)
        if only:
            for _, data in answers:
                if isinstance(data, dict) and isinstance(data.get("engines"), dict):
                    data["engines"] = {k: v for k, v in data["engines"].items() if k in only}
        return answers

    answers = fetch()
    if not watch and not any(isinstance(data, dict) for _, data in answers):
        if as_json:
            print_json(fleet.fleet_json(answers))
        else:
            view._out.print(fleet.fleet_view(answers, per_node=per_node))
        fail("ebctl status: no daemon of the fleet answered", 1)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            if as_json:
                print_json(fleet.fleet_json(answers), indent=None if watch else 1)
            else:
                if watch:
                    view._out.rule(time.strftime("%Y-%m-%d %H:%M:%S"), align="left", style="dim")
                view._out.print(fleet.fleet_view(answers, per_node=per_node))
                view._out.file.flush()
            if not watch:
                return
            time.sleep(interval)
            answers = fetch()


def _watch_view(data: dict[str, Any], show_all: bool, height: int | None) -> Any:
    """The view of one refresh; at a terminal, ``height`` rows at most (Live would cut the rest)."""
    from rich.text import Text

    if "error" in data:
        return Text(data["error"], style="red")
    return status_view(data, full=show_all, height=height)


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
            key, _, value = config.assignment(item)
            updates[key] = value
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
    if out is not None:  # before asking: a fit is not thrown away for a typo in the path
        if not out.parent.is_dir():
            fail(f"ebctl tune calibrate: --out {out}: no directory {out.parent}", 2)
        if out.is_dir():
            fail(f"ebctl tune calibrate: --out {out} is a directory; name the file", 2)
    data = ask(cfg, "calibrate", engine=engine)
    text = data if isinstance(data, str) else json.dumps(jsonable(data), indent=1)
    if out is None:
        sys.stdout.write(text.rstrip("\n") + "\n")
        return
    try:
        out.write_text(text.rstrip("\n") + "\n")
    except OSError as e:
        fail(f"ebctl tune calibrate: --out {out}: {e.strerror or e}", 2)
    say(f'wrote {out}; use it with --set daemon.profile={out} (or profile = "{out}" in [daemon])')


@command(app)
def reload(cfg: Config) -> None:
    """Re-read the daemon's config file (a broken one is refused and the running config stays).

    A broken file exits 2. With the daemon down under `ebctl start` (e.g. after it refused its file), start it
    again."""
    try:
        data = ask(cfg, "reload", refused=2)
    except ConnectionError:
        _restart_under_start(cfg)
        return
    typer.echo("reloaded" + ("" if isinstance(data, dict) and data.get("changed") else ": nothing changed"))
    print_changes(data)


RESTART_WAIT_S = 15.0  # how long `reload` waits for a daemon that `ebctl start` starts again to answer


def _restart_under_start(cfg: Config) -> None:
    """No daemon answers: the ``ebctl start`` holding the runtime directory, if any, starts one (SIGUSR1), which
    reads the config file as it is now. Waits for it to answer; a refused configuration exits 2, as a refused
    reload does. No ``start`` there: unreachable (exit 1)."""
    from ebctl.cli import supervisor

    run_dir = cfg.daemon.runtime_dir
    before = supervisor.holder(run_dir)
    if before is None:
        raise ConnectionError
    try:
        os.kill(before.pid, supervisor.RETRY_SIGNAL)
    except ProcessLookupError:
        raise ConnectionError from None
    say(f"ebctl reload: no daemon answers; asked ebctl start (pid {before.pid}) to start it again")
    deadline = time.monotonic() + RESTART_WAIT_S
    while time.monotonic() < deadline:
        if answers(cfg, timeout_s=0.5):
            typer.echo("reloaded: the daemon started again, with the config file as it is now")
            return
        now = supervisor.holder(run_dir)
        if now is not None and now.refused > before.refused:
            fail(f"ebctl reload: the daemon refused its configuration again: {now.said or '(no message)'}", 2)
        time.sleep(0.2)
    fail(f"ebctl reload: still no daemon at {cfg.endpoint('control')} after {RESTART_WAIT_S:g} s; "
         f"ebctl start's output (pid {before.pid}) says why", 1)


@command(config_app, "show")
def config_show(
    g: Globals,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of TOML")] = False,
    from_daemon: Annotated[bool, typer.Option(
        "--daemon", help="the running daemon's configuration (asked over the control socket), not this command's")
    ] = False,
) -> None:
    """Print a configuration, every key with its doc and allowed values.

    By default the one this command loads (the file, then --set), which is what `ebctl daemon` would start with;
    with --daemon, the one the running daemon uses now (its file at start or last reload, its --set, and any
    `tune set`)."""
    cfg = g.load()
    origin = (f"# this command's configuration: {cfg.path or 'built-in defaults'}"
              f"{' + --set' if g.sets or g.runtime_dir or g.insecure else ''} (the running daemon's: "
              "ebctl config show --daemon)\n")
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
            cfg = dataclasses.replace(Config().with_updates({k: v for k, v in flat.items() if k in config.SPECS}),
                                      path=str(data.get("path") or ""))
        except ConfigError:
            print_json(data)
            return
        origin = (f"# the running daemon's configuration ({cfg.endpoint('control')}), from "
                  f"{cfg.path or 'no file'} and any --set or tune set\n")
    if as_json:
        print_json({**cfg.as_dict(), "path": cfg.path})
    else:
        sys.stdout.write(origin + config.to_toml(cfg))


@command(config_app, "check")
def config_check(g: Globals, file: Annotated[Path | None, typer.Argument(
        help="the TOML file to check (default: the one `ebctl daemon` would read: --config, EBCTL_CONFIG or "
        f"{config.DEFAULT_PATH})", show_default=False)] = None) -> None:
    """Check a configuration as the daemon does before it starts; "ok" (exit 0) or the error (exit 2).

    With any --set applied: the keys, the cost profile, the endpoints and keys, the socket paths."""
    from ebctl import security
    from ebctl.daemon.control import preflight

    cfg = g.load(str(file) if file is not None else None)
    try:
        preflight(cfg)
    except (ConfigError, security.SecurityError) as e:
        fail(f"invalid configuration: {e}", 2)
    typer.echo(f"ok: {cfg.path or 'built-in defaults'}{' + --set' if g.sets or g.runtime_dir or g.insecure else ''}")
