"""Several sittings of the A/B pooled: each configuration against the baseline of the same round.

One sitting's interval says how its runs spread; it says nothing of the next sitting's (on this project's CPU
machine a configuration's speed drifts by 5-10% from one sitting to the next). Each run is paired with the
baseline's run of the same round: the round's ratio x/b. Across sittings the rounds pool:

- the estimate is the geometric mean of every paired round's ratio (each round weighs the same);
- its 95% interval is a cluster bootstrap over sittings (10,000 draws: the sittings resampled with replacement,
  each bringing all its rounds): rounds of one sitting share its drift, so the sitting, not the round, is the
  unit that is independent. Few sittings give a rough interval; the table says how many there were.

``summary`` writes the markdown of sittings kept as data, one a line (docs/results/ab_real.jsonl: each line a
sitting's record, its runs' summaries without the per-request records): by workload, each configuration pooled
over its sittings, then each sitting's rows. Pure: records in, text out (the files are the shell's).

Not ``scipy.stats.bootstrap``: the cluster bootstrap resamples groups (sittings), each bringing its rounds, which
scipy's resamples of observations do not do.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebctl.ab import stats
from ebctl.ab.report import fmt

MEASURES = {"tok_s": "output", "tok_s_last": "output, last part", "goodput_tok_s": "goodput",
            "goodput_last_tok_s": "goodput, last part", "step_s": "time per decode step (> 1: slower)"}


def later_pace(run: dict[str, Any], n: int) -> float:
    """The median of the later half of a run's ``decode_pace`` lines at ``n`` running (s per decode step; NaN
    with fewer than two lines). JSON keeps the counts as strings."""
    lines = (run.get("decode_pace") or {}).get(str(n)) or []
    return statistics.median(lines[len(lines) // 2:]) if len(lines) >= 2 else math.nan


def round_figures(doc: dict[str, Any], slo: tuple[float, float] | None,
                  same: dict[str, str], pace: int = 0) -> dict[int, dict[str, dict[str, float]]]:
    """A sitting's runs by round: {round: {configuration: {measure: value}}}; with ``slo`` the goodput measures
    from each run's records, with ``pace`` the time per decode step at that many running (``later_pace``). Runs
    that did not finish (no summary) are left out; ``same`` renames."""
    st = doc["settings"]
    out: dict[int, dict[str, dict[str, float]]] = {}
    for run in doc["runs"]:
        if "summary" not in run:
            continue
        s = {k: run["summary"][k] for k in ("tok_s", "tok_s_last")}
        if slo is not None:
            g = stats.goodput(run.get("records") or [], st["duration"], slo, st["last"])
            s.update(goodput_tok_s=g["goodput_tok_s"], goodput_last_tok_s=g["goodput_last_tok_s"])
        if pace:
            s["step_s"] = later_pace(run, pace)
        out.setdefault(run["round"], {})[same.get(run["config"], run["config"])] = s
    return out


def paired_ratios(sittings: Sequence[dict[int, dict[str, dict[str, float]]]], name: str, baseline: str,
                  measure: str) -> list[list[float]]:
    """Per sitting, the ratio ``name``/``baseline`` of ``measure`` in each round that ran both (a round where
    either is 0 or not finite has no ratio: the geometric mean needs both positive, so a configuration with no
    goodput in a round is left out of that round, not counted as 0)."""
    out = []
    for rounds in sittings:
        rs = []
        for cfgs in rounds.values():
            x, b = cfgs.get(name, {}).get(measure), cfgs.get(baseline, {}).get(measure)
            if x is not None and b and math.isfinite(x) and math.isfinite(b) and x > 0:
                rs.append(x / b)
        out.append(rs)
    return out


def pooled(groups: Sequence[Sequence[float]], *, draws: int = 10_000, seed: int = 0,
           level: float = 0.95) -> tuple[float, float, float, int, int]:
    """(estimate, low, high, sittings, rounds): the geometric mean of every ratio in ``groups`` (one group per
    sitting) and the central ``level`` interval of the same over ``draws`` cluster-bootstrap resamples (groups
    drawn with replacement, each bringing all its ratios). NaN where no group has a ratio."""
    logs = [[math.log(r) for r in g] for g in groups if g]
    n = sum(len(g) for g in logs)
    if not logs:
        return (math.nan, math.nan, math.nan, 0, 0)
    est = math.exp(statistics.fmean(x for g in logs for x in g))
    rng = random.Random(seed)
    means = []
    for _ in range(draws):
        pick = rng.choices(logs, k=len(logs))
        means.append(math.exp(statistics.fmean(x for g in pick for x in g)))
    tail = (1 - level) / 2 * 100
    return (est, stats.percentile(means, tail), stats.percentile(means, 100 - tail), len(logs), n)


def table(sittings: Sequence[dict[int, dict[str, dict[str, float]]]], labels: Sequence[str], baseline: str,
          measures: Sequence[str]) -> str:
    """The markdown table (a row per configuration, a column per measure) and each sitting's round ratios."""
    names = sorted({n for rounds in sittings for cfgs in rounds.values() for n in cfgs} - {baseline})
    rows = [f"| configuration | sittings | rounds | {' | '.join(f'{MEASURES[m]} [95%]' for m in measures)} |",
            "|---|---|---|" + "---|" * len(measures)]
    detail = []
    for name in names:
        per = {m: paired_ratios(sittings, name, baseline, m) for m in measures}
        cells, shape = [], (0, 0)
        for m in measures:
            est, lo, hi, k, n = pooled(per[m])
            shape = max(shape, (k, n))
            cells.append("-" if math.isnan(est) else f"{est:.3f} [{lo:.3f}, {hi:.3f}]")
        if shape[1] == 0:
            continue
        rows.append(f"| {name} | {shape[0]} | {shape[1]} | {' | '.join(cells)} |")
        first = per[measures[0]]
        detail.append(f"- {name}, {MEASURES[measures[0]]}: " + "; ".join(
            f"{lab} {', '.join(f'{r:.3f}' for r in rs)}" for lab, rs in zip(labels, first, strict=True) if rs))
    return "\n".join([*rows, "", f"Round ratios by sitting ({baseline} = 1):", "", *detail])


