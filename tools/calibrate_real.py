"""Calibrate on the real SGLang CPU server, then check the profile on a later run of another workload.

    python tools/calibrate_real.py [--quick] [--duration 300] [--out PROFILE.json] [--json RESULT.json]
                                   [--venv VENV] [--workdir DIR]

1. **Calibrate under ``ebctl start``.** ``ebctl start --engine sglang`` runs the daemon and the tiny model
   (tools/sglang_cpu/; one torch thread, SGLANG_CPU_OMP_THREADS_BIND=0) with the daemon's defaults;
   first every prefill row count runs once and the daemon forgets those iterations (:func:`warm`: on the Intel
   VM the first forward of a row count costs more than later ones), then sglang's own client
   (``sglang.benchmark.serving``, random-ids) loads it for ``--duration`` seconds (workload A). Then ``ebctl
   tune calibrate --out PROFILE`` writes the profile, and ``ebctl status --json`` must say the online fits are
   in use (``costs.source == "online"``).
2. **A later run, another workload.** A fresh daemon seeded with the profile (``daemon.profile``), the same
   server flags, and a tap between the plugin and the daemon that records every iteration report
   (tests/sglang/harness.py's ``Tap``: ``ebctl start`` wires the engine straight to its daemon, so the tap
   needs the pieces started one by one). Warmed the same way, then workload B (other input/output lengths and
   concurrency) runs for half the duration.
3. **The check.** Per batch kind, the profile's ``iteration_costs`` predict workload B's iterations (features
   and ``switched`` computed as the daemon does, ``costfit.OnlineCosts``); ``costmodel.judge`` gives the
   median relative error against predicting the mean of the calibration run (the profile's ``fit.<kind>.
   mean_s``: the same test every cost fit passes). Workload B's own mean is printed beside it, for scale.

Exit 0 when the profile was written, status showed the online fits in use, and prefill and decode pass the
check on workload B. ``--quick``: 60 s of calibration (up to 90 s more while the fits do not pass), 20 s of
workload B (the tests' variant).
The full run (``--duration 300``, the default) takes about 10 minutes with the two server starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang"))  # the harness: daemon, tap, server, client
sys.path.insert(0, str(REPO))

from harness import ONE_TORCH_CORE, Daemon, Server, Tap, bench, ebctl_start, engine_config, server_env, warm_shapes  # noqa: E402
from server import ensure_installed, exit_on_sigterm, sglang_venv  # noqa: E402 -- tools/sglang_cpu, on the path via harness

from ebctl import profiles  # noqa: E402
from ebctl.costfit import KINDS, OnlineCosts  # noqa: E402
from ebctl.costmodel import judge  # noqa: E402
from ebctl.params import ControllerParams  # noqa: E402

SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--max-total-tokens", "16384", "--mem-fraction-static", "0.1", "--max-running-requests", "16",
               "--chunked-prefill-size", "256", "--sleep-on-idle"]
# Workload A (calibration) and B (the later run): other lengths, other concurrency. A is what a server sees over
# a few minutes: rounds of sglang's client at three loads in turn (decode batches from a few requests to the
# server's 16, prompts short to long). B is another mix: longer prompts (past the chunk size, 256: full-chunk
# prefills) and small decode batches (c = 2); its iterations do not sit at A's mean, so "better than
# predicting the mean" tests the model. (Measured 2026-11-23: A at one load, c = 24, leaves the decode batch
# at 16 and the fit cannot learn the per-request cost; A with long prompts only at low load and short ones at
# high load made the prefill fit fail its own held-out test, 27.8%.)
WORKLOAD_A = [{"input_len": 64, "output_len": 64, "range_ratio": 0.5, "concurrency": 4, "num_prompts": 32},
              {"input_len": 160, "output_len": 64, "range_ratio": 0.5, "concurrency": 10, "num_prompts": 60},
              {"input_len": 320, "output_len": 48, "range_ratio": 0.5, "concurrency": 24, "num_prompts": 96}]
CHUNK = 256  # --chunked-prefill-size above: the most rows a prefill batch holds
FORGET = 20  # the smallest controller.cost_window: what the windows keep of the warm-up (warm iterations)
WORKLOAD_B = [{"input_len": 480, "output_len": 32, "range_ratio": 0.5, "concurrency": 2, "num_prompts": 120}]



def load_for(venv: Path, url: str, work: Path, seconds: float, mix: list[dict[str, Any]], tag: str
             ) -> dict[str, float]:
    """Rounds of sglang's client, the workloads of ``mix`` in turn, until ``seconds`` have passed; totals."""
    t0, rounds, done, out_tok = time.monotonic(), 0, 0, 0
    while time.monotonic() - t0 < seconds:
        wl = mix[rounds % len(mix)]
        res = bench(venv, url, work / f"{tag}.{rounds}.json", seed=1000 * len(tag) + rounds, timeout=600, **wl)
        rounds, done, out_tok = rounds + 1, done + res["completed"], out_tok + res["total_output_tokens"]
    return {"rounds": rounds, "completed": done, "output_tokens": out_tok, "seconds": time.monotonic() - t0}


