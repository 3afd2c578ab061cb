"""The A/B's load client: ``python ebctl/ab/client.py SPEC.json``, a process of its own in the server's Python
(asyncio on uvloop where it is installed, aiohttp: both come with sglang), so that the controller's process and
the client do not share a core's time. It writes ``{records, hist, res, wall_s, cpu_s}`` to the spec's ``out``.

Two loops (the spec's ``loop``):

- ``closed``: ``concurrency`` requests always in flight until ``duration`` seconds have passed (each slot sends
  its next request when its last one ends); this measures the server saturated, whatever it is asked;
- ``open``: a request at each of the spec's ``arrivals`` (seconds from the start: a Poisson process,
  ``workloads.poisson_arrivals``), whether or not earlier ones have ended, as production traffic comes; a
  request's ``t`` is when it arrived (its TTFT counts from then, the client's own delay in sending it included).

Then it sends nothing more and waits (up to ``drain`` s) for what is in flight. Every request is a fresh random
prompt (token ids drawn from the spec's ``ids``: the radix cache never skips a prefill), streamed (``"stream":
true``, the SSE ``data:`` lines parsed), ``ignore_eos`` with ``max_new_tokens`` = the pair's output length,
temperature 0. A request failed on an HTTP error, an error in the stream, or a stream that ended before its last
token; one still running after the drain is ``unfinished``. Lengths cycle, in order, through the spec's pairs.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run by path: the package beside it, whatever this Python has installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ebctl.ab.stats import HIST_S, add_tokens, stream_summary

SPIN_S = 0.002


def token_ids(spec: dict[str, Any]) -> list[int]:
    """The ids a prompt may use: ``token_ids`` as listed, or ``ids`` = [low, high) less ``exclude`` (the
    tokenizer's special ids)."""
    if "token_ids" in spec:
        return list(spec["token_ids"])
    lo, hi = spec["ids"]
    skip = set(spec.get("exclude") or ())
    return [i for i in range(lo, hi) if i not in skip]


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    import aiohttp
    try:
        from orjson import loads
    except ImportError:
        loads = json.loads

    rng = random.Random(spec["seed"])
    ids, pairs, duration = token_ids(spec), spec["pairs"], spec["duration"]
    url = spec["url"] + "/generate"
    records: list[dict[str, Any]] = []
    hist: list[float] = []
    nxt = [0]
    t0 = time.perf_counter()
    cpu0 = time.process_time()

    async def one(session: aiohttp.ClientSession, sched: float | None = None, due: float | None = None) -> None:
        i = nxt[0] % len(pairs)
        nxt[0] += 1
        n_in, n_out = pairs[i]
        payload = {"input_ids": rng.choices(ids, k=n_in), "stream": True,
                   "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0.0}}
        t = time.perf_counter() - t0 if due is None else due  # the open loop's: when it arrived (TTFT counts from it)
        rec: dict[str, Any] = {"pair": i, "in": n_in, "out": n_out, "t": t, "end": None,
                               "status": "unfinished", "err": None}
        if sched is not None:
            rec["sched"] = round(sched, 5)
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

    async def arrivals(session: aiohttp.ClientSession) -> None:
        sent = []
        for t in spec["arrivals"]:
            while (wait := t - (time.perf_counter() - t0)) > 0:
                # the event loop's timers are as coarse as a millisecond: the last 2 ms are spent yielding
                # (sleep(0)), so that gaps under a millisecond are kept, as a Poisson process has them
                await asyncio.sleep(wait - SPIN_S if wait > SPIN_S else 0)
            sent.append(asyncio.ensure_future(one(session, t, time.perf_counter() - t0)))
        await asyncio.gather(*sent)

    stop = asyncio.Event()  # SIGTERM: the A/B was interrupted; what was measured so far is written
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=spec["drain"])
    # a connection per request, as sglang's bench_serving opens one (a session per request): a kept-alive one
    # that the server closes just as it is reused fails the request on the client's side
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if spec["loop"] == "open":
            tasks = [asyncio.ensure_future(arrivals(session))]
        else:
            tasks = [asyncio.ensure_future(worker(session)) for _ in range(spec["concurrency"])]
        load = asyncio.ensure_future(asyncio.wait(tasks))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([load, stopped], timeout=max(0.0, duration - (time.perf_counter() - t0))
                           + spec["drain"], return_when=asyncio.FIRST_COMPLETED)
        for t in (*tasks, load, stopped):
            t.cancel()
        await asyncio.gather(*tasks, load, stopped, return_exceptions=True)
    return {"records": records, "hist": hist, "res": HIST_S, "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - cpu0, "stopped_at": time.perf_counter() - t0 if stop.is_set() else None}


def main(spec_path: str) -> int:
    import asyncio

    spec = json.loads(Path(spec_path).read_text())
    try:  # sglang depends on uvloop: about a quarter less client CPU than asyncio's own loop
        import uvloop

        out = uvloop.run(run(spec))
    except ImportError:
        out = asyncio.run(run(spec))
    Path(spec["out"]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
