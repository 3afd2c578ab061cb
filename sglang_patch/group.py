"""One policy for every rank of a scheduling group, carried on the broadcast sglang already makes.

With tensor, context or pipeline parallelism (attention TP × attention CP × PP > 1) several scheduler
processes run over the same requests and must form identical batches at every iteration, or their
collectives hang. Only the group's source rank (attention-TP 0, attention-CP 0, PP stage 0) reads its
requests from the tokenizer, and hands them to the others each iteration: ``broadcast_pyobj`` over the TP
CPU group, ``attn_cp_tp_broadcast_pyobj`` under DP attention
(``SchedulerRequestReceiver._broadcast_reqs_across_ranks``, scheduler_components/request_receiver.py:163-213),
and ``point_to_point_pyobj`` to the next PP stage, which relays the list ``ingest_requests`` returns
(scheduler_pp_mixin.py:139-146, 748-766).

The source rank, the only one that talks to the daemon, appends an :data:`Envelope` to the requests it
broadcasts (as ``local_reqs``, which ride the same broadcast, request_receiver.py:84-86, 174, 203): the
source's clock and, when its applied policy changed, the new policy (or "stock"). Every rank, the source
included, takes the envelope out of the list in ``Scheduler.process_input_requests`` (the list relayed to
the next PP stage keeps it) and applies what it says before that iteration's batch is planned. So every
rank applies the same policy at the same iteration and measures the gate's deferral clock on the same
(source's) clock. No collective is added; the one socket is the way back for a follower's fault
(``group_fault.py``). A rank never judges a policy's expiry itself: the source does, and broadcasts "stock"
when its policy expires or when its plugin switches off (its own fault, or a follower's).

Pure: plain functions and tuples, no sglang, no sockets.
"""

from __future__ import annotations

from typing import Any

from ebctl.protocol import Policy, ProtocolError, decode, encode

TAG = "ebctl.policy/1"
STOCK = b""  # the payload that means: no policy, sglang as launched

# (TAG, generation, source's monotonic clock, payload): payload None = no change since the last envelope,
# STOCK, or an encoded Policy. A plain tuple of builtins: every rank unpickles it without importing ebctl.
Envelope = tuple[str, int, float, bytes | None]


def envelope(gen: int, now: float, payload: bytes | None) -> Envelope:
    return (TAG, gen, now, payload)


def payload_of(policy: Policy | None) -> bytes:
    """What an envelope carries for ``policy`` (None: stock)."""
    return STOCK if policy is None else encode(policy)


def is_envelope(obj: Any) -> bool:
    return type(obj) is tuple and len(obj) == 4 and obj[0] == TAG


def split(reqs: list) -> tuple[list, Envelope | None]:
    """``reqs`` without envelopes, and the last envelope that carries a payload if any, else the last one
    (several can queue when sglang defers input past a pause, scheduler.py:2184-2215)."""
    rest, last, last_payload = [], None, None
    for r in reqs:
        if is_envelope(r):
            last = r
            if r[3] is not None:
                last_payload = r
        else:
            rest.append(r)
    if last is not None and last_payload is not None and last_payload is not last:
        last = envelope(last[1], last[2], last_payload[3])  # the newest clock, the newest policy
    return rest, last


def policy_of(payload: bytes) -> Policy | None:
    """The policy an envelope's payload carries; None for stock or for a payload that does not decode
    (a rank that cannot read it runs stock, as the source would on any error)."""
    if not payload:
        return None
    try:
        return decode(payload, Policy)
    except ProtocolError:
        return None
