"""The ``ebctl`` command line: run the daemon, start a supervised daemon + engine pair, read and steer it.

Exit codes: 0 ok, 2 usage or validation (bad flag, bad key/value, a refused ``tune`` or ``reload``),
1 runtime failure (daemon unreachable, a child died, a missing engine). Every command takes the global
options ``--config PATH``, ``--set KEY=VALUE`` (repeatable), ``--runtime-dir DIR`` and ``--insecure``, before
or after its name. Shell only: it loads one ``Config``, talks to the daemon through ``link.ControlClient``
and prints; it decides nothing.

This module is the entry point (``ebctl.cli:app``): the Typer app, the global options and the ``command``
decorator, control requests (``request`` / ``ask`` / ``answers``), and the commands that run processes,
``daemon`` and ``start``. The rest, imported at the end so that their commands register in this order:
``cli_supervisor`` (``start``'s two process groups), ``cli_control`` (``status``, ``tune``, ``reload``,
``config``), ``cli_local`` (``profiles``, ``keygen``, ``simulate``); ``cli_view`` prints (JSON, tables).
"""

import enum
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ebctl import config
from ebctl.cli_view import jsonable, status_view  # noqa: F401 -- part of this module's interface
from ebctl.config import Config, ConfigError
from ebctl.security import SecurityError

