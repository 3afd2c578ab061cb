"""``ebctl status --daemon EP ...`` / ``--fleet FILE``: several daemons (one per node) as one view.

Each daemon is asked for its status at once (a thread each: a node that does not answer costs one timeout,
not one per node). Engines are grouped by node (the daemon's ``daemon.node``, else its host name, else the
name the fleet gives it) and server (``ebctl.fleet.where``), a row each; a fleet of more than ``NODE_ROWS``
engines gets a row per node instead. A daemon that does not answer is a row saying so: the others are shown.

A fleet file is TOML::

    client_key = "/etc/ebctl/keys/operator.key_secret"   # optional: else daemon.curve_client_key
    [[daemon]]
    name = "node-a"                                      # optional: else the daemon's node name
    control = "tcp://10.0.0.1:5557"
    server_key = "/etc/ebctl/keys/node-a.key"            # optional: else daemon.curve_server_key
"""

from __future__ import annotations

import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebctl.cli.view import _line, _pct, age, num, shown
from ebctl.config import Config, ConfigError

NODE_ROWS = 40  # engines above which the view has a row per node (--engine ID shows one in full)
_KEYS = {"name", "control", "server_key"}


@dataclass(frozen=True, slots=True)
class Member:
    """One daemon of the fleet: where to ask, with which keys."""

    name: str  # "" → the daemon's node name, else its host
    control: str
    server_key: str
    client_key: str


def members(cfg: Config, daemons: list[str], fleet_file: Path | None) -> list[Member]:
    """The daemons to ask: ``--daemon [NAME=]ENDPOINT`` (keys from the configuration), then the fleet file's.
    ConfigError names the entry that is wrong."""
    d = cfg.daemon
    out = []
    for item in daemons:
        name, sep, ep = item.partition("=")
        if not sep or "://" in name:
            name, ep = "", item
        if "://" not in ep:
            raise ConfigError(f"--daemon {item!r}: expected ENDPOINT or NAME=ENDPOINT, e.g. tcp://10.0.0.1:5557")
        out.append(Member(name, ep, d.curve_server_key, d.curve_client_key))
    if fleet_file is not None:
        try:
            doc = tomllib.loads(fleet_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"fleet file {fleet_file}: {e}") from None
        client = doc.get("client_key", d.curve_client_key)
        rows = doc.get("daemon")
        if not isinstance(rows, list) or not rows or not isinstance(client, str):
            raise ConfigError(f"fleet file {fleet_file}: expected [[daemon]] tables (and client_key a string)")
        for i, row in enumerate(rows, 1):
            bad = sorted(set(row) - _KEYS) if isinstance(row, dict) else ["(not a table)"]
            ep = row.get("control") if isinstance(row, dict) else None
            if bad or not isinstance(ep, str) or "://" not in ep or \
                    not all(isinstance(row.get(k, ""), str) for k in _KEYS):
                raise ConfigError(f"fleet file {fleet_file}, daemon {i}: needs control = \"tcp://HOST:PORT\" (or "
                                  f"ipc://PATH), optional name and server_key strings; got {row!r}")
            out.append(Member(row.get("name", ""), ep, row.get("server_key", d.curve_server_key), client))
    return out


def ask_all(cfg: Config, fleet: list[Member], timeout_s: float) -> list[tuple[Member, dict[str, Any] | str]]:
    """Each member's status data, or why it has none (unreachable, refused, no keys), asked in parallel."""
    from ebctl.link import ControlClient

    def one(m: Member) -> dict[str, Any] | str:
        try:
            with ControlClient(m.control, timeout_s=timeout_s, curve_client_key=m.client_key,
                               curve_server_public=m.server_key, insecure=cfg.daemon.insecure) as client:
                reply = client.request("status")
        except ConnectionError:
            return f"no answer within {timeout_s:g} s"
        except Exception as e:  # a key that cannot be read, an endpoint zmq refuses: this row, not the view
            return f"{type(e).__name__}: {e}"
        return reply.data if reply.ok and isinstance(reply.data, dict) else f"refused: {reply.error}"

    with ThreadPoolExecutor(max_workers=min(32, len(fleet)) or 1) as pool:
        return list(zip(fleet, pool.map(one, fleet), strict=True))


