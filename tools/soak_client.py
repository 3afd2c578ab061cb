"""The soak's load client: ``python tools/soak_client.py SPEC.json``, a process of its own in the server's Python
(asyncio on uvloop where installed, aiohttp: both come with sglang), so that the load a soak offers does not
depend on the soak process's own threads (a thread per request ran out of file descriptors at 70 req/s, and
its CPU was the servers' CPU).

The spec (JSON): ``urls`` {server name: base URL}; ``pairs`` [(input, output)] cycled in order; ``ids`` the
token ids a prompt may use; ``seed``; ``loop``:

- ``closed``: ``concurrency`` requests always in flight on the servers in turn for ``duration`` seconds; the
  completions per second are written to ``out`` as ``{"capacity": ...}`` (what the open loop's rate is a
  share of);
- ``open``: requests arrive as a Poisson process of ``rate`` per second until SIGTERM, each sent to the next
  server (round robin) that ``up`` (a JSON file {name: bool}, re-read whenever it changes) lists as up;
  every finished request is appended to ``out`` as one JSON line ``{n, server, sent, done, ok, error}`` (wall
  clock seconds: the soak compares them with the times it killed a server). On SIGTERM no more arrive; those
  in flight get ``drain`` seconds, then are written as failed ("unfinished"). Every second ``progress`` is
  rewritten: ``{sent, ok, failed, in_flight: {name: n}}``.

Every request is a fresh random prompt (the radix cache never skips a prefill), not streamed, ``ignore_eos``
with ``max_new_tokens`` the pair's output length, temperature 0, ``timeout`` seconds at most (default 300).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _write(path: str, doc: Any) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, path)


async def run(spec: dict[str, Any]) -> int:
    import asyncio

    import aiohttp

    rng = random.Random(spec["seed"])
    arrivals_rng = random.Random(rng.random())
    urls, pairs, ids = spec["urls"], spec["pairs"], spec["ids"]
    names = list(urls)
    up = dict.fromkeys(names, True)
    up_mtime = [0.0]
    counts = {"sent": 0, "ok": 0, "failed": 0}
    in_flight: dict[int, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    timeout = aiohttp.ClientTimeout(total=float(spec.get("timeout", 300.0)))

    async def one(session: aiohttp.ClientSession, server: str, n: int) -> dict[str, Any]:
        n_in, n_out = pairs[n % len(pairs)]
        body = {"input_ids": rng.choices(ids, k=n_in),
                "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0.0}}
        rec: dict[str, Any] = {"n": n, "server": server, "sent": time.time(), "done": None, "ok": False,
                               "error": None}
        in_flight[n] = rec
        counts["sent"] += 1
        try:
            async with session.post(f"{urls[server]}/generate", json=body) as r:
                text = await r.text()
                if r.status != 200:
                    rec["error"] = f"HTTP {r.status}: {text[:200]}"
                else:
                    got = json.loads(text).get("meta_info", {}).get("completion_tokens", n_out)
                    rec["ok"] = got == n_out
                    if not rec["ok"]:
                        rec["error"] = f"{got} of {n_out} tokens"
        except asyncio.CancelledError:
            rec["error"] = "unfinished"
            raise
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            rec["done"] = time.time()
            in_flight.pop(n, None)
            counts["ok" if rec["ok"] else "failed"] += 1
            done.append(rec)
        return rec

    def read_up() -> None:
        with contextlib.suppress(OSError, ValueError):
            m = os.stat(spec["up"]).st_mtime
            if m != up_mtime[0]:
                up_mtime[0] = m
                up.update({k: bool(v) for k, v in json.loads(Path(spec["up"]).read_text()).items() if k in up})

    # a connection per request, as sglang's bench_serving opens one: a kept-alive one that the server closes as
    # it is reused fails the request on the client's side ("Can not write request body")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if spec["loop"] == "closed":
            end = time.monotonic() + spec["duration"]
            ok = [0]

            nxt = [0]

            async def worker(k: int) -> None:
                while time.monotonic() < end:
                    nxt[0] += 1  # the next pair of the workload for each request, whichever slot sends it
                    r = await one(session, names[k % len(names)], nxt[0] - 1)
                    if r["ok"] and time.monotonic() < end:
                        ok[0] += 1
            await asyncio.gather(*(worker(k) for k in range(spec["concurrency"])))
            _write(spec["out"], {"capacity": ok[0] / spec["duration"], "sent": counts["sent"]})
            return 0

        out = open(spec["out"], "a")  # noqa: SIM115 -- appended to for the whole run
        tasks: set[asyncio.Task] = set()

        def progress() -> None:
            for rec in done:
                out.write(json.dumps(rec) + "\n")
            done.clear()
            out.flush()
            per: dict[str, int] = dict.fromkeys(names, 0)
            for rec in in_flight.values():
                per[rec["server"]] += 1
            _write(spec["progress"], {**counts, "in_flight": per, "at": time.time()})

        async def housekeeping() -> None:
            last = 0.0
            while True:
                read_up()
                if time.monotonic() - last >= 1.0:
                    last = time.monotonic()
                    progress()
                await asyncio.sleep(0.05)

        keeper = asyncio.ensure_future(housekeeping())
        nxt, k, n = time.monotonic(), 0, 0
        while not stop.is_set():
            nxt += arrivals_rng.expovariate(spec["rate"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, nxt - time.monotonic()))
            if stop.is_set():
                break
            live = [s for s in names if up[s]]
            if not live:
                continue
            server = live[k % len(live)]
            k += 1
            t = asyncio.ensure_future(one(session, server, n))
            n += 1
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=spec["drain"])
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        progress()
        out.close()
    return 0


def main(spec_path: str) -> int:
    import asyncio

    spec = json.loads(Path(spec_path).read_text())
    try:
        import uvloop

        return uvloop.run(run(spec))
    except ImportError:
        return asyncio.run(run(spec))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
