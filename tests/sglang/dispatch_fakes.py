"""Stand-ins for what the DP controller's dispatcher reads and calls in sglang (tests/sglang/
test_sglang_dispatch_unit.py and tools/bench_sbs.py; no sglang needed): requests and control messages with
sglang 0.5.23's class names (the dispatcher checks them by name), the load snapshot reader, and a
``DataParallelController`` whose hooked methods call ``sglang_patch.dispatch``'s hooks around recording originals.
"""

from __future__ import annotations

from types import SimpleNamespace

from sglang_patch import dispatch
from sglang_patch.dispatch_life import DispatchSetup
from sglang_patch.dispatch_state import DispatchState


class TokenizedGenerateReqInput(SimpleNamespace):  # sglang's class name is what the dispatcher checks
    pass


class TokenizedEmbeddingReqInput(SimpleNamespace):
    pass


class AbortReq(SimpleNamespace):
    pass


class FlushCacheReqInput(SimpleNamespace):
    pass


class GetInternalStateReq(SimpleNamespace):
    pass


def gen(rid: str, tokens: int = 10, rank: int | None = None) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(rid=rid, input_ids=[7] * tokens, routed_dp_rank=rank)


class Reader:
    """``load_snapshot_reader``: what each rank published last."""

    def __init__(self, ranks: int) -> None:
        self.snaps = {r: snap(r, 0.0) for r in range(ranks)}
        self.reads = 0

    def read_all(self):
        self.reads += 1
        return list(self.snaps.values())

    def publish(self, rank: int, ts: float, **kw) -> None:
        self.snaps[rank] = snap(rank, ts, **kw)


def snap(rank, ts, running=0, waiting=0, queued=0, used=0, total=0):
    return SimpleNamespace(dp_rank=rank, timestamp=ts, num_running_reqs=running, num_waiting_reqs=waiting,
                           num_waiting_uncached_tokens=queued, num_used_tokens=used, num_total_tokens=total)


class Ctl:
    """``DataParallelController`` with the hooks applied as HookRegistry would: each hooked method is the hook
    around a recording original. ``sent``: (rid, routed_dp_rank) per call of sglang's dispatch, in order."""

    def __init__(self, ranks: int = 2, fail_routed: bool = False) -> None:
        self._active_workers = list(range(ranks))
        self.status = [True] * ranks  # ActiveRanksOutput's view
        self.load_snapshot_reader = Reader(ranks)
        self.sent: list[tuple[str, int | None]] = []
        self.controls: list[str] = []
        self.fail_routed = fail_routed

    def _dispatch(self, req):
        if self.fail_routed and req.routed_dp_rank is not None:
            raise ValueError(f"DP rank {req.routed_dp_rank} is not active.")
        self.sent.append((req.rid, req.routed_dp_rank))

    def _control(self, obj):
        self.controls.append(type(obj).__name__)
        self.sent.append((f"<{type(obj).__name__}>", None))

    def dispatching_with_trace(self, req, *args, **kwargs):
        return dispatch.dispatch(lambda c, r, *a, **k: c._dispatch(r), self, req, *args, **kwargs)

    def send_control_message(self, obj):
        return dispatch.control(lambda c, o: c._control(o), self, obj)


class Link:
    def __init__(self, policy=None):
        self.p, self.reports = policy, []

    def policy(self, now):
        return self.p

    def report(self, r):
        self.reports.append(r)
        return True

    def close(self):
        pass


def armed(ctl: Ctl, policy=None, layout: str = "plain", chunk: int = 100) -> DispatchState:
    """What ``arm`` sets up in the DP controller (without sglang), a fresh state; install it as
    ``sglang_patch.dispatch.STATE`` to route the hooks to it."""
    st = DispatchState()
    st.armed, st.link, st.ranks = True, Link(policy), list(ctl._active_workers)
    st.setup = DispatchSetup(ctl=ctl, dispatcher_id="dispatch", layout=layout, server_chunk=chunk,
                             reader=ctl.load_snapshot_reader,
                             health_check=lambda req: str(req.rid).startswith("HEALTH_CHECK"))
    return st
