"""The ``ebctl`` command line: run the daemon, start a supervised daemon + engine pair, read and steer it.

Exit codes: 0 ok, 2 usage or validation (bad flag, bad key/value, a refused ``tune`` or ``reload``),
1 runtime failure (daemon unreachable, a child died, a missing engine). Every command takes the global
options ``--config PATH``, ``--set KEY=VALUE`` (repeatable), ``--runtime-dir DIR`` and ``--insecure``, before
or after its name. Shell only: it loads one ``Config``, talks to the daemon through ``link.ControlClient``
and prints; it decides nothing.
"""

import contextlib
import ctypes
import enum
import importlib.util
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ebctl import config, profiles
from ebctl.config import Config, ConfigError
from ebctl.security import SecurityError

app = typer.Typer(name="ebctl", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Online controller for exclusive vs mixed batching in SGLang.")
tune_app = typer.Typer(no_args_is_help=True, help="Change the running daemon's settings or export its costs.")
config_app = typer.Typer(no_args_is_help=True, help="Show the effective configuration or check a file.")
app.add_typer(tune_app, name="tune")
app.add_typer(config_app, name="config")

_out = Console(width=None if sys.stdout.isatty() else 160)  # piped: don't squeeze tables to 80 columns

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


def jsonable(x: Any) -> Any:
    """NaN and infinities → null, so ``--json`` output is valid JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x


def print_json(x: Any, *, indent: int | None = 1) -> None:
    sys.stdout.write(json.dumps(jsonable(x), indent=indent) + "\n")
    sys.stdout.flush()


def print_changes(data: Any, asked: dict[str, Any] | None = None) -> None:
    """What a tune or reload changed (the daemon's ``{"changed": {key: [old, new]}}``)."""
    changed = data.get("changed", {}) if isinstance(data, dict) else {}
    for key, value in (asked or {}).items():
        if key not in changed:
            typer.echo(f"{key} = {json.dumps(value)} (unchanged)")
    for key, (old, new) in changed.items():
        typer.echo(f"{key} = {json.dumps(new)} (was {json.dumps(old)})")
    if isinstance(data, dict) and data.get("needs_restart"):
        typer.echo(f"needs a restart to take effect: {', '.join(data['needs_restart'])}")


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
        code = Supervisor(cfg, grace).run(daemon_cmd, engine_cmd, env, ready_timeout, f"{engine} engine")
    finally:
        cfg_file.unlink(missing_ok=True)
    raise typer.Exit(code)


def _pdeathsig() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when ``ebctl start`` dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass
class Child:
    name: str
    proc: subprocess.Popen

    def group_alive(self) -> bool:
        """The child or anything it spawned (its own process group) still running (zombies don't count)."""
        self.proc.poll()
        members = group_members(self.proc.pid)
        if members is not None:
            return bool(members)
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def group_members(pgid: int) -> list[int] | None:
    """Pids of the live (not zombie) processes in group ``pgid``, from /proc; None without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = text[text.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            out.append(int(d.name))
    return out


def describe_exit(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-rc).name}"
    return f"exited with code {rc}"


class Supervisor:
    """Two children in their own process groups; whichever dies (or a signal) stops the other."""

    def __init__(self, cfg: Config, grace: float) -> None:
        self.cfg, self.grace = cfg, grace
        self.stop = threading.Event()
        self.children: list[Child] = []

    def run(self, daemon_cmd: list[str], engine_cmd: list[str], env: dict[str, str], ready_timeout: float,
            engine_name: str) -> int:
        old = {s: signal.signal(s, lambda *_: self.stop.set())
               for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            daemon = self.spawn("daemon", daemon_cmd, env)
            if not self.wait_ready(daemon, ready_timeout):
                return 1
            if self.stop.is_set():
                return 0
            engine = self.spawn(engine_name, engine_cmd, env)
            say(f"ebctl: daemon (pid {daemon.proc.pid}) at {self.cfg.endpoint('control')} and "
                f"{engine_name} (pid {engine.proc.pid}) running; Ctrl-C stops both")
            while not self.stop.wait(0.2):
                for c in self.children:
                    rc = c.proc.poll()
                    if rc is not None:
                        others = " and ".join(o.name for o in self.children if o is not c)
                        say(f"ebctl: the {c.name} {describe_exit(rc)}; stopping the {others}")
                        return 1
            say("ebctl: stopping the " + " and the ".join(c.name for c in reversed(self.children)))
            return 0
        finally:
            for c in reversed(self.children):  # the engine first: it fails open without the daemon
                self.terminate(c)
            for s, h in old.items():
                signal.signal(s, h)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_pdeathsig())
        child = Child(name, proc)
        self.children.append(child)
        return child

    def wait_ready(self, daemon: Child, timeout: float) -> bool:
        ep = self.cfg.endpoint("control")
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            rc = daemon.proc.poll()
            if rc is not None:
                say(f"ebctl: the daemon {describe_exit(rc)} before answering at {ep}")
                return False
            if answers(self.cfg, timeout_s=0.5):
                return True
            if time.monotonic() > deadline:
                say(f"ebctl: the daemon did not answer at {ep} within {timeout:g} s; stopping it")
                return False
            self.stop.wait(0.1)
        return True

    def terminate(self, child: Child) -> None:
        """SIGTERM to the child's group, SIGKILL after the grace period; returns when the group is gone."""
        child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while child.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if child.group_alive():
            say(f"ebctl: the {child.name} ignored SIGTERM for {self.grace:g} s: SIGKILL")
            child.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(5)


# ---- status --------------------------------------------------------------------------------------------

# (key, label) in display order; keys the daemon sends that are not listed here are shown after them
ENGINE_FIELDS = (
    ("mode", "mode"), ("k", "k"), ("n_max", "N"), ("version", "policy version"),
    ("theta0", "θ̂0"), ("delta_theta", "Δθ"), ("theta_star", "θ̂*"), ("n_star", "N̂*"),
    ("p0", "p̂0"), ("eta", "η̂"), ("fit_r2", "fit R²"), ("mu_l", "μ̂_L"), ("mu_o", "μ̂_O"), ("n_obs", "N_obs"),
    ("eb_lhs", "Eq. 8 lhs"), ("eb_rhs", "Eq. 8 rhs"),
    ("alpha_p", "α_P (s)"), ("beta_p", "β_P (s/token)"), ("alpha_d", "α_D (s)"), ("beta_d", "β_D (s/token)"),
    ("cost_source", "cost source"),
    ("reports", "reports"), ("last_report_age_s", "last report (s ago)"),
    ("last_update_age_s", "last update (s ago)"),
)
_WIDE = ("reason", "costs", "cost_fits", "last_error")  # one full-width row each, after the grid
_HIDDEN = ("engine_id", "issued_at", "type", "v")


def fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3e}" if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5) else f"{x:.4g}"
    if isinstance(x, dict):
        return " ".join(f"{k}={fmt(v)}" for k, v in x.items())
    if isinstance(x, list | tuple):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return str(x)


def pairs_grid(title: str, pairs: list[tuple[str, str]]) -> Table:
    """(label, value) pairs in two column pairs, filled top to bottom."""
    grid = Table(title=title, title_justify="left", show_header=False)
    for _ in range(2):
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(justify="right")
    half = (len(pairs) + 1) // 2
    for left, right in zip(pairs[:half], [*pairs[half:], ("", "")], strict=False):
        grid.add_row(*left, *right)
    return grid


def engine_view(engine_id: str, st: dict[str, Any]) -> Group:
    """One engine's policy, estimates and costs: a two-pairs-per-row grid, then the long values."""
    known = dict(ENGINE_FIELDS)
    pairs = [(label, fmt(st.get(key))) for key, label in ENGINE_FIELDS if key in st]
    pairs += [(k, fmt(v)) for k, v in st.items() if k not in known and k not in _WIDE and k not in _HIDDEN]
    grid = pairs_grid(f"engine {engine_id}", pairs)
    long = Table(show_header=False, box=None, padding=(0, 1))
    long.add_column(style="cyan", no_wrap=True)
    long.add_column()
    if isinstance(st.get("costs"), dict):
        long.add_row("costs in use", fmt(st["costs"]))
    for phase, fit in (st.get("cost_fits") or {}).items():
        long.add_row(f"cost fit {phase}", fmt(fit))
    for key in ("reason", "last_error"):
        if st.get(key):
            long.add_row(key, str(st[key]))
    return Group(grid, long)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def status_view(data: dict[str, Any]) -> Group:
    daemon_t = pairs_grid("daemon", [(k.removeprefix("counters."), fmt(v))
                                     for k, v in _flatten(data.get("daemon") or {})])
    engines = data.get("engines") or {}
    parts: list[Any] = [engine_view(eid, st) for eid, st in sorted(engines.items())]
    if not engines:
        parts.append("[dim]no engine has reported yet[/dim]")
    return Group(daemon_t, *parts)


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


# ---- tune, reload --------------------------------------------------------------------------------------

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


# ---- config, profiles, keygen --------------------------------------------------------------------------

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


@command(app, "profiles")
def list_profiles(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """The built-in cost profiles (use one with --set daemon.profile=NAME)."""
    presets = profiles.builtin()
    if as_json:
        print_json({name: {"model": p.model, "gpu": p.gpu, "source": p.source,
                           "costs": {k: getattr(p.costs, k) for k in p.costs.__dataclass_fields__},
                           "has_beta_mb": math.isfinite(p.costs.c0)} for name, p in sorted(presets.items())})
        return
    t = Table(title="built-in cost profiles", title_justify="left", box=box.SIMPLE,
              caption="α in s, β in s/token; β_MB: a measured mixed-batch cost curve", caption_justify="left")
    for col in ("name", "model", "gpu", "α_P", "β_P", "α_D", "β_D", "β_MB"):
        t.add_column(col, justify="left" if col in ("name", "model", "gpu") else "right", no_wrap=True)
    for name, p in sorted(presets.items()):
        c = p.costs
        t.add_row(name, p.model.split("/")[-1], p.gpu, fmt(c.alpha_p), fmt(c.beta_p), fmt(c.alpha_d),
                  fmt(c.beta_d), "yes" if math.isfinite(c.c0) else "no")
    _out.print(t)


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
    except (OSError, SecurityError) as e:
        fail(f"ebctl keygen: {e}", 1)
    typer.echo(
        f"public key: {public}\nsecret key: {secret}\n\n"
        "In the daemon's config ([daemon]), when this pair is the daemon's:\n"
        f'  curve_server_key = "{secret}"\n'
        '  curve_authorized = "<a directory holding the public .key file of every client>"\n'
        "In a client's config (an engine, or the CLI on another host), with the client's own pair:\n"
        '  curve_client_key = "<the client\'s .key_secret file>"\n'
        '  curve_server_key = "<the daemon\'s public .key file>"')


# ---- simulate (optional module) ------------------------------------------------------------------------

def _register_simulate() -> None:
    try:
        from ebctl.sim.cli import simulate
    except ImportError as e:
        why = str(e)

        @app.command("simulate", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                     add_help_option=False)
        def simulate_missing() -> None:
            """Replay a workload through the simulator (not available in this install)."""
            fail(f"ebctl simulate is not available: {why}", 1)

        return
    app.command("simulate")(simulate)


_register_simulate()
