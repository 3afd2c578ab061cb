"""How the ``ebctl`` commands print: JSON (``--json``), the changes a ``tune`` or ``reload`` made, and
``ebctl status``: the compact view (``status_view``: the controller's state first, made for an 80×24
terminal, two engines and more) and the full one (``status_view(full=True)``, ``--all``: every field the
daemon sends, known or not). Pure output: nothing here talks to the daemon or reads the config, so the views
are tested with plain dicts.

Every string a view shows goes through :func:`shown`, and reaches rich as plain text, never as markup: engine
ids, reasons and keys come from engines and dispatchers (through the daemon), and a terminal obeys the escape
sequences a string carries.

rich is imported by the functions that build a view and by the first use of ``_out``, the console they print
on: ``--json``, ``tune`` and ``reload`` print without it.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

_out: Console  # (no value here: ``__getattr__`` makes it at its first use)


def __getattr__(name: str) -> Any:
    """``_out``, the console views print on, made at its first use (and kept: tests replace it)."""
    if name != "_out":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    out = globals()["_out"] = Console(width=None if sys.stdout.isatty() else 160)  # piped: 160, not 80 columns
    return out


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(x: Any) -> str:
    """``str(x)`` safe to print on a terminal: each non-printable character (C0 and C1 controls, ESC among
    them, DEL, Unicode format and separator characters such as bidi overrides) becomes its escape as
    ``repr`` writes it (``\\x1b``, ``\\u202e``, ``\\n``); printable Unicode ("é", "θ̂") stays as it is."""
    s = x if isinstance(x, str) else str(x)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _SHORT.get(c) or _escape(ord(c)) for c in s)


def _escape(n: int) -> str:
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _text(x: Any) -> Text:
    """A table cell or title: :func:`shown`, as rich text (a ``str`` there is markup: "[/x]" in an engine id
    would raise, ":smile:" would become an emoji)."""
    from rich.text import Text

    return Text(shown(x))


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
            typer.echo(f"{shown(key)} = {json.dumps(value)} (unchanged)")
    for key, (old, new) in changed.items():
        typer.echo(f"{shown(key)} = {json.dumps(new)} (was {json.dumps(old)})")
    if isinstance(data, dict) and data.get("needs_restart"):
        typer.echo(f"needs a restart to take effect: {', '.join(map(shown, data['needs_restart']))}")



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
        return " ".join(f"{shown(k)}={fmt(v)}" for k, v in x.items())
    if isinstance(x, list | tuple):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return shown(x)


def pairs_grid(title: str, pairs: list[tuple[str, str]]) -> Table:
    """(label, value) pairs in two column pairs, filled top to bottom."""
    from rich.table import Table

    grid = Table(title=_text(title), title_justify="left", show_header=False)
    for _ in range(2):
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(justify="right")
    half = (len(pairs) + 1) // 2
    for left, right in zip(pairs[:half], [*pairs[half:], ("", "")], strict=False):
        grid.add_row(*map(_text, (*left, *right)))
    return grid


def engine_view(engine_id: str, st: dict[str, Any]) -> Group:
    """One engine's policy, estimates and costs: a two-pairs-per-row grid, then the long values."""
    from rich.console import Group
    from rich.table import Table

    known = dict(ENGINE_FIELDS)
    pairs = [(label, fmt(st.get(key))) for key, label in ENGINE_FIELDS if key in st]
    pairs += [(k, fmt(v)) for k, v in st.items() if k not in known and k not in _WIDE and k not in _HIDDEN]
    grid = pairs_grid(f"engine {engine_id}", pairs)
    long = Table(show_header=False, box=None, padding=(0, 1))
    long.add_column(style="cyan", no_wrap=True)
    long.add_column()
    if isinstance(st.get("costs"), dict):
        long.add_row("costs in use", _text(fmt(st["costs"])))
    for phase, fit in (st.get("cost_fits") or {}).items():
        long.add_row(_text(f"cost fit {phase}"), _text(fmt(fit)))
    for key in ("reason", "last_error"):
        if st.get(key):
            long.add_row(key, _text(st[key]))
    return Group(grid, long)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def full_view(data: dict[str, Any]) -> Group:
    """``ebctl status --all``: every daemon counter and every engine field, known or not."""
    from rich.console import Group

    daemon_t = pairs_grid("daemon", [(k.removeprefix("counters."), fmt(v))
                                     for k, v in _flatten(data.get("daemon") or {})])
    engines = data.get("engines") or {}
    parts: list[Any] = [engine_view(eid, st) for eid, st in sorted(engines.items())]
    if not engines:
        parts.append("[dim]no engine has reported yet[/dim]")
    for did, st in sorted((data.get("dispatchers") or {}).items()):
        parts.append(pairs_grid(f"dispatcher {did}", [(k, fmt(v)) for k, v in _flatten(st)]))
    return Group(daemon_t, *parts)


