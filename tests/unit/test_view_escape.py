"""``ebctl status`` shows strings that engines and dispatchers chose (ids, reasons, keys): none of them may
reach the terminal as a control sequence, or as rich markup."""

from __future__ import annotations

import io
import random

import pytest

from ebctl.cli import view
from ebctl.cli.view import shown

EVIL = "\x1b[2J\x1b[31mEVIL"  # clear the screen, then red
SHOWN_EVIL = "\\x1b[2J\\x1b[31mEVIL"  # by hand: ESC is 0x1b, the rest printable


@pytest.mark.parametrize(("raw", "expected"), [
    (EVIL, SHOWN_EVIL),
    ("node-é/θ̂ μ_L ²", "node-é/θ̂ μ_L ²"),  # printable Unicode stays
    ("a\nb\tc\r", "a\\nb\\tc\\r"),
    ("\x00\x07\x08\x7f", "\\x00\\x07\\x08\\x7f"),  # NUL, BEL, BS, DEL
    ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: 8-bit CSI, NEL
    ("\u202eevil\u200b", "\\u202eevil\\u200b"),  # bidi override, zero-width space (format characters)
    ("\U000e0041\ud800", "\\U000e0041\\ud800"),  # a tag character; a lone surrogate (would not even encode)
    (3, "3"),
])
def test_shown_escapes_what_a_terminal_would_obey(raw, expected):
    assert shown(raw) == expected
    assert shown(shown(raw)) == shown(raw)  # what it returns is all printable


def test_shown_escapes_as_repr_does():
    """``repr`` escapes exactly the characters ``str.isprintable`` refuses, the same way: an independent
    oracle for strings without quotes or backslashes (which repr escapes too)."""
    pool = [chr(c) for c in (*range(0x00, 0x30), *range(0x7b, 0xb0), 0x2028, 0x202e, 0xfeff, 0x3b8, 0x1f600)
            if chr(c) not in "'\"\\"]
    rng = random.Random(25)
    for _ in range(300):
        s = "".join(rng.choices(pool, k=rng.randint(0, 12)))
        assert shown(s) == repr(s)[1:-1], repr(s)


def controls(text: str) -> list[str]:
    """C0 controls but the newline, DEL and C1 controls in ``text``."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]


def render(renderable) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=400, height=1000, color_system=None, force_terminal=False)
    console.print(renderable)
    return console.file.getvalue()


ENGINE = {"mode": "eb\x1b[5m", "k": 4, "n_max": 8, "version": 3, "reason": f"because {EVIL}\x9b",
          "last_error": "boom\x1b]0;title\x07", "mixed_unavailable": True,
          "mixed_unavailable_reason": "no \x1b[8mmixing", "gate_reasons": {f"wait_k{EVIL}": 3},
          "cost_source": "online\x1b[1m", "costs": {"alpha_p": 0.01, "source": "prof\x1b[0m"},
          "cost_fits": {f"prefill{EVIL}": {"in_use": False, "reason": "too\x1bfew", "n": 1}},
          f"new_field{EVIL}": "v\x1b[7m"}
STATUS = {"daemon": {"pid": 1, "engines": 2, "config_path": f"/etc/{EVIL}.toml", "profile": "p\x1b[3m",
                     "endpoints": {"control": "ipc://\x1b[4m"}, "tuned": {f"controller.k{EVIL}": "1\x1b"},
                     "counters": {"received": 1, f"rejected{EVIL}": {"malformed": 2}}},
          "engines": {EVIL: ENGINE, "dp[/x]:smile:": {**ENGINE, "reason": "[bold]ok[/bold]"}},
          "dispatchers": {f"disp{EVIL}": {"state": "failed\x1b[9m", "reason": f"stock {EVIL}",
                                          "layout": "plain\x1b", "rank": [[f"r{EVIL}", 1, 0, 0, 0, 0, 0, 5]],
                                          "policy": {"version": "\x1b[1m"}}}}


@pytest.mark.parametrize(("full", "height"), [(False, None), (False, 5), (True, None)],
                         ids=["blocks", "summary table", "--all"])
def test_status_views_print_no_control_character_a_peer_sent(full, height):
    out = render(view.status_view(STATUS, full=full, height=height))
    assert controls(out) == []
    assert "EVIL" in out and "\\x1b" in out  # shown, escaped
    assert "dp[/x]:smile:" in out  # plain text: neither markup (it would raise) nor an emoji
    if not full:  # the compact views, by hand: the id escaped
        assert f"engine {SHOWN_EVIL}" in out if height is None else SHOWN_EVIL[:10] in out
    if full:
        assert f"engine {SHOWN_EVIL}" in out and f"dispatcher disp{SHOWN_EVIL}" in out
        assert "[bold]ok[/bold]" in out


def test_changes_print_no_control_character(capsys):
    view.print_changes({"changed": {f"controller.k{EVIL}": [1, "\x1b[2J"]}, "needs_restart": [EVIL]},
                       {"a\x07": 1})
    out = capsys.readouterr().out
    assert controls(out) == []
    assert f"controller.k{SHOWN_EVIL} = " in out and f"needs a restart to take effect: {SHOWN_EVIL}" in out
