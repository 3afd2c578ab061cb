"""Several sittings of tools/ab_real.py pooled: each configuration against the baseline of the same round.

    python tools/ab_pool.py A.json B.json ... --baseline NAME [--slo TTFT,TPOT] [--pace N]
                            [--same NAME OTHER ...] [--report FILE]

One sitting's interval says how its runs spread; it says nothing of the next sitting's. On this project's CPU
machine a configuration's speed drifts by 5-10% from one sitting to the next (tools/ab_real.py's records in
docs/ab-real.md: the knob alone at 1,445-1,747 output tok/s on different days), so a 3% effect can look like 8% in
one sitting and 0% in another. This tool reads several ``--json`` records (each a sitting) and pairs each run
with the baseline's run of the same round: the round's ratio x/b. Across sittings it pools the rounds:

- the estimate is the geometric mean of every paired round's ratio (each round weighs the same);
- its 95% interval is a cluster bootstrap over sittings (10,000 draws: the sittings resampled with replacement,
  each bringing all its rounds): rounds of one sitting share its drift, so the sitting, not the round, is the
  unit that is independent. Few sittings give a rough interval; the table says how many there were.

Configurations match by name, as given to ab_real's ``--configs``; ``--same NAME OTHER`` counts OTHER as NAME
(the same setting written differently in an older sitting). Columns: output tok/s over the whole run and its last
part (each sitting's ``--last``), and with ``--slo`` (or the targets the sittings were recorded at) goodput and
its last part (tools/ab_real.py ``goodput``), and with ``--pace N`` the engine's time per decode step at N running
requests (sglang's own decode log, ``ab_real.decode_pace``: the median over the later half of the run's lines at
that count, after a controller's learning; a ratio above 1 is a slower engine at the same load, whatever its
batching). Sittings of different durations pool together only where the user
gives them: a controller's learning period weighs more in a shorter run. Prints a markdown table and, per
configuration, each sitting's round ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_real import _nan, goodput, parse_slo, percentile  # tools/ is not a package: its own dir on the path

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
            g = goodput(run.get("records") or [], st["duration"], slo, st["last"])
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
    return (est, percentile(means, tail), percentile(means, 100 - tail), len(logs), n)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="tools/ab_real.py --json records, one per sitting")
    ap.add_argument("--baseline", required=True, help="the configuration each run is paired with, by round")
    ap.add_argument("--slo", type=parse_slo, default=None, metavar="TTFT,TPOT",
                    help="goodput at these targets (default: each sitting's own, where it was recorded with one)")
    ap.add_argument("--pace", type=int, default=0, metavar="N",
                    help="also the time per decode step at N running requests (sglang's decode log; > 1: slower)")
    ap.add_argument("--same", action="append", nargs=2, default=[], metavar=("NAME", "OTHER"),
                    help="count configuration OTHER as NAME (repeatable)")
    ap.add_argument("--report", type=Path, default=None, help="also write the table here")
    a = ap.parse_args(argv)
    same = {other: name for name, other in a.same}
    sittings, labels, slos = [], [], set()
    for f in a.files:
        try:
            doc = _nan(json.loads(f.read_text()))
            slo = a.slo or (tuple(doc["settings"]["slo"]) if isinstance(doc["settings"].get("slo"), list) else None)
            rounds = round_figures(doc, slo, same, a.pace)
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"{f}: not a tools/ab_real.py --json record ({type(e).__name__}: {e})")
        if not any(a.baseline in cfgs for cfgs in rounds.values()):
            ap.error(f"{f}: no finished run of the baseline {a.baseline!r} (its configurations: "
                     f"{', '.join(doc['configs'])})")
        sittings.append(rounds)
        label = f.parent.name if f.name == "ab.json" else f.stem
        labels.append(f"{label}@{doc['commit']}" if doc.get("commit") else label)
        slos.add(slo)
    measures = ["tok_s", "tok_s_last"]
    if None not in slos and len(slos) == 1:
        measures += ["goodput_tok_s", "goodput_last_tok_s"]
    elif slos - {None}:
        print(f"[pool] the sittings were recorded at different targets ({sorted(slos, key=str)}): give --slo to "
              "compare goodput", file=sys.stderr)
    if a.pace:
        measures.append("step_s")
    text = table(sittings, labels, a.baseline, measures)
    head = (f"{len(sittings)} sitting(s); ratio to `{a.baseline}`: each run paired with its run of the same round; "
            "geometric mean of the round ratios, 95% interval by a bootstrap over sittings"
            + (f"; goodput at TTFT ≤ {next(iter(slos))[0]:g} s, TPOT ≤ {next(iter(slos))[1] * 1e3:g} ms"
               if "goodput_tok_s" in measures else "")
            + (f"; time per decode step at {a.pace} running, later half of each run" if a.pace else ""))
    print(head + "\n\n" + text)
    if a.report:
        a.report.write_text(head + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
