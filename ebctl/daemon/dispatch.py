"""The daemon's side of staggered batch scheduling (``ebctl.sbs``, the second paper) for SGLang's DP controller.

* T̄_fwd per DP rank: the mean of the last ``dispatch.fwd_window`` forward times each rank's scheduler
  reports (``IterationReport.forward_s`` of its non-idle iterations; Algorithm 1 lines 15-19). The DP
  controller cannot see forward times (its load snapshots only move when a forward ends), so the daemon,
  which receives every iteration, measures them.
* One record per dispatcher (the plugin in a DP controller process; id ``<prefix>/dispatch`` or
  ``dispatch``), from its ``DispatchReport`` every half second: what status and the metrics show.
* Its policy (``DispatchPolicy``): mode, T̄_fwd (the mean over its ranks) and I_opt, the watchdog factor,
  IQR k, N_limit, chunk capacity, drained ranks, poll period; versioned, with the TTL of
  ``controller.ttl_s``. Published like an engine's policy: when the dispatcher first reports, when the
  ``[dispatch]`` config changes, and every ``daemon.republish_s``.

A dispatcher's ranks are the engines reporting under the same prefix: ``dispatch`` ↔ ``dp0``, ``dp1``, ...;
``node1/dispatch`` ↔ ``node1/dp0``, ... (the ids the plugin gives each scheduler rank). Plain data and
arithmetic: the sockets are the shell's (``shell.py``).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ebctl.config import Config
from ebctl.link import topic
from ebctl.protocol import BatchKind, DispatchPolicy, DispatchReport, IterationReport
from ebctl.sbs.types import parse_ranks

MAX_DISPATCHERS = 256  # dispatcher ids beyond this are refused: a bounded daemon, whatever peers send
SUFFIX = "dispatch"


@dataclass(slots=True)
class DispatchRecord:
    """One dispatcher: its latest report and what was published to it (monotonic times)."""

    dispatcher_id: str
    topic: bytes
    created: float
    pattern: re.Pattern[str]  # its ranks' engine ids; group 1: the DP rank
    report: DispatchReport | None = None
    last_report: float = math.nan
    instance: str = ""
    restarts: int = 0  # a new process took over this id (the DP controller restarted)
    reports: int = 0
    version: int = -1
    content: tuple = ()  # the policy last published, without version and issue time
    published_cfg: Any = None  # the (dispatch config, ttl) it was computed from
    published_at: float = math.nan
    policy: DispatchPolicy | None = None


def rank_pattern(dispatcher_id: str) -> re.Pattern[str]:
    """Engine ids of the ranks a dispatcher feeds: ``<prefix>/dp<N>`` for ``<prefix>/dispatch``."""
    prefix = dispatcher_id[:-len(SUFFIX)]  # "" or "node1/"
    return re.compile(re.escape(prefix) + r"dp(\d+)")


@dataclass(slots=True)
class DispatchSide:
    """Forward-time windows of every engine, the dispatchers' records and their policies."""

    window: int = 64
    forwards: dict[str, deque[float]] = field(default_factory=dict)
    dispatchers: dict[str, DispatchRecord] = field(default_factory=dict)
    refused: int = 0  # reports from ids that are not "<prefix>dispatch" or beyond MAX_DISPATCHERS

    def forward(self, r: IterationReport) -> None:
        """An engine's iteration: its forward time joins that rank's window (idle steps have none)."""
        if r.kind is not BatchKind.IDLE and r.forward_s > 0:
            w = self.forwards.get(r.engine_id)
            if w is None:
                w = self.forwards[r.engine_id] = deque(maxlen=self.window)
            w.append(r.forward_s)

    def set_window(self, window: int) -> None:
        if window != self.window:
            self.window = window
            self.forwards = {eid: deque(w, maxlen=window) for eid, w in self.forwards.items()}

    def ingest(self, rep: DispatchReport, mono: float) -> DispatchRecord | None:
        """A dispatcher's report; its record when the policy should go out now (a new dispatcher or process)."""
        rec = self.dispatchers.get(rep.engine_id)
        if rec is None:
            did = rep.engine_id
            if not (did == SUFFIX or did.endswith("/" + SUFFIX)) or len(self.dispatchers) >= MAX_DISPATCHERS:
                self.refused += 1
                return None
            rec = self.dispatchers[rep.engine_id] = DispatchRecord(rep.engine_id, topic(rep.engine_id), mono,
                                                                   rank_pattern(rep.engine_id))
        fresh = rep.instance != rec.instance
        if fresh and rec.instance:
            rec.restarts += 1
        rec.instance, rec.report, rec.last_report = rep.instance, rep, mono
        rec.reports += 1
        return rec if fresh else None

    def t_fwd_by_rank(self, rec: DispatchRecord) -> dict[int, float]:
        out = {}
        for eid, w in self.forwards.items():
            m = rec.pattern.fullmatch(eid)
            if m and w:
                out[int(m.group(1))] = sum(w) / len(w)
        return out

    def policy(self, rec: DispatchRecord, cfg: Config, now: float) -> DispatchPolicy:
        """The dispatcher's policy now; its version moves when its content does."""
        d = cfg.dispatch
        by_rank = self.t_fwd_by_rank(rec)
        t_fwd = sum(by_rank.values()) / len(by_rank) if by_rank else d.t_default_s
        targets = max(1, rec.report.targets if rec.report is not None else 1)
        reasons = []
        if d.mode != "sbs":
            reasons.append("dispatch.mode = off: sglang's own --load-balance-method")
        if not by_rank:
            reasons.append(f"no rank reported a forward yet: T̄_fwd = dispatch.t_default_s ({d.t_default_s:g} s)")
        fields = dict(mode=d.mode, t_fwd_s=t_fwd, t_fwd_by_rank=by_rank, interval_s=(t_fwd + d.l_net_s) / targets,
                      l_net_s=d.l_net_s, watchdog_factor=d.watchdog_factor, fixed_interval_s=d.fixed_interval_s,
                      chunk_tokens=d.chunk_tokens, n_limit=d.n_limit, iqr_k=d.iqr_k,
                      drain_ranks=parse_ranks(d.drain_ranks), poll_s=d.poll_s, reason="; ".join(reasons))
        content = tuple(fields.items())
        if content != rec.content:
            rec.version += 1
            rec.content = content
        rec.published_cfg = (d, cfg.controller.ttl_s)
        return DispatchPolicy(engine_id=rec.dispatcher_id, version=rec.version, issued_at=now,
                              ttl_s=cfg.controller.ttl_s, **fields)

    def status(self, mono: float) -> dict[str, Any]:
        """What ``ebctl status`` shows per dispatcher: its latest report, the policy in force, ages."""
        out = {}
        for did, rec in self.dispatchers.items():
            rep = msgspec.to_builtins(rec.report) if rec.report is not None else {}
            for k in ("v", "type", "engine_id", "instance"):
                rep.pop(k, None)
            pol = rec.policy
            out[did] = {**rep, "policy": None if pol is None else {
                k: v for k, v in msgspec.to_builtins(pol).items() if k not in ("v", "type", "engine_id")},
                "reports": rec.reports, "restarts": rec.restarts, "last_report_age_s": mono - rec.last_report,
                "policy_age_s": mono - rec.published_at}
        return out
