"""Shared fixtures for the simulator tests: profiles, cost models and a small-run helper."""

from __future__ import annotations

import pytest

from ebctl import profiles
from ebctl.sim import costs, policies, runner
from ebctl.sim.engine import EngineConfig


@pytest.fixture(scope="session")
def h200():
    return profiles.load("qwen3-8b/h200")


@pytest.fixture(scope="session")
def h200_model(h200):
    return costs.build(h200)


@pytest.fixture(scope="session")
def sim_run():
    """run(workload, policy spec, cost model, EngineConfig, concurrency=..., prof=..., **runner kwargs)."""

    def run(wl, spec, cost_model, cfg: EngineConfig, *, concurrency=64, prof=None, **kw):
        src = policies.make(spec, max_running=cfg.max_running, kv_tokens=cfg.kv_tokens,
                            costs=prof.costs if prof is not None else None)
        return runner.run(wl, src, cost_model, cfg, concurrency=concurrency, **kw)

    return run