def node_name(m: Member, data: dict[str, Any] | str) -> str:
    d = data.get("daemon") or {} if isinstance(data, dict) else {}
    return m.name or str(d.get("node") or d.get("host") or m.control)


def fleet_json(answers: list[tuple[Member, dict[str, Any] | str]]) -> dict[str, Any]:
    return {"daemons": [{"node": node_name(m, data), "control": m.control,
                         **({"status": data} if isinstance(data, dict) else {"error": data})}
                        for m, data in answers]}


def _rows(answers: list[tuple[Member, dict[str, Any] | str]]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(node, server, rank, engine status) for every engine of every daemon that answered, sorted."""
    from ebctl import fleet

    out = []
    for m, data in answers:
        if not isinstance(data, dict):
            continue
        own = str((data.get("daemon") or {}).get("node") or "")
        for eid, st in (data.get("engines") or {}).items():
            w = fleet.where(eid, own)
            out.append((node_name(m, data), w.server, w.rank, st if isinstance(st, dict) else {}))
    return sorted(out, key=lambda r: r[:3])


def fleet_view(answers: list[tuple[Member, dict[str, Any] | str]], *, per_node: bool | None = None) -> Any:
    """The fleet in one view: a head line, then a row per engine (grouped by node and server) or, for a large
    fleet (or ``per_node``), a row per node; daemons that did not answer last."""
    from rich.console import Group
    from rich.table import Table

    rows = _rows(answers)
    live = [r for r in rows if not r[3].get("gone")]
    servers = {(r[0], r[1]) for r in rows}
    down = [(m, data) for m, data in answers if not isinstance(data, dict)]
    total = sum(float(r[3].get("output_tok_s") or 0.0) for r in live)
    head = _line(("fleet ", "bold"), f"{len(answers)} daemon{'s' * (len(answers) != 1)}"
                 + (f" ({len(down)} not answering)" if down else "")
                 + f" · {len(servers)} server{'s' * (len(servers) != 1)} · {len(rows)} engines"
                 + (f", {len(rows) - len(live)} gone" if len(rows) > len(live) else "")
                 + f" · output {num(total)} tok/s")
    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="cyan")
    if per_node if per_node is not None else len(rows) > NODE_ROWS:
        for col in ("node", "servers", "engines", "gone", "tok/s", "modes"):
            t.add_column(col, justify="left" if col in ("node", "modes") else "right", no_wrap=True)
        for node in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == node]
            modes: dict[str, int] = {}
            for r in mine:
                if not r[3].get("gone"):
                    modes[str(r[3].get("mode", "?"))] = modes.get(str(r[3].get("mode", "?")), 0) + 1
            t.add_row(shown(node), num(len({r[1] for r in mine})), num(len(mine)),
                      num(sum(1 for r in mine if r[3].get("gone"))),
                      num(sum(float(r[3].get("output_tok_s") or 0.0) for r in mine if not r[3].get("gone"))),
                      ", ".join(f"{k} {v}" for k, v in sorted(modes.items())))
    else:
        for col in ("node", "server", "engine", "mode", "k", "N", "tok/s", "gain", "last report"):
            t.add_column(col, justify="left" if col in ("node", "server", "engine", "mode") else "right",
                         no_wrap=True)
        last: tuple[str, str] = ("", "")
        for node, server, rank, st in rows:
            shown_node = shown(node) if node != last[0] else ""
            shown_server = shown(server) if (node, server) != last else ""
            last = (node, server)
            report = age(st.get("last_report_age_s"))
            if st.get("gone"):
                t.add_row(shown_node, shown_server, shown(rank), "gone", "", "", "", "", report, style="yellow")
                continue
            g = st.get("gain") if isinstance(st.get("gain"), dict) else {}
            t.add_row(shown_node, shown_server, shown(rank), shown(str(st.get("mode", "—"))), num(st.get("k")),
                      num(st.get("n_max")), num(st.get("output_tok_s")), _pct(g.get("vs_stock")), report)
    parts: list[Any] = [head, t]
    for m, why in down:
        parts.append(_line(((m.name + " ") if m.name else "", "bold"), f"at {m.control}: {why}", style="red"))
    return Group(*parts)
