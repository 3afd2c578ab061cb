"""Fault injection, a test switch (``engine.fault``): a hook's ebctl work raises at its N-th call.

``"HOOK:N"``: in every process the plugin runs in; ``"HOOK:N@RANK"``: only in the scheduler of that rank in
its group (``reading.Ranks.rank``: PP stage × TP size + TP rank, the ``r<RANK>`` of the trace files), e.g.
``"run_batch:30@1"`` on the follower of a ``--tp-size 2`` server; never in the DP controller, which has no
rank. The scheduler's fault points are named after their hooks (``next_batch``, ``defer_prefill``,
``allocatable``, ``run_batch``, ``batch_result``, ``abort_output``), the dispatcher's after its steps
(``dispatch``, ``tick``, ``release``, ``control``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Fault:
    """Raises in ``hit(hook)`` at the ``at``-th call naming ``hook``; ``what`` names the hooks in the message."""

    hook: str
    at: int = 1
    what: str = "hook"
    calls: int = 0

    def hit(self, hook: str) -> None:
        if hook == self.hook:
            self.calls += 1
            if self.calls == self.at:
                raise RuntimeError(f"ebctl: injected fault in {self.what} {hook} (engine.fault)")


def parse(spec: str, rank: int | None, what: str = "hook") -> Fault | None:
    """The fault ``spec`` arms in this process (None: none). ``rank``: this scheduler's rank in its group; None
    outside the schedulers (a spec naming a rank then arms nothing). A malformed spec raises ValueError."""
    if not spec:
        return None
    spec, _, target = spec.partition("@")
    hook, _, n = spec.partition(":")
    fault = Fault(hook.strip(), int(n or 1), what)
    if target.strip() and (rank is None or int(target) != rank):
        return None
    return fault
