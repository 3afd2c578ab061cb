"""The A/B's configurations, as text to records, and each round's running order. Pure (the ebctl settings of a
configuration are checked against ``ebctl.config``'s keys).

A configuration is a HEAD, optionally ``:ITEM;ITEM...``:

- ``alone``: sglang without the plugin (``SGLANG_PLUGINS=none``: unset, sglang would load every installed plugin,
  ebctl included); ``mixed`` = ``alone:--enable-mixed-chunk``; ``mfsd=K`` = ``alone:--min-free-slots-delay K``;
  ``pdi=N`` = ``alone:--prefill-decode-interval N``;
- ``ebctl``: ``ebctl start --engine sglang -- <the same args>``, default configuration, from a cold start (a fresh
  runtime directory every run: the learning period is in the figures);
- ``plugin``: sglang with the plugin loaded (``SGLANG_PLUGINS=ebctl``) but no daemon: what the plugin costs inside
  sglang, apart from what ``ebctl start`` around it does; its ``KEY=VALUE`` items go to the plugin's config;
- an ITEM is ``KEY=VALUE`` with a dotted key (an ebctl ``--set``; ebctl and plugin configurations), ``NAME=VALUE``
  with an upper-case NAME (an environment variable of the configuration's server), extra sglang flags starting
  with ``--`` (split like a shell line), or one of the shorthands ``mixed``, ``mfsd=K``, ``pdi=N``.

The configuration's name is the text as given. ``alone,alone:AA=1`` (a variable nothing reads) is an A/A check.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

SHORTHANDS = {"mixed": ("--enable-mixed-chunk",), "mfsd": ("--min-free-slots-delay",),
              "pdi": ("--prefill-decode-interval",)}
ENGINES = ("alone", "ebctl", "plugin")


def _shorthand(item: str) -> list[str] | None:
    key, eq, val = item.partition("=")
    if key == "mixed" and not eq:
        return list(SHORTHANDS["mixed"])
    if key in ("mfsd", "pdi") and eq and val.strip():
        return [*SHORTHANDS[key], val.strip()]
    return None


def parse_config(text: str) -> dict[str, Any]:
    """``HEAD[:ITEM;ITEM...]`` → {name, engine: alone|ebctl|plugin, flags: [...], sets: [...], env: {...}};
    ValueError naming the configuration and the item otherwise."""
    head, _, rest = text.strip().partition(":")
    cfg: dict[str, Any] = {"name": text.strip(), "engine": head if head in ("ebctl", "plugin") else "alone",
                           "flags": [], "sets": [], "env": {}}
    if head not in ENGINES:
        flags = _shorthand(head)
        if flags is None:
            raise ValueError(f"configuration {text!r}: {head!r} is none of alone, ebctl, plugin, mixed, mfsd=K, "
                             "pdi=N")
        cfg["flags"] += flags
    for item in filter(None, (x.strip() for x in rest.split(";"))):
        if item.startswith("--"):
            cfg["flags"] += shlex.split(item)
        elif (flags := _shorthand(item)) is not None:
            cfg["flags"] += flags
        elif re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", item):
            name, _, value = item.partition("=")
            cfg["env"][name] = value
        elif "=" in item and "." in item.partition("=")[0]:
            if cfg["engine"] == "alone":
                raise ValueError(f"configuration {text!r}: {item!r} is an ebctl setting, and this runs no ebctl")
            from ebctl import config  # checked here, before any run: a typo would otherwise end a sitting midway

            try:
                key, value, _ = config.assignment(item)
            except config.ConfigError as e:
                raise ValueError(f"configuration {text!r}: {e}") from e
            cfg["sets"].append(f"{key}={value}")
        else:
            raise ValueError(f"configuration {text!r}: item {item!r} is neither --sglang-flags, KEY=VALUE (dotted "
                             "key), NAME=VALUE (environment) nor mixed, mfsd=K, pdi=N")
    return cfg


def parse_configs(text: str, baseline: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """``--configs`` (comma-separated) and ``--baseline`` (default: the first) → (configurations, baseline);
    ValueError for a bad one, one named twice, or a baseline not among them."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ValueError(f"--configs {text!r}: no configuration")
    cfgs = [parse_config(n) for n in names]
    if len(set(names)) != len(names):
        raise ValueError(f"--configs {text}: a configuration is named twice")
    base = baseline or names[0]
    if base not in names:
        raise ValueError(f"--baseline {base}: not among --configs ({', '.join(names)})")
    return cfgs, base


def round_order(items: list, rnd: int, order: str) -> list:
    """Round ``rnd``'s (1-based) running order: ``given``, or ``rotate``d to start at item ``rnd - 1`` (mod n)."""
    r = (rnd - 1) % len(items) if order == "rotate" and items else 0
    return items[r:] + items[:r]
