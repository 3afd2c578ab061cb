"""The ``ebctl`` commands that run processes: ``daemon`` (the daemon in the foreground) and ``start`` (a
supervised daemon + engine pair, ``supervisor.py``)."""

import enum
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from ebctl import config
from ebctl.cli.common import Globals, answers, app, command, fail, say
from ebctl.config import Config

SGLANG_INSTALL_HINT = "sglang is not installed: pip install 'ebctl[sglang]'"


@command(app)
def daemon(cfg: Config, g: Globals) -> None:
    """Run the daemon in the foreground (what systemd's ebctl.service runs).

    SIGHUP or `ebctl reload` re-reads the config file, with the same --set overrides applied on top."""
    from ebctl import daemon as daemon_mod

    try:
        code = daemon_mod.main(cfg, overrides=g.overrides())
    except KeyboardInterrupt:  # Ctrl-C: the daemon's own clean-up has run on the way out
        code = 0
    raise typer.Exit(code)


class Engine(enum.StrEnum):
    SIM = "sim"
    SGLANG = "sglang"


def _sim_engine_cmd(cfg_path: str, args: Sequence[str]) -> list[str]:
    """The simulated engine, connected to the daemon through ``cfg_path``; ``args`` are passed on
    (``--engine-id ID``, ``--workload NAME``, ``--speed X``, ...: ``python -m ebctl.sim.live --help``)."""
    return [sys.executable, "-m", "ebctl.sim.live", "--config", cfg_path, *args]


