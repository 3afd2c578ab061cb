"""The default controller given the engine's profile, against SGLang's static flags and the paper's controller,
from a cold start in the simulator: does the model's ranking (ebctl/predict.py) take what a static flag takes?

    python tools/sim_model.py [--cells PROFILE:WORKLOAD:C,...] [--requests 15000] [--jobs 2] [--seed 0]
                              [--json FILE] [--md FILE] [--quick]

Each cell (a profile, a workload of ``ebctl simulate``, a closed loop of C clients on 1,024 slots) runs every
policy from a cold start on the same requests: stock (``v0``), ``mb``, ``sglang:min-free-slots=K`` and
``sglang:pd-interval=N`` (``policies.static_sweep``), EB pinned at θ = 0.2, 0.4, 0.8 (the controller's N̂* at
that θ), the paper's ``eb+`` (Eq. 3 + 5 + 8 on the profile's costs), ``default`` (no profile: the shipped
default as installed), ``default:profile=engine`` (the daemon given the engine's profile: ``daemon.profile``),
and on the Qwen3-8B cells the wrong model, the daemon given the other GPU's profile.

Figures per policy: output tok/s over the whole run, and over the "second half": the output tokens of the
requests finishing between the median and the 90th percentile finish time, over that span (the closed loop's
drain, when fewer than C requests are left, is left out). A static setting is "eligible" where its TTFT p99 and
TPOT p99 are within the default's latency slack (10%) of stock's. Printed per cell: each policy's figures and
its ratio to the best eligible static setting; for the controllers, where they ended and the model's record.

``--quick``: 3,000 requests, one cell, the statics of ``QUICK_STATICS`` (CI-sized).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ebctl import profiles  # noqa: E402
from ebctl.params import ControllerParams  # noqa: E402
from ebctl.sim import costs, hardware, metrics, policies, runner, workloads  # noqa: E402
from ebctl.sim.engine import EngineConfig  # noqa: E402

CELLS = ("qwen3-8b/h200:azure-conv:2048", "qwen3-8b/rtx-pro-6000:azure-conv:2048",
         "llama-3.1-8b/h200:azure-conv:2048", "qwen3-30b-a3b/h200:azure-conv:2048",
         "qwen3-30b-a3b/h200:mooncake-conv:2048", "qwen3-8b/h200:azure-code:512",
         "qwen3-8b/rtx-pro-6000:mooncake-conv:512")
WRONG = {"qwen3-8b/h200": "qwen3-8b/rtx-pro-6000", "qwen3-8b/rtx-pro-6000": "qwen3-8b/h200"}
THETAS = (0.2, 0.4, 0.8)
CONTROLLERS = ("eb+", "default", "default:profile=engine")
QUICK_STATICS = ("v0", "mb", "sglang:min-free-slots=512", "sglang:pd-interval=2", "sglang:pd-interval=4",
                 "sglang:pd-interval=8")


def parse_cell(text: str) -> tuple[str, str, int]:
    """PROFILE:WORKLOAD:C, each checked (ValueError naming the part that is wrong)."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"cell {text!r}: want PROFILE:WORKLOAD:C")
    prof, wl, c = parts
    profiles.load(prof)
    if wl not in workloads.names():
        raise ValueError(f"cell {text!r}: workload {wl!r} is not one of {', '.join(workloads.names())}")
    if not c.isdigit() or int(c) < 1:
        raise ValueError(f"cell {text!r}: C={c!r} is not a positive whole number")
    return prof, wl, int(c)


def engine(prof_name: str) -> tuple[profiles.Profile, EngineConfig]:
    prof = profiles.load(prof_name)
    sim = (prof.sim or {}).get("engine", {})
    kv = int(sim.get("kv_tokens", 0)) or hardware.kv_capacity_tokens(prof.model, prof.gpu)
    return prof, EngineConfig(kv_tokens=kv)


def specs(cell: tuple[str, str, int], n: int, seed: int, quick: bool = False) -> list[str]:
    prof_name, wl_name, _ = cell
    _, cfg = engine(prof_name)
    wl = workloads.load(wl_name, n, seed=seed)
    caps = policies.eq6_caps(THETAS, input_len=wl.input_len, output_len=wl.output_len, kv_tokens=cfg.kv_tokens,
                             max_running=cfg.max_running)
    out = [*policies.static_sweep(cfg.max_running), *(f"eb:theta={t},n={c}" for t, c in zip(THETAS, caps, strict=True)),
           *CONTROLLERS]
    if prof_name in WRONG:
        out.append(f"default:profile={WRONG[prof_name]}")
    if quick:  # the statics that lead somewhere on the quick cell, and every controller
        out = [s for s in out if not policies.is_static(s) or s in QUICK_STATICS]
    return out


def second_half(req: dict[str, np.ndarray]) -> float:
    """Output tok/s of the requests finishing between the median and the 90th percentile finish time."""
    f, out = req["finish"], req["output_len"]
    ok = np.isfinite(f) & (req["reason"] != "abort")
    a, b = np.percentile(f[ok], [50, 90])
    sel = ok & (f > a) & (f <= b)
    return float(out[sel].sum() / max(b - a, 1e-9))