# ---- the compact view: the controller's state first, one 80-column block per engine ---------------------

def num(x: Any, *, signed: bool = False) -> str:
    """A number in at most ~8 characters: 3 significant digits, thousands grouped, short exponents."""
    if x is None or isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return "—" if not isinstance(x, bool) else fmt(x)
    sign = "+" if signed and x > 0 else ""
    if isinstance(x, int) or abs(x) >= 1000:
        return f"{sign}{x:,.0f}" if abs(x) < 1e7 else f"{sign}{x:.2e}".replace("e+0", "e")
    if x == 0 or abs(x) >= 1e-3:
        return f"{sign}{x:.3g}"
    return f"{sign}{x:.2e}".replace("e-0", "e-")


def age(seconds: Any) -> str:
    if not _finite(seconds):
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    for unit, size in (("s", 1), ("min", 60), ("h", 3600)):
        if seconds < 120 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86400:.1f} d"


def _line(*parts: tuple[str, str] | str, style: str = "") -> Text:
    """One row that never wraps (cut with … at the terminal's edge): the height of the view stays fixed.
    A part is a string or (string, style); each string goes through :func:`shown`."""
    from rich.text import Text

    t = Text(no_wrap=True, overflow="ellipsis", style=style)
    for p in parts:
        t.append(shown(p[0]), p[1]) if isinstance(p, tuple) else t.append(shown(p))
    return t


def _daemon_lines(d: dict[str, Any]) -> list[Text]:
    c = d.get("counters") or {}
    counts = c if isinstance(c, dict) else {}
    engines = d.get("engines", 0)
    first = _line(("ebctl daemon", "bold"), f" pid {d.get('pid', '?')} · up {age(d.get('uptime_s'))} · "
                  f"{engines} engine{'' if engines == 1 else 's'} · {num(counts.get('received'))} reports · "
                  f"{num(counts.get('published'))} policies")
    where = [f"config {d.get('config_path') or '(none)'}", f"profile {d.get('profile') or '—'}",
             f"control {(d.get('endpoints') or {}).get('control', '?')}"]
    if d.get("metrics"):
        where.append(f"metrics {d['metrics']}")
    lines = [first, _line(" · ".join(where), style="dim")]
    not_problems = {"received", "published", "republished", "control_requests", "frames", "dispatch_received"}
    if "control_refused" in counts:  # the clients' mistakes, apart (a daemon without the split: all are problems)
        not_problems |= {"control_errors", "control_refused", "control_rejected"}
    problems = [(k, v) for k, v in _flatten({k: v for k, v in counts.items() if k not in not_problems})
                if isinstance(v, int | float) and v]
    restarts = d.get("restarts", d.get("daemon_restarts"))
    if restarts:  # by ebctl start's supervisor
        problems.insert(0, ("daemon restarts", restarts))
    if problems:
        lines.append(_line(("problems ", "bold yellow"), " · ".join(f"{k} {num(v)}" for k, v in problems),
                           style="yellow"))
    refused = counts.get("control_refused")
    if isinstance(refused, int) and refused:  # each client was told why; nothing wrong with the daemon
        bad = counts.get("control_rejected")
        why = [f"{k} {num(v)}" for k, v in (bad.items() if isinstance(bad, dict) else ()) if v]
        lines.append(_line(" · ".join([f"refused requests {num(refused)}", *why]), style="dim"))
    for warning in d.get("warnings") or ():  # the set-up runs, but an operator should fix it
        lines.append(_line(("warning ", "bold red"), str(warning), style="red"))
    tuned = d.get("tuned")
    if tuned:  # changed with `ebctl tune set`, not from the config file
        text = ", ".join(f"{k}={v}" for k, v in tuned.items()) if isinstance(tuned, dict) else fmt(tuned)
        lines.append(_line(("tuned live ", "bold"), text))
    return lines