def ebctl(venv: Path, rt: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt), *args],
                          capture_output=True, text=True, timeout=60, cwd="/")


def warm(venv: Path, url: str, rt: Path, sets: list[str]) -> None:
    """Calibrate a warmed engine: every prefill row count once (harness.warm_shapes: the first forward of a row
    count can cost more than later ones, a one-time cost the model is not meant to describe), then the
    daemon forgets those iterations. Shrinking ``controller.cost_window`` keeps a window's newest rows, so the
    newest are made warm ones first (``FORGET`` more prefills of row counts already run), then the window is
    shrunk to them and restored."""
    warm_shapes(url, CHUNK)
    warm_shapes(url, FORGET, seed=1)
    window = next((int(kv.split("=", 1)[1]) for kv in reversed(sets) if kv.startswith("controller.cost_window=")),
                  ControllerParams().cost_window)
    for size in (FORGET, window):
        p = ebctl(venv, rt, "tune", "set", f"controller.cost_window={size}")
        if p.returncode != 0:
            raise RuntimeError(f"ebctl tune set controller.cost_window={size}: {p.stderr.strip()}")
    print(f"[calibrate] warmed: {CHUNK + FORGET} prefills, then the cost windows kept the last {FORGET}", flush=True)


EXTRA_STEP, EXTRA_UP_TO = 0.5, 1.5  # while the fits do not pass: more load in steps of half the duration, up to 1.5×


def _engine(st: subprocess.CompletedProcess) -> dict[str, Any]:
    try:
        return (json.loads(st.stdout).get("engines") or {}).get("dp0", {}) if st.returncode == 0 else {}
    except ValueError:
        return {}


def _source(st: subprocess.CompletedProcess) -> str | None:
    return (_engine(st).get("costs") or {}).get("source")


def _reason(st: subprocess.CompletedProcess) -> str:
    return str(_engine(st).get("cost_reason") or st.stderr.strip()[-200:])