def engine_command(engine: Engine, cfg_path: str, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The engine's command line and extra environment; exits 1 if the engine is not installed. The engine
    reads its endpoints from the one config file ``EBCTL_CONFIG`` names."""
    env = {"EBCTL_CONFIG": cfg_path}
    if engine is Engine.SGLANG:
        if importlib.util.find_spec("sglang") is None:
            fail(SGLANG_INSTALL_HINT, 1)
        return [sys.executable, "-m", "sglang.launch_server", *args], {**env, "SGLANG_PLUGINS": "ebctl"}
    if importlib.util.find_spec("ebctl.sim.live") is None:
        fail("the simulated engine (ebctl.sim.live) is not part of this install", 1)
    from ebctl.sim.live import args_error

    if why := args_error(list(args)):  # refused before anything starts (sglang checks its own arguments)
        fail(f"ebctl start: the simulated engine refuses its arguments: {why} (python -m ebctl.sim.live --help "
             "lists them)", 2)
    return _sim_engine_cmd(cfg_path, args), env


SNAPSHOT_FLAG = "--load-snapshot-publish-interval"


def engine_args_for(engine: Engine, cfg: Config, args: Sequence[str]) -> list[str]:
    """The engine's arguments as ``start`` passes them: with SBS on (``dispatch.mode = sbs``), sglang's ranks
    publish their load snapshot after every forward (``--load-snapshot-publish-interval 1``; sglang's default,
    15, shows the DP controller a decode step's end only every 15 steps), unless the arguments set it."""
    args = list(args)
    if engine is Engine.SGLANG and cfg.dispatch.mode == "sbs" and \
            not any(a == SNAPSHOT_FLAG or a.startswith(SNAPSHOT_FLAG + "=") for a in args):
        args += [SNAPSHOT_FLAG, "1"]
    return args


def daemon_command(cfg: Config, g: Globals, restarts: int) -> list[str]:
    """The daemon's command line under ``ebctl start``: the operator's own config file (so that ``reload``
    and SIGHUP re-read what the operator edits) and ``--set`` flags; on a restart, the restart count and
    ``--resume`` (the keys ``tune`` changed survive)."""
    cmd = [sys.executable, "-m", "ebctl.daemon"]
    if cfg.path:
        cmd += ["--config", str(Path(cfg.path).resolve())]
    for key, value in g.overrides().items():
        cmd += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    if restarts:
        cmd += ["--restarts", str(restarts), "--resume"]
    return cmd


@command(app)
def start(
    cfg: Config,
    g: Globals,
    engine: Annotated[Engine, typer.Option("--engine", "-e", help="sim: the simulated engine; sglang: "
                                           "python -m sglang.launch_server with the ebctl plugin")],
    engine_args: Annotated[list[str] | None, typer.Argument(
        metavar="ENGINE_ARGS", show_default=False, help="passed to the engine, after --: -- --model-path M")] = None,
    ready_timeout: Annotated[float, typer.Option(help="seconds to wait for the daemon to answer", min=0.1)] = 20.0,
    grace: Annotated[float, typer.Option(help="seconds between SIGTERM and SIGKILL when stopping", min=0.0)] = 10.0,
    join: Annotated[bool, typer.Option(
        "--join", help="start only the engine, under the daemon that already answers at the control endpoint (a "
        "node daemon: systemd's ebctl.service or `ebctl daemon`), its engine ids named by --server")] = False,
    server: Annotated[str, typer.Option(
        help="with --join: this server's name in its engine ids, <daemon.node>/<server>/dp<N> (letters, digits, "
        "'.', '_', '-'); default: port<P>, P the engine's --port (sglang's default 30000)")] = "",
) -> None:
    """Start the daemon and an engine wired to it; Ctrl-C stops both.

    A daemon that dies is restarted and the engine keeps serving; the engine's exit stops the daemon (exit code
    0 if the engine exited 0). One per runtime directory (another holding it: exit 2). With --join, several
    servers share one daemon. Options of ebctl come before `--`, the engine's after it."""
    if server and not join:
        fail("ebctl start: --server names a server that joins a running daemon: add --join", 2)
    if join:
        raise typer.Exit(_join(cfg, engine, engine_args or [], server, grace, ready_timeout))
    cfg_file = Path(cfg.daemon.runtime_dir) / "start.toml"
    engine_cmd, engine_env = engine_command(engine, str(cfg_file), engine_args_for(engine, cfg, engine_args or []))
    from ebctl import security
    from ebctl.cli import supervisor

    try:
        security.check_endpoints(cfg)
        security.ensure_runtime_dir(cfg.daemon.runtime_dir)
        lock = supervisor.StartLock(cfg.daemon.runtime_dir)  # before anything in the directory is touched
    except (security.SecurityError, supervisor.RunDirBusy) as e:
        fail(f"ebctl start: {e}", 2)
    except OSError as e:
        fail(f"ebctl start: runtime_dir {cfg.daemon.runtime_dir}: {e}", 1)
    try:
        if answers(cfg, timeout_s=0.5):
            fail(f"ebctl start: a daemon already answers at {cfg.endpoint('control')}: stop it "
                 "(systemctl stop ebctl) or use another --runtime-dir", 1)
        fd = os.open(cfg_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config.to_toml(cfg))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **engine_env}
        try:
            code = supervisor.Supervisor(cfg, grace).run(lambda restarts: daemon_command(cfg, g, restarts),
                                                         engine_cmd, env, ready_timeout, f"{engine} engine", lock,
                                                         engine_stops_group=engine is Engine.SGLANG)
        finally:
            cfg_file.unlink(missing_ok=True)
    finally:
        lock.release()  # after start.toml is gone: the next start's file is its own
    raise typer.Exit(code)


_SERVER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A plugin reports every scheduler step, and every 2 s when idle (sglang_patch.state.HEARTBEAT_S): an engine
# silent longer than two beats and a margin is a server that died, not one that serves.
SILENT_S = 5.0


def _same_name(status: dict, node: str, name: str) -> dict[str, dict]:
    """The engines of a status reply that belong to a server named ``name`` on ``node`` and are not shown gone."""
    from ebctl import fleet

    return {eid: st for eid, st in (status.get("engines") or {}).items()
            if eid.startswith(fleet.server_prefix(node, name) + "/") and not st.get("gone")}


def _silent(st: dict) -> bool:
    """An engine in the daemon's status that has not reported for ``SILENT_S`` (but is not yet shown gone)."""
    age = st.get("last_report_age_s")
    return isinstance(age, int | float) and age >= SILENT_S
SGLANG_DEFAULT_PORT = 30000  # sglang 0.5.23 server_args.py: ServerArgs.port


def server_name(engine: Engine, args: Sequence[str], given: str) -> str:
    """The server's name in its engine ids: ``given``, else ``port<P>`` from the engine's ``--port`` (sglang),
    else ``sim<pid>`` (the simulated engine has no port)."""
    if given:
        return given
    if engine is Engine.SIM:
        return f"sim{os.getpid()}"
    port = str(SGLANG_DEFAULT_PORT)
    for i, a in enumerate(args):
        if a == "--port" and i + 1 < len(args):
            port = args[i + 1]
        elif a.startswith("--port="):
            port = a.partition("=")[2]
    return f"port{port}"


def _join(cfg: Config, engine: Engine, args: list[str], given: str, grace: float, ready_timeout: float) -> int:
    """``start --join``: the engine alone, wired to the running daemon, with ids of its own
    (``fleet.server_prefix``); refused (exit 1) when a live server has that name there. A daemon that does not
    answer within ``ready_timeout`` is waited for no longer: the engine starts and runs stock until one does
    (the engine serves whatever the controller does)."""
    import time

    from ebctl import fleet
    from ebctl.cli import supervisor
    from ebctl.cli.common import request

    name = server_name(engine, args, given)
    if not _SERVER_NAME.fullmatch(name):
        fail(f"ebctl start: --server {name!r}: use 1-64 letters, digits, '.', '_' or '-'", 2)
    deadline, reply = time.monotonic() + ready_timeout, None
    while reply is None:
        try:
            reply = request(cfg, "status", timeout_s=2.0)
        except ConnectionError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    node = cfg.daemon.node
    if reply is None:
        say(f"ebctl start --join: no daemon answers at {cfg.endpoint('control')} after {ready_timeout:g} s; "
            "starting the engine anyway: it runs stock until one answers there (systemctl start ebctl, or "
            "ebctl daemon)")
    elif not reply.ok:
        fail(f"ebctl start --join: the daemon refused status: {reply.error}", 1)
    else:
        node = str((reply.data.get("daemon") or {}).get("node") or "")
        mine = _same_name(reply.data, node, name)
        # a server of this name that died a moment ago (a supervisor restarting it at once) falls silent within
        # SILENT_S; one that goes on reporting is alive, and this one is refused
        settle = time.monotonic() + SILENT_S + 1.0
        while any(not _silent(st) for st in mine.values()) and time.monotonic() < settle:
            time.sleep(0.5)
            try:
                reply = request(cfg, "status", timeout_s=2.0)
            except ConnectionError:
                break
            if reply.ok:
                mine = _same_name(reply.data, node, name)
        live = sorted(eid for eid, st in mine.items() if not _silent(st))
        if live:
            fail(f"ebctl start --join: a server named {name!r} already reports to this daemon "
                 f"({', '.join(live)}); name this one with --server NAME", 1)
        if mine:  # a server of this name that died (or was killed) moments ago: this one takes its place
            say(f"ebctl start --join: the server named {name!r} has been silent for "
                f"{min(st['last_report_age_s'] for st in mine.values()):.0f} s (not yet shown gone): taken for "
                "dead, this one starts under its name")
    prefix = fleet.server_prefix(node, name)
    joined = cfg.with_updates({"engine.id_prefix": prefix})
    cfg_file = Path(cfg.daemon.runtime_dir) / f"join-{name}-{os.getpid()}.toml"
    engine_cmd, engine_env = engine_command(engine, str(cfg_file), engine_args_for(engine, cfg, args))
    from ebctl import security

    try:
        security.ensure_runtime_dir(cfg.daemon.runtime_dir)  # the daemon's, or this one's until a daemon comes
        fd = os.open(cfg_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config.to_toml(joined))
        return supervisor.Supervisor(cfg, grace).run_engine(
            engine_cmd, {**os.environ, "PYTHONUNBUFFERED": "1", **engine_env}, f"{engine} engine {prefix}",
            engine_stops_group=engine is Engine.SGLANG)
    except security.SecurityError as e:
        fail(f"ebctl start --join: {e}", 2)
    except OSError as e:
        fail(f"ebctl start --join: runtime_dir {cfg.daemon.runtime_dir}: {e}", 1)
    finally:
        cfg_file.unlink(missing_ok=True)