def _grid(cells: list[tuple[str, str]], per_row: int = 4) -> Table:
    """(label, value) cells, ``per_row`` pairs to a row, aligned in columns (values right-aligned)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(width=1)  # the block's indent
    for _ in range(per_row):
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(justify="right", no_wrap=True, min_width=9)
    for i in range(0, len(cells), per_row):
        row = cells[i:i + per_row]
        grid.add_row("", *(_text(x) for cell in row for x in cell))
    return grid


def _fits_text(fits: Any) -> str:
    """Per cost kind, in words: in use (✓ with its held-out error), passed but not in use (no cross: the costs
    row says why they are not used), failed (✗ with why), or waiting for data; coefficients are on --all."""
    if not isinstance(fits, dict):
        return "—"
    out = []
    for kind, f in fits.items():
        if not isinstance(f, dict):
            out.append(f"{kind} —")
            continue
        err = next((f[k] for k in ("rel_err", "error") if isinstance(f.get(k), int | float)), None)
        err_s = "" if not _finite(err) else f"err {err:.1%}" if err >= 0.0005 else "err < 0.1%"
        state = f.get("state")
        used = next((f[k] for k in ("in_use", "used", "ok") if k in f), None)
        if state == "passed, not in use":
            out.append(f"{kind} passed ({err_s}), not in use" if err_s else f"{kind} passed, not in use")
        elif state == "waiting":
            out.append(f"{kind} waiting ({f.get('reason') or 'no data'})")
        elif used:
            words = [kind, "✓", err_s, f"R² {f['r2']:.3f}" if _finite(f.get("r2")) else ""]
            out.append(" ".join(w for w in words if w))
        else:
            out.append(" ".join(w for w in (kind, "✗", str(f.get("reason") or err_s)) if w))
    return " · ".join(out)


_COEF_LABELS = {"alpha_p": "α_P", "beta_p": "β_P", "alpha_d": "α_D", "beta_d": "β_D", "alpha_mb": "α_MB"}


def cost_source_text(source: str) -> str:
    """Where the costs in use come from, in words: ``default`` (the built-in ones), ``profile:NAME`` (a shipped
    preset or a file of ``ebctl tune calibrate``), ``online`` (fitted from this engine's iterations)."""
    if source.startswith("online"):
        return " ".join(("fitted online from this engine", source.removeprefix("online"))).strip()
    if source.startswith("profile:"):
        return f"profile {source.removeprefix('profile:')}"
    if source == "default":
        return "built-in defaults"
    return source


def _costs_text(st: dict[str, Any]) -> str:
    """The costs in use: where they come from, and until when (the online fits replace a profile or the defaults
    once they pass and identify the decode intercept: ``cost_reason``); the coefficients after."""
    costs = st.get("costs") if isinstance(st.get("costs"), dict) else {}
    source = str(costs.get("source") or st.get("cost_source") or "?")
    coefs = [(k, v) for k, v in _flatten({k: v for k, v in costs.items() if k != "source"})
             if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v]
    return f"{cost_source_text(source)}{_until(source, str(st.get('cost_reason') or ''))} · " + \
        " ".join(f"{_COEF_LABELS.get(k, k)} {num(v)}" for k, v in coefs)


def _until(source: str, reason: str) -> str:
    """Why a profile or the defaults are still in use, in a few words, from ``costfit.OnlineCosts.choose``'s
    reason (``--explain`` shows it whole)."""
    if source.startswith("online") or source == "?":
        return ""
    if "intercept is not identified" in reason:
        return " (fits pass; decode intercept not identified yet)"
    if "online fits off" in reason:
        return " (online fits off)"
    return " (until the online fits pass)"


def decision_text(st: dict[str, Any]) -> str:
    """What the controller decided and why, in one sentence: the policy in force and the measurement behind it
    (the measured search's incumbent and its trials), or the daemon's own reason where the search is not in
    charge (a cold start, a pinned mode, a probe)."""
    mode, k, n = st.get("mode"), st.get("k"), st.get("n_max")
    policy = ("stock sglang" if mode in ("off", None) else "mixed batches" if mode == "mb"
              else f"EB, k = {num(k)} of N = {num(n)}")
    if st.get("pd_interval"):
        policy += f", prefill every {num(st['pd_interval'])} decode steps"
    tu = st.get("tuner") if isinstance(st.get("tuner"), dict) else {}
    g = st.get("gain") if isinstance(st.get("gain"), dict) else {}
    if not tu:
        return f"{policy}: {st.get('reason') or '—'}"
    trial = tu.get("trial") if isinstance(tu.get("trial"), dict) else None
    won, n_trials = tu.get("won"), tu.get("trials")
    record = (f"{won} of {n_trials} trials won" if isinstance(won, int) and isinstance(n_trials, int) else "")
    what = "goodput" if _targets(st) else "faster"
    if trial:
        arm = str(trial.get("challenger", "?"))
        return f"{policy}: trying {arm} against {tu.get('incumbent', '?')}" + (f" ({record})" if record else "")
    if tu.get("incumbent") == "stock":
        return f"stock sglang: no arm measured {what if what == 'faster' else 'better'} than stock" + \
            (f" ({record})" if record else "")
    if _finite(g.get("vs_stock")):
        measured = (f"measured {abs(g['vs_stock']):.1%} {'faster' if g['vs_stock'] >= 0 else 'slower'} than stock"
                    if what == "faster" else f"measured {g['vs_stock']:+.1%} goodput against stock")
        return f"{policy}: {measured}"
    return f"{policy}: {st.get('reason') or '—'}"


def _finite(x: Any) -> bool:
    """A number a view can print: JSON's null (a NaN in the daemon) and non-numbers are not."""
    return isinstance(x, int | float) and math.isfinite(x)


def _pct(x: Any) -> str:
    return f"{x:+.1%}" if _finite(x) else "—"


def _arm_name(tu: dict[str, Any]) -> str:
    inc = str(tu.get("incumbent", "?"))
    return ("stock" if inc == "stock" else "mb" if inc == "mb" else f"pd-interval {inc[4:]}" if inc.startswith("pdi@")
            else f"EB θ {num(tu.get('theta_incumbent'))}")


def gain_text(st: dict[str, Any]) -> str:
    """Is it helping: what the running arm buys against stock by the tuner's own measurements (the ratio of their
    output tokens/s, or goodput with targets, over the windows each ran: 95% interval), the trials the measured
    search ran, and what exploring has cost so far. The interval comes first after the figure, so that it stays
    whole at 80 columns; the output rate is on the engine's first row."""
    g = st.get("gain")
    if not isinstance(g, dict):
        return "gain against stock: not measured (controller.theta_method is not measured)"
    tu = st.get("tuner") if isinstance(st.get("tuner"), dict) else {}
    inc = tu.get("incumbent", "?")
    what = " goodput" if _targets(st) else ""  # with latency targets the tuner compares goodput
    # a measured gain without a spread (null bounds) has no interval; null itself (after a reset): not measured
    band = ("(no interval: won in two windows against one)" if _finite(g.get("vs_stock")) and not _finite(g.get("low"))
            else f"[{_pct(g.get('low'))}, {_pct(g.get('high'))}]")
    gain = (f"{_arm_name(tu)}: {_pct(g.get('vs_stock'))}{what} against stock {band}"
            if inc != "stock" else f"at stock (nothing measured {'better' if what else 'faster'})")
    share = g.get("explore_share")  # net: trials that ran ahead of the incumbent count as a gain
    ok = _finite(share)
    cost = (f"exploring gained {-share:.1%}" if ok and share < 0 else f"exploring cost {share:.1%}" if ok
            else "exploring cost —")
    n = tu.get("trials")
    trials = f" · {n} trial{'' if n == 1 else 's'}" if isinstance(n, int) else ""
    return gain + trials + f" · {cost} of {age(g.get('elapsed_s'))}"


def model_text(st: dict[str, Any]) -> str:
    """The model's word beside the measurement (``Tuner.model_status``): the running arm's predicted gain against
    stock, the measured one, and the model's record on this engine ("" before any ranking)."""
    tu = st.get("tuner") if isinstance(st.get("tuner"), dict) else {}
    m = tu.get("model")
    if not isinstance(m, dict):
        return ""
    g = st.get("gain") if isinstance(st.get("gain"), dict) else {}
    n = m.get("trials")
    err = m.get("mean_abs_error")
    record = (f"{n} trial{'' if n == 1 else 's'}, mean |error| {err * 100:.1f} pt" if isinstance(n, int) and n
              and _finite(err) else "no trial yet")
    unverified = " (not measured yet)" if m.get("unverified") else ""
    pick = f" · next: {m['pick']}" if m.get("pick") else ""
    return (f"predicted {_pct(m.get('predicted_vs_stock'))}, measured {_pct(g.get('vs_stock'))}{unverified} "
            f"[{_pct(g.get('low'))}, {_pct(g.get('high'))}]; {record}{pick}")


def _targets(st: dict[str, Any]) -> str:
    """The latency targets of an engine's status ("" when none is set)."""
    slo = st.get("slo") if isinstance(st.get("slo"), dict) else {}
    parts = []
    for key, name, scale, unit in (("ttft_s", "TTFT", 1.0, "s"), ("tpot_s", "TPOT", 1e3, "ms")):
        v = slo.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            parts.append(f"{name} ≤ {v * scale:g} {unit}")
    return ", ".join(parts)


def slo_text(st: dict[str, Any]) -> str:
    """The latency targets and, over the last minute, the share of the output tokens within all of them and within
    each, and goodput (what the measured search maximizes with them), in one line."""
    slo = st["slo"]

    def share(key: str) -> str:
        x = slo.get(key)
        return f"{x:.0%}" if _finite(x) else "—"

    return (f"{_targets(st)}: {share('attainment')} met (TTFT {share('ttft_attainment')}, TPOT "
            f"{share('tpot_attainment')}) · goodput {num(slo.get('goodput_tok_s'))} tok/s")


def plugin_text(st: dict[str, Any], daemon_protocol: Any = None) -> tuple[str, str]:
    """The engine's plugin as the ``plugin`` row shows it: its package version and wire protocol (an older one
    than the daemon's said so: it is served in its own version until its server restarts, docs/upgrade.md), then
    its gate's decisions by reason. Returns (text, style)."""
    parts, style = [], ""
    version, proto = st.get("plugin_version"), st.get("plugin_protocol")
    if version or isinstance(proto, int):
        parts.append(f"{'v' + str(version) if version else 'version unknown'}"
                     + (f" (protocol {proto})" if isinstance(proto, int) else ""))
        if isinstance(proto, int) and isinstance(daemon_protocol, int) and proto < daemon_protocol:
            parts[-1] = parts[-1][:-1] + f", older than the daemon's {daemon_protocol})"
            style = "yellow"
    gate = st.get("gate_reasons")
    if isinstance(gate, dict) and gate:
        parts.append("gate " + " · ".join(f"{k} {num(v)}" for k, v in gate.items()))
    return " · ".join(parts), style


def engine_block(engine_id: str, st: dict[str, Any], daemon_protocol: Any = None) -> Group:
    """One engine in ~9 rows of at most 80 columns: policy, threshold, hazard fit, costs, the plugin, why."""
    from rich.console import Group

    head = _line(("engine ", "bold"), (engine_id, "bold cyan"))
    if isinstance(st.get("group_size"), int) and st["group_size"] > 1:
        head.append(f" (group of {num(st['group_size'])})")
    head.append(shown(f" · policy v{st.get('version', '?')} · {num(st.get('output_tok_s'))} out tok/s · "
                      f"{num(st.get('reports'))} reports, last {age(st.get('last_report_age_s'))} ago"))
    if st.get("seq_gaps"):
        head.append(f" · {num(st['seq_gaps'])} lost", style="yellow")
    if st.get("mixed_unavailable"):
        head.append(" · mb unavailable", style="yellow")
    n = num(st.get("n_max"))
    if st.get("n_limit"):
        n += f"/{num(st['n_limit'])}"
    kv = st.get("kv_reserve_frac")
    mode = str(st.get("mode", "—")) + (f" pdi {st['pd_interval']}" if st.get("pd_interval") else "")
    cells = [("mode", mode), ("k", num(st.get("k"))), ("N", n),
             ("age", age(st.get("last_update_age_s"))),
             ("θ̂0", num(st.get("theta0"))), ("Δθ", num(st.get("delta_theta"), signed=True)),
             ("θ̂*", num(st.get("theta_star"))), ("N̂*", num(st.get("n_star"))),
             ("p̂0", num(st.get("p0"))), ("η̂", num(st.get("eta"), signed=True)),
             ("fit R²", num(st.get("fit_r2"))), ("N_obs", num(st.get("n_obs"))),
             ("μ̂_L", num(st.get("mu_l"))), ("μ̂_O", num(st.get("mu_o"))),
             ("window", num(st.get("n_window", st.get("window")))),
             ("KV res.", "—" if not isinstance(kv, int | float) else f"{kv:.1%}")]
    helps = [_line(("  helps ", "cyan"), gain_text(st))] if isinstance(st.get("gain"), dict) else []
    if model_text(st):
        helps.append(_line(("  model ", "cyan"), model_text(st)))
    if _targets(st):
        helps.append(_line(("  slo   ", "cyan"), slo_text(st)))
    rows: list[Any] = [head, *helps, _grid(cells),
                       _line(("  costs ", "cyan"), _costs_text(st)),
                       _line(("  fits  ", "cyan"), _fits_text(st.get("cost_fits")))]
    plugin, style = plugin_text(st, daemon_protocol)
    if plugin:
        rows.append(_line(("  plugin ", "cyan"), plugin, style=style))
    why = _line(("  why   ", "cyan"), decision_text(st))
    if _finite(st.get("eb_lhs")):
        why.append(f" · Eq. 8: {num(st['eb_lhs'])} vs {num(st.get('eb_rhs'))}")
    if st.get("mixed_unavailable") and st.get("mixed_unavailable_reason"):
        why.append(shown(f" · mb unavailable: {st['mixed_unavailable_reason']}"), style="yellow")
    if st.get("last_error"):
        why.append(shown(f" · error: {st['last_error']}"), style="red")
    rows.append(why)
    return Group(*rows)


def summary_table(engines: dict[str, Any]) -> Table:
    """One row per engine, for when the blocks do not fit the terminal's height (Δθ and η̂ are in the blocks:
    the row keeps the output rate and the measured gain against stock within 80 columns)."""
    from rich.table import Table

    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="cyan")
    t.add_column("engine", overflow="fold", max_width=16)
    for col in ("mode", "k", "N", "θ̂0", "θ̂*", "N̂*", "p̂0", "tok/s", "gain", "age"):
        t.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for eid, st in sorted(engines.items()):
        g = st.get("gain") if isinstance(st.get("gain"), dict) else {}
        t.add_row(*map(_text, (eid, st.get("mode", "—"), num(st.get("k")), num(st.get("n_max")),
                               num(st.get("theta0")), num(st.get("theta_star")), num(st.get("n_star")),
                               num(st.get("p0")), num(st.get("output_tok_s")), _pct(g.get("vs_stock")),
                               age(st.get("last_update_age_s")))))
    return t


