"""The plugin's start, stop and status in one scheduler process (a mixin of ``state.PluginState``).

``start`` runs on the first ``get_next_batch_to_run`` of the scheduler: it reads the config, finds where
this rank sits (``reading.ranks``), opens the link on the group's source rank only, and notes the launch
settings it may later restore. ``fail`` is the fail-open path (docs/design.md §3): log once,
restore sglang's launch settings on the scheduler and on the batch being planned, close the link, stay
off. ``status`` is what ``GET /server_info`` shows under ``internal_states[i]["ebctl"]``.
"""

from __future__ import annotations

import json
import logging
import os
from time import monotonic
from typing import Any

from sglang_patch import reading

log = logging.getLogger("ebctl.sglang")

_TIMES = 4096  # per-iteration hook costs kept for status (ns)


class Lifecycle:
    """Start, fail-open and status of ``PluginState`` (it owns the attributes used here)."""

    def start(self, sched: Any) -> None:
        """First iteration of this scheduler: read the config, open the link on the source rank."""
        from ebctl import config
        from ebctl.link import EngineLink

        self.ready = True
        self.sched = sched
        cfg = config.load(os.environ.get("EBCTL_CONFIG") or None)
        self._parse_fault(cfg.engine.fault)
        where = reading.ranks()
        prefix = cfg.engine.id_prefix or cfg.daemon.node
        self.engine_id = f"{prefix}/dp{where.dp}" if prefix else f"dp{where.dp}"
        self.reporting = where.source
        self.group = where.group
        self.launch_mixed = bool(sched.is_mixed_chunk)
        self.mixed_reason = reading.mixed_unavailable_reason(sched, allow_without_flag=cfg.engine.mixed_without_flag)
        self.mixed_unavailable = bool(self.mixed_reason)
        self.max_running = int(sched.max_running_requests)
        self.kv_total = int(sched.max_total_num_tokens)
        self._kv_used = reading.kv_used_reader(sched)
        self.sync_forward = str(sched.device) == "cpu"
        self.kinds = reading.batch_kinds()
        if self.reporting:
            # the link refuses a policy above this scheduler's own cap (counted in its stats' "rejected")
            self.link = EngineLink.from_config(cfg, self.engine_id, max_running=self.max_running)
        if cfg.engine.trace_dir:  # line-buffered: a test reads it while the server runs
            path = os.path.join(cfg.engine.trace_dir, f"trace.dp{where.dp}.r{where.rank}.jsonl")
            self.trace = open(path, "a", buffering=1)  # noqa: SIM115 -- open for the process's life
        log.info("ebctl: plugin active in this scheduler: engine %s (%s rank of a group of %d), telemetry %s, "
                 "policy %s%s", self.engine_id, "source" if self.reporting else "follower", self.group,
                 cfg.endpoint("telemetry"), cfg.endpoint("policy"),
                 f"; mb unavailable: {self.mixed_reason}" if self.mixed_reason else "")

    def fail(self, where: str, running_batch: Any = None, sched: Any = None) -> None:
        """Called in an ``except`` block: log once with the traceback, restore stock settings, stay off.
        ``running_batch``: the batch being planned when the failure is inside planning (not yet
        ``sched.running_batch``): admission is reopened on it and on the scheduler's. ``sched``: the
        scheduler, when the hook has it (else the one ``start`` saw)."""
        if not self.on:
            return
        self.on = False
        self.farewell = self.reporting and self.group > 1  # tell the group's other ranks: stock from now on
        self.error = f"exception in hook {where}"
        log.exception("ebctl: exception in hook %s; the ebctl plugin is now OFF in this scheduler process "
                      "(stock sglang from here on, the server keeps serving)", where)
        self.unapply(running_batch, sched)
        try:
            if self.link is not None:
                self.link.close()
        except Exception:
            log.exception("ebctl: could not close the link")
        if self.trace is not None:
            try:  # called from a hook's except block: nothing may escape into sglang from here
                self.trace.write(json.dumps({"it": self.iterations, "off": where}) + "\n")
            except Exception:
                log.exception("ebctl: could not write the trace")

    def unapply(self, running_batch: Any = None, sched: Any = None) -> None:
        """Back to sglang as launched: launch mixing, no cap, no gate; admission reopened if we closed it."""
        closed = self.cap is not None or self.hold_new or self.held
        self.cap, self.gate_policy, self.hold_new, self.held = None, None, False, False
        sched = sched or self.sched
        if sched is None:
            return
        try:
            if self.launch_mixed is not None:
                sched.is_mixed_chunk = self.launch_mixed
            if closed:  # our cap or a chunk held alone may have set the sticky batch_is_full
                sched.running_batch.batch_is_full = False
                if running_batch is not None:
                    running_batch.batch_is_full = False
        except Exception:
            log.exception("ebctl: could not restore sglang's settings")

    def _parse_fault(self, spec: str) -> None:
        if spec:
            hook, _, n = spec.partition(":")
            self.fault_hook, self.fault_at = hook.strip(), int(n or 1)
            log.warning("ebctl: fault injection armed (engine.fault=%r): a hook will raise on purpose", spec)

    def fault(self, hook: str) -> None:
        """Raise at the configured call of ``hook`` (engine.fault, a test switch)."""
        if hook == self.fault_hook:
            self.fault_calls += 1
            if self.fault_calls == self.fault_at:
                raise RuntimeError(f"ebctl: injected fault in hook {hook} (engine.fault)")

    def status(self, sched: Any) -> dict[str, Any]:
        """The plugin's state for humans and tests. A rank alone in its group refreshes the policy first
        (an idle engine does not); in a group only the broadcast changes it (ranks must not diverge)."""
        if self.on and self.ready and self.group == 1:
            self.refresh(sched, monotonic())
        p = self.policy
        n = min(self.n_times, _TIMES)
        ns = sorted(self.times[:n])
        link = self.link.stats() if self.link is not None and self.on else None
        return {
            "enabled": self.on, "started": self.ready, "error": self.error, "engine_id": self.engine_id,
            "steering": self.on and self.ready, "reporting": self.reporting, "group_size": self.group,
            "policy_version": self.version, "group_generation": self.applied_gen,
            "mode": "none" if p is None else str(p.mode), "k": p.k if p else None,
            "n_max": p.n_max if p else None, "launch_mixed_chunk": self.launch_mixed,
            "is_mixed_chunk": bool(getattr(sched, "is_mixed_chunk", False)),
            "mixed_unavailable": self.mixed_unavailable, "mixed_unavailable_reason": self.mixed_reason,
            "iterations": self.iterations, "reports": self.reports, "finished": self.finished,
            "defers": self.defers, "capped": self.capped, "chunk_alone": self.chunk_alone,
            "mixed_steps": self.mixed_steps, "gate_reasons": {str(r): c for r, c in self.gate.counts.items() if c},
            "link": link,
            "hook_ns": {"iterations": n, "p50": ns[n // 2] if n else None,
                        "p99": ns[min(n - 1, (99 * n) // 100)] if n else None, "max": ns[-1] if n else None},
        }
