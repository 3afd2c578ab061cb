"""What an engine refuses to run, whoever sent it: ``ebctl.link.policy_fault``, case by case."""

from __future__ import annotations

import pytest

from ebctl.config import SPECS
from ebctl.link import MAX_TTL_S, policy_fault
from ebctl.protocol import DispatchPolicy, Mode, Policy


def test_no_configuration_makes_a_ttl_the_engine_refuses():
    assert MAX_TTL_S == 86_400.0 == SPECS["controller.ttl_s"].hi  # one day: the config's own upper bound


def pol(**kw) -> Policy:
    return Policy(engine_id="e0", version=1, mode=kw.pop("mode", Mode.EB), **kw)


@pytest.mark.parametrize(("policy", "max_running", "fault"), [
    (pol(k=16, n_max=16, ttl_s=10.0), 16, None),  # n_max at the engine's limit
    (pol(k=4, n_max=17, ttl_s=10.0), 16, "n_max"),  # one above it
    (pol(k=4, n_max=17, ttl_s=10.0, mode=Mode.OFF), 16, "n_max"),  # whatever the mode
    (pol(k=4, n_max=17, ttl_s=10.0), 0, None),  # limit unknown: only the absolute bounds
    (pol(k=1, n_max=1_000_000, ttl_s=10.0), 0, None),
    (pol(k=8, n_max=8), 0, None),
    (pol(k=9, n_max=8), 0, "k"),
    (pol(k=9, n_max=8), 16, "k"),
    (pol(ttl_s=86_400.0), 0, None),  # one day exactly
    (pol(ttl_s=86_400.001), 0, "ttl"),
    (pol(ttl_s=1e9, k=20, n_max=17), 16, "ttl"),  # several faults: the first
    (DispatchPolicy(engine_id="d", ttl_s=86_400.0), 16, None),  # a dispatcher's policy: ttl only
    (DispatchPolicy(engine_id="d", ttl_s=86_401.0), 0, "ttl"),
])
def test_policy_fault(policy, max_running, fault):
    assert policy_fault(policy, max_running) == fault
