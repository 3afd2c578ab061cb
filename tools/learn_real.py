"""The learning controller on the real SGLang CPU server: eb+ with the measured θ, no profile, c = 24.

    python tools/learn_real.py [--quick] [--duration 300] [--concurrency 24] [--json RESULT.json]
                               [--venv VENV] [--workdir DIR] [--set KEY=VALUE ...]

``ebctl start --engine sglang`` runs the daemon with its defaults (mode eb+, theta_method measured, no
``daemon.profile``: the default costs until the online fits pass) and the tiny model (tools/sglang_cpu/, one
torch thread) launched with ``--enable-mixed-chunk`` and 16 slots, so that c = 24 keeps requests waiting,
and ``--disable-radix-cache`` (random-ids prompts share prefixes whatever the seed: no prefill is skipped).
sglang's own client (``sglang.benchmark.serving``, random-ids, prompts of 48 ± 50% tokens, outputs of 64 ± 50%)
holds ``--concurrency`` requests in flight, round after round, for ``--duration`` seconds, while
``ebctl status --json`` is read every 10 s. Printed: how the cost fits and the tuner moved over time, the final
fits per kind (state, held-out error), where the costs came from, every trial of the tuner (arms, windows'
rates, effect, decision), eb+'s probes, and the client's count of requests sent and completed.

Exit 0 when, under load, each of the prefill, decode and mixed fits passed the quality test at some status read,
the controller planned with the online costs at some read (source ``online``), the tuner ran at least one trial,
and every request sent completed. Printed beside it: when each fit first passed, and how many reads had the
online costs in use. A fit can fail again later: on this server an iteration's cost barely depends on the batch,
so a fit's held-out error sits near the mean predictor's and crosses it with noise (in CI, the decode fit at
15.7% against the mean's 14.2% at the last read, after every fit had been in use from 83 s to 135 s; on a
loaded machine the mixed fit at 17.1% against 14.4%).
``--quick``: 150 s of load (the tuner's windows then hold 50 completions: ``controller.tune_window=50``,
``controller.window=200``); its figures are not the full run's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang"))  # the harness: server environment, client
sys.path.insert(0, str(REPO))

from harness import ONE_TORCH_CORE, bench, ebctl_start, server_env  # noqa: E402
from server import ensure_installed, exit_on_sigterm, sglang_venv  # noqa: E402 -- tools/sglang_cpu, on the path via harness

SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--max-total-tokens", "16384", "--mem-fraction-static", "0.1", "--max-running-requests", "16",
               "--chunked-prefill-size", "256", "--enable-mixed-chunk", "--sleep-on-idle", "--disable-radix-cache"]
# --disable-radix-cache: random-ids prompts are runs of consecutive ids ((offset + i + j) mod 512 here), so
# prompts that start alike share prefixes whatever the seed (each round has its own): with the radix cache up
# to 42% of a round's prompt tokens could skip their prefill, and the controller would learn from a workload
# lighter than the lengths it sees.
# Rounds of 720 prompts (about 55 s each here): each round's tail empties the queue (under 16 in flight nobody
# waits), and with rounds of 240 a window of 400 completions (the default) held two tails and the round's
# restart, and was never saturated on 90% of its time: in 5 minutes the tuner ran no trial.
WORKLOAD = {"input_len": 48, "output_len": 64, "range_ratio": 0.5, "num_prompts": 720}
# --quick: 150 s, so the exploration budget (1% of the time: 1.5 s) would allow one trial at most; the check is that
# every cost fit learns, and the prefill fit learns from EB's iterations (the server mixes on its own)
QUICK_SETS = ["controller.tune_window=50", "controller.window=200", "controller.tune_explore_budget=0.2"]


def ebctl(venv: Path, rt: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "ebctl", "--runtime-dir", str(rt), *args],
                          capture_output=True, text=True, timeout=60, cwd="/")


def snapshot(venv: Path, rt: Path) -> dict[str, Any]:
    """The engine's block of ``ebctl status --json`` (empty when the daemon does not answer yet)."""
    st = ebctl(venv, rt, "status", "--json")
    if st.returncode != 0:
        return {}
    engines = json.loads(st.stdout).get("engines") or {}
    return next(iter(engines.values()), {})


FITS = ("prefill", "decode", "mixed")


def passed(e: dict[str, Any], kind: str) -> bool:
    """The fit of ``kind`` passed the quality test at this read (in use or not)."""
    return ((e.get("cost_fits") or {}).get(kind) or {}).get("state") in ("in use", "passed, not in use")


def online(e: dict[str, Any]) -> bool:
    return (e.get("costs") or {}).get("source") == "online"


