"""The simulated engine: the real gate and controller on an iteration-level engine model (no GPU).

``engine.Engine`` (``add``, ``step(now) -> IterationReport``, ``policy`` injected between steps),
``costs`` (cost models; ``calibrate`` fits their mixed-iteration interference), ``hardware`` (KV capacity),
``workloads``, ``policies`` (policy names → sources of ``Policy``), ``runner.run`` (one workload under one
policy), ``metrics``, ``cli.simulate`` (``ebctl simulate``; ``python -m ebctl.sim``).
"""