def _ms(x: Any) -> str:
    return "—" if not _finite(x) else f"{1e3 * x:.3g} ms"


def dispatcher_lines(did: str, st: dict[str, Any]) -> list[Text]:
    """A DP controller's dispatcher (SBS) in four or five rows: its state, the buffer, the release clock, each
    rank (requests sent, tokens in flight), and what went through sglang's own dispatch, and why."""
    state = str(st.get("state", "?"))
    pol = st.get("policy") if isinstance(st.get("policy"), dict) else {}
    head = _line(("dispatcher ", "bold"), (did, "bold cyan"), " · ",
                 (state, "bold" if state == "sbs" else "yellow"),
                 f" · policy v{pol.get('version', '—')} · {st.get('layout', '?')}, {num(st.get('ranks'))} ranks · "
                 f"last report {age(st.get('last_report_age_s'))} ago")
    held = _line(("  held  ", "cyan"), f"{num(st.get('buffered'))} (max {num(st.get('buffered_max'))}) · released "
                 f"{num(st.get('released'))} in {num(st.get('releases'))} · wait {_ms(st.get('hold_mean_s'))} "
                 f"(max {_ms(st.get('hold_max_s'))})")
    clock = _line(("  clock ", "cyan"), f"I_opt {_ms(st.get('interval_s'))} · T̄_fwd {_ms(st.get('t_fwd_s'))} · "
                  f"watchdog {num(st.get('watchdog_fired'))}, lost {num(st.get('lost'))} · spread "
                  f"{num(st.get('load_spread'))}")
    ranks = st.get("rank") if isinstance(st.get("rank"), list) else []
    per = " · ".join(f"{r[0]}: {num(r[1])} sent, {num(r[7])} tok in flight"
                     for r in ranks if isinstance(r, list | tuple) and len(r) >= 8)
    rows = [head, held, clock, _line(("  ranks ", "cyan"), per or "—")]
    stock = [f"{k} {num(st[k])}" for k in ("passed", "overloaded", "flushed", "aborted") if st.get(k)]
    if st.get("reason") or stock:
        rows.append(_line(("  stock ", "cyan"), " · ".join([*stock, str(st.get("reason") or "")]).strip(" ·"),
                          style="yellow" if state == "failed" else ""))
    return rows