def workload_of(doc: dict[str, Any]) -> str:
    """A sitting's workload as the server saw it: the trace (the issue's by default) and the server's flags."""
    st = doc["settings"]
    trace = st.get("trace") or "issue"
    name = "the issue's workload" if trace == "issue" else f"`--trace {trace}`"
    return name + (f", server `{st['server_args']}`" if st.get("server_args") else "")


def sitting_name(doc: dict[str, Any]) -> str:
    """``#N``, the sitting's place in the file, and its own label where it had one (``--json /tmp/abN/...``)."""
    return f"#{doc['sitting']}" + (f" ({doc['label']})" if doc.get("label") else "")


def _r(x: Sequence[float] | None) -> str:
    return "-" if not x or math.isnan(x[0]) else f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"


def sitting_rows(doc: dict[str, Any]) -> list[str]:
    """One sitting's rows, a configuration each but its baseline: medians over its finished runs, the ratio to the
    baseline (ab_real's: bootstrap over runs of the ratio of means), the goodput ratio as its record printed it."""
    st, runs = doc["settings"], [r for r in doc["runs"] if "summary" in r]
    base = st["baseline"]
    by = {n: [r["summary"] for r in runs if r["config"] == n] for n in doc["configs"]}
    good = (doc.get("goodput") or [{}])[0]
    rows = []
    for n in doc["configs"]:
        ss = by[n]
        if n == base or not ss:
            continue

        def med(key: str, ss: list = ss) -> float:
            xs = [s[key] for s in ss if s.get(key) is not None and not math.isnan(s[key])]
            return statistics.median(xs) if xs else math.nan

        def p99(key: str, scale: float, digits: int, med: Any = med) -> str:
            b = statistics.median(x) if (x := [s[key] for s in by[base] if s.get(key) is not None]) else math.nan
            return f"{fmt(med(key), scale, digits)} / {fmt(b, scale, digits)}"

        whole = stats.bootstrap_ratio([s["tok_s"] for s in ss], [s["tok_s"] for s in by[base]])
        last = stats.bootstrap_ratio([s["tok_s_last"] for s in ss], [s["tok_s_last"] for s in by[base]])
        g = good.get("configs", {}).get(n, {}).get("goodput_ratio")
        rows.append(f"| {sitting_name(doc)} | {doc.get('commit') or '-'} | {doc.get('date') or '-'} | `{n}` | "
                    f"{len(ss)} | {fmt(med('tok_s'))} | {fmt(statistics.median(s['tok_s'] for s in by[base]))} | "
                    f"{_r(whole)} | {_r(last)} | {p99('ttft_p99', 1, 2)} | {p99('tpot_p99', 1e3, 1)} | {_r(g)} | "
                    f"{sum(s['failed'] for s in ss)} |")
    return rows


