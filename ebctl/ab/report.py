"""The A/B's text: a run's line, the table per configuration (medians over runs, the ratio to the baseline with
its bootstrap interval, goodput at targets), the daemon's status reads as rows, sglang's decode log as the time
per decode step, and the markdown record a user can paste into an issue. Pure: records in, text out.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from typing import Any

from ebctl.ab import stats


def _rounded(x: Any) -> Any:
    """Floats to 4 significant digits, inside dicts and lists too (for printing)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


def fmt(x: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * scale:,.{digits}f}"


def engine_status(snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """The engine's block of a daemon status (the first engine; {} when there is none)."""
    engines = (snapshot or {}).get("engines") or {}
    return next(iter(engines.values()), None) or {}


def status_text(e: dict[str, Any]) -> str:
    if not e:
        return "no status"
    out = f"mode {e.get('mode', '-')} k {e.get('k', '-')} n_max {e.get('n_max', '-')}"
    for key in ("gain", "exploration"):
        if key in e:
            out += f" {key} {json.dumps(_rounded(e[key]), separators=(',', ':'), default=str)}"
    return out


_DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),.*?gen throughput \(token/s\): ([0-9.]+)")


def decode_pace(log: str) -> dict[int, list[float]]:
    """sglang's own pace, from its server log: every ``--decode-log-interval`` (40) decode steps it logs the
    running requests and the tokens generated per second since its last line (scheduler_components/
    metrics_reporter.py 933-955). running / that rate is the wall time of one decode step there, the
    prefills planned between them included: at the same running count, a slower engine has larger figures
    whatever the policy batched. Running count → those seconds, one per line."""
    out: dict[int, list[float]] = {}
    for m in _DECODE_LINE.finditer(log):
        n, rate = int(m.group(1)), float(m.group(2))
        if n > 0 and rate > 0:
            out.setdefault(n, []).append(n / rate)
    return out


def pace_table(names: list[str], runs: list[dict[str, Any]], top: int = 3) -> list[str]:
    """Per configuration, the median ``decode_pace`` (ms) at the ``top`` running counts most often logged by every
    configuration, over all its runs: the same load, so a difference is the engine's speed, not its batching."""
    per = {n: [{int(k): v for k, v in r.get("decode_pace", {}).items()} for r in runs if r["config"] == n]
           for n in names}  # int keys: JSON gives them back as strings
    counts: dict[int, int] = {}
    for pcs in per.values():
        for pc in pcs:
            for k, v in pc.items():
                counts[k] = counts.get(k, 0) + len(v)
    common = [k for k in sorted(counts, key=lambda k: -counts[k])
              if all(any(k in pc for pc in pcs) for pcs in per.values())][:top]
    if not common:
        return []
    rows = ["", "sglang's decode log: ms per decode step at the same running count n (median over every run's lines; "
            "lines)", "", "| configuration | " + " | ".join(f"n = {k}" for k in sorted(common)) + " |",
            "|---|" + "---|" * len(common)]
    for n in names:
        cells = []
        for k in sorted(common):
            xs = [x for pc in per[n] for x in pc.get(k, [])]
            cells.append(f"{statistics.median(xs) * 1e3:.2f} ({len(xs)})" if xs else "—")
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return rows


def run_line(rnd: int, runs: int, run: dict[str, Any], width: int) -> str:
    head = f"[ab] round {rnd}/{runs} {run['config']:<{width}}"
    if "summary" not in run:
        return f"{head}: FAILED: {run.get('error')}"
    s = run["summary"]
    line = (f"{head}: {fmt(s['tok_s'])} out tok/s (last part {fmt(s['tok_s_last'])}), TTFT p50/p99 "
            f"{fmt(s['ttft_p50'], 1, 2)}/{fmt(s['ttft_p99'], 1, 2)} s, TPOT p50/p99 {fmt(s['tpot_p50'], 1e3, 1)}/"
            f"{fmt(s['tpot_p99'], 1e3, 1)} ms, {s['completed']} completed, {s['failed']} failed, "
            f"{s['in_flight_at_end']} in flight at the end ({s['completed_in_drain']} completed in the drain, "
            f"{s['unfinished']} unfinished), client CPU {run['client_cpu_s'] / run['client_wall_s']:.1%}, "
            f"ready in {run['ready_s']:.0f} s")
    if "arrival_rate" in run:
        line += f", sent {run['arrival_rate']:.2f} requests/s"
    if run.get("cpu_s"):
        line += " | CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(run["cpu_s"].items(), key=lambda x: -x[1]))
    if run.get("scheduler_threads"):
        u = run["scheduler_threads"]
        line += (f" | scheduler main thread {u['main_voluntary_per_s']:.0f} voluntary, "
                 f"{u['main_involuntary_per_s']:.0f} involuntary switches/s, {u.get('minflt_per_s', 0):.0f} minor "
                 f"and {u.get('majflt_per_s', 0):.0f} major page faults/s (all threads: "
                 f"{u.get('all_minflt_per_s', 0):.0f} minor)")
        if u["on_main_core"] and run.get("pinned"):
            line += f"; on its core too: {', '.join(u['on_main_core'])}"
        line += "; threads' CPU s: " + ", ".join(f"{k} {t['cpu_s']:.1f}" for k, t in sorted(
            u["threads"].items(), key=lambda x: -x[1]["cpu_s"]) if t["cpu_s"] >= 0.5)
    if run["status"]:
        line += f" | {status_text(engine_status(run['status'][-1]['status']))}"
    if run.get("errors"):
        line += f" | errors: {run['errors'][:3]}"
    return line