# ``ebctl status --explain``: what each row of an engine's block and each symbol means (docs/controller.md has the
# equations behind them)
LEGEND = (
    ("helps", "what the running arm buys against stock: the ratio of output tokens/s (goodput with targets) over "
              "the windows of completions the tuner measured each on, with its 95% interval; the trials the search "
              "ran; what exploring has cost (or gained) so far, net, as a share of the time since the first report"),
    ("model", "with a profile (daemon.profile): the running arm's gain against stock as the engine simulator "
              "predicts it on the served requests, beside the measured one; the model's record on this engine "
              "(decided trials it predicted, mean |predicted − measured|); the arm it would try next"),
    ("mode", "eb: exclusive batching (prefill and decode in separate batches); mb: mixed batches; off: stock "
             "sglang; pdi N: sglang's --prefill-decode-interval N"),
    ("k, N", "EB refills when k of the N slots are free; N is the running batch's cap (N/limit: the engine's own)"),
    ("age", "time since the policy was last updated"),
    ("θ̂0", "the refill threshold as a share of N that Eq. 3 gives, from the fitted hazard and costs"),
    ("Δθ", "the correction of Eq. 5 for the waiting requests; θ̂* = θ̂0 + Δθ (clamped), the threshold in force"),
    ("N̂*", "the batch size of Eq. 6 that keeps the KV cache from overflowing"),
    ("p̂0, η̂", "the output-length hazard fitted as p(t) = p̂0 + η̂·t per decode step (Eq. 1): a request ends at "
               "step t with probability p(t)"),
    ("fit R²", "how well that hazard fits the finished requests' lengths"),
    ("N_obs", "the running batch the engine reaches on its own (an EMA of its reports)"),
    ("μ̂_L, μ̂_O", "mean input and output length of the finished requests in the window"),
    ("window", "finished requests the estimates are fitted on"),
    ("KV res.", "the share of the KV cache held back from refills (Eq. 23)"),
    ("costs", "the iteration costs in use (α: a batch's fixed cost, β: per token) and where they come from: "
              "built-in defaults or a profile until this engine's own fits are usable, then fitted online"),
    ("fits", "the online cost fits per batch kind, by held-out median error: ✓ in use, 'passed, not in use' "
             "(good, but the costs row says why they are not used yet), ✗ failed (with why), waiting (for data)"),
    ("plugin", "the engine's plugin: its version and wire protocol (one older than the daemon's is served in its own "
               "protocol until its server restarts), and its phase gate's decisions by reason since the engine "
               "started"),
    ("why", "what the controller decided and the measurement behind it"),
)


