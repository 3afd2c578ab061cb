"""The picture of a sitting: output tokens/s (top) and TTFT p99 (bottom) over each run's time, a line per run,
a colour per configuration, and ebctl's policy changes marked on the time axis where its status reads saw them.
Needs matplotlib (the ``plot`` extra); ``changes`` is pure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ebctl.ab.report import engine_status


def changes(run: dict[str, Any]) -> list[tuple[float, str]]:
    """(time, "mode k N") at each status read whose policy differs from the read before (the first read with a
    policy counts as a change: from stock)."""
    out, prev = [], None
    for snap in run.get("status") or []:
        e = engine_status(snap.get("status") if isinstance(snap.get("status"), dict) else None)
        if not e or not isinstance(e.get("mode"), str):
            continue
        now = f"{e['mode']} k={e.get('k', '-')} N={e.get('n_max', '-')}"
        if now != prev:
            out.append((float(snap["t"]), now))
        prev = now
    return out


def draw(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = doc["configs"]
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    shown: set[str] = set()
    for run in doc["runs"]:
        series = run.get("series")
        if not series:
            continue
        w, c = series["bin_s"], colors[run["config"]]
        xs = [(i + 0.5) * w for i in range(len(series["tok_s"]))]
        label = None if run["config"] in shown else run["config"]
        shown.add(run["config"])
        top.plot(xs, series["tok_s"], color=c, alpha=0.85, label=label, marker=".")
        ttft = [x if isinstance(x, int | float) and math.isfinite(x) else math.nan for x in series["ttft_p99"]]
        bottom.plot(xs[:len(ttft)], ttft, color=c, alpha=0.85, marker=".")
        for t, text in changes(run):
            for ax in (top, bottom):
                ax.axvline(t, color=c, linestyle=":", linewidth=1)
            top.annotate(text, (t, 0.98), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, color=c,
                         va="top", ha="right", bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                                      "alpha": 0.8})
    top.set_ylabel("output tokens/s")
    bottom.set_ylabel("TTFT p99 (s)")
    bottom.set_xlabel("seconds since the load started (each run)")
    top.legend(loc="lower right", fontsize=8)
    st = doc["settings"]
    loop = f"open loop {st['rate']:g} req/s" if st.get("loop") == "open" else f"closed loop c={st.get('concurrency')}"
    top.set_title(f"ebctl ab: {', '.join(names)}; {st['runs']} round(s) of {st['duration']:.0f} s, {loop}; "
                  "dotted: ebctl's policy changes (status reads)", fontsize=9)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