def load_sittings(path: Path) -> list[dict[str, Any]]:
    """The sittings of a JSON-lines file, one a line (``--summary``); a run's figure recorded as none is NaN."""
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for d in docs:
        d["runs"] = stats.nan(d["runs"])
    return docs


def summary(docs: Sequence[dict[str, Any]], command: str, version: str) -> str:
    """The markdown summary of sittings kept as data (``--summary``): by workload, each configuration pooled over
    its sittings against each baseline it ran beside, then a row per sitting and configuration."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        groups.setdefault(workload_of(d), []).append(d)
    runs = sum(len(d["runs"]) for d in docs)
    out = ["# The A/B on the real server: every recorded sitting", "",
           f"Written by `{command}` at ebctl {version}, from {len(docs)} sittings ({runs} runs). Do not edit: "
           "change the data or the tool, and run it again.", "",
           "Each sitting is one `tools/ab_real.py` record on the machine it names: its configurations interleaved "
           "by round, each run on a fresh sglang server (sglang 0.5.23, the tiny test model, CPU). The data, a "
           "sitting a line with every run's figures, the daemon's status reads and the controller's trials: "
           "[ab_real.jsonl](ab_real.jsonl). A configuration is named as given to `--configs`: `alone` is sglang "
           "without the plugin, `ebctl` the default controller from a cold start, `plugin` sglang with the plugin "
           "loaded and no daemon, `mfsd=K` and `pdi=N` sglang's own `--min-free-slots-delay K` and "
           "`--prefill-decode-interval N`, `ebctl:KEY=VALUE;...` ebctl with those settings.", ""]
    for name, ds in groups.items():
        ds = sorted(ds, key=lambda d: d["sitting"])
        out += [f"## {name[0].upper()}{name[1:]}", "",
                "Pooled over sittings (`tools/ab_pool.py`): each run paired with its baseline's run of the same "
                "round; the geometric mean of the round ratios, 95% interval by a bootstrap over sittings. The "
                "sittings ran different code: the range is given.", "",
                "| configuration | baseline | sittings | rounds | code | output [95%] | output, last part [95%] |",
                "|---|---|---|---|---|---|---|"]
        pairs = sorted({(n, d["settings"]["baseline"]) for d in ds for n in d["configs"]
                        if n != d["settings"]["baseline"]}, key=lambda p: (p[1], p[0]))
        for n, base in pairs:
            with_both = [d for d in ds if d["settings"]["baseline"] == base and n in d["configs"]]
            rounds = [round_figures(d, None, {}) for d in with_both]
            est = [pooled(paired_ratios(rounds, n, base, m)) for m in ("tok_s", "tok_s_last")]
            if est[0][4] == 0:
                continue
            commits = [d.get("commit") or "?" for d in with_both]
            code = commits[0] if len(set(commits)) == 1 else f"{commits[0]} to {commits[-1]}"
            out.append(f"| `{n}` | `{base}` | {est[0][3]} | {est[0][4]} | {code} | {_r(est[0])} | {_r(est[1])} |")
        out += ["", "Each sitting: medians over the configuration's runs; ratio to the sitting's baseline: the "
                "bootstrap median [95% interval] of mean output tok/s (runs resampled), whole run and last part; "
                "p99s: the configuration's / the baseline's; goodput ratio at the sitting's targets, as its record "
                "printed it. The sittings, in the order they ran:", ""]
        for d in ds:
            st = d["settings"]
            slo = st.get("slo")
            targets = f", targets TTFT ≤ {slo[0]:g} s, TPOT ≤ {slo[1] * 1e3:g} ms" if isinstance(slo, list) else ""
            out.append(f"- {sitting_name(d)}: {d.get('date') or 'date not recorded'}, "
                       f"{d.get('machine') or 'machine not recorded'}, {st['runs']} × {st['duration']:.0f} s "
                       f"(last part {st['last']:.0f} s), baseline `{st['baseline']}`{targets}"
                       + (f"; {d['note']}" if d.get("note") else "") + f": `{d['command']}`")
        out += ["", "| sitting | code | date | configuration | runs | out tok/s | baseline's | ratio [95%] | "
                "last part [95%] | TTFT p99 s | TPOT p99 ms | goodput ratio [95%] | failed |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for d in ds:
            out += sitting_rows(d)
        out.append("")
    return "\n".join(out)