app = typer.Typer(name="ebctl", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Online controller for exclusive vs mixed batching in SGLang.")
tune_app = typer.Typer(no_args_is_help=True, help="Change the running daemon's settings or export its costs.")
config_app = typer.Typer(no_args_is_help=True, help="Show the effective configuration or check a file.")
app.add_typer(tune_app, name="tune")
app.add_typer(config_app, name="config")

SGLANG_INSTALL_HINT = "sglang is not installed: pip install 'ebctl[sglang]'"
CONTROL_TIMEOUT_S = 3.0  # how long a control request waits for the daemon's reply

# ---- global options ------------------------------------------------------------------------------------

_G = "Global options"
ConfigOpt = Annotated[str | None, typer.Option(
    "--config", "-c", envvar="EBCTL_CONFIG", rich_help_panel=_G, show_default=False,
    help=f"TOML config file (default: {config.DEFAULT_PATH} if it exists, else built-in defaults)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", rich_help_panel=_G, show_default=False, metavar="KEY=VALUE",
    help="override one key, e.g. --set controller.mode=eb+ (repeatable; `ebctl config show` lists keys)")]
RuntimeDirOpt = Annotated[str | None, typer.Option(
    "--runtime-dir", rich_help_panel=_G, show_default=False, help="shortcut for --set daemon.runtime_dir=DIR")]
InsecureOpt = Annotated[bool, typer.Option(
    "--insecure", rich_help_panel=_G, help="shortcut for --set daemon.insecure=true (plaintext tcp://)")]


@dataclass(frozen=True, slots=True)
class Globals:
    """The global options, as given before the command name and after it (the latter win; --set adds up)."""

    config: str | None = None
    sets: tuple[str, ...] = ()
    runtime_dir: str | None = None
    insecure: bool = False

    def then(self, later: "Globals") -> "Globals":
        return Globals(later.config or self.config, self.sets + later.sets,
                       later.runtime_dir or self.runtime_dir, self.insecure or later.insecure)

    def overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in self.sets:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set controller.mode=eb+")
            out[key.strip()] = value.strip()
        if self.runtime_dir:
            out["daemon.runtime_dir"] = self.runtime_dir
        if self.insecure:
            out["daemon.insecure"] = True
        return out

    def load(self, path: str | None = None) -> Config:
        """The effective Config (``path`` replaces ``--config``); a bad file or value exits 2."""
        try:
            return config.load(path or self.config, self.overrides())
        except ConfigError as e:
            fail(f"invalid configuration: {e}", 2)


_GLOBAL_PARAMS = [
    inspect.Parameter("g_config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
    inspect.Parameter("g_sets", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SetOpt),
    inspect.Parameter("g_runtime_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RuntimeDirOpt),
    inspect.Parameter("g_insecure", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=InsecureOpt),
    inspect.Parameter("g_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
]


@app.callback()
def _root(ctx: typer.Context, g_config: ConfigOpt = None, g_sets: SetOpt = None,
          g_runtime_dir: RuntimeDirOpt = None, g_insecure: InsecureOpt = False) -> None:
    """Online controller for exclusive vs mixed batching in SGLang."""
    ctx.obj = Globals(g_config, tuple(g_sets or ()), g_runtime_dir, g_insecure)


def command(group: typer.Typer, name: str | None = None, **settings: Any) -> Callable[[Callable], Callable]:
    """Register ``fn`` as a command that also takes the global options. ``fn`` may ask for ``cfg`` (the
    loaded Config) and/or ``g`` (the Globals, for commands that load a file of their own)."""

    def register(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for n, p in sig.parameters.items() if n not in ("cfg", "g")]

        def wrapper(**kw: Any) -> Any:
            here = Globals(kw.pop("g_config"), tuple(kw.pop("g_sets") or ()), kw.pop("g_runtime_dir"),
                           kw.pop("g_insecure"))
            root = kw.pop("g_ctx").find_root().obj
            g = (root if isinstance(root, Globals) else Globals()).then(here)
            if "g" in sig.parameters:
                kw["g"] = g
            if "cfg" not in sig.parameters:
                return fn(**kw)
            cfg = kw["cfg"] = g.load()
            try:
                return fn(**kw)
            except ConnectionError:  # link.DaemonUnreachable and friends
                fail(unreachable_message(cfg), 1)
            except SecurityError as e:  # e.g. a tcp:// endpoint without keys
                fail(f"ebctl: {e}", 2)

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        wrapper.__signature__ = sig.replace(parameters=own + _GLOBAL_PARAMS)  # type: ignore[attr-defined]
        group.command(name, **settings)(wrapper)
        return fn

    return register


def fail(message: str, code: int) -> NoReturn:
    say(message)
    raise typer.Exit(code)


def say(message: str) -> None:
    """A plain message on stderr (no markup, no wrapping: paths and endpoints stay whole)."""
    typer.echo(message, err=True)


def unreachable_message(cfg: Config) -> str:
    return (f"ebctl daemon not reachable at {cfg.endpoint('control')}: is it running? "
            "(ebctl start / systemctl start ebctl)")


# ---- talking to the daemon -----------------------------------------------------------------------------

def request(cfg: Config, op: str, *, timeout_s: float | None = None, **args: Any) -> Any:
    """One control request; the reply (``ok``, ``error``, ``data``). ConnectionError if unreachable,
    SecurityError (exit 2 in ``command``) if the endpoint needs keys the config lacks."""
    from ebctl.link import ControlClient, DaemonUnreachable

    ep = cfg.endpoint("control")
    if ep.startswith("ipc://"):
        sock = Path(ep.removeprefix("ipc://"))
        try:
            present = sock.exists()
        except PermissionError:
            fail(f"cannot reach {ep}: {sock.parent} is private to the daemon's user; run this as that user "
                 "or as root (sudo -u ebctl ebctl ...)", 1)
        if not present:
            raise DaemonUnreachable(ep)  # no socket file: nothing to wait for
    with ControlClient.from_config(cfg, timeout_s=timeout_s or CONTROL_TIMEOUT_S) as client:
        return client.request(op, **args)


def ask(cfg: Config, op: str, *, refused: int = 1, **args: Any) -> Any:
    """``request`` that exits ``refused`` with the daemon's message when it says no; returns ``data``."""
    reply = request(cfg, op, **args)
    if not reply.ok:
        fail(f"ebctl {op}: {reply.error}", refused)
    return reply.data


def answers(cfg: Config, timeout_s: float) -> bool:
    """Does a daemon answer "status" at the control endpoint right now?"""
    try:
        return bool(request(cfg, "status", timeout_s=timeout_s).ok)
    except ConnectionError:
        return False


# ---- daemon, start -------------------------------------------------------------------------------------

@command(app)
def daemon(cfg: Config, g: Globals) -> None:
    """Run the daemon in the foreground (what systemd's ebctl.service runs); SIGHUP or `ebctl reload`
    re-reads the config file, with the same --set overrides applied on top."""
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
    return _sim_engine_cmd(cfg_path, args), env


@command(app, context_settings={"ignore_unknown_options": True})
def start(
    cfg: Config,
    engine: Annotated[Engine, typer.Option("--engine", "-e", help="sim: the simulated engine; sglang: "
                                           "python -m sglang.launch_server with the ebctl plugin")],
    engine_args: Annotated[list[str] | None, typer.Argument(
        metavar="ENGINE_ARGS", show_default=False, help="passed to the engine, after --: -- --model-path M")] = None,
    ready_timeout: Annotated[float, typer.Option(help="seconds to wait for the daemon to answer", min=0.1)] = 20.0,
    grace: Annotated[float, typer.Option(help="seconds between SIGTERM and SIGKILL when stopping", min=0.0)] = 10.0,
) -> None:
    """Start the daemon and an engine wired to it; stop both on Ctrl-C or when either dies."""
    cfg_file = Path(cfg.daemon.runtime_dir) / "start.toml"
    engine_cmd, engine_env = engine_command(engine, str(cfg_file), list(engine_args or []))
    from ebctl import security

    try:
        security.check_endpoints(cfg)
        security.ensure_runtime_dir(cfg.daemon.runtime_dir)
    except SecurityError as e:
        fail(f"ebctl start: {e}", 2)
    if answers(cfg, timeout_s=0.5):
        fail(f"ebctl start: a daemon already answers at {cfg.endpoint('control')}: stop it "
             "(systemctl stop ebctl) or use another --runtime-dir", 1)
    fd = os.open(cfg_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config.to_toml(cfg))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **engine_env}
    daemon_cmd = [sys.executable, "-m", "ebctl.daemon", "--config", str(cfg_file)]
    try:
        code = cli_supervisor.Supervisor(cfg, grace).run(daemon_cmd, engine_cmd, env, ready_timeout,
                                                         f"{engine} engine")
    finally:
        cfg_file.unlink(missing_ok=True)
    raise typer.Exit(code)


# The other modules import from this one, so they come last (as modules, not names: whichever of them is
# imported first, the cycle resolves); cli_control's and cli_local's commands register on ``app``, in this
# order, after the ones above.
from ebctl import cli_control, cli_local, cli_supervisor  # noqa: E402, F401
