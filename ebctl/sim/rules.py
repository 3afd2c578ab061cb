"""The simulated engine by its rule set's name (``EngineConfig.rules``): a plain factory over the subclasses of
:class:`~ebctl.sim.engine.Engine`, so that ``engine.py`` imports none of them."""

from __future__ import annotations

from ebctl.sim.costs import CostModel
from ebctl.sim.engine import Engine, EngineConfig
from ebctl.sim.rules_sglang import SglangEngine
from ebctl.sim.rules_vllm import VllmEngine

ENGINES: dict[str, type[Engine]] = {"sglang": SglangEngine, "vllm": VllmEngine}


def make_engine(config: EngineConfig, cost_model: CostModel) -> Engine:
    """The engine running ``config.rules``' scheduler (``EngineConfig`` checks the name)."""
    return ENGINES[config.rules](config, cost_model)
