"""Several sittings of the A/B pooled (``ebctl.ab.pool``): each configuration against the baseline of the same
round, the geometric mean of the round ratios, its 95% interval by a bootstrap over sittings.

    python tools/ab_pool.py A.json B.json ... --baseline NAME [--slo TTFT,TPOT] [--pace N]
                            [--same NAME OTHER ...] [--report FILE]
    python tools/ab_pool.py --summary RECORDS.jsonl [--report FILE.md]

The records are ``ebctl ab --json`` (or ``tools/ab_real.py --json``) sittings; ``ebctl ab --pool FILE.jsonl``
appends each sitting to a file and prints the pool as it runs. Configurations match by name, as given to
``--configs``; ``--same NAME OTHER`` counts OTHER as NAME. ``--slo``: goodput at those targets (default: the
sittings' own); ``--pace N``: the engine's time per decode step at N running requests (sglang's decode log, the
later half of each run; a ratio above 1 is a slower engine at the same load).

``--summary RECORDS.jsonl`` writes the markdown summary of sittings kept as data, one a line:
docs/results/ab_real.md is ``python tools/ab_pool.py --summary docs/results/ab_real.jsonl --report
docs/results/ab_real.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ebctl.ab import pool, stats


def _slo(text: str) -> tuple[float, float]:
    try:
        return stats.parse_slo(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="tools/ab_real.py --json records, one per sitting")
    ap.add_argument("--baseline", help="the configuration each run is paired with, by round")
    ap.add_argument("--slo", type=_slo, default=None, metavar="TTFT,TPOT",
                    help="goodput at these targets (default: each sitting's own, where it was recorded with one)")
    ap.add_argument("--pace", type=int, default=0, metavar="N",
                    help="also the time per decode step at N running requests (sglang's decode log; > 1: slower)")
    ap.add_argument("--same", action="append", nargs=2, default=[], metavar=("NAME", "OTHER"),
                    help="count configuration OTHER as NAME (repeatable)")
    ap.add_argument("--report", type=Path, default=None, help="also write the table here")
    ap.add_argument("--summary", type=Path, default=None, metavar="JSONL",
                    help="sittings kept as data, one a line: print (with --report, write) their markdown summary")
    a = ap.parse_args(argv)
    if a.summary:
        if a.files or a.baseline:
            ap.error("--summary takes its sittings from its file: no FILES or --baseline")
        try:
            docs = pool.load_sittings(a.summary)
        except (OSError, ValueError) as e:
            ap.error(f"{a.summary}: {type(e).__name__}: {e}")
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("ebctl")
        except PackageNotFoundError:
            ver = "(not installed)"
        cmd = "python tools/ab_pool.py --summary " + str(a.summary) + (f" --report {a.report}" if a.report else "")
        md = pool.summary(docs, cmd, ver)
        if a.report:
            a.report.write_text(md)
        print(md, end="")
        return 0
    if not a.files or not a.baseline:
        ap.error("give the --json records and --baseline (or --summary JSONL)")
    same = {other: name for name, other in a.same}
    sittings, labels, slos = [], [], set()
    for f in a.files:
        try:
            doc = stats.nan(json.loads(f.read_text()))
            slo = a.slo or (tuple(doc["settings"]["slo"]) if isinstance(doc["settings"].get("slo"), list) else None)
            rounds = pool.round_figures(doc, slo, same, a.pace)
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
    text = pool.table(sittings, labels, a.baseline, measures)
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