def explain_view(data: dict[str, Any]) -> Group:
    """``--explain``: the legend, then for each engine the daemon's reason and where its costs come from, whole
    (the block cuts them at the terminal's edge)."""
    from rich.console import Group
    from rich.table import Table

    legend = Table(title=_text("what the rows and symbols mean"), title_justify="left", show_header=False,
                   box=None, padding=(0, 1))
    legend.add_column(style="cyan", no_wrap=True)
    legend.add_column()
    for label, text in LEGEND:
        legend.add_row(_text(label), _text(text))
    parts: list[Any] = ["", legend]
    for eid, st in sorted((data.get("engines") or {}).items()):
        rows = Table(title=_text(f"engine {eid}, in full"), title_justify="left", show_header=False, box=None,
                     padding=(0, 1))
        rows.add_column(style="cyan", no_wrap=True)
        rows.add_column()
        for key, label in (("reason", "daemon's reason"), ("cost_reason", "costs"), ("eq8_cost_reason", "Eq. 8 costs"),
                           ("mixed_unavailable_reason", "mb unavailable"), ("last_error", "last error")):
            if st.get(key):
                rows.add_row(_text(label), _text(st[key]))
        parts += ["", rows]
    return Group(*parts)


BLOCK_ROWS = 9  # an engine block's height at most (its plugin row shows once the plugin has reported)


