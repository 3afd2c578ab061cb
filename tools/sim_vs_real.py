"""The simulator against the real sglang 0.5.23 on CPU: measured and predicted throughput, policy by policy.

    python tools/sim_vs_real.py [--quick] [--repeats 3] [--requests 480] [--concurrency 24]
                                [--venv VENV] [--out DIR] [--json FILE]

What it does (tiny model, tools/sglang_cpu/; the environment of tools/sglang_env.sh with this checkout in it):

1. Two servers with the ebctl plugin, each with its own daemon, the same settings (``--max-running-requests
   16 --chunked-prefill-size 256 --disable-overlap-schedule --disable-radix-cache``, KV 16,384 tokens, torch
   on one thread, ``SGLANG_CPU_OMP_THREADS_BIND=0``, not pinned without AMX), one launched plain, one with
   ``--enable-mixed-chunk``. No radix cache: the same seeded requests run in every round and configuration,
   and a cached prefix would skip prefill work that the simulator prices.
2. Configurations: ``stock`` (plain, policy off: the plugin only reports), ``mixed`` (the mixed server,
   policy off), ``eb k=K`` (plain server, fixed EB(k, n_max = 16), K = 1, 4, 12). An EB policy is the
   daemon's cold policy held for the whole run (window = min_window = 10⁶ completions, so it never moves):
   no KV reserve, anti-starvation clock at 86,400 s, and the tool checks both in the daemon's status and
   that the plugin applied it before measuring; the simulator runs that very policy, field for field.
3. Each configuration is driven by sglang's own client (``sglang.benchmark.serving``, random-ids, closed
   loop at ``--concurrency`` > 16, inputs 24-240 tokens, outputs 9-96, sent with ignore_eos), the same seeded
   requests every time, in rounds (stock, mixed, k = 1, 4, 12; ``--repeats`` rounds): the spread over rounds
   is what noise is here. Measured: output tokens/s and median TTFT, as the client reports them.
4. Calibration from the stock and mixed runs only (``ebctl.calibrate``: each iteration's period from the
   plugin's reports, fitted per kind and judged on held-out iterations), written as a profile (``--out``);
   the EB runs are out of sample.
5. The simulator (sglang rules, the same settings, the same requests, the same concurrency) prices every
   iteration with that profile; the table prints measured (median, min-max) against predicted.

``--quick`` (CI, about 2-3 minutes): 120 requests, one round, stock, mixed and eb k=4. Run the full version on
a quiet machine: another job on the CPUs moves these figures by tens of percent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang"))  # the test harness: daemon, tap, server, client
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO))

import msgspec  # noqa: E402
from harness import Rig, server_env  # noqa: E402
from server import ensure_installed, exit_on_sigterm, sglang_venv  # noqa: E402 -- tools/sglang_cpu, on the path via harness

from ebctl import calibrate  # noqa: E402
from ebctl.protocol import Mode, Policy  # noqa: E402
from ebctl.sim import costs, policies, runner, workloads  # noqa: E402
from ebctl.sim.engine import EngineConfig  # noqa: E402

MAX_RUNNING = 16
CHUNK = 256
# --disable-radix-cache: sglang's random-ids prompts are runs of consecutive ids, (offset + i + j) mod 512 with
# this model's vocabulary, so prompts with one start share their prefixes; with the radix cache, 27% of one
# round's prompt tokens (and 62% after a second round with the same seed) could be prefix hits that skip their
# prefill, which the simulator does not model. Every configuration gets the same seeded requests on purpose.
SERVER_ARGS = ["--max-running-requests", str(MAX_RUNNING), "--chunked-prefill-size", str(CHUNK),
               "--disable-overlap-schedule", "--disable-radix-cache"]
LOAD = {"input_len": 240, "output_len": 96, "range_ratio": 0.1, "seed": 1}
NO_CLOCK_S = 86400.0  # controller.max_defer_s at its maximum: the anti-starvation clock never fires
DAEMON = {"controller.mode": "off", "controller.cold_mode": "off", "controller.window": "1000000",
          "controller.min_window": "1000000", "controller.max_defer_s": str(NO_CLOCK_S),
          "controller.k_override": "1", "controller.n_override": str(MAX_RUNNING)}
FULL = ("stock", "mixed", "eb k=1", "eb k=4", "eb k=12")
QUICK = ("stock", "mixed", "eb k=4")


def bench(venv: Path, url: str, out: Path, *, num_prompts: int, concurrency: int) -> dict:
    """sglang's own client, closed loop, with per-request details (lengths, TTFTs)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    cmd = [str(venv / "bin" / "python"), "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", host,
           "--port", port, "--dataset-name", "random-ids", "--num-prompts", str(num_prompts),
           "--random-input-len", str(LOAD["input_len"]), "--random-output-len", str(LOAD["output_len"]),
           "--random-range-ratio", str(LOAD["range_ratio"]), "--max-concurrency", str(concurrency),
           "--warmup-requests", "0", "--disable-tqdm", "--seed", str(LOAD["seed"]), "--output-details",
           "--output-file", str(out)]
    out.unlink(missing_ok=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=server_env())
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(f"sglang.benchmark.serving failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(out.read_text().splitlines()[-1])


def apply(rig: Rig, config: str) -> Policy | None:
    """Put the rig's daemon on this configuration's policy, wait until the plugin runs it, return the policy
    as the daemon publishes it (None: stock). Refuses a policy with a KV reserve or a live deferral clock."""
    if not config.startswith("eb"):
        rig.set_mode("off")
        return None
    k = int(config.split("=")[1])
    rig.daemon.tune(controller__k_override=k, controller__mode="eb", controller__cold_mode="eb")
    rig.wait_policy("eb", k=k, n_max=MAX_RUNNING)
    st = rig.daemon.engine()
    p = Policy(mode=Mode(st["mode"]), k=st["k"], n_max=st["n_max"], kv_reserve_frac=st["kv_reserve_frac"],
               max_defer_s=st["max_defer_s"], ttl_s=math.inf)
    if p.kv_reserve_frac != 0.0 or p.max_defer_s < NO_CLOCK_S or (p.k, p.n_max) != (k, MAX_RUNNING):
        raise RuntimeError(f"{config}: the daemon publishes {p}, not a plain EB(k={k}, n_max={MAX_RUNNING})")
    return p


def measure(venv: Path, model: Path, work: Path, configs: tuple[str, ...], *, requests: int, concurrency: int,
            repeats: int) -> dict:
    rigs = {}
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    try:
        launches = (("plain", []), ("mixed", ["--enable-mixed-chunk"]))
        for name, _ in launches:
            (work / name).mkdir(parents=True, exist_ok=True)
        # the two servers load side by side (each loads on its own; their measured runs come one after another)
        with ThreadPoolExecutor(len(launches)) as pool:
            started = {name: pool.submit(Rig, venv, model, work / name, [*SERVER_ARGS, *extra], daemon=DAEMON)
                       for name, extra in launches}
            for name, fut in started.items():
                with contextlib.suppress(Exception):
                    rigs[name] = fut.result()
        if len(rigs) < len(launches):  # one failed to start: its error, the other closed (finally)
            next(f for f in started.values() if f.exception() is not None).result()
        for name, _ in launches:
            rigs[name].set_mode("off")
            bench(venv, rigs[name].server.url, work / name / "warmup.json", num_prompts=2 * concurrency,
                  concurrency=concurrency)
        for rnd in range(repeats):
            for config in configs:
                rig = rigs["mixed" if config == "mixed" else "plain"]
                policy = apply(rig, config)
                mark = rig.tap.mark()
                res = bench(venv, rig.server.url, work / f"{config.replace(' ', '_')}.{rnd}.json",
                            num_prompts=requests, concurrency=concurrency)
                time.sleep(0.5)  # the last reports
                runs[config].append({"result": res, "reports": rig.tap.since(mark), "policy": policy})
                print(f"  round {rnd + 1}/{repeats} {config:>8}: {res['output_throughput']:,.0f} output tok/s, "
                      f"TTFT p50 {res['median_ttft_ms']:.0f} ms", file=sys.stderr, flush=True)
    finally:
        for rig in rigs.values():
            rig.close()
    return runs


def predict(runs: dict, cal: calibrate.Calibration, *, concurrency: int) -> dict[str, dict]:
    """The simulator on each configuration's requests, settings and policy, priced with the calibration."""
    cm = costs.IterationCostModel(cal.costs)
    out = {}
    for config, rs in runs.items():
        first = rs[0]
        res, reps = first["result"], first["reports"]
        inputs, outputs = res["input_lens"], res["output_lens"]
        served = [f.input_len for r in reps for f in r.finished]
        bos = round((sum(served) - sum(inputs)) / len(inputs)) if served else 0  # the server adds a BOS
        wl = workloads.Workload(config, _arr([i + bos for i in inputs]), _arr(outputs))
        kv = max(r.kv_total for r in reps)
        cfg = EngineConfig(rules="sglang", max_running=MAX_RUNNING, token_budget=CHUNK, kv_tokens=kv,
                           mixed_chunk=config == "mixed")
        src = policies.Fixed(config, first["policy"]) if first["policy"] else policies.Stock(name=config)
        sim = runner.run(wl, src, cm, cfg, concurrency=concurrency)
        out[config] = {"tok_per_s": sim["tok_per_s"], "ttft_p50_s": sim["ttft_s"]["p50"], "bos": bos, "kv": kv}
    return out


def _arr(x):
    import numpy as np

    return np.asarray(x, dtype=np.int64)


def profile_doc(cal: calibrate.Calibration, forward: calibrate.Calibration, kv: int) -> dict:
    """A schema-2 profile: ``iteration_costs`` (forward seconds, the daemon's basis) and, for the simulator,
    ``sim.iteration_costs`` (whole-iteration periods)."""
    return {"schema": 2, "name": "tiny-cpu", "model": "tiny-llama-2l (tools/sglang_cpu)", "gpu": "cpu",
            "source": "tools/sim_vs_real.py: stock and mixed runs of sglang 0.5.23 on CPU",
            "costs": {"alpha_p": 0.0, "beta_p": 0.0, "alpha_d": 1e-3, "beta_d": 0.0},
            "iteration_costs": msgspec.to_builtins(forward.costs), "fit": forward.summary(),
            "sim": {"iteration_costs": msgspec.to_builtins(cal.costs), "basis": "period", "fit": cal.summary(),
                    "engine": {"rules": "sglang", "max_running": MAX_RUNNING, "token_budget": CHUNK,
                               "kv_tokens": kv}}}


def table(runs: dict, pred: dict, cal: calibrate.Calibration) -> tuple[str, dict]:
    lines = ["| configuration | measured output tok/s, median (min-max) | predicted | error | measured TTFT p50 "
             "(median) | predicted TTFT p50 | in calibration |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for config, rs in runs.items():
        tps = [r["result"]["output_throughput"] for r in rs]
        ttft = [r["result"]["median_ttft_ms"] / 1e3 for r in rs]
        med, p = statistics.median(tps), pred[config]
        err = p["tok_per_s"] / med - 1
        summary[config] = {"measured": tps, "median": med, "predicted": p["tok_per_s"], "error": err,
                           "ttft_measured_s": ttft, "ttft_predicted_s": p["ttft_p50_s"]}
        lines.append(f"| {config} | {med:,.0f} ({min(tps):,.0f}-{max(tps):,.0f}) | {p['tok_per_s']:,.0f} | "
                     f"{err:+.1%} | {statistics.median(ttft):.2f} s | {p['ttft_p50_s']:.2f} s | "
                     f"{'yes' if config in ('stock', 'mixed') else 'no'} |")
    fits = "; ".join(f"{k}: {v['reason']}, n = {v['n']}" for k, v in cal.summary().items())
    lines.append(f"\nCalibration (stock + mixed runs, iteration periods; held-out iterations): {fits}.")
    return "\n".join(lines), summary


def ranking(summary: dict) -> list[str]:
    """Pairs whose measured medians differ by more than both runs' spreads: is the predicted order the same?"""
    if min(len(v["measured"]) for v in summary.values()) < 2:
        return ["one round: the run-to-run spread is unknown, no ranking is claimed (use --repeats 3 or more)"]
    out, names = [], list(summary)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            sa, sb = summary[a], summary[b]
            gap = abs(sa["median"] - sb["median"])
            spread = max(max(sa["measured"]) - min(sa["measured"]), max(sb["measured"]) - min(sb["measured"]))
            if gap > spread:
                same = (sa["median"] > sb["median"]) == (sa["predicted"] > sb["predicted"])
                verdict = "same order" if same else "ORDER DIFFERS"
                out.append(f"{a} vs {b}: measured {sa['median']:,.0f} vs {sb['median']:,.0f}, predicted "
                           f"{sa['predicted']:,.0f} vs {sb['predicted']:,.0f}: {verdict}")
    return out or ["no pair differs by more than the run-to-run spread"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI: 120 requests, one round, stock, mixed, eb k=4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--venv", default=None, help="the SGLang CPU environment (default: tools/sglang_env.sh's)")
    ap.add_argument("--out", default=None, help="directory for the calibrated profile and the raw results")
    ap.add_argument("--json", default=None, help="write the figures here as JSON")
    a = ap.parse_args()
    exit_on_sigterm()
    configs, requests, repeats = (QUICK, 120, 1) if a.quick else (FULL, a.requests, a.repeats)
    if a.concurrency <= MAX_RUNNING:
        ap.error(f"--concurrency {a.concurrency}: must be above --max-running-requests {MAX_RUNNING}")
    t0 = time.monotonic()
    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    with tempfile.TemporaryDirectory(prefix="svr-") as tmp:  # short: unix socket paths are limited
        work = Path(tmp)
        model = work / "model"
        subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                        str(model)], check=True, capture_output=True)
        runs = measure(venv, model, work, configs, requests=requests, concurrency=a.concurrency, repeats=repeats)
    train = [r["reports"] for c in ("stock", "mixed") for r in runs[c]]
    cal = calibrate.fit(calibrate.periods(train))
    kv = max(r.kv_total for rs in runs.values() for run in rs for r in run["reports"])
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        doc = profile_doc(cal, calibrate.fit(calibrate.periods(train, seconds="forward")), kv)
        (Path(a.out) / "profile.json").write_text(json.dumps(doc, indent=1))
        raw = {c: [{"result": r["result"], "reports": [msgspec.to_builtins(x) for x in r["reports"]]} for r in rs]
               for c, rs in runs.items()}
        (Path(a.out) / "runs.json").write_text(json.dumps(raw))
    pred = predict(runs, cal, concurrency=a.concurrency)
    text, summary = table(runs, pred, cal)
    print(f"`python tools/sim_vs_real.py {' '.join(sys.argv[1:])}`: {requests} requests per run, closed loop "
          f"c = {a.concurrency}, {repeats} round(s), {time.monotonic() - t0:.0f} s\n")
    print(text)
    print("\nRanking where the measured difference exceeds the run-to-run spread:")
    for line in ranking(summary):
        print(f"- {line}")
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": summary, "calibration": cal.summary()}, indent=1))


if __name__ == "__main__":
    main()
