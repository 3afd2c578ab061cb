"""The base of the ``ebctl`` command line: the Typer app, the global options (``--config``, ``--set``,
``--runtime-dir``, ``--insecure``) and ``--version``, the ``command`` decorator, exits and messages, and
control requests to the daemon (``request`` / ``ask`` / ``answers``). The other modules of ``ebctl.cli``
import ``view`` and this one (``interrupt`` excepted), and this one imports only ``interrupt`` of them.

The global options are taken before or after the command's name by the commands that read the
configuration (``daemon``, ``start``, ``status``, ``tune``, ``reload``, ``config``). ``profiles``,
``keygen`` and ``simulate`` read none: given to them, the options are refused (exit 2), not ignored.
"""

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ebctl import config
from ebctl.cli.interrupt import ends_quietly, interrupted
from ebctl.config import Config, ConfigError

# ---- coercion without pydantic where none is needed -----------------------------------------------------
# typer >= 0.29 passes every parameter's value, given or not, through a pydantic TypeAdapter, and importing
# pydantic for that costs ~0.15 s of CPU, more than all the rest of `ebctl status --json`. Values that need
# no coercion are taken as they are: a missing one, a default of its annotation's own type, text for a str,
# texts for a list[str] (what typer's adapters return for them: the value, or the texts as a list). Any other
# value goes through typer's own coercion, with its checks and messages. A typer without ``get_runtime_param``
# (before 0.29) has nothing to skip.


class _Uncoerced:
    """What ``get_runtime_param()`` gives typer's ``process_value`` here: ``coerce`` as typer's, less pydantic
    for the values that need no coercion."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build  # the parameter's own get_runtime_param

    def coerce(self, value: Any, param: Any, ctx: typer.Context) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None  # typer's answer for a missing value, without building its adapter
        desc = param.type_descriptor
        ann = desc.annotation
        if getattr(desc.parameter_info, "parser", None) is None:
            if (ann is str and type(value) is str) or (value is param.default and type(value) is ann):
                return value
            if multi and ann == list[str] and isinstance(value, list | tuple) and \
                    all(type(v) is str for v in value):
                return list(value)
        return self.build().coerce(value, param=param, ctx=ctx)


def _no_flag_type(ctx: Any) -> None:
    """A flag's type label in ``--help``: none (typer writes ``<bool>`` beside every flag, which takes no value)."""
    return None


def _coerce_lazily(params: list[Any]) -> None:
    for p in params:
        if getattr(p, "is_flag", False) and hasattr(p, "display_type_rich"):
            p.display_type_rich = _no_flag_type
        build = getattr(p, "get_runtime_param", None)
        if build is not None and hasattr(p, "type_descriptor") and "get_runtime_param" not in vars(p):
            p.get_runtime_param = lambda build=build: _Uncoerced(build)


class _LazyCoercion:
    """Coerces its parameters as above, ``--help`` (made when first asked for) included."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _coerce_lazily(self.params)  # type: ignore[attr-defined]
        if self.help:  # type: ignore[has-type]
            self.help = unwrapped(self.help)  # type: ignore[has-type]

    def get_help_option(self, ctx: typer.Context) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        _coerce_lazily([option])
        return option


def unwrapped(doc: str) -> str:
    """A docstring as help text: its paragraphs kept, the line breaks inside each joined (typer's rich mode
    prints them as they are, so sentences broke where the source wrapped)."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


class Group(_LazyCoercion, typer.core.TyperGroup):
    """typer's group, coercing as above; Ctrl-C in a command is ``interrupted``'s (typer's own answer,
    "Aborted!" and exit 1 in older versions, would not say what happened)."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


class Command(_LazyCoercion, typer.core.TyperCommand):
    """typer's command, coercing as above."""


