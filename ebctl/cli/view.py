"""How the ``ebctl`` commands print: JSON (``--json``), the changes a ``tune`` or ``reload`` made, and the
rich tables of ``ebctl status`` (and ``fmt`` for ``ebctl profiles``). Pure output: nothing here talks to the
daemon or reads the config, so the views are tested with plain dicts.
"""

import json
import math
import sys
from typing import Any

import typer
from rich.console import Console, Group
from rich.table import Table

_out = Console(width=None if sys.stdout.isatty() else 160)  # piped: don't squeeze tables to 80 columns


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
