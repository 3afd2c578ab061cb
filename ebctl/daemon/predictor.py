"""The model's rankings, run off the report path: one worker process, one ranking at a time, for every engine.

A ranking (``ebctl.predict``: every arm on the engine simulator) takes seconds of CPU; the daemon's per-report
budget is milliseconds (docs/benchmarks.md). So the shell calls :meth:`Predictor.poll` once per republish tick:
it hands a finished ranking to its engine's controller (``Controller.take_predictions``) and submits the next
request one controller has (``Controller.prediction_request``), engines in turn. The worker is a spawned process
(``concurrent.futures.ProcessPoolExecutor``, one worker, started at the first request: a daemon without a profile
never starts it) that loads the profile by its name or path and prices iterations with it
(``ebctl.sim.costs.build``) or with the online fits the request carries.

Fail-open: a worker that dies, a ranking that raises or runs past ``TIMEOUT_S`` is the controller's
``prediction_failed`` (its search goes on unranked, and asks again later); the pool is replaced at the next
request. Nothing here blocks: ``poll`` only looks at a future.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from functools import cache
from typing import Any

log = logging.getLogger("ebctl.daemon")

TIMEOUT_S = 300.0  # a ranking running longer is abandoned (its worker killed)


@cache
def _profile_model(profile: str) -> Any:
    from ebctl import profiles
    from ebctl.sim.costs import build

    return build(profiles.load(profile))


def rank(profile: str, sample: Any, fits: Any) -> tuple:
    """The worker's job: ``sample``'s arms on ``profile``'s costs, or on ``fits`` where given."""
    from ebctl import predict

    return predict.predict(sample, predict.cost_model(_profile_model(profile) if profile else None, fits))


class Predictor:
    """One ranking in flight at most; ``poll`` it from the shell's timer, ``close`` it at exit."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._job: tuple[str, Future, float] | None = None  # (engine id, future, monotonic start)
        self._turn = 0  # where the next look for a request starts among the engines
        self.counts = {"ranked": 0, "failed": 0}

    def poll(self, engines: dict[str, Any], profile: str, mono: float) -> None:
        """Collect the ranking in flight if done (or abandon it past TIMEOUT_S); else submit the next request."""
        if self._job is not None:
            eid, fut, started = self._job
            eng = engines.get(eid)
            if fut.done():
                self._job = None
                try:
                    preds = fut.result()
                except Exception as e:  # the worker died, or the ranking raised: the search goes on unranked
                    self._failed(eng, f"{type(e).__name__}: {e}")
                else:
                    self.counts["ranked"] += 1
                    if eng is not None:
                        eng.controller.take_predictions(preds)
            elif mono - started > TIMEOUT_S:
                self._job = None
                self._failed(eng, f"ranking took more than {TIMEOUT_S:.0f} s")
                self._kill()
            return
        ids = list(engines)
        for i in range(len(ids)):
            eid = ids[(self._turn + i) % len(ids)]
            req = engines[eid].controller.prediction_request()
            if req is None:
                continue
            self._turn = (self._turn + i + 1) % len(ids)
            try:
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                self._job = (eid, self._pool.submit(rank, profile, *req), mono)
            except Exception as e:  # a pool that cannot start: this engine asks again later
                self._failed(engines[eid], f"{type(e).__name__}: {e}")
                self._kill()
            return

    def _failed(self, eng: Any, why: str) -> None:
        self.counts["failed"] += 1
        log.warning("the model's ranking failed: %s", why)
        if eng is not None:
            eng.controller.prediction_failed(why)
        if self._pool is not None and getattr(self._pool, "_broken", False):
            self._kill()

    def _kill(self) -> None:
        """Drop the pool, its worker killed (a ranking cannot be cancelled once it runs)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.kill()
        deadline = time.monotonic() + 2.0
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        self._job = None
        self._kill()