class App(typer.Typer):
    """The Typer app, Ctrl-C ending it quietly wherever it lands (``interrupt``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with ends_quietly():
            return super().__call__(*args, **kwargs)


# A command's summary in the command list is its docstring's first paragraph, line breaks kept (typer's rich
# mode): each command's docstring opens with a one-line paragraph (tests/unit/test_cli_parsing.py checks).
app = App(name="ebctl", cls=Group, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
          help="Online controller for exclusive vs mixed batching in SGLang.")
tune_app = typer.Typer(cls=Group, no_args_is_help=True,
                       help="Change the running daemon's settings or export its costs.")
config_app = typer.Typer(cls=Group, no_args_is_help=True, help="Show the effective configuration or check a file.")
app.add_typer(tune_app, name="tune")
app.add_typer(config_app, name="config")

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
        """The effective Config (``path`` replaces ``--config``); a bad file or value exits 2, with one line."""
        try:
            return config.load(path or self.config, self.overrides())
        except ConfigError as e:
            fail(f"invalid configuration: {e}", 2)
        except UnicodeDecodeError as e:
            fail(f"invalid configuration: config file {path or self.config or config.DEFAULT_PATH}: not UTF-8 "
                 f"text (byte {e.start}: {e.reason})", 2)
        except OSError as e:
            fail(f"invalid configuration: config file {path or self.config or config.DEFAULT_PATH}: {e}", 2)


_GLOBAL_PARAMS = [
    inspect.Parameter("g_config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
    inspect.Parameter("g_sets", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SetOpt),
    inspect.Parameter("g_runtime_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RuntimeDirOpt),
    inspect.Parameter("g_insecure", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=InsecureOpt),
    inspect.Parameter("g_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
]


# commands that read no configuration: the global options given to them are refused, not ignored
NO_CONFIG_COMMANDS = frozenset({"profiles", "keygen", "simulate"})


def version_text() -> str:
    import importlib.metadata
    import platform

    from ebctl.protocol import PROTOCOL_VERSION
    from sglang_patch import TESTED_SGLANG

    return (f"ebctl {importlib.metadata.version('ebctl')} (wire protocol {PROTOCOL_VERSION}; SGLang plugin "
            f"tested with sglang {TESTED_SGLANG}; Python {platform.python_version()})")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


def _explicit_globals(ctx: typer.Context) -> list[str]:
    """The global options given on the command line here (EBCTL_CONFIG from the environment is ambient)."""
    names = {"g_config": "--config", "g_sets": "--set", "g_runtime_dir": "--runtime-dir", "g_insecure": "--insecure"}
    return [flag for p, flag in names.items() if getattr(ctx.get_parameter_source(p), "name", "") == "COMMANDLINE"]


def _refuse_globals(command_name: str, given: list[str]) -> None:
    if given:
        fail(f"ebctl {command_name} reads no configuration: {', '.join(given)} would change nothing (the global "
             "options apply to daemon, start, status, tune, reload and config)", 2)


@app.callback()
def _root(ctx: typer.Context, g_config: ConfigOpt = None, g_sets: SetOpt = None,
          g_runtime_dir: RuntimeDirOpt = None, g_insecure: InsecureOpt = False,
          version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="print the version and exit")] = False) -> None:
    """Online controller for exclusive vs mixed batching in SGLang."""
    if ctx.invoked_subcommand in NO_CONFIG_COMMANDS:
        _refuse_globals(ctx.invoked_subcommand, _explicit_globals(ctx))
    ctx.obj = Globals(g_config, tuple(g_sets or ()), g_runtime_dir, g_insecure)


def command(group: typer.Typer, name: str | None = None, **settings: Any) -> Callable[[Callable], Callable]:
    """Register ``fn`` as a command that also takes the global options. ``fn`` may ask for ``cfg`` (the
    loaded Config) and/or ``g`` (the Globals, for commands that load a file of their own); a command that
    asks for neither reads no configuration and refuses the global options (exit 2) instead of ignoring them."""

    def register(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for n, p in sig.parameters.items() if n not in ("cfg", "g")]
        reads_config = "cfg" in sig.parameters or "g" in sig.parameters

        def wrapper(**kw: Any) -> Any:
            ctx = kw.pop("g_ctx")
            if not reads_config:
                _refuse_globals(ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip() or
                                fn.__name__, _explicit_globals(ctx))
            here = Globals(kw.pop("g_config"), tuple(kw.pop("g_sets") or ()), kw.pop("g_runtime_dir"),
                           kw.pop("g_insecure"))
            root = ctx.find_root().obj
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
            except Exception as e:
                if not _is_security_error(e):
                    raise
                fail(f"ebctl: {e}", 2)  # e.g. a tcp:// endpoint without keys

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        wrapper.__signature__ = sig.replace(parameters=own + _GLOBAL_PARAMS)  # type: ignore[attr-defined]
        group.command(name, cls=Command, **settings)(wrapper)
        return fn

    return register


def _is_security_error(e: BaseException) -> bool:
    """Is ``e`` an ``ebctl.security.SecurityError``? Without importing that module (and zmq) to find out: only
    a loaded module can have raised its error."""
    security = sys.modules.get("ebctl.security")
    return security is not None and isinstance(e, security.SecurityError)


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


