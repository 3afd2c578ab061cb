"""The one fail-open guard: every hook runs its ebctl part through :func:`guarded`, in the schedulers
(``hooks.py``) and in the DP controller (``dispatch.py``).

sglang catches nothing a hook raises (the scheduler or the controller would die and take the server with it).
So a hook calls sglang's original exactly once, outside the guard, and everything ebctl does (its reads,
decisions, reports, trace lines) is a *part* run inside it: any ``Exception`` there goes to the state's
fail-open path (``fail``), and the hook answers what sglang answered. The fail-open path is itself guarded:
nothing it raises escapes either. Outside the guard a hook only reads its state's flags, calls the original and
hands the guard what sglang gave it (on CPU ``run_batch`` is also bracketed by the thread's clock).

Its price is one Python call per guarded part (a few tens of ns; tools/bench_hook.py measures the hooks whole).
The parts take ``(state, sched, arg, answer)`` positionally, so that call stays on CPython's fast path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

log = logging.getLogger("ebctl.sglang")


def guarded(st: Any, where: str, part: Callable[[Any, Any, Any, Any], Any], sched: Any, arg: Any, answer: Any,
            running_batch: Any, timed: bool) -> Any:
    """``part(st, sched, arg, answer)`` under the guard: its result, or ``answer`` (what sglang answered, or
    None) if it raised, after ``st.fail(where, running_batch, sched)``. ``running_batch``: the batch being planned
    when the part is a planning decision (fail-open reopens its admission), else None. ``timed``: the part's
    time is added to ``st.ns``, the iteration's hook time (left out where one call costs less than its timing)."""
    t = perf_counter_ns() if timed else 0
    try:
        answer = part(st, sched, arg, answer)
    except Exception:
        try:
            st.fail(where, running_batch, sched)
        except Exception:  # the fail-open path itself broke: stock from here on, whatever is left applied
            st.on = False
            log.exception("ebctl: the fail-open path of hook %s raised; the plugin is OFF in this process", where)
    if timed:
        st.ns += perf_counter_ns() - t
    return answer
