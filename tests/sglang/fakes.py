"""Stand-ins for the sglang objects the plugin reads (tests and tools/bench_hook.py; no sglang needed).

Only the attributes sglang_patch reads (sglang_patch/reading.py and state.py), with sglang 0.5.23's names.
"""

from __future__ import annotations

from types import SimpleNamespace

from ebctl.protocol import BatchKind
from sglang_patch.lifecycle import Setup
from sglang_patch.state import PluginState


class Lens(list):
    """Stands in for ``seq_lens_cpu`` (a CPU tensor): ``sum()`` and slicing."""

    def sum(self) -> int:
        return sum(self)

    def tolist(self) -> list:
        return list(self)

    def __getitem__(self, i):
        out = super().__getitem__(i)
        return Lens(out) if isinstance(i, slice) else out


def req(rid="r", n_in=10, n_out=5, done=False, reason="FINISH_LENGTH"):
    fr = type(reason, (), {})() if done else None
    ts = SimpleNamespace(prefill_finished_time=2.0, scheduler_recv_time=1.5, wait_queue_entry_time=1.6,
                         completion_time=0.0)  # 0: not stamped (sglang stamps it as the last token is processed)
    return SimpleNamespace(rid=rid, origin_input_ids=[1] * n_in, output_ids=[2] * n_out, finished_len=None,
                           finished_reason=fr, finished_output=done, time_stats=ts)


def batch(reqs=(), mode="DECODE", decoding=None, ext=0, lens=None, forward_iter=1, lens_sum=None, extend_lens=None,
          prefix_lens=None):
    """``lens_sum``: sglang's ``seq_lens_sum`` (None: not computed, the plugin sums ``seq_lens_cpu``);
    ``extend_lens``, ``prefix_lens``: per row, as ``prepare_for_extend`` sets them (None on a decode batch)."""
    return SimpleNamespace(reqs=list(reqs), forward_mode=mode, decoding_reqs=decoding, extend_num_tokens=ext,
                           seq_lens_cpu=Lens(lens or [12] * len(reqs)), seq_lens_sum=lens_sum,
                           forward_iter=forward_iter, launch_ts=0.0, batch_is_full=False, extend_lens=extend_lens,
                           prefix_lens=prefix_lens)


class Sched(SimpleNamespace):
    def __init__(self, **kw):
        super().__init__(is_mixed_chunk=False, chunked_prefill_size=4096, max_running_requests=16, device="cpu",
                         waiting_queue=[req(f"w{i}") for i in range(5)], running_batch=batch(),
                         chunked_req=None, forward_ct=0, max_total_num_tokens=1000,
                         token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: 900),
                         tree_cache=SimpleNamespace(evictable_size=lambda: 0), server_args=SimpleNamespace())
        self.__dict__.update(kw)


class Link:
    def __init__(self, policy=None):
        self.p, self.sent = policy, []
        self.instance = "fake"

    def policy(self, now):
        return self.p

    def report(self, r):
        self.sent.append(r)
        return True

    def stats(self):
        return {"sent": len(self.sent)}

    def close(self):
        self.closed = True


class Original:
    """The hooked sglang method: records each call, returns ``value``."""

    def __init__(self, value):
        self.value, self.calls = value, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.value


KINDS = {"EXTEND": BatchKind.PREFILL, "MIXED": BatchKind.MIXED, "DECODE": BatchKind.DECODE, "IDLE": BatchKind.IDLE}


def setup(**kw) -> Setup:
    """What ``lifecycle.start`` learns in a scheduler, for a rank alone that reports (``kw`` overrides)."""
    return Setup(**{"engine_id": "dp0", "reporting": True, "launch_mixed": False, "max_running": 16,
                    "kv_total": 1000, "kv_free": lambda: 900, "kv_evictable": lambda: 0, "sync_forward": True,
                    "kinds": KINDS, **kw})  # mixed_reason "": it may mix


def new_state(**kw) -> PluginState:
    """A started plugin state (what ``PluginState.begin`` sets up inside a scheduler), with a fake link;
    ``kw``: its ``Setup`` fields."""
    s = PluginState()
    s.ready, s.link, s.setup = True, Link(), setup(**kw)
    return s
