"""What the SBS core is told: one rank's load, and the knobs (the ``dispatch.*`` config keys).

``RankLoad`` carries exactly the numbers sglang 0.5.23 publishes per DP rank in its shared-memory
``LoadSnapshot`` (``srt/managers/load_snapshot.py:196-220``, built by
``scheduler_components/load_inquirer.py:229-260`` after every prefill forward and every
``--load-snapshot-publish-interval`` decode forwards, ``scheduler.py:5082``), so the DP-controller plugin
can feed the core from there unchanged; the simulator builds the same record from its own ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple


class RankLoad(NamedTuple):
    """One DP rank's load at ``timestamp`` (LoadSnapshot field in brackets)."""

    rank: int  # [dp_rank]
    timestamp: float  # [timestamp] when the rank published it: it moves after each forward
    running: int = 0  # [num_running_reqs] requests in the running batch
    waiting: int = 0  # [num_waiting_reqs]
    queued_tokens: int = 0  # [num_waiting_uncached_tokens] prompt tokens still to prefill: the waiting
    # queue and the rest of the chunked request (load_inquirer.py:82-104): R_queued of Algorithm 2
    used_tokens: int = 0  # [num_used_tokens] KV tokens held: K_i of Algorithm 3
    total_tokens: int = 0  # [num_total_tokens] used + waiting prompts: what sglang's total_tokens balances

    @property
    def quiescent(self) -> bool:
        """Zero tasks: §4.1.2's quiescence path (the rank is ready for a release at once)."""
        return self.running == 0 and self.waiting == 0 and self.queued_tokens == 0


@dataclass(frozen=True, slots=True)
class SbsParams:
    """The knobs of the SBS core; config.py builds this from the ``[dispatch]`` section."""

    mode: Literal["off", "sbs"] = "off"  # off: sglang's own --load-balance-method; sbs: buffer and release
    fwd_window: int = 64  # W_size of Algorithm 1: forward times averaged into T̄_fwd
    t_default_s: float = 0.1  # T_default of Algorithm 1: T̄_fwd before any forward was measured (s)
    l_net_s: float = 0.001  # L_net of Algorithm 1: dispatcher → rank latency (s)
    watchdog_factor: float = 5.0  # §4.1.2: a target silent for this many T̄_fwd after a release is lost
    fixed_interval_s: float = 0.0  # release interval to a lost target; 0: the current I_opt
    chunk_tokens: int = 0  # C_chunk of Algorithm 2 per rank and forward; 0: the engine's chunked prefill size
    n_limit: int = 10  # N_limit of Algorithm 2: a request left behind more cycles is an overload event
    iqr_k: float = 1.5  # k of Algorithm 3: Th_outlier = Q3 + k·(Q3 − Q1)
    drain_ranks: str = ""  # DP ranks SBS sends no new request to, comma-separated ("1,3"); "" none
    poll_s: float = 0.001  # the DP controller reads the ranks' load snapshots this often while it holds requests


def parse_ranks(text: str) -> tuple[int, ...]:
    """``drain_ranks`` ("1, 3") as sorted unique rank ids; ValueError naming the bad item."""
    out = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"{item!r} is not a DP rank (an integer >= 0)")
        out.add(int(item))
    return tuple(sorted(out))
