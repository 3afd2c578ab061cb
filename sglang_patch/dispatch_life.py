"""The dispatcher's start, stop, report and trace in the DP controller process (a mixin of
``dispatch_state.DispatchState``, which owns the attributes used here).

``arm`` runs on the first ``DataParallelController.event_loop`` call, so only in that process: it reads the
config, names the dispatcher (``<engine.id_prefix or daemon.node>/dispatch``, else ``dispatch``: the daemon
pairs it with the ranks ``<prefix>/dp<N>``), reads the layout from sglang's runtime context and opens the link.
``fail`` is the fail-open path: log once, flush the buffer through sglang's own dispatch, stay off; a last
report says so, then the link closes. ``report`` sends the state the daemon shows (``ebctl status``).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import threading
from time import time as wall_clock
from typing import Any

from ebctl.protocol import DispatchPolicy, DispatchReport, RankDispatch

log = logging.getLogger("ebctl.sglang")

LINK_CLOSE_DELAY_S = 1.0  # after a failure: time for the last report to leave before the link closes


class DispatchLife:
    """Start, fail-open, report and trace of ``DispatchState``."""

    def arm(self, ctl: Any) -> None:
        """First event_loop call of the DP controller: config, id, layout, link (DataParallelController,
        data_parallel_controller.py:158-267, is fully built by then)."""
        from sglang.srt.managers.utils import is_health_check_generate_req
        from sglang.srt.runtime_context import get_disagg, get_parallel

        from ebctl import config
        from ebctl.link import EngineLink

        self.armed = True
        self.ctl = ctl
        cfg = config.load(os.environ.get("EBCTL_CONFIG") or None)
        if cfg.engine.fault:
            hook, _, n = cfg.engine.fault.partition(":")
            self.fault_hook, self.fault_at = hook.strip(), int(n or 1)
        prefix = cfg.engine.id_prefix or cfg.daemon.node
        self.dispatcher_id = f"{prefix}/dispatch" if prefix else "dispatch"
        self.health_check = is_health_check_generate_req
        if get_disagg().disaggregation_mode == "decode":
            self.layout = "decode"
        elif get_parallel().attn_dp_enabled:
            self.layout = "attention"
        if ctl.load_balance_method.name == "FOLLOW_BOOTSTRAP_ROOM":
            self.never = "--load-balance-method follow_bootstrap_room: each request's rank follows its bootstrap room"
        args = ctl.server_args
        chunk = getattr(args, "chunked_prefill_size", None) or 0
        self.server_chunk = chunk if chunk > 0 else int(getattr(args, "max_prefill_tokens", 0) or 16384)
        self.reader = ctl.load_snapshot_reader
        self.ranks = [r for r in ctl._active_workers if ctl.status[r]]
        self.link = EngineLink.from_config(cfg, self.dispatcher_id, policy_type=DispatchPolicy)
        if cfg.engine.trace_dir:  # line-buffered: a test reads it while the server runs
            self.trace = open(os.path.join(cfg.engine.trace_dir, "dispatch.jsonl"), "a", buffering=1)  # noqa: SIM115
        atexit.register(self.at_exit)
        log.info("ebctl: dispatcher %s active in the DP controller (%s, %d ranks, chunk %d tokens%s), telemetry %s, "
                 "policy %s", self.dispatcher_id, self.layout, len(self.ranks), self.server_chunk,
                 f"; never held: {self.never}" if self.never else "", cfg.endpoint("telemetry"),
                 cfg.endpoint("policy"))
        if self.fault_hook:
            log.warning("ebctl: fault injection armed (engine.fault=%r): a hook will raise on purpose",
                        cfg.engine.fault)

    def fail(self, where: str) -> None:
        """Called in an ``except`` block: log once with the traceback, flush the buffer through sglang's own
        dispatch, stay off (stock dispatch from here on, sglang's own event loop)."""
        if not self.on:
            return
        self.on = self.holding = False
        self.error = self.reason = f"exception in dispatch hook {where}"
        log.exception("ebctl: exception in dispatch hook %s; the ebctl dispatcher is now OFF in the DP controller "
                      "(sglang's own dispatch from here on, the server keeps serving)", where)
        try:
            if self.ctl is not None and self.reqs:
                self.flush("plugin off")
        except Exception:
            log.exception("ebctl: could not flush the dispatcher's buffer")
        if self.link is not None:
            try:
                self.report(wall_clock())
            except Exception:
                log.exception("ebctl: could not send the dispatcher's last report")
            t = threading.Timer(LINK_CLOSE_DELAY_S, self.link.close)
            t.daemon = True
            t.start()
        if self.trace is not None:
            try:  # called from a hook's except block: nothing may escape into sglang from here
                self.trace.write(json.dumps({"t": wall_clock(), "off": where}) + "\n")
            except Exception:
                log.exception("ebctl: could not write the trace")

    def at_exit(self) -> None:
        """Interpreter exit (not SIGKILL): nothing buffered may be left behind."""
        try:
            if self.on and self.reqs and self.ctl is not None:
                self.flush("exit")
        except Exception:
            log.exception("ebctl: could not flush the dispatcher's buffer at exit")

    def fault(self, hook: str) -> None:
        """Raise at the configured call of ``hook`` (engine.fault = "HOOK:N", a test switch)."""
        if hook == self.fault_hook:
            self.fault_calls += 1
            if self.fault_calls == self.fault_at:
                raise RuntimeError(f"ebctl: injected fault in dispatch hook {hook} (engine.fault)")

    def trace_event(self, how: str, rid: Any, rank: int | None = None) -> None:
        """engine.trace_dir: one JSON line per request the dispatcher held or sent, with the rank it chose."""
        self.trace.write(json.dumps({"t": wall_clock(), "rid": str(rid), "how": how, "rank": rank}) + "\n")

    def report(self, now: float) -> None:
        """What the daemon shows for this dispatcher: counters, the clock, each rank; window stats reset."""
        if self.link is None:
            return
        core = self.core
        live = [r for ranks in core.instances for r in ranks] if core is not None and self.holding else []
        window = [self.window_tokens.get(r, 0) for r in live]
        mean = sum(window) / len(window) if window else 0.0
        holds = self.holds
        ranks = tuple(RankDispatch(r, self.sent_reqs.get(r, 0), self.sent_tokens.get(r, 0),
                                   *(_load_fields(self.loads.get(r))),
                                   core.in_flight.tokens(r) if core is not None else 0) for r in self.ranks)
        rep = DispatchReport(
            engine_id=self.dispatcher_id, seq=self.seq, wall_time=now,
            state="failed" if not self.on else "sbs" if self.holding else "stock", reason=self.reason,
            policy_version=self.policy.version if self.policy is not None else -1, layout=self.layout,
            ranks=len(self.ranks), targets=len(core.instances) if core is not None else 0,
            chunk_tokens=core.chunk if core is not None else self.server_chunk, buffered=len(self.reqs),
            buffered_max=self.buffered_max, arrived=self.arrived, released=self.released, releases=self.releases,
            passed=self.passed, overloaded=self.overloaded, flushed=self.flushed, aborted=self.aborted,
            hold_mean_s=sum(holds) / len(holds) if holds else math.nan, hold_max_s=max(holds, default=math.nan),
            interval_s=core.clock.interval if core is not None else math.nan,
            t_fwd_s=core.clock.t_fwd if core is not None else math.nan,
            watchdog_fired=core.clock.watchdog_fired if core is not None else 0,
            lost=len(core.clock.lost) if core is not None else 0,
            load_spread=max(window) / mean if mean > 0 else math.nan, rank=ranks)
        self.seq += 1
        self.link.report(rep)
        self.window_tokens, self.holds, self.buffered_max = {}, [], len(self.reqs)


def _load_fields(load: Any) -> tuple[int, int, int, int]:
    """(running, waiting, queued tokens, used tokens) of a rank's latest snapshot (zeros before the first)."""
    if load is None:
        return 0, 0, 0, 0
    return load.running, load.waiting, load.queued_tokens, load.used_tokens
