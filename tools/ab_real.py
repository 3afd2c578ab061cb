"""The user's A/B on the real SGLang CPU server: the same server with and without ebctl, measured as a user would.

    python tools/ab_real.py [--configs alone,mixed,mfsd=4,ebctl,'ebctl:controller.mode=off'] [--runs 3]
                            [--duration 480] [--last 240] [--concurrency 24] [--trace FILE|WORKLOAD]
                            [--requests 480] [--seed 0] [--server-args=--enable-mixed-chunk] [--baseline NAME]
                            [--status-every 60] [--slo TTFT,TPOT] [--json FILE] [--venv VENV] [--workdir DIR]
                            [--model DIR] [--quick] [--from-json FILE [--slo TTFT,TPOT] [--report FILE]]

Every run starts the tiny model (tools/sglang_cpu/make_tiny_model.py) FRESH, with torch on one OpenMP thread
(``OMP_NUM_THREADS=1``; ``SGLANG_CPU_OMP_THREADS_BIND=0`` binds nothing on a CPU without AMX, so the tool pins:
the scheduler's main thread alone on CPU 0, every other process and thread on the other CPUs, as a GPU server's
scheduler has a core to itself; ``--no-pin`` leaves placement to the kernel) and the base server args: the harness's CPU
flags (tools/sglang_cpu/server.py ``BASE_ARGS``: 16 slots, KV 16,384 tokens, ``--sleep-on-idle``) plus
``--chunked-prefill-size 256``, plus ``--server-args`` (for every configuration, ``alone`` included; write it
with ``=``, as in ``--server-args='--enable-mixed-chunk --disable-overlap-schedule'``: a value starting with
``--`` is otherwise taken for an option).

Configurations (``--configs``, comma-separated; each is a HEAD, optionally ``:ITEM;ITEM...``; quote the ``;``):

- ``alone``: sglang without the plugin (``SGLANG_PLUGINS=none``: unset, sglang would load every installed
  plugin, ebctl included); ``mixed`` = ``alone:--enable-mixed-chunk``; ``mfsd=K`` = ``alone:--min-free-slots-delay
  K``; ``pdi=N`` = ``alone:--prefill-decode-interval N``;
- ``ebctl``: ``ebctl start --engine sglang -- <the same args>``, default configuration, cold (a fresh runtime dir
  every run: the learning period is in the figures);
- ``plugin``: sglang with the plugin loaded (``SGLANG_PLUGINS=ebctl``) but started as ``alone`` is, without
  ``ebctl start``: no daemon, no supervisor, its reports go nowhere and no policy comes; its ``KEY=VALUE`` items
  go to the plugin's config (``EBCTL_CONFIG``). Beside ``alone`` and ``ebctl`` it tells what the plugin costs
  inside sglang from what ``ebctl start`` around it does (``'plugin:pdi=8;engine.fault=next_batch:1'``: loaded,
  and switched off at its first hook);
- an ITEM is either ``KEY=VALUE`` with a dotted key (an ebctl ``--set``; ebctl and plugin configurations), or
  ``NAME=VALUE`` with an upper-case NAME (an environment variable of the configuration's server, e.g.
  ``PYTHONUNBUFFERED=1``, which ``ebctl start`` sets for sglang), or extra
  sglang flags starting with ``--`` (split like a shell line), or one of the shorthands ``mixed``, ``mfsd=K``,
  ``pdi=N``. E.g. ``'ebctl:controller.mode=off'``, ``'ebctl:mixed;controller.mode=eb'``,
  ``'alone:--schedule-policy lpm'``. The configuration's name is the text as given. ``alone,alone:AA=1`` (an
  environment variable nothing reads) is an A/A check: how far two identical servers of one sitting differ.

Configurations run INTERLEAVED: each round (``--runs``) runs each once. ``--order rotate`` (the default) starts
round r at the r-th configuration (a Latin square over as many rounds as configurations): a configuration that
always ran first, right after the previous round's last server, would carry whatever that position does to it;
``--order given`` keeps the order given.

The client (one process in the sglang venv's python: asyncio on uvloop + aiohttp; about 10% of one core at
1,000 output tok/s here, printed per run) is a timed CLOSED LOOP:
``--concurrency`` requests in flight until ``--duration`` seconds have passed; then it sends nothing more and
waits (up to ``--drain`` s) for what was in flight: those are reported (``in flight at the end``, and how many of
them completed in the drain); they count as completed when they complete. A request failed on an HTTP error, an
error in the stream, or a stream that ended before its last token; one still running after the drain is
``unfinished``. Every request is a FRESH random prompt (``input_ids`` drawn uniformly from the model's
vocabulary less its special ids: the radix cache never skips a prefill), streamed (``"stream": true``, the SSE
``data:`` lines parsed), ``ignore_eos`` with ``max_new_tokens`` = the output length, temperature 0. Lengths
cycle, in order, through ``--requests`` (input, output) pairs, the same list for every run: by default the
issue's workload (seeded by ``--seed``): inputs ``10 + floor(231 u^0.9)``, u uniform (10-240 tokens, mean
≈ 131), outputs geometric with mean 43 capped at 160 (mean ≈ 42); ``--trace`` takes a trace CSV or any
workload name of ``ebctl simulate`` (``ebctl.sim.workloads.load``: rows drawn at random, seeded).

Printed, one line per run as it finishes, then a table per configuration (medians over its runs): output
tokens/s over the whole load phase (tokens received in [0, duration) / duration) and over its last ``--last``
seconds, TTFT p50/p99, TPOT p50/p99 (per request: (last token time - first token time) / (tokens - 1)),
requests completed and failed (summed), and the ratio of output tok/s to the baseline (the first
configuration, or ``--baseline``): the median of a bootstrap (each configuration's runs resampled, the ratio of
the means; 10,000 draws) and its 95% interval, for the whole run and for the last part. With one run per
configuration the interval is zero-width and says nothing. For ``ebctl`` configurations the daemon's status is
read over its control socket every ``--status-every`` seconds, at the end of the load and after the drain; the
last read's mode,
k, n_max and, where the engine's status has them, ``gain`` and ``exploration`` are printed.
Each run's line also says how the scheduler process ran under load (/proc): CPU seconds per process and per
scheduler thread, the main thread's voluntary (it waited: the GIL, a lock) and involuntary (preempted) context
switches per second, its minor and major page faults per second (and all the scheduler's threads' minor faults),
and any thread confined to the main thread's core. After the table, sglang's own decode log
(a line every 40 decode steps: running requests and tokens/s) gives each configuration's time per decode step at
the running counts all of them logged: at the same load, a difference there is the engine's speed, not the batch
the policy formed (for an ``ebctl`` configuration it includes its learning period).
``--json``: everything (the commit it ran from; per run: the per-request records, throughput per 30-s bin, the
status reads); tools/ab_pool.py pools several such records, each run paired with the baseline's of its round.
``--slo TTFT,TPOT`` (seconds): the table adds goodput at those targets, the output tokens of the requests that
completed with TTFT and TPOT within them per second of load, the share of requests sent that did
(``attained``), and the goodput ratio to the baseline (bootstrap, as above); with ``--from-json`` it re-reports
a recorded A/B at any targets.

``--quick`` (CI): ``alone,ebctl``, one run each, 45 s of load, ``--last 20``, status every 15 s (each unless
given on the command line); the figures are printed, not judged. Each run also costs 30-50 s of server start
on a 2-core machine. Exit status: 0 unless a run failed to start or a
request failed or was unfinished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ISSUE_ARGS = ("--chunked-prefill-size", "256")  # BASE_ARGS has --max-running-requests 16, --max-total-tokens 16384
SHORTHANDS = {"mixed": ("--enable-mixed-chunk",), "mfsd": ("--min-free-slots-delay",),
              "pdi": ("--prefill-decode-interval",)}
BIN_S = 30.0  # the JSON's throughput bins (the learning curve)
HIST_S = 1.0  # the client's token histogram resolution


# ---------------------------------------------------------------------------------------------------------------
# The pure core: plain functions of lists (tests/unit/test_ab_stats.py).

def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between order statistics (numpy's default); nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def tpot(t_first: float, t_last: float, tokens: int) -> float | None:
    """Time per output token after the first: (last token time - first token time) / (tokens - 1)."""
    return (t_last - t_first) / (tokens - 1) if tokens >= 2 else None


def stream_summary(t_send: float, events: Sequence[tuple[float, int]]) -> dict[str, Any]:
    """One streamed request: ``events`` are (arrival time, cumulative output tokens) of the chunks that brought
    tokens. Its TTFT, TPOT, tokens and first/last token times (None where there were no tokens)."""
    if not events:
        return {"ttft": None, "tpot": None, "tokens": 0, "first": None, "last": None}
    (t1, _), (tn, n) = events[0], events[-1]
    return {"ttft": t1 - t_send, "tpot": tpot(t1, tn, n), "tokens": n, "first": t1, "last": tn}


def add_tokens(hist: list[float], events: Sequence[tuple[float, int]], res: float = HIST_S) -> None:
    """Add each chunk's new tokens to ``hist`` (tokens per bin of ``res`` seconds, bin i = [i res, (i+1) res))."""
    prev = 0
    for t, n in events:
        i = max(0, int(t // res))
        if i >= len(hist):
            hist.extend([0.0] * (i + 1 - len(hist)))
        hist[i] += n - prev
        prev = n


def window_rate(hist: Sequence[float], res: float, a: float, b: float) -> float:
    """Tokens per second in [a, b) from a histogram of bins of ``res`` seconds (a bin cut by the window counts in
    proportion to its overlap); nan for an empty window."""
    if not b > a:
        return math.nan
    total = 0.0
    for i in range(max(0, int(a // res)), min(len(hist), math.ceil(b / res))):
        lo, hi = i * res, (i + 1) * res
        overlap = min(hi, b) - max(lo, a)
        if overlap > 0:
            total += hist[i] * overlap / res
    return total / (b - a)


def bins(hist: Sequence[float], res: float, width: float, end: float) -> list[float]:
    """Tokens per second in consecutive bins of ``width`` seconds over [0, end) (the last may be shorter)."""
    out, a = [], 0.0
    while a < end - 1e-9:
        out.append(window_rate(hist, res, a, min(a + width, end)))
        a += width
    return out


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, draws: int = 10_000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of mean(num*) / mean(den*) over ``draws`` bootstrap resamples (each list resampled with
    replacement, on its own); the interval is the central ``level`` of those ratios. Draws whose baseline mean is
    0 have no ratio and are left out; NaN throughout when more than half are."""
    if not num or not den:
        return (math.nan, math.nan, math.nan)
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        d = statistics.fmean(rng.choices(den, k=len(den)))
        n = statistics.fmean(rng.choices(num, k=len(num)))
        if d:  # a draw whose baseline mean is 0 (no goodput at tight targets) has no ratio: left out
            ratios.append(n / d)
    if len(ratios) < draws / 2:
        return (math.nan, math.nan, math.nan)
    tail = (1 - level) / 2 * 100
    return (percentile(ratios, 50), percentile(ratios, tail), percentile(ratios, 100 - tail))


def summarize(records: Sequence[dict[str, Any]], hist: Sequence[float], res: float, duration: float,
              last: float) -> dict[str, Any]:
    """One run's figures from the client's records (``t`` send time, ``end`` time it ended or None, ``status``
    ok/failed/unfinished, ``ttft``, ``tpot``) and token histogram; times relative to the start of the load."""
    ok = [r for r in records if r["status"] == "ok"]
    at_end = [r for r in records if r["t"] < duration and (r["end"] is None or r["end"] >= duration)]
    last = min(last, duration)
    return {
        "tok_s": window_rate(hist, res, 0.0, duration),
        "tok_s_last": window_rate(hist, res, duration - last, duration),
        "ttft_p50": percentile([r["ttft"] for r in ok], 50), "ttft_p99": percentile([r["ttft"] for r in ok], 99),
        "tpot_p50": percentile([r["tpot"] for r in ok if r["tpot"] is not None], 50),
        "tpot_p99": percentile([r["tpot"] for r in ok if r["tpot"] is not None], 99),
        "sent": len(records), "completed": len(ok),
        "failed": sum(r["status"] == "failed" for r in records),
        "unfinished": sum(r["status"] == "unfinished" for r in records),
        "in_flight_at_end": len(at_end), "completed_in_drain": sum(r["status"] == "ok" for r in at_end),
        "output_tokens": sum(hist), "bins_30s": bins(hist, res, BIN_S, duration),
    }


def goodput(records: Sequence[dict[str, Any]], duration: float, slo: tuple[float, float],
            last: float = math.nan) -> dict[str, float]:
    """Goodput at the operator's targets ``slo`` = (TTFT s, TPOT s): the output tokens of the requests that
    completed with TTFT ≤ the first and TPOT ≤ the second (a one-token request has no TPOT: its TTFT alone),
    per second of load (``duration``; requests in flight at its end count when they completed in the drain),
    and ``attained``: their share of the requests sent (a failed or unfinished request misses). With ``last``,
    also ``goodput_last_tok_s``: the same over the last ``last`` seconds, the requests that ended from then on
    (a run's learning is over by then, as for its last part's throughput)."""
    ttft_s, tpot_s = slo
    good = [r for r in records if r["status"] == "ok" and r["ttft"] is not None and r["ttft"] <= ttft_s
            and (r["tpot"] is None or math.isnan(r["tpot"]) or r["tpot"] <= tpot_s)]  # NaN: None read back
    out = {"goodput_tok_s": sum(r["tokens"] for r in good) / duration,
           "attained": len(good) / len(records) if records else math.nan}
    if last > 0:
        since = duration - min(last, duration)
        out["goodput_last_tok_s"] = sum(r["tokens"] for r in good if r["end"] >= since) / (duration - since)
    return out


def parse_slo(text: str) -> tuple[float, float]:
    """``--slo TTFT,TPOT`` (seconds, both > 0)."""
    parts = text.split(",")
    try:
        ttft_s, tpot_s = (float(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give TTFT,TPOT in seconds, e.g. 1.0,0.05") from None
    if not (ttft_s > 0 and tpot_s > 0 and math.isfinite(ttft_s + tpot_s)):
        raise argparse.ArgumentTypeError(f"{text!r}: both targets must be positive seconds")
    return ttft_s, tpot_s


def issue_workload(n: int = 480, seed: int = 0) -> list[tuple[int, int]]:
    """The issue's (input, output) pairs: inputs 10 + floor(231 u^0.9) (10-240, mean ≈ 131), outputs geometric
    on {1, 2, ...} with mean 43, capped at 160 (mean ≈ 42)."""
    rng = random.Random(seed)
    p = 1 / 43
    out = []
    for _ in range(n):
        inp = 10 + int(231 * rng.random() ** 0.9)
        geo = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
        out.append((inp, min(geo, 160)))
    return out


def parse_config(text: str) -> dict[str, Any]:
    """``HEAD[:ITEM;ITEM...]`` (module docstring) → {name, engine: alone|ebctl, flags: [...], sets: [...]}."""
    def shorthand(item: str) -> list[str] | None:
        key, eq, val = item.partition("=")
        if key == "mixed" and not eq:
            return list(SHORTHANDS["mixed"])
        if key in ("mfsd", "pdi") and eq and val.strip():
            return [*SHORTHANDS[key], val.strip()]
        return None

    head, _, rest = text.strip().partition(":")
    cfg: dict[str, Any] = {"name": text.strip(), "engine": head if head in ("ebctl", "plugin") else "alone",
                           "flags": [], "sets": [], "env": {}}
    if head not in ("alone", "ebctl", "plugin"):
        flags = shorthand(head)
        if flags is None:
            raise ValueError(f"configuration {text!r}: {head!r} is none of alone, ebctl, plugin, mixed, mfsd=K, "
                             "pdi=N")
        cfg["flags"] += flags
    for item in filter(None, (x.strip() for x in rest.split(";"))):
        if item.startswith("--"):
            cfg["flags"] += shlex.split(item)
        elif (flags := shorthand(item)) is not None:
            cfg["flags"] += flags
        elif re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", item):
            name, _, value = item.partition("=")
            cfg["env"][name] = value
        elif "=" in item and "." in item.partition("=")[0]:
            if cfg["engine"] == "alone":
                raise ValueError(f"configuration {text!r}: {item!r} is an ebctl setting, and this runs no ebctl")
            from ebctl import config  # checked here, before any run: a typo would otherwise end a sitting midway

            try:
                key, value, _ = config.assignment(item)
            except config.ConfigError as e:
                raise ValueError(f"configuration {text!r}: {e}") from e
            cfg["sets"].append(f"{key}={value}")  # as checked: the plugin's config file is written from it
        else:
            raise ValueError(f"configuration {text!r}: item {item!r} is neither --sglang-flags, KEY=VALUE (dotted "
                             "key), NAME=VALUE (environment) nor mixed, mfsd=K, pdi=N")
    return cfg


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


# ---------------------------------------------------------------------------------------------------------------
# The client: ``python tools/ab_real.py --client SPEC.json`` in the sglang venv (stdlib + aiohttp only).

async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    import aiohttp
    try:
        from orjson import loads
    except ImportError:
        loads = json.loads

    rng = random.Random(spec["seed"])
    ids, pairs, duration = spec["token_ids"], spec["pairs"], spec["duration"]
    url = spec["url"] + "/generate"
    records: list[dict[str, Any]] = []
    hist: list[float] = []
    nxt = [0]
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def one(session: aiohttp.ClientSession) -> None:
        i = nxt[0] % len(pairs)
        nxt[0] += 1
        n_in, n_out = pairs[i]
        payload = {"input_ids": rng.choices(ids, k=n_in), "stream": True,
                   "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0.0}}
        rec: dict[str, Any] = {"pair": i, "in": n_in, "out": n_out, "t": time.perf_counter() - t0, "end": None,
                               "status": "unfinished", "err": None}
        records.append(rec)
        events: list[tuple[float, int]] = []
        prev, done = 0, False
        try:
            async with session.post(url, json=payload) as r:
                if r.status != 200:
                    rec["status"], rec["err"] = "failed", f"HTTP {r.status}: {(await r.text())[:300]}"
                    return
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    body = line[5:].strip()
                    if body == b"[DONE]":
                        done = True
                        break
                    d = loads(body)
                    if "error" in d:
                        rec["status"], rec["err"] = "failed", f"stream error: {str(d['error'])[:300]}"
                        return
                    n = d["meta_info"]["completion_tokens"]
                    if n > prev:
                        events.append((time.perf_counter() - t0, n))
                        prev = n
            if done and prev == n_out:
                rec["status"] = "ok"
            else:
                rec["status"] = "failed"
                rec["err"] = f"stream ended after {prev} of {n_out} tokens{'' if done else ' without [DONE]'}"
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError) as e:
            rec["status"], rec["err"] = "failed", f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if rec["status"] != "unfinished":
                rec["end"] = time.perf_counter() - t0
            rec.update({k: v for k, v in stream_summary(rec["t"], events).items() if k in ("ttft", "tpot", "tokens")})
            for k in ("t", "end", "ttft", "tpot"):  # 10 µs: enough, and a third of the JSON
                if rec[k] is not None:
                    rec[k] = round(rec[k], 5)
            add_tokens(hist, events)

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() - t0 < duration:
            await one(session)

    timeout = aiohttp.ClientTimeout(total=None, sock_read=spec["drain"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = [asyncio.ensure_future(worker(session)) for _ in range(spec["concurrency"])]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, duration - (time.perf_counter() - t0))
                                        + spec["drain"])
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return {"records": records, "hist": hist, "res": HIST_S, "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - cpu0}


def client_main(spec_path: str) -> int:
    import asyncio

    spec = json.loads(Path(spec_path).read_text())
    try:  # sglang depends on uvloop: about a quarter less client CPU than asyncio's own loop
        import uvloop

        out = uvloop.run(_client(spec))
    except ImportError:
        out = asyncio.run(_client(spec))
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The shell: servers, the client subprocess, the daemon's status, the table.

def harness() -> Any:
    """tests/sglang/harness.py (imports zmq and ebctl; also puts tools/sglang_cpu on sys.path)."""
    sys.path.insert(0, str(REPO / "tests" / "sglang"))
    sys.path.insert(0, str(REPO))
    import harness as h

    return h


def model_vocab(model: Path) -> list[int]:
    """The token ids a prompt may use: the model's vocabulary less the tokenizer's special (added) ids."""
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    special: set[int] = set()
    tok = model / "tokenizer.json"
    if tok.is_file():
        special = {t["id"] for t in json.loads(tok.read_text()).get("added_tokens", []) if t.get("special", True)}
    return [i for i in range(vocab) if i not in special]


def base_args(extra: str) -> list[str]:
    from server import BASE_ARGS  # tools/sglang_cpu, on the path via harness()

    return [*BASE_ARGS, *ISSUE_ARGS, *shlex.split(extra)]


class Serving:
    """One configuration's server, fresh: ``alone`` via the harness's Server (plugins "none"), ``ebctl`` via
    ``ebctl start`` (harness.ebctl_start). ``url``, ``control`` (the daemon's control endpoint or None)."""

    def __init__(self, h: Any, venv: Path, model: Path, work: Path, cfg: dict[str, Any], args: list[str]) -> None:
        from server import BASE_ARGS

        self.control = None
        self._cm = None
        self._server = None
        t0 = time.monotonic()
        if cfg["engine"] == "ebctl":
            env = {k: v for k, v in h.server_env().items() if k not in ("SGLANG_PLUGINS", "EBCTL_CONFIG")}
            env.update(h.ONE_TORCH_CORE)
            env.update(cfg["env"])
            self._cm = h.ebctl_start(venv, model, work, [*args, *cfg["flags"]], cfg["sets"], env=env)
            proc, self.url = self._cm.__enter__()
            self.root = proc.pid
            self.control = f"ipc://{work / 'rt' / 'control.sock'}"
        else:  # Server prepends BASE_ARGS itself: the command line is the same as ebctl's
            conf = None
            if cfg["sets"]:
                conf = work / "plugin.toml"
                conf.write_text(h.toml(dict(item.split("=", 1) for item in cfg["sets"])))
            self._server = h.Server(venv, model, work, [*args[len(BASE_ARGS):], *cfg["flags"]],
                                    plugins="ebctl" if cfg["engine"] == "plugin" else "none", ebctl_config=conf,
                                    env=cfg["env"] or None)
            self.url = self._server.url
            self.root = self._server.proc.pid
            h.post_json(f"{self.url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
                        timeout=60)  # what ebctl_start waits for: one answered generate
        self.ready_s = time.monotonic() - t0

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
        if self._server is not None:
            self._server.close()


def _procs(proc: Path) -> dict[int, tuple[int, str, str, float]]:
    """Every live process: pid → (parent pid, comm, command line, CPU ticks user + system), from /proc/PID/stat
    (proc(5): fields 4, 14, 15)."""
    out: dict[int, tuple[int, str, str, float]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        comm, rest = _stat(raw)
        out[int(d.name)] = (int(rest[1]), comm, cmd, int(rest[11]) + int(rest[12]))
    return out


def _stat(raw: str) -> tuple[str, list[str]]:
    """A /proc/.../stat line: the name (field 2, in parentheses, which may hold spaces) and the fields after it
    (``rest[1]`` is field 4, the parent pid; ``rest[11]``, ``rest[12]`` fields 14, 15: user and system ticks)."""
    return raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def _descendants(procs: dict[int, tuple[int, str, str, float]], root: int) -> list[int]:
    keep = {root}
    for _ in range(8):  # a few passes reach the leaves (pid order is not parent-first)
        keep |= {pid for pid, p in procs.items() if p[0] in keep}
    return sorted(keep & (procs.keys() | {root}))


def tree(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and its live descendants (pids)."""
    return _descendants(_procs(proc), root)


def pin(pids: list[int], core: int = 0, proc: Path = Path("/proc"), rest: set[int] | None = None) -> int:
    """Give sglang's scheduler a core of its own, as a GPU server's scheduler has: the main thread of each
    ``sglang::scheduler`` process (its tid is its pid) on ``core``, every other thread of ``pids`` (the
    scheduler's helpers, the HTTP/tokenizer process, the detokenizer, ebctl's daemon, the client) on ``rest``
    (default: the other cores). ``SGLANG_CPU_OMP_THREADS_BIND`` does not do it on this CPU: sglang binds threads
    only on AMX or arm64 CPUs (sglang/srt/distributed/bootstrap.py 277-301, "init_cpu_threads_env ... is
    disabled"). Threads started later inherit their starter's set. Returns how many schedulers were pinned."""
    if rest is None:
        rest = (os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))) - {core} or {core}
    n = 0
    for pid in pids:
        try:
            comm = (proc / str(pid) / "comm").read_text().strip()
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            main = comm.startswith("sglang::sched") and tid == pid
            try:
                os.sched_setaffinity(tid, {core} if main else rest)
            except OSError:  # gone meanwhile
                continue
            n += main
    return n


def tree_cpu(root: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU seconds (user + system, every thread) of ``root`` and its live descendants, summed by process name
    (``comm``: sglang's processes name themselves ``sglang::scheduler`` etc., ebctl's daemon and supervisor are
    told apart by their command line)."""
    tick, procs, out = os.sysconf("SC_CLK_TCK"), _procs(proc), {}
    for pid in _descendants(procs, root):
        if pid in procs:
            _, comm, cmd, ticks = procs[pid]
            name = ("ebctl daemon" if "ebctl.daemon" in cmd else
                    "ebctl start" if " -m ebctl " in cmd and " start " in cmd else comm)
            out[name] = out.get(name, 0.0) + ticks / tick
    return out


def scheduler_threads(pids: list[int], proc: Path = Path("/proc")) -> dict[str, Any]:
    """The scheduler processes' threads (every ``sglang::schedul*`` among ``pids``), summed by thread name: CPU
    ticks and the cores each may run on (``Cpus_allowed_list``); for each main thread (the one that plans and runs
    batches) its context switches from /proc/PID/task/TID/status (proc(5)): voluntary when it waited (the GIL, a
    lock, a socket), involuntary when the kernel ran something else on its core; and each thread name's page faults
    (/proc/PID/task/TID/stat fields 10 and 12, minor and major: a minor fault is a page the kernel had to map, as
    when freed memory is given back and touched again)."""
    main, threads = {"voluntary": 0, "involuntary": 0}, {}
    for pid in pids:
        try:
            if not (proc / str(pid) / "comm").read_text().startswith("sglang::sched"):
                continue
            tids = sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for tid in tids:
            d = proc / str(pid) / "task" / str(tid)
            try:
                raw, status = (d / "stat").read_text(), (d / "status").read_text()
            except OSError:  # gone meanwhile
                continue
            comm, f = _stat(raw)
            ticks = int(f[11]) + int(f[12])
            kv = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            name = "main" if tid == pid else comm
            t = threads.setdefault(name, {"cpu": 0, "n": 0, "cores": set(), "minflt": 0, "majflt": 0})
            t["cpu"] += ticks
            t["minflt"] += int(f[7])
            t["majflt"] += int(f[9])
            t["n"] += 1
            t["cores"].add(kv.get("Cpus_allowed_list", "?").strip())
            if tid == pid:
                main["voluntary"] += int(kv.get("voluntary_ctxt_switches", 0))
                main["involuntary"] += int(kv.get("nonvoluntary_ctxt_switches", 0))
    return {"main": main, "threads": threads}


def thread_use(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What the scheduler's threads did between two ``scheduler_threads`` readings ``seconds`` apart: the main
    thread's context switches and page faults per second (and all the threads' minor faults), and each thread
    name's CPU seconds and allowed cores."""
    tick = os.sysconf("SC_CLK_TCK")
    b, a = before["main"], after["main"]
    own = after["threads"].get("main", {}).get("cores", set())

    def faults(key: str, names: Any) -> float:
        return sum(after["threads"][k][key] - before["threads"].get(k, {}).get(key, 0) for k in names) / seconds

    main_only = [k for k in after["threads"] if k == "main"]
    return {"main_voluntary_per_s": (a["voluntary"] - b["voluntary"]) / seconds,
            "main_involuntary_per_s": (a["involuntary"] - b["involuntary"]) / seconds,
            "minflt_per_s": faults("minflt", main_only), "majflt_per_s": faults("majflt", main_only),
            "all_minflt_per_s": faults("minflt", after["threads"]),
            # started after pin() by the main thread, they inherited its core: they take turns with it there
            "on_main_core": sorted(k for k, t in after["threads"].items() if k != "main" and t["cores"] & own),
            "threads": {k: {"cpu_s": (t["cpu"] - before["threads"].get(k, {}).get("cpu", 0)) / tick, "n": t["n"],
                            "cores": sorted(t["cores"])} for k, t in after["threads"].items()}}


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


def server_pace(work: Path) -> dict[int, list[float]]:
    """``decode_pace`` of the sglang log a run left in ``work`` (``start.log`` under ebctl, else the server's)."""
    logs = [work / "start.log", *sorted(work.glob("server.*.log"))]
    return decode_pace("".join(f.read_text(errors="replace") for f in logs if f.is_file()))


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


def start_client(venv: Path, url: str, work: Path, *, concurrency: int, duration: float, drain: float,
                 pairs: list[tuple[int, int]], ids: list[int], seed: int) -> subprocess.Popen:
    """The closed-loop client (``--client``) against ``url`` in a process of its own (the sglang venv's python,
    for aiohttp and uvloop); its spec, log and results (``client.json``) in ``work``."""
    spec = {"url": url, "concurrency": concurrency, "duration": duration, "drain": drain, "pairs": pairs,
            "token_ids": ids, "seed": seed, "out": str(work / "client.json")}
    (work / "client.spec.json").write_text(json.dumps(spec))
    with open(work / "client.log", "wb") as log:
        return subprocess.Popen([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "--client",
                                 str(work / "client.spec.json")], cwd="/", stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)


def run_one(h: Any, venv: Path, model: Path, work: Path, cfg: dict[str, Any], args: list[str], a: Any,
            pairs: list[tuple[int, int]], ids: list[int], seed: int) -> dict[str, Any]:
    """Start the configuration fresh, load it, stop it; the run's record (``error`` set if it did not start)."""
    work.mkdir(parents=True, exist_ok=True)
    run: dict[str, Any] = {"config": cfg["name"], "seed": seed, "workdir": str(work), "status": []}
    try:
        serving = Serving(h, venv, model, work, cfg, args)
    except Exception as e:  # a run that does not start is reported, and the others still run
        run["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
        return run
    try:
        run["ready_s"] = serving.ready_s
        cpu0 = tree_cpu(serving.root)
        client = start_client(venv, serving.url, work, concurrency=a.concurrency, duration=a.duration,
                              drain=a.drain, pairs=pairs, ids=ids, seed=seed)
        if a.pin:
            run["pinned"] = pin([*tree(serving.root), client.pid])
        t0, threads0 = time.monotonic(), scheduler_threads(tree(serving.root))
        try:
            ticks = ([x * a.status_every for x in range(1, int(a.duration // a.status_every) + 1)]
                     if serving.control else [])
            if serving.control and a.duration not in ticks:
                ticks.append(a.duration)
            for tick in ticks:
                try:
                    client.wait(max(0.0, tick - (time.monotonic() - t0)))
                    break
                except subprocess.TimeoutExpired:
                    run["status"].append({"t": time.monotonic() - t0, "status": h.daemon_status(serving.control)})
            client.wait(a.duration + a.drain + 120)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
        run["cpu_s"] = {k: v - cpu0.get(k, 0.0) for k, v in tree_cpu(serving.root).items()}  # under load
        run["scheduler_threads"] = thread_use(threads0, scheduler_threads(tree(serving.root)),
                                              max(1e-9, time.monotonic() - t0))
        if serving.control:
            run["status"].append({"t": time.monotonic() - t0, "status": h.daemon_status(serving.control)})
        if client.returncode != 0 or not (work / "client.json").is_file():
            run["error"] = f"the client exited with {client.returncode}: " + \
                (work / "client.log").read_text(errors="replace")[-1500:]
            return run
        res = json.loads((work / "client.json").read_text())
        run["decode_pace"] = server_pace(work)
        run["summary"] = summarize(res["records"], res["hist"], res["res"], a.duration, a.last)
        run["client_cpu_s"], run["client_wall_s"] = res["cpu_s"], res["wall_s"]
        run["records"] = res["records"]
        run["errors"] = sorted({r["err"] for r in res["records"] if r["err"]})[:10]
    finally:
        serving.close()
    return run


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
        done = [{**r, "summary": {**r["summary"], **goodput(r.get("records") or [], duration, slo, last)}}
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
        ratio = bootstrap_ratio([s["tok_s"] for s in ss], base_all)
        ratio_last = bootstrap_ratio([s["tok_s_last"] for s in ss], base_last)
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
            g = bootstrap_ratio([s["goodput_tok_s"] for s in ss], [s["goodput_tok_s"] for s in by[baseline]])
            g_last = bootstrap_ratio([s["goodput_last_tok_s"] for s in ss],
                                     [s["goodput_last_tok_s"] for s in by[baseline]])
            summary[n].update(goodput_runs=[s["goodput_tok_s"] for s in ss], goodput_ratio=g,
                              goodput_last_runs=[s["goodput_last_tok_s"] for s in ss], goodput_ratio_last=g_last)
            att = "-" if math.isnan(med["attained"]) else f"{med['attained']:.1%}"
            row += f" {fmt(med['goodput_tok_s'])} | {att} | {r(g)} | {r(g_last)} |"
        rows.append(row)
    return "\n".join(rows), summary


def _nan(x: Any) -> Any:
    """None (a NaN written to the strict JSON) → NaN again."""
    if x is None:
        return math.nan
    if isinstance(x, dict):
        return {k: _nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan(v) for v in x]
    return x


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
    placed = ("the scheduler's main thread alone on CPU 0 (pin())" if st.get("pin") else
              "not pinned (sglang binds threads only on AMX or arm64 CPUs)")
    orders = {"rotate": " (each round's order rotated by one)", "given": " (in the order given)"}
    out = [f"`{command}`", "",
           f"{st['runs']} round(s) of {st['duration']:.0f} s, c = {st['concurrency']}, workload "
           f"{doc['workload']['source']} (seed {doc['workload']['seed']}), base args `{shlex.join(doc['base_args'])}`, "
           f"one OpenMP thread, {placed}; configurations interleaved{orders.get(st.get('order'), '')}, each run on a "
           "fresh server.", "", "```",
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=None, help="comma-separated configurations (default: alone,ebctl)")
    ap.add_argument("--runs", type=int, default=None, help="rounds; each runs every configuration once (default 3)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load per run (default 480)")
    ap.add_argument("--last", type=float, default=None,
                    help="the last part's length (s) for its throughput (default 240)")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds to wait for the requests in flight at the end")
    ap.add_argument("--concurrency", type=int, default=24, help="requests always in flight")
    ap.add_argument("--trace", default=None, help="a trace CSV or an `ebctl simulate` workload name "
                    "(default: the issue's workload)")
    ap.add_argument("--requests", type=int, default=480, help="(input, output) pairs, cycled in order")
    ap.add_argument("--seed", type=int, default=0, help="lengths' seed; prompts use seed, run number")
    ap.add_argument("--server-args", default="", help="sglang flags added to the base args of every "
                    "configuration; write --server-args='--flag ...' (with =)")
    ap.add_argument("--order", choices=("rotate", "given"), default="rotate",
                    help="each round's order: rotated by one configuration per round (default), or as given")
    ap.add_argument("--baseline", default=None, help="the configuration ratios are to (default: the first)")
    ap.add_argument("--status-every", type=float, default=None,
                    help="seconds between daemon status reads (default 60)")
    ap.add_argument("--json", type=Path, default=None, help="write everything here")
    ap.add_argument("--venv", default=None, help="the sglang CPU environment (default: tools/sglang_env.sh's)")
    ap.add_argument("--workdir", type=Path, default=None, help="logs and runtime dirs (default: a temporary one)")
    ap.add_argument("--model", type=Path, default=None,
                    help="a tiny model already built by make_tiny_model.py (default: build one in the workdir)")
    ap.add_argument("--quick", action="store_true",
                    help="CI: alone,ebctl, 1 run, 45 s, --last 20, status every 15 s (each unless given)")
    ap.add_argument("--report", type=Path, default=None, help="write a markdown record of the A/B here")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="run nothing: read a finished A/B's --json and print (with --report, write) its record")
    ap.add_argument("--slo", type=parse_slo, default=None, metavar="TTFT,TPOT",
                    help="the operator's targets in seconds, e.g. 1.0,0.05: adds goodput (output tok/s of the "
                         "requests meeting both), attainment and the goodput ratio (with --from-json too)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave sglang's threads where the kernel puts them (default: the scheduler's main thread on "
                         "CPU 0, everything else on the other CPUs; see pin())")
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.client:
        return client_main(a.client)
    if a.from_json:
        doc = _nan(json.loads(a.from_json.read_text()))
        st = doc["settings"]
        for r in doc["runs"]:  # recorded before the pace was: from the run's logs where they are still there
            if "decode_pace" not in r and r.get("workdir") and Path(r["workdir"]).is_dir():
                r["decode_pace"] = server_pace(Path(r["workdir"]))
        if a.slo:
            st["slo"] = list(a.slo)
        cmd = "python tools/ab_real.py " + " ".join(
            f"--{k.replace('_', '-')}{'=' if k == 'server_args' else ' '}{shlex.quote(str(v))}" for k, v in st.items()
            if isinstance(v, str | int | float) and v not in (False, "") and v == v
            and k in ("configs", "runs", "order", "duration", "last", "trace", "server_args"))
        if isinstance(st.get("slo"), list):
            cmd += f" --slo {st['slo'][0]:g},{st['slo'][1]:g}"
        md = report(doc, cmd)
        if a.report:
            a.report.write_text(md)
        print(md)
        return 0
    harness()  # puts tools/sglang_cpu on the path
    from server import exit_on_sigterm

    exit_on_sigterm()
    for key, full, quick in (("runs", 3, 1), ("duration", 480.0, 45.0), ("last", 240.0, 20.0),
                             ("status_every", 60.0, 15.0)):
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else full)
    names = [x.strip() for x in (a.configs or "alone,ebctl").split(",") if x.strip()]
    try:
        cfgs = [parse_config(n) for n in names]
    except ValueError as e:
        ap.error(str(e))
    if len(set(names)) != len(names):
        ap.error(f"--configs {a.configs}: a configuration is named twice")
    baseline = a.baseline or names[0]
    if baseline not in names:
        ap.error(f"--baseline {baseline}: not among --configs")
    if not (a.duration > 0 and a.status_every > 0 and a.runs >= 1 and a.concurrency >= 1):
        ap.error("--duration, --status-every, --runs and --concurrency must be positive")
    a.last = min(a.last, a.duration)

    if a.trace:
        from ebctl.sim import workloads

        wl = workloads.load(a.trace, a.requests, seed=a.seed)
        pairs = [(int(i), int(o)) for i, o in zip(wl.input_len, wl.output_len, strict=True)]
    else:
        pairs = issue_workload(a.requests, a.seed)

    if a.pin:  # what this tool starts inherits the other CPUs; pin() then moves each scheduler's main thread
        os.sched_setaffinity(0, (set(range(os.cpu_count() or 1)) - {0}) or {0})
    h = harness()
    from server import ensure_installed, sglang_venv

    venv = sglang_venv(a.venv)
    ensure_installed(venv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="ebab-"))  # short: unix socket paths ≤ 107 bytes
    work.mkdir(parents=True, exist_ok=True)
    model = a.model or work / "model"
    subprocess.run([str(venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                    str(model)], check=True, capture_output=True)  # idempotent: nothing to do for a built one
    ctx = json.loads((model / "config.json").read_text()).get("max_position_embeddings", 2048)
    too_long = sum(i + o > ctx for i, o in pairs)
    if too_long:
        ap.error(f"{too_long} of the {len(pairs)} requests exceed the tiny model's context ({ctx} tokens)")
    ids = model_vocab(model)
    args = base_args(a.server_args)
    mean_in, mean_out = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
    print(f"[ab] {', '.join(names)}: {a.runs} round(s) of {a.duration:.0f} s, c = {a.concurrency}, "
          f"{len(pairs)} pairs ({a.trace or 'the issue workload'}, seed {a.seed}: mean input {mean_in:.1f}, mean "
          f"output {mean_out:.1f}); fresh random prompts from {len(ids)} token ids\n[ab] base args: "
          f"{shlex.join(args)}; torch {h.ONE_TORCH_CORE}; workdir {work}", flush=True)

    t_start, commit = time.monotonic(), head_commit()
    width = max(len(n) for n in names)
    runs: list[dict[str, Any]] = []
    count = 0
    for rnd in range(1, a.runs + 1):
        for cfg in round_order(cfgs, rnd, a.order):
            count += 1
            run = run_one(h, venv, model, work / f"r{count}", cfg, args, a, pairs, ids, a.seed * 1_000_003 + count)
            run["round"] = rnd
            runs.append(run)
            print(run_line(rnd, a.runs, run, width), flush=True)
            if a.json:
                write_json(a, names, args, pairs, runs, None, commit)

    text, summary = table(names, runs, baseline, a.last, slo=a.slo, duration=a.duration)
    cpu = [r["client_cpu_s"] / r["client_wall_s"] for r in runs if "client_cpu_s" in r]
    print(f"\n`python tools/ab_real.py {shlex.join(sys.argv[1:] if argv is None else argv)}`: "
          f"{time.monotonic() - t_start:.0f} s in all; medians over runs; ratio: bootstrap median "
          f"[95% interval] of mean output tok/s against {baseline}\n")
    print(text)
    print("\n".join(pace_table(names, runs)))
    if cpu:
        print(f"\nclient CPU: {min(cpu):.1%}-{max(cpu):.1%} of one core (user + system over its wall time)")
    bad = [r for r in runs if "summary" not in r or r["summary"]["failed"] or r["summary"]["unfinished"]]
    if a.json:
        write_json(a, names, args, pairs, runs, summary, commit)
    if a.report:
        cmd = f"python tools/ab_real.py {shlex.join(sys.argv[1:] if argv is None else argv)}"
        doc = {"settings": {**vars(a), "baseline": baseline}, "configs": names, "runs": runs, "base_args": args,
               "workload": {"source": a.trace or "issue", "seed": a.seed}, "bin_s": BIN_S}
        a.report.write_text(report(doc, cmd))
    for r in bad:
        print(f"[ab] NOT OK: round {r['round']} {r['config']}: "
              f"{r.get('error') or {k: r['summary'][k] for k in ('failed', 'unfinished')}} {r.get('errors') or ''}")
    return 1 if bad else 0


def round_order(items: list, rnd: int, order: str) -> list:
    """Round ``rnd``'s (1-based) running order: ``given``, or ``rotate``d to start at item ``rnd - 1`` (mod n)."""
    r = (rnd - 1) % len(items) if order == "rotate" and items else 0
    return items[r:] + items[:r]


def write_json(a: Any, names: list[str], args: list[str], pairs: list, runs: list, summary: dict | None,
               commit: str | None) -> None:
    doc = {"tool": "ab_real", "commit": commit, "configs": names, "base_args": args,
           "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "client"},
           "workload": {"source": a.trace or "issue", "seed": a.seed, "pairs": pairs}, "bin_s": BIN_S,
           "runs": runs, "summary": summary,
           "ok": summary is not None and all("summary" in r and not r["summary"]["failed"]
                                             and not r["summary"]["unfinished"] for r in runs)}
    a.json.write_text(json.dumps(_finite(doc), separators=(",", ":"), default=str))  # compact: ~100 B a request


def head_commit(repo: Path = REPO) -> str | None:
    """The commit this tool runs from (``repo``'s HEAD, ``+`` if a tracked file differs from it); None outside
    a git work tree."""
    try:
        git = ["git", "-C", str(repo)]
        sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+" if dirty else "")


def _finite(x: Any) -> Any:
    """nan → None, so that the JSON is strict."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


if __name__ == "__main__":
    sys.exit(main())