def table(names: list[str], runs: list[dict[str, Any]], baseline: str, last: float, *,
          slo: tuple[float, float] | None = None, duration: float = math.nan) -> tuple[str, dict]:
    """The markdown table of the A/B and its figures per configuration; with ``slo`` (TTFT s, TPOT s) also
    :func:`goodput` from each run's records (over ``duration`` s of load) and its ratio to the baseline's."""
    done = [r for r in runs if "summary" in r]
    if slo is not None:
        done = [{**r, "summary": {**r["summary"], **stats.goodput(r.get("records") or [], duration, slo, last)}}
                for r in done]
    by = {n: [r["summary"] for r in done if r["config"] == n] for n in names}
    base_all = [s["tok_s"] for s in by[baseline]]
    base_last = [s["tok_s_last"] for s in by[baseline]]
    good_cols = (f" goodput tok/s (TTFT ≤ {slo[0]:g} s, TPOT ≤ {slo[1] * 1e3:g} ms) | attained | goodput ratio "
                 "[95%] | goodput, last part [95%] |" if slo else "")
    rows = [f"| configuration | runs | out tok/s | last {last:.0f} s | TTFT p50 s | TTFT p99 s | TPOT p50 ms | "
            f"TPOT p99 ms | completed | failed | ratio to {baseline} [95%] | last part [95%] |{good_cols}",
            "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if slo else "")]
    summary: dict[str, Any] = {}
    keys = ("tok_s", "tok_s_last", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
            *(("goodput_tok_s", "attained", "goodput_last_tok_s") if slo else ()))
    for n in names:
        ss = by[n]
        med = {k: (statistics.median(v) if (v := [s[k] for s in ss if not math.isnan(s[k])]) else math.nan)
               for k in keys}
        ratio = stats.bootstrap_ratio([s["tok_s"] for s in ss], base_all)
        ratio_last = stats.bootstrap_ratio([s["tok_s_last"] for s in ss], base_last)
        summary[n] = {**med, "runs": len(ss), "completed": sum(s["completed"] for s in ss),
                      "failed": sum(s["failed"] for s in ss), "unfinished": sum(s["unfinished"] for s in ss),
                      "tok_s_runs": [s["tok_s"] for s in ss], "tok_s_last_runs": [s["tok_s_last"] for s in ss],
                      "ratio": ratio, "ratio_last": ratio_last}

        def r(x: tuple[float, float, float]) -> str:
            return "-" if math.isnan(x[0]) else f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"

        row = (f"| {n} | {len(ss)} | {fmt(med['tok_s'])} | {fmt(med['tok_s_last'])} | "
               f"{fmt(med['ttft_p50'], 1, 2)} | {fmt(med['ttft_p99'], 1, 2)} | {fmt(med['tpot_p50'], 1e3, 1)} | "
               f"{fmt(med['tpot_p99'], 1e3, 1)} | {summary[n]['completed']} | {summary[n]['failed']} | "
               f"{r(ratio)} | {r(ratio_last)} |")
        if slo:
            g = stats.bootstrap_ratio([s["goodput_tok_s"] for s in ss], [s["goodput_tok_s"] for s in by[baseline]])
            g_last = stats.bootstrap_ratio([s["goodput_last_tok_s"] for s in ss],
                                     [s["goodput_last_tok_s"] for s in by[baseline]])
            summary[n].update(goodput_runs=[s["goodput_tok_s"] for s in ss], goodput_ratio=g,
                              goodput_last_runs=[s["goodput_last_tok_s"] for s in ss], goodput_ratio_last=g_last)
            att = "-" if math.isnan(med["attained"]) else f"{med['attained']:.1%}"
            row += f" {fmt(med['goodput_tok_s'])} | {att} | {r(g)} | {r(g_last)} |"
        rows.append(row)
    return "\n".join(rows), summary


def status_rows(run: dict[str, Any]) -> list[str]:
    """One markdown row per status read of an ebctl run: time, policy, the search, output rate, gain, cost."""
    rows = []
    for snap in run.get("status") or []:
        e = engine_status(snap.get("status"))
        tu = e.get("tuner") if isinstance(e.get("tuner"), dict) else {}
        g = e.get("gain") if isinstance(e.get("gain"), dict) else {}

        def pct(x: Any) -> str:
            return f"{x:+.1%}" if isinstance(x, int | float) and math.isfinite(x) else "-"

        gain = f"{pct(g.get('vs_stock'))} [{pct(g.get('low'))}, {pct(g.get('high'))}]" if g else "-"
        cost = g.get("explore_share")
        rows.append(f"| {snap.get('t', math.nan):.0f} | {e.get('mode', '-')} | {e.get('k', '-')} | "
                    f"{e.get('n_max', '-')} | {tu.get('state', '-')} | {tu.get('incumbent', '-')} | "
                    f"{fmt(e.get('output_tok_s'))} | {gain} | "
                    f"{f'{cost:.1%}' if isinstance(cost, int | float) and math.isfinite(cost) else '-'} |")
    return rows


def report(doc: dict[str, Any], command: str) -> str:
    """The markdown record of a finished A/B (``--report``): setup, every run's line, the table, and for each
    ebctl run its status reads and the trials its controller ran."""
    st = doc["settings"]
    names, runs = doc["configs"], doc["runs"]
    baseline = st["baseline"] if isinstance(st.get("baseline"), str) and st["baseline"] else names[0]
    slo = tuple(st["slo"]) if isinstance(st.get("slo"), (list, tuple)) else None  # a live run: a tuple; JSON: a list
    text, _ = table(names, runs, baseline, st["last"], slo=slo, duration=st["duration"])
    width = max(len(n) for n in names)
    placed = ("the scheduler's main thread alone on CPU 0 (--pin)" if st.get("pin") else "not pinned")
    orders = {"rotate": " (each round's order rotated by one)", "given": " (in the order given)"}
    loop = (f"open loop at {st['rate']:g} requests/s" if st.get("loop") == "open" else
            f"closed loop, c = {st['concurrency']}")
    out = [f"`{command}`", "",
           f"{st['runs']} round(s) of {st['duration']:.0f} s, {loop}, workload "
           f"{doc['workload']['source']} (seed {doc['workload']['seed']}), base args `{shlex.join(doc['base_args'])}`, "
           f"{placed}; configurations interleaved{orders.get(st.get('order'), '')}, each run on a "
           "fresh server.", *setup_lines(doc), "", "```",
           *(run_line(r["round"], st["runs"], r, width) for r in runs), "```", "",
           f"Medians over runs; ratio: bootstrap median [95% interval] of mean output tok/s against {baseline}.", "",
           text, *pace_table(names, runs)]
    for r in runs:
        if not r.get("status"):
            continue
        out += ["", f"**Round {r['round']}, {r['config']}**: throughput per {doc['bin_s']:.0f}-s bin "
                    f"{', '.join(fmt(x) for x in r.get('summary', {}).get('bins_30s', []))}", "",
                "| t (s) | mode | k | N | search | incumbent | output tok/s (last min) | gain vs stock [95%] | "
                "exploring cost |", "|---|---|---|---|---|---|---|---|---|", *status_rows(r)]
        last = engine_status(r["status"][-1].get("status"))
        tuner = last.get("tuner") if isinstance(last.get("tuner"), dict) else {}  # mode off: none (--from-json: NaN)
        for h in tuner.get("history") or []:
            eff = h.get("effect")
            out.append(f"- trial {h['incumbent']} against {h['challenger']}: windows {h['rates']}, effect "
                       f"{f'{eff:+.1%}' if isinstance(eff, int | float) and math.isfinite(eff) else '-'}, "
                       f"{h['decision']} {h.get('why') or ''}".rstrip())
    return "\n".join(out) + "\n"


def setup_lines(doc: dict[str, Any]) -> list[str]:
    """Where the A/B ran, as its record says: the device, the versions, the commit (nothing for a record made
    before it kept them)."""
    env = doc.get("environment")
    if not isinstance(env, dict):
        return []
    dev = env.get("device") if isinstance(env.get("device"), dict) else {}
    gpus = dev.get("gpus") or []
    where = (f"{len(gpus)} × {gpus[0]}" if gpus and len(set(gpus)) == 1 else ", ".join(gpus)) if gpus else \
        f"CPU only ({dev.get('cpu') or 'CPU not named'}, {dev.get('cpus', '?')} cores)"
    versions = ", ".join(f"{k} {env.get(k) or '-'}" for k in ("sglang", "torch", "ebctl"))
    return ["", f"Device: {where} (from {dev.get('source') or 'nothing'}); {versions}; commit "
                f"{env.get('commit') or '-'}."]