def calibrate(venv: Path, model: Path, work: Path, seconds: float, out: Path, sets: list[str]) -> dict[str, Any]:
    """Step 1: ``ebctl start`` + workload A (more of it, up to ``EXTRA_UP_TO`` × ``seconds``, while ``status``
    says the online fits do not pass yet), then ``tune calibrate``."""
    env = {k: v for k, v in server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
    env.update(ONE_TORCH_CORE)
    with ebctl_start(venv, model, work, SERVER_ARGS, sets, env=env) as (_, url):
        warm(venv, url, work / "rt", sets)
        print(f"[calibrate] serving at {url}; workload A for {seconds:.0f} s: {WORKLOAD_A}", flush=True)
        load = load_for(venv, url, work, seconds, WORKLOAD_A, "a")
        extra = 0.0
        while (_source(st := ebctl(venv, work / "rt", "status", "--json")) != "online"
               and extra < seconds * EXTRA_UP_TO):
            # What the user is told to do ("until the online fits pass"): keep serving, then calibrate. On a
            # shared 2-core machine the decode times of a minute can be too noisy for the fit to beat the mean.
            print(f"[calibrate] the online fits do not pass yet ({_reason(st)}): "
                  f"{seconds * EXTRA_STEP:.0f} s more of workload A", flush=True)
            more = load_for(venv, url, work, seconds * EXTRA_STEP, WORKLOAD_A, f"a{int(extra)}")
            extra += more["seconds"]
            load = {k: load[k] + more[k] for k in load}
        cal = ebctl(venv, work / "rt", "tune", "calibrate", "--out", str(out))
    status = json.loads(st.stdout) if st.returncode == 0 else {}
    eng = (status.get("engines") or {}).get("dp0", {})
    return {"load": load, "extra_s": extra, "calibrate_rc": cal.returncode,
            "calibrate_stderr": cal.stderr.strip()[-2000:],
            "status_rc": st.returncode, "cost_source": (eng.get("costs") or {}).get("source"),
            "cost_reason": eng.get("cost_reason"), "cost_fits": eng.get("cost_fits"),
            "reports": eng.get("reports")}


def later_run(venv: Path, model: Path, work: Path, seconds: float, prof_path: Path, sets: list[str]) -> list:
    """Step 2: a fresh daemon seeded with the profile, a tap, the same server; workload B; the reports."""
    daemon = tap = server = None
    try:
        # the model's rankings off: its worker would share the CPU with the server whose iterations are judged
        daemon = Daemon(work, {**dict(kv.split("=", 1) for kv in sets), "daemon.profile": str(prof_path),
                               "controller.predict": "false"})
        tap = Tap(work, daemon.cfg.endpoint("telemetry"))
        server = Server(venv, model, work, SERVER_ARGS, ebctl_config=engine_config(work, daemon, tap))
        warm_shapes(server.url, CHUNK)  # the profile describes a warmed engine: judged on one
        time.sleep(1.0)
        first = len(tap.reports)
        print(f"[later run] warmed ({first} reports); workload B for {seconds:.0f} s: {WORKLOAD_B}", flush=True)
        load_for(venv, server.url, work, seconds, WORKLOAD_B, "b")
        time.sleep(1.0)  # the last reports
        reports = list(tap.reports)[first:]
        (work / "reports.json").write_bytes(msgspec.json.encode(reports))  # kept for a second look
        return reports
    finally:
        for part, how in ((server, "close"), (tap, "close"), (daemon, "stop")):
            if part is not None:
                with contextlib.suppress(Exception):
                    getattr(part, how)()


def check(prof: profiles.Profile, reports: list) -> dict[str, Any]:
    """Step 3: per kind, the profile's prediction of the later run against the calibration run's mean."""
    oc = OnlineCosts(capacity=10**6)  # rows (switched included) exactly as the daemon files them
    for r in reports:
        oc.observe(r)
    out: dict[str, Any] = {}
    for kind in KINDS:
        x, y = oc.windows[kind].rows()
        fit = prof.fit.get(kind.value) or {}
        if not len(y) or prof.iteration_costs is None or prof.iteration_costs.phase(kind) is None:
            out[kind.value] = {"n": len(y), "predicted": False}
            continue
        pred = prof.iteration_costs.predict_rows(kind, x)
        q = judge(pred, y, fit.get("mean_s") or float("nan"))
        own_mean = float(np.median(np.abs(y.mean() - y) / y))
        out[kind.value] = {"n": len(y), "predicted": True, "ok": q.ok, "median_rel_err": q.median_rel_err,
                           "calibration_mean_rel_err": q.mean_rel_err, "own_mean_rel_err": own_mean,
                           "reason": q.reason, "median_s": float(np.median(y)),
                           "median_predicted_s": float(np.median(pred))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 s of calibration and 20 s of workload B")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of calibration load (B: half)")
    ap.add_argument("--out", type=Path, default=None, help="the profile (default: in the work directory)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("--venv", default=None, help="the sglang CPU environment (default: tools/sglang_env.sh)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary directory)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="ebctl config for both daemons (e.g. controller.cost_max_rel_err=0.3); default: the defaults")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    seconds_a, seconds_b = (60.0, 20.0) if a.quick else (a.duration, a.duration / 2)
    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="ebcal-"))  # short: unix socket paths ≤ 107 bytes
    work.mkdir(parents=True, exist_ok=True)
    out = a.out or work / "profile.json"
    model = work / "model"
    subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                    str(model)], check=True, capture_output=True)
    t0 = time.monotonic()
    result: dict[str, Any] = {"workdir": str(work), "profile": str(out), "sets": a.set, "workload_a": WORKLOAD_A,
                              "workload_b": WORKLOAD_B, "seconds_a": seconds_a, "seconds_b": seconds_b}
    (work / "a").mkdir(exist_ok=True)
    result["calibration"] = cal = calibrate(venv, model, work / "a", seconds_a, out, a.set)
    ok = cal["calibrate_rc"] == 0 and out.is_file()
    print(f"[calibrate] {cal['load']['completed']} requests in {cal['load']['seconds']:.0f} s, "
          f"{cal['reports']} reports; tune calibrate rc={cal['calibrate_rc']} {cal['calibrate_stderr']}")
    print(f"[calibrate] status: costs from {cal['cost_source']!r}: {cal['cost_reason']}")
    in_use = cal["cost_source"] == "online"
    if ok:
        prof = profiles.load(str(out))
        result["round_trip"] = prof.to_dict() == json.loads(out.read_text())
        (work / "b").mkdir(exist_ok=True)
        reports = later_run(venv, model, work / "b", seconds_b, out, a.set)
        result["later_reports"] = len(reports)
        result["check"] = chk = check(prof, reports)
        print(f"\nprofile {out}: prediction of workload B ({len(reports)} reports), per kind")
        print(f"{'kind':8} {'n':>6} {'median s':>10} {'predicted':>10} {'rel. error':>10} "
              f"{'mean of A':>10} {'mean of B':>10}  verdict")
        for kind, c in chk.items():
            if not c["predicted"]:
                print(f"{kind:8} {c['n']:>6}  (no {'iterations' if not c['n'] else 'fit in the profile'})")
                continue
            print(f"{kind:8} {c['n']:>6} {c['median_s']:>10.2e} {c['median_predicted_s']:>10.2e} "
                  f"{c['median_rel_err']:>10.1%} {c['calibration_mean_rel_err']:>10.1%} "
                  f"{c['own_mean_rel_err']:>10.1%}  {'pass' if c['ok'] else 'FAIL'}: {c['reason']}")
        passed = all(chk.get(k, {}).get("ok") for k in ("prefill", "decode"))
    else:
        passed = False
    result["ok"] = ok and in_use and passed and result.get("round_trip", False)
    result["wall_s"] = time.monotonic() - t0
    print(f"\nprofile written: {ok}; online fits in use: {in_use}; round trip: {result.get('round_trip')}; "
          f"prefill and decode predicted within the test on workload B: {passed}  ({result['wall_s']:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
