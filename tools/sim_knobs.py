"""The simulator's table "against SGLang's own knobs" (docs/results/sim_knobs.md), as Markdown.

    .venv/bin/python tools/sim_knobs.py [--requests 3000] [--jobs 2] [--seed 0] [--quick] [--slo-objective]
        [--profile P ...] [--workload W ...] [--conc C ...]

What an operator can set instead of ebctl, one flag each (``ebctl.sim.policies.static_sweep``: stock, mixed
chunks, ``--min-free-slots-delay K`` for K = 2 ... 512, ``--prefill-decode-interval N`` for N = 1 ... 32), run
beside the controller as a default install configures it (``default``), on qwen3-8b/rtx-pro-6000 and
qwen3-8b/h200 (sglang's rules, N = 1,024 slots, B = 8,192 tokens, the GPU's KV capacity, the default cost
model), the three synthetic mixes and the three shipped traces, closed loops of c = 256, 512, 2,048.

Per cell: output tokens/s of the default and of the best static setting, and goodput (output tokens/s of the
requests that met both targets; ``tools/ab_real.py --slo`` counts the same on the real server) at two target
pairs: the paper's (TTFT ≤ 10 s, TPOT ≤ 100 ms, its Table 18) and a tight pair set per cell from stock's own
latencies (TTFT ≤ stock's p75, TPOT ≤ stock's p90, both scaled down where the best static setting met them for
more than 90% of its requests: ``tight_slo``), with the best static setting's attainment (the share of requests
meeting both) beside it. ``--quick``: one profile, two workloads, c = 512, 400 requests (CI).

``--slo-objective``: the default is run again per cell and pair with that pair as its latency targets
(``default:ttft=X,tpot=Y``: ``controller.slo_ttft_s``/``slo_tpot_s``, so its measured search maximizes goodput
under them; the tight pair comes from the cell's stock run, so these runs follow the others), and a second table
sets its goodput beside the best static setting's and the default's without targets. ``--profile``,
``--workload``, ``--conc`` (each repeatable) run a subset of the cells.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ebctl import profiles
from ebctl.sim import costs, hardware, policies, runner, workloads
from ebctl.sim.engine import EngineConfig

PROFILES = ("qwen3-8b/rtx-pro-6000", "qwen3-8b/h200")
MIXES = ("prefill-heavy", "balanced", "decode-heavy", "azure-code", "azure-conv", "mooncake-conv")
CONCURRENCY = (256, 512, 2048)
PAPER_SLO = (10.0, 0.1)  # the paper's Table 18: TTFT < 10 s, TPOT < 100 ms
CONTROLLER = "default"


@functools.cache
def _setup(profile: str):
    prof = profiles.load(profile)
    return prof, costs.build(prof), hardware.kv_capacity_tokens(prof.model, prof.gpu)


def job(profile: str, workload: str, conc: int, spec: str, requests: int, seed: int) -> dict:
    """One run; the per-request TTFT, TPOT and output length that goodput at any targets needs."""
    prof, cm, kv = _setup(profile)
    cfg = EngineConfig(kv_tokens=kv)
    wl = workloads.load(workload, requests, seed=seed)
    src = policies.make(spec, max_running=cfg.max_running, kv_tokens=cfg.kv_tokens, costs=prof.costs)
    res = runner.run(wl, src, cm, cfg, concurrency=conc, keep_engine=True)
    req = res.pop("_engine").req.arrays()
    ok = req["reason"] != "abort"
    out = req["output_len"].astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (req["finish"] - req["first_token"]) / (out - 1), np.nan)
    return {"profile": profile, "workload": workload, "conc": conc, "policy": spec,
            "tok_per_s": res["tok_per_s"], "makespan_s": res["makespan_s"],
            "ttft": np.where(ok, req["first_token"] - req["arrival"], np.nan), "tpot": tpot, "out": out}


def goodput(r: dict, slo: tuple[float, float]) -> tuple[float, float]:
    """(output tok/s of the requests within both targets, their share of the requests): ab_real.goodput's rule
    (a one-token request has no TPOT: its TTFT alone)."""
    met = (r["ttft"] <= slo[0]) & (np.isnan(r["tpot"]) | (r["tpot"] <= slo[1])) & np.isfinite(r["ttft"])
    return float(r["out"][met].sum() / r["makespan_s"]), float(met.mean())


def best_static(runs: dict[str, dict], slo: tuple[float, float]) -> tuple[str, tuple[float, float]]:
    """The static setting of a cell with the highest goodput at ``slo``, and its (goodput, attainment)."""
    good = {s: goodput(r, slo) for s, r in runs.items() if policies.is_static(s)}
    best = max(good, key=lambda s: good[s][0])
    return best, good[best]


TIGHT_MAX, TIGHT_STEP = 0.9, 0.98  # the best static setting meets the tight pair for at most 90% of its requests


def tight_slo(runs: dict[str, dict]) -> tuple[float, float]:
    """The cell's tight pair, one at which the best static setting meets both targets for 50-90% of its requests
    (the issue's definition): from stock's own latencies, TTFT ≤ its p75 and TPOT ≤ its p90 (stock meets
    both for at least 65%), both scaled by 0.98 at a time while the best static setting at the pair meets them for
    more than 90% (on simulated RTX PRO 6000, balanced, c = 2,048, `--prefill-decode-interval 8` met stock's pair
    for 92%). Small steps: at c = 2,048 on 1,024 slots a request's TTFT is mostly its wait in the queue, alike for
    all, and one step of 0.9 took the best static setting there from 92% to 53%."""
    stock = runs["v0"]
    base = float(np.nanpercentile(stock["ttft"], 75)), float(np.nanpercentile(stock["tpot"], 90))
    for i in range(200):
        slo = base[0] * TIGHT_STEP**i, base[1] * TIGHT_STEP**i
        if best_static(runs, slo)[1][1] <= TIGHT_MAX:
            break
    return slo


def slo_spec(slo: tuple[float, float]) -> str:
    """The default with ``slo`` as its latency targets (exact: ``repr`` round-trips a float)."""
    return f"{CONTROLLER}:ttft={slo[0]!r},tpot={slo[1]!r}"


def cell_row(runs: dict[str, dict]) -> dict:
    """The default against the best static setting of one cell: by output tok/s, and by goodput at each pair
    (``targeted``: the default's goodput with that pair as its targets, where it ran)."""
    static = {s: r for s, r in runs.items() if policies.is_static(s)}
    ctl = runs[CONTROLLER]
    best_tok = max(static, key=lambda s: static[s]["tok_per_s"])
    row = {"tok": (ctl["tok_per_s"], best_tok, static[best_tok]["tok_per_s"])}
    for name, slo in (("paper", PAPER_SLO), ("tight", tight_slo(runs))):
        best, best_good = best_static(runs, slo)
        row[name] = {"slo": slo, "ctl": goodput(ctl, slo), "best": best, "best_good": best_good}
        if slo_spec(slo) in runs:
            row[name]["targeted"] = goodput(runs[slo_spec(slo)], slo)
    return row


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1%}" if b > 0 else ("= (both 0)" if a == 0 else "-")


def _short(spec: str) -> str:
    return spec.replace("sglang:min-free-slots=", "mfsd ").replace("sglang:pd-interval=", "pdi ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="one profile, two workloads, c = 512, 400 requests")
    ap.add_argument("--slo-objective", action="store_true",
                    help="also run the default with each pair as its latency targets (a second table)")
    ap.add_argument("--profile", action="append", choices=PROFILES, help="only this profile (repeatable)")
    ap.add_argument("--workload", action="append", choices=MIXES, help="only this workload (repeatable)")
    ap.add_argument("--conc", action="append", type=int, help="only this concurrency (repeatable)")
    a = ap.parse_args(argv)
    prof_list, mixes, concs = (PROFILES[:1], MIXES[1:3], (512,)) if a.quick else (PROFILES, MIXES, CONCURRENCY)
    prof_list, mixes, concs = a.profile or prof_list, a.workload or mixes, a.conc or concs
    n = 400 if a.quick else a.requests
    specs = [CONTROLLER, *policies.static_sweep(EngineConfig().max_running)]
    jobs = [(p, w, c, s, n, a.seed) for p in prof_list for w in mixes for c in concs for s in specs]
    t0 = time.perf_counter()
    got: dict[tuple, dict[str, dict]] = {}
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        for r in ex.map(job, *zip(*jobs, strict=True), chunksize=2):
            got.setdefault((r["profile"], r["workload"], r["conc"]), {})[r["policy"]] = r
        if a.slo_objective:  # the tight pair is the cell's stock run's: these follow
            more = [(*cell, slo_spec(slo), n, a.seed) for cell, runs in got.items()
                    for slo in (PAPER_SLO, tight_slo(runs))]
            jobs += more
            for r in ex.map(job, *zip(*more, strict=True), chunksize=2):
                got[(r["profile"], r["workload"], r["conc"])][r["policy"]] = r
    cmd = "python tools/sim_knobs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Made by `{cmd.strip()}` ({n:,} requests per run, seed {a.seed}; {len(jobs)} runs in "
          f"{time.perf_counter() - t0:.0f} s). Engine: sglang's rules, N = 1,024 slots, B = 8,192 tokens, the GPU's "
          f"KV capacity, the default cost model. Static settings: {', '.join(_short(s) for s in specs[1:])}. "
          "Goodput: output tok/s of the requests meeting both targets; paper: TTFT ≤ 10 s and TPOT ≤ 100 ms; "
          "tight: TTFT ≤ stock's p75 and TPOT ≤ stock's p90 in that cell, both scaled by 0.98 at a time while the best "
          "static setting met them for more than 90% of its requests; attained: the share of requests the best "
          "static setting got within both.\n")
    worst = {"tok": 1e9, "paper": 1e9, "tight": 1e9}
    for p in prof_list:
        print(f"*{p}*\n")
        print("| workload | c | default tok/s | best static (tok/s) | default / best | paper SLO: default goodput "
              "| best static (goodput, attained) | default / best | tight SLO (TTFT s, TPOT ms) | default goodput "
              "| best static (goodput, attained) | default / best |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for w in mixes:
            for c in concs:
                row = cell_row(got[(p, w, c)])
                ctl, best, best_tok = row["tok"]
                cells = [f"| {w} | {c} | {ctl:,.0f} | {_short(best)} ({best_tok:,.0f}) | {_ratio(ctl, best_tok)} "]
                worst["tok"] = min(worst["tok"], ctl / best_tok)
                for name in ("paper", "tight"):
                    x = row[name]
                    g, att = x["best_good"]
                    if name == "tight":
                        cells.append(f"| {x['slo'][0]:.2f}, {x['slo'][1] * 1e3:.0f} ")
                    cells.append(f"| {x['ctl'][0]:,.0f} | {_short(x['best'])} ({g:,.0f}, {att:.0%}) "
                                 f"| {_ratio(x['ctl'][0], g)} ")
                    if g > 0:
                        worst[name] = min(worst[name], x["ctl"][0] / g)
                print("".join(cells) + "|")
        print()
    print(f"Lowest default / best static: output tok/s {worst['tok']:.1%}, goodput at the paper's targets "
          f"{worst['paper']:.1%}, at the tight pair {worst['tight']:.1%} (cells where the best static got some).")
    if a.slo_objective:
        print()
        slo_table(got, prof_list, mixes, concs)
    return 0


def slo_table(got: dict[tuple, dict[str, dict]], prof_list, mixes, concs, bar: float = 0.98) -> None:
    """The default with each pair as its latency targets, against the best static setting by goodput at that pair
    (and the default without targets), per cell and pair; then how many cells reach ``bar`` of the best."""
    print("With the targets set (`default:ttft=X,tpot=Y`: the default's measured search maximizes goodput under the "
          "pair):\n")
    below: list[str] = []
    ratios: list[float] = []
    for p in prof_list:
        print(f"*{p}*\n")
        print("| workload | c | pair | best static (goodput, attained) | default, no targets (goodput, / best) "
              "| default, targets set (goodput, attained) | / best |")
        print("|---|---|---|---|---|---|---|")
        for w in mixes:
            for c in concs:
                row = cell_row(got[(p, w, c)])
                for name in ("paper", "tight"):
                    x = row[name]
                    g, att = x["best_good"]
                    tg, tatt = x["targeted"]
                    pair = "paper" if name == "paper" else f"tight ({x['slo'][0]:.2f} s, {x['slo'][1] * 1e3:.0f} ms)"
                    print(f"| {w} | {c} | {pair} | {_short(x['best'])} ({g:,.0f}, {att:.0%}) "
                          f"| {x['ctl'][0]:,.0f}, {_ratio(x['ctl'][0], g)} | {tg:,.0f}, {tatt:.0%} "
                          f"| {_ratio(tg, g)} |")
                    if g > 0:
                        ratios.append(tg / g)
                        if tg < bar * g:
                            below.append(f"{p.split('/')[-1]} {w} c={c} {name} {tg / g:.1%}")
        print()
    if ratios:
        print(f"Default with targets / best static goodput: {len(ratios) - len(below)} of {len(ratios)} cell-pairs "
              f"(where the best static got some) at ≥ {bar:.0%}; lowest {min(ratios):.1%}, median "
              f"{float(np.median(ratios)):.1%}." + (f" Below: {'; '.join(below)}." if below else ""))


if __name__ == "__main__":
    raise SystemExit(main())
