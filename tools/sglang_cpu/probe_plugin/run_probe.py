"""Run the tiny sglang server with the ebctl_probe plugin, drive load, and check what the probe saw.

    $VENV/bin/python tools/sglang_cpu/probe_plugin/run_probe.py --venv $VENV --model DIR --out DIR \
        [--mode defer:4] [--bench] [-- extra sglang flags]

Throwaway test infrastructure (see ../HOOKS.md). Needs ebctl-probe installed in the venv.
Prints a JSON summary; the probe's raw lines are in OUT/probe.jsonl, the server log in OUT/server.log.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from server import post_json, tiny_server

REASON = {"length": "FINISH_LENGTH", "stop": "FINISH_MATCHED_TOKEN", "abort": "FINISH_ABORT"}


def drive(url: str, n: int, concurrency: int, seed: int, timeout: float,
          abort_rids: tuple[str, ...] = ()) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        params = {"max_new_tokens": rng.randint(1, 48), "temperature": 1.0}
        if i % 2:  # early stops -> FINISH_MATCHED_TOKEN (about 1 in 9 tokens is a stop token)
            params["stop_token_ids"] = list(range(3, 60))
        else:
            params["ignore_eos"] = True
        ids = [rng.randint(3, 511) for _ in range(rng.randint(4, 300))]
        jobs.append({"input_ids": ids, "sampling_params": params, "rid": f"probe-{seed}-{i}"})

    def one(job):
        try:
            r = post_json(f"{url}/generate", job, timeout=timeout)
            m = r["meta_info"]
            return {"rid": m["id"], "prompt_tokens": m["prompt_tokens"],
                    "completion_tokens": m["completion_tokens"],
                    "reason": REASON.get(m["finish_reason"]["type"], m["finish_reason"]["type"])}
        except Exception as e:
            return {"rid": job["rid"], "error": repr(e)}

    def aborted():  # one long request aborted by rid while it runs
        job = {"input_ids": [5] * 20, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True},
               "rid": f"probe-{seed}-abort"}
        res = {}
        t = threading.Thread(target=lambda: res.update(one(job)))
        t.start()
        time.sleep(1.5)
        try:
            for rid in (job["rid"], *abort_rids):
                post_json(f"{url}/abort_request", {"rid": rid}, timeout=10)
        except Exception as e:
            res["abort_error"] = repr(e)
        t.join(timeout)
        return res

    with ThreadPoolExecutor(concurrency) as ex:
        fut_abort = ex.submit(aborted)
        results = list(ex.map(one, jobs))
        results.append(fut_abort.result())
    return results


def bench(venv: str, url: str, out: Path, num_prompts: int) -> dict:
    host, port = url.rsplit(":", 1)
    cmd = [f"{venv}/bin/python", "-m", "sglang.benchmark.serving", "--backend", "sglang",
           "--host", host.split("//")[1], "--port", port, "--dataset-name", "random-ids",
           "--num-prompts", str(num_prompts), "--random-input-len", "32", "--random-output-len", "16",
           "--random-range-ratio", "1.0", "--max-concurrency", "8", "--disable-tqdm",
           "--output-file", str(out / "bench.jsonl"), "--seed", "1"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (out / "bench.log").write_text(p.stdout + p.stderr)
    res = {"rc": p.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    if p.returncode == 0 and (out / "bench.jsonl").exists():
        m = json.loads((out / "bench.jsonl").read_text().splitlines()[-1])
        res.update({k: m.get(k) for k in ("completed", "total_input_tokens", "total_output_tokens",
                                          "request_throughput", "output_throughput",
                                          "mean_ttft_ms", "median_itl_ms", "duration")})
    return res


def check(records: list[dict], client: list[dict]) -> dict:
    iters = [r for r in records if r["ev"] == "iter"]
    results = [r for r in records if r["ev"] == "result"]
    fin = [f for r in results for f in r["finished"]]
    fin_user = [f for f in fin if f["rid"].startswith("probe-")]
    by_rid = collections.Counter(f["rid"] for f in fin_user)
    stream_rids = collections.Counter(x for r in records if r["ev"] == "stream_fin"
                                      for x in r["rids"] if x.startswith("probe-"))
    ok = [c for c in client if "error" not in c]
    aborted_outside = [r for r in records if r["ev"] == "abort_output"]
    outside_rids = {r["rid"] for r in aborted_outside}
    mism = []
    probe = {f["rid"]: f for f in fin_user}
    for c in ok:
        if c["rid"] in outside_rids and c["rid"] not in probe:
            continue
        f = probe.get(c["rid"])
        out_len = None if f is None else (f["finished_len"] if f["finished_len"] is not None
                                          else f["output_len"])
        if f is None or (f["input_len"], out_len, f["reason"]) != (
                c["prompt_tokens"], c["completion_tokens"], c["reason"]):
            mism.append({"client": c, "probe": f})
    modes = collections.Counter(r["mode"] for r in iters)
    return {
        "iterations": len(iters), "modes": dict(modes),
        "max_running": max((r["running"] for r in iters), default=0),
        "max_batch_bs": max((r.get("bs", 0) for r in iters), default=0),
        "mixed_iters": modes.get("MIXED", 0),
        "defers": sum(r["ev"] == "defer" for r in records),
        "dropped": sum(bool(r.get("dropped")) for r in iters),
        "client_ok": len(ok), "client_errors": [c for c in client if "error" in c][:3],
        "probe_finished_user": len(fin_user),
        "seen_more_than_once": {k: v for k, v in by_rid.items() if v > 1},
        "client_not_seen": [c["rid"] for c in ok if c["rid"] not in by_rid
                            and c["rid"] not in outside_rids],
        "ended_outside_stream": aborted_outside,
        "outside_and_streamed": sorted(outside_rids & set(by_rid)),
        "stream_hook_agrees": stream_rids == by_rid,
        "mismatches": mism[:5], "n_mismatches": len(mism),
        "client_output_tokens": sum(c["completion_tokens"] for c in ok),
        "probe_output_tokens": sum((f["finished_len"] if f["finished_len"] is not None
                                    else f["output_len"]) for f in fin_user if f["rid"] in
                                   {c["rid"] for c in ok}),
        "reasons": dict(collections.Counter(f["reason"] for f in fin_user)),
        "all_finished_total": len(fin), "health_or_other": len(fin) - len(fin_user),
        "ttft_s_median": sorted(f["ttft_s"] for f in fin_user if f["ttft_s"])[len(fin_user) // 2]
        if fin_user else None,
        "kv_used_end": results[-1]["kv_used"] if results else None,
        "run_s_by_mode": {m: round(sum(r["run_s"] for r in records if r["ev"] == "run"
                                       and r["mode"] == m), 3) for m in modes if m},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--bench", type=int, default=0, help="also run sglang.benchmark.serving, N prompts")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--abort", default="", help="comma-separated extra rids to abort after 1.5 s")
    ap.add_argument("extra", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    probe_path = out / "probe.jsonl"
    probe_path.unlink(missing_ok=True)
    env = dict(__import__("os").environ, SGLANG_PLUGINS="ebctl_probe",
               EBCTL_PROBE_OUT=str(probe_path), EBCTL_PROBE_MODE=a.mode)
    summary: dict = {"mode": a.mode, "extra": extra}
    t0 = time.monotonic()
    try:
        with tiny_server(a.venv, a.model, extra, env=env, log_path=out / "server.log") as (url, proc):
            summary["ready_s"] = round(time.monotonic() - t0, 1)
            t1 = time.monotonic()
            client = drive(url, a.n, a.concurrency, seed=0, timeout=a.timeout,
                           abort_rids=tuple(filter(None, a.abort.split(","))))
            summary["drive_s"] = round(time.monotonic() - t1, 1)
            if a.bench:
                summary["bench"] = bench(a.venv, url, out, a.bench)
            time.sleep(0.5)
            summary["server_alive"] = proc.poll() is None
    except (RuntimeError, TimeoutError, urllib.error.URLError) as e:
        summary["server_error"] = repr(e)[:500]
        client = []
    records = [json.loads(x) for x in probe_path.read_text().splitlines()] if probe_path.exists() else []
    summary["register_events"] = [{k: r[k] for k in ("pid", "argv0", "scheduler_imported", "proctitle")}
                                  for r in records if r["ev"] == "register"]
    summary.update(check(records, client))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
