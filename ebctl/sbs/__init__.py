"""Staggered Batch Scheduling (SBS, the second paper): the pure core of data-parallel dispatch.

The dispatcher buffers requests and releases them in batches instead of sending each to a rank on
arrival. Three pieces, each a small pure module (no I/O, no clock: time comes in as an argument):

* ``interval``: when to release (Algorithm 1, I_opt = (T̄_fwd + L_net)/N_active, and §4.1.2's dual
  trigger, quiescence path and 5·T̄ liveness watchdog with its fixed-interval fallback);
* ``pbaa``: where prefills go (Algorithm 2, water-filling over each rank's free chunk capacity
  C_avail = C_chunk − U_flight − R_queued, carried-over requests first, N_limit);
* ``iqr``: where decodes go (Algorithm 3, the IQR mask on KV load, then the lexicographic minimum of
  (batch size, KV load)).

``dispatcher`` puts the three together (the buffer, U_flight, one release at a time) for both callers, the
simulator and the SGLang DP-controller plugin. ``types`` holds what comes in: a rank's load as sglang's
``LoadSnapshot`` carries it, and the knobs.
"""

from ebctl.sbs.dispatcher import Dispatcher, Release
from ebctl.sbs.interval import ReleaseClock
from ebctl.sbs.iqr import place_decode
from ebctl.sbs.pbaa import Allocation, InFlight, Job, allocate, capacity
from ebctl.sbs.types import RankLoad, SbsParams

__all__ = ["Allocation", "Dispatcher", "InFlight", "Job", "RankLoad", "Release", "ReleaseClock", "SbsParams",
           "allocate", "capacity", "place_decode"]