def run_one(job: tuple[tuple[str, str, int], str, int, int]) -> dict[str, Any]:
    cell, spec, n, seed = job
    prof_name, wl_name, c = cell
    prof, cfg = engine(prof_name)
    wl = workloads.load(wl_name, n, seed=seed)
    src = policies.make(spec, max_running=cfg.max_running, kv_tokens=cfg.kv_tokens, costs=prof.costs, profile=prof)
    t0 = time.perf_counter()
    res = runner.run(wl, src, costs.build(prof), cfg, concurrency=c, keep_engine=True)
    req = res.pop("_engine").req.arrays()
    row = {"cell": ":".join(map(str, cell)), "policy": spec, "tok_s": res["tok_per_s"], "half_tok_s": second_half(req),
           "ttft_p99": res["ttft_s"]["p99"], "tpot_p99": res["tpot_s"]["p99"], "static": policies.is_static(spec),
           "wall_s": time.perf_counter() - t0}
    ctl = getattr(src, "controller", None)
    if ctl is not None and ctl.measured:
        t = ctl.tuner
        row["ended"] = t.incumbent
        row["trials"] = t.counts["trials"]
        row["record"] = {"n": t.record.n, "mean_abs_error": t.record.mean_abs()}
        row["moves"] = [[round(h["started"]), h["challenger"], h["decision"]] for h in t.history]
    return row


def judge(rows: list[dict[str, Any]], slack: float) -> dict[str, Any]:
    """The best eligible static setting of a cell (TTFT and TPOT p99 within ``slack`` of stock's), by second half
    and by whole run, and each policy's ratios to it."""
    stock = next(r for r in rows if r["policy"] == "v0")
    ok = [r for r in rows if r["static"] and r["ttft_p99"] <= stock["ttft_p99"] * (1 + slack)
          and r["tpot_p99"] <= stock["tpot_p99"] * (1 + slack)]
    best_half = max(ok, key=lambda r: r["half_tok_s"])
    best_whole = max(ok, key=lambda r: r["tok_s"])
    for r in rows:
        r["vs_best_half"] = r["half_tok_s"] / best_half["half_tok_s"]
        r["vs_best_whole"] = r["tok_s"] / best_whole["tok_s"]
        r["vs_stock_half"] = r["half_tok_s"] / stock["half_tok_s"]
        r["eligible"] = r in ok
    return {"best_half": best_half["policy"], "best_whole": best_whole["policy"]}


def _record(r: dict[str, Any]) -> str:
    n, err = r["n"], r["mean_abs_error"]
    return "no trial predicted" if not n else f"model's record: {n} trials, mean |error| {err * 100:.1f} pt"


def report(cells: dict[str, dict[str, Any]], command: str) -> str:
    lines = ["# The default with the engine's profile, in the simulator", "",
             f"`{command}` (tools/sim_model.py; its docstring says what each figure is).", "",
             "| cell | best eligible static (2nd half) | its gain on stock | eb+ | default | default + profile "
             "| wrong profile | default + profile, whole run | where it ended |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, c in cells.items():
        by = {r["policy"]: r for r in c["rows"]}
        best = by[c["best_half"]]
        wrong = next((r for p, r in by.items() if p.startswith("default:profile=") and p != "default:profile=engine"),
                     None)
        mine = by["default:profile=engine"]

        def f(r: dict[str, Any] | None, key: str = "vs_best_half") -> str:
            return "-" if r is None else f"{r[key]:.3f}"

        wrong_text = "-" if wrong is None else f"{wrong['vs_stock_half']:.3f} of stock"
        lines.append(f"| {name} | {best['policy']} | {best['vs_stock_half'] - 1:+.1%} | {f(by['eb+'])} | "
                     f"{f(by['default'])} | {f(mine)} | {wrong_text} | {f(mine, 'vs_best_whole')} | "
                     f"{mine.get('ended', '-')} ({mine.get('trials', 0)} trials; {_record(mine['record'])}) |")
    lines += ["", "Ratios are to the best eligible static setting's output tok/s over the second half (the whole run "
              "for the 'whole run' column); 'wrong profile' is the default given the other GPU's profile, over "
              "stock's second half."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--requests", type=int, default=15_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    try:
        cells = [parse_cell(x) for x in a.cells.split(",") if x.strip()]
    except (ValueError, profiles.ProfileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.quick:
        cells, a.requests = cells[:1], 3000
    jobs = [(cell, s, a.requests, a.seed) for cell in cells for s in specs(cell, a.requests, a.seed, a.quick)]
    print(f"{len(jobs)} runs over {len(cells)} cells, {a.requests} requests each, {a.jobs} at a time", flush=True)
    rows: list[dict[str, Any]] = []
    with Pool(a.jobs) as pool:
        for r in pool.imap_unordered(run_one, jobs):
            rows.append(r)
            print(f"  {r['cell']} {r['policy']}: {r['tok_s']:.0f} tok/s, 2nd half {r['half_tok_s']:.0f} "
                  f"({r['wall_s']:.0f} s)", flush=True)
    slack = ControllerParams().tune_ttft_slack
    out: dict[str, dict[str, Any]] = {}
    for cell in cells:
        name = ":".join(map(str, cell))
        cr = [r for r in rows if r["cell"] == name]
        out[name] = {**judge(cr, slack), "rows": sorted(cr, key=lambda r: r["policy"])}
        print(f"\n{name}: best eligible static {out[name]['best_half']}")
        for r in out[name]["rows"]:
            print(f"  {r['policy']:>34} {r['half_tok_s']:9.0f} {r['vs_best_half']:.3f} whole {r['vs_best_whole']:.3f}"
                  f"{'' if r['eligible'] or not r['static'] else ' (not eligible)'}"
                  f"{'  ended ' + r['ended'] + ' ' + str(r['moves'][:6]) if 'ended' in r else ''}")
    command = "python tools/sim_model.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.json:
        a.json.write_text(json.dumps(metrics.jsonable({"command": command, "cells": out}), indent=1))
    if a.md:
        a.md.write_text(report(out, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
