"""After the runs: the table printed, the record (JSON), the markdown report, the picture and the pool written,
the exit code chosen; and ``--from-json``, which does the same for a recorded sitting without running anything."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
from pathlib import Path
from typing import Any

from ebctl.ab import pool, report, sitting, stats


def where(env: dict[str, Any]) -> str:
    """One line: the device, the versions, the commit."""
    return report.setup_lines({"environment": env})[-1]


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same way out as Ctrl-C: servers stopped, the partial record written


def finish(plan: sitting.Plan, a: argparse.Namespace, slo: tuple[float, float] | None, work: Path) -> int:
    st = plan.settings
    out_json, out_md, out_png = a.json or work / "ab.json", a.report or work / "ab.md", a.png or work / "ab.png"
    signal.signal(signal.SIGTERM, _sigterm)
    if a.pin:  # what it starts inherits the other CPUs; pin() then moves each scheduler's main thread to CPU 0
        os.sched_setaffinity(0, (set(range(os.cpu_count() or 1)) - {0}) or {0})
    runs, interrupted = sitting.sit(plan, out_json)
    text, summary = report.table(plan.names, runs, plan.baseline, st["last"], slo=slo, duration=st["duration"])
    doc = sitting.record(plan, runs, summary, interrupted)
    sitting.write(out_json, doc)
    head = "interrupted: the runs so far" if interrupted else "done"
    print(f"\n`{plan.command}`: {head}; medians over runs; ratio: bootstrap median [95% interval] of mean output "
          f"tok/s against {plan.baseline}\n")
    print(text)
    print("\n".join(report.pace_table(plan.names, runs)))
    cpu = [r["client_cpu_s"] / r["client_wall_s"] for r in runs if "client_cpu_s" in r]
    if cpu:
        print(f"\nclient CPU: {min(cpu):.1%}-{max(cpu):.1%} of one core (user + system over its wall time)")
    out_md.write_text(report.report(doc, plan.command))
    print(f"[ab] record {out_json}, report {out_md}" + picture(doc, out_png))
    if a.pool and runs:
        print(append_and_pool(a.pool, doc))
    bad = [r for r in runs if "summary" not in r or r["summary"]["failed"] or r["summary"]["unfinished"]]
    for r in bad:
        print(f"[ab] NOT OK: round {r['round']} {r['config']}: "
              f"{r.get('error') or {k: r['summary'][k] for k in ('failed', 'unfinished')}} {r.get('errors') or ''}")
    left = sorted({p for r in runs for p in r.get("left_running") or []})
    if left:
        print(f"[ab] still running after their servers were stopped: pids {left}")
    if interrupted:
        print("[ab] interrupted: every server it started is stopped; the partial record is written")
        return sitting.INTERRUPTED
    return 1 if bad or left else 0


def picture(doc: dict[str, Any], path: Path) -> str:
    """Draw the picture; the words for the line that says where it went."""
    try:
        from ebctl.ab import plot

        plot.draw(doc, path)
    except ImportError:
        return " (no picture: matplotlib is not installed; pip install 'ebctl[plot]')"
    return f", picture {path}"


def pooled_line(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """The sitting as one line of a pool file: its record less the per-request records."""
    env = doc.get("environment") or {}
    runs = [{k: v for k, v in r.items() if k != "records"} for r in doc["runs"]]
    return {**{k: v for k, v in doc.items() if k != "runs"}, "runs": runs, "sitting": n, "label": None,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": where(env).removeprefix("Device: ")}


def append_and_pool(path: Path, doc: dict[str, Any]) -> str:
    """Append the sitting to the pool file; the pooled table of every sitting there with the same baseline."""
    docs = pool.load_sittings(path) if path.is_file() else []
    with open(path, "a") as f:
        f.write(json.dumps(stats.finite(pooled_line(doc, len(docs) + 1)), separators=(",", ":"), default=str) + "\n")
    docs = pool.load_sittings(path)
    base = doc["settings"]["baseline"]
    same = [d for d in docs if d["settings"].get("baseline") == base]
    rounds = [pool.round_figures(d, None, {}) for d in same]
    text = pool.table(rounds, [pool.sitting_name(d) for d in same], base, ["tok_s", "tok_s_last"])
    return (f"\n[ab] pooled over the {len(same)} sitting(s) of {path} against `{base}`: each run paired with its "
            f"round's; geometric mean of the round ratios, 95% interval by a bootstrap over sittings\n\n{text}")


def from_json(a: argparse.Namespace, slo: tuple[float, float] | None) -> int:
    """``--from-json``: the report of a recorded sitting (at other targets with ``--slo``), and its picture."""
    doc = stats.nan(json.loads(a.from_json.read_text()))
    if slo:
        doc["settings"]["slo"] = list(slo)
    md = report.report(doc, doc.get("command") or f"ebctl ab --from-json {a.from_json}")
    if a.report:
        a.report.write_text(md)
    print(md)
    if a.png:
        print("[ab]" + picture(doc, a.png).removeprefix(","))
    return 0