def status_view(data: dict[str, Any], *, full: bool = False, height: int | None = None) -> Group:
    """``ebctl status``. Compact unless ``full``; with ``height`` (a live view), engines that do not fit
    as blocks are shown one row each (``--engine ID`` shows one in full)."""
    from rich.console import Group
    from rich.text import Text

    if full:
        return full_view(data)
    engines = data.get("engines") or {}
    parts: list[Any] = [*_daemon_lines(data.get("daemon") or {}), ""]
    if not engines:
        known = (data.get("daemon") or {}).get("engines")
        parts.append(Text(shown(f"none of the {known} engines matches --engine") if known else
                          "no engine has reported yet", style="dim"))
    elif height is not None and len(parts) + (BLOCK_ROWS + 1) * len(engines) - 1 > height:  # blank between
        parts += [summary_table(engines), Text(f"{len(engines)} engines: too many for {height} rows; "
                                               "--engine ID shows one in full", style="dim")]
    else:
        for i, (eid, st) in enumerate(sorted(engines.items())):
            parts += [*([""] if i else []), engine_block(eid, st, (data.get("daemon") or {}).get("protocol"))]
    for did, st in sorted((data.get("dispatchers") or {}).items()):  # SBS in a DP controller: a few rows each
        parts += ["", *dispatcher_lines(did, st)]
    return Group(*parts)