def line(t: float, e: dict[str, Any]) -> str:
    fits = e.get("cost_fits") or {}
    tu = e.get("tuner") or {}
    pr = e.get("probes") or {}
    fit = " ".join(f"{k}:{(v.get('state') or '-').replace(', not in use', '')}" for k, v in fits.items())
    return (f"t={t:5.0f}s completions={e.get('completions', 0):5d} mode={e.get('mode', '-'):3} k={e.get('k', '-')} "
            f"n={e.get('n_max', '-')} | fits {fit} | costs {(e.get('costs') or {}).get('source', '-')} | tuner "
            f"{tu.get('state', '-')} at {tu.get('incumbent', '-')}, arm {tu.get('arm', '-')}, trials "
            f"{tu.get('trials', 0)} | probes {pr.get('count', 0)}")


def run(venv: Path, model: Path, work: Path, seconds: float, conc: int, sets: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
    env.update(ONE_TORCH_CORE)
    timeline: list[str] = []
    with ebctl_start(venv, model, work, SERVER_ARGS, sets, env=env) as (_, url):
        print(f"[learn] serving at {url}; c = {conc} for {seconds:.0f} s: {WORKLOAD}", flush=True)
        t0 = time.monotonic()
        results: list[dict] = []

        def client() -> None:
            r = 0
            while time.monotonic() - t0 < seconds:
                results.append(bench(venv, url, work / f"bench.{r}.json", seed=r, concurrency=conc, timeout=900,
                                     **WORKLOAD))
                r += 1

        th = threading.Thread(target=client, daemon=True)
        th.start()
        loaded: dict[str, Any] = {}
        first_passed: dict[str, float] = {}  # seconds into the load when each fit first passed
        reads = reads_online = 0
        while th.is_alive():
            th.join(10.0)
            snap = snapshot(venv, work / "rt")
            if th.is_alive():  # taken under load: the fits the check reads (the drain after it is no load)
                loaded = snap
                reads += 1
                reads_online += online(snap)
                for kind in FITS:
                    if passed(snap, kind):
                        first_passed.setdefault(kind, round(time.monotonic() - t0, 1))
            timeline.append(line(time.monotonic() - t0, snap))
            print(timeline[-1], flush=True)
        final = snapshot(venv, work / "rt")
        rounds = len(results)
        return {"final": final, "loaded": loaded, "first_passed": first_passed, "reads": reads,
                "reads_online": reads_online, "timeline": timeline, "rounds": rounds,
                "sent": rounds * WORKLOAD["num_prompts"], "completed": sum(r["completed"] for r in results),
                "load_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="150 s of load, smaller tuner windows")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("--venv", default=None, help="the sglang CPU environment (default: tools/sglang_env.sh)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temporary directory)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="ebctl config (default: none)")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    seconds = 150.0 if a.quick else a.duration
    sets = [*(QUICK_SETS if a.quick else []), *a.set]
    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="eblrn-"))  # short: unix socket paths ≤ 107 bytes
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                    str(model)], check=True, capture_output=True)
    res = run(venv, model, work, seconds, a.concurrency, sets)
    e = res["final"]
    fits = e.get("cost_fits") or {}
    print(f"\nfinal cost fits (costs from {(e.get('costs') or {}).get('source')!r}: {e.get('cost_reason')}):")
    for kind, f in fits.items():
        err = f.get("rel_err")
        print(f"  {kind:8} {f.get('state'):20} n={f.get('n'):5}  held-out median error "
              f"{'-' if err is None else f'{err:.1%}'}  ({f.get('reason')})")
    tu = e.get("tuner") or {}
    print(f"tuner: {tu.get('state')} at {tu.get('incumbent')} (θ {tu.get('theta_incumbent')}); trials "
          f"{tu.get('trials')} (won {tu.get('won')}, lost {tu.get('lost')}, aborted {tu.get('aborted')})")
    for h in tu.get("history") or []:
        effect = "-" if h.get("effect") is None else f"{h['effect']:+.1%} ± {h.get('half_width') or 0:.1%}"
        print(f"  {h['incumbent']} vs {h['challenger']}: {h['pairs']} pairs, windows {h['rates']}, effect "
              f"{effect} -> {h['decision']} {h['why']}")
    pr = e.get("probes") or {}
    print(f"probes: {pr.get('count')} ({pr.get('seconds', 0):.1f} s, {pr.get('share', 0):.1%} of the time, "
          f"last for the {pr.get('last_for') or '-'} fit)")
    print(f"client: {res['rounds']} rounds, {res['completed']} of {res['sent']} requests completed in "
          f"{res['load_s']:.0f} s; workdir {work}")
    learned = set(res["first_passed"]) == set(FITS) and res["reads_online"] > 0
    ok = learned and (tu.get("trials") or 0) >= 1 and res["sent"] > 0 and res["completed"] == res["sent"]
    when = ", ".join(f"{k} at {res['first_passed'][k]:.0f} s" if k in res["first_passed"] else f"{k} never"
                     for k in FITS)
    print(f"\nunder load, fits first passed: {when}; online costs in use at {res['reads_online']} of "
          f"{res['reads']} reads; tuner trials: {tu.get('trials')}; no request lost: "
          f"{res['completed'] == res['sent']} -> {'ok' if ok else 'NOT MET'}")
    if a.json:
        a.json.write_text(json.dumps({**res, "ok": ok, "sets": sets}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
