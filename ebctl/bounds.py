"""Bounds on what peers send and what the daemon publishes: pure checks of frozen records against the
``daemon.*`` limits (``DaemonConfig``).

The protocol's validation (``protocol.decode``) refuses what no engine could mean (negative counts, NaN
timings); these refuse what no engine does but a hostile or broken peer could send to grow the daemon's
memory or poison its arithmetic: long strings, huge ``finished`` lists, counts beyond any server. Each check
returns the name of the bound that refused (counted under ``rejected["bound:<name>"]`` in status), or None.
"""

from __future__ import annotations

from ebctl.config import DaemonConfig
from ebctl.protocol import DispatchReport, IterationReport, Policy

MAX_GROUP = 1 << 16  # scheduler ranks in one policy group: more than any TP × CP × PP layout

# the fields of a report bounded by daemon.max_running_limit, and by daemon.max_kv_tokens
_REQ_FIELDS = ("prefill_reqs", "decode_reqs", "running", "waiting", "max_running")
_TOKEN_FIELDS = ("prefill_tokens", "decode_ctx_tokens", "kv_used", "kv_total")


def report_fault(r: IterationReport, lim: DaemonConfig) -> str | None:
    """The bound an iteration report breaks, or None."""
    if max(len(r.instance), len(r.mixed_unavailable_reason), max(map(len, r.gate_reasons), default=0)) \
            > lim.max_string or any(len(f.finish_reason) > lim.max_string for f in r.finished):
        return "string"
    if len(r.finished) > lim.max_finished:
        return "finished"
    if any(getattr(r, f) > lim.max_running_limit for f in _REQ_FIELDS) or r.group_size > MAX_GROUP:
        return "requests"
    if any(getattr(r, f) > lim.max_kv_tokens for f in _TOKEN_FIELDS) or any(
            f.input_len > lim.max_kv_tokens or f.output_len > lim.max_kv_tokens for f in r.finished):
        return "tokens"
    if r.prefill_ctx_tokens > r.prefill_tokens * lim.max_kv_tokens:  # a prompt token attends to the KV at most
        return "tokens"
    return None


def dispatch_report_fault(r: DispatchReport, lim: DaemonConfig) -> str | None:
    """The bound a DP controller's report breaks, or None."""
    if max(len(r.instance), len(r.state), len(r.reason), len(r.layout)) > lim.max_string:
        return "string"
    return None


def kept_bytes(r: IterationReport) -> int:
    """What a report kept in ``Engine.recent`` costs, roughly (its ``finished`` list is not kept): a struct of
    ~25 slots, its strings, its gate-reason dict."""
    return 400 + len(r.instance) + len(r.mixed_unavailable_reason) + sum(60 + len(k) for k in r.gate_reasons)


def policy_fault(p: Policy, max_running: int) -> str | None:
    """Why ``p`` must not leave the daemon for an engine that reported ``max_running`` slots (0: unknown), or
    None. The controller never computes such a policy; this is the last check before a bug reaches an engine."""
    if p.k > p.n_max:
        return f"k={p.k} above n_max={p.n_max}"
    if max_running > 0 and p.n_max > max_running:
        return f"n_max={p.n_max} above the engine's max_running={max_running}"
    return None
