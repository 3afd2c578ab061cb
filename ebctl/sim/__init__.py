"""The simulated engine: the real gate and controller on an iteration-level engine model (no GPU).

``engine.Engine`` (``add``, ``step(now) -> IterationReport``, ``policy`` injected between steps; the rules of
``rules_sglang`` or ``rules_vllm``), ``costs`` (cost models: ``gpucost`` end to end on a GPU, with overheads
fitted by ``paperfit`` to the paper's measurements in ``paperdata``; ``calibrate`` fits one to a real engine's
reports), ``hardware`` (KV capacity),
``workloads``, ``policies`` (policy names → sources of ``Policy``), ``runner.run`` (one workload under one
policy), ``metrics``, ``cli.simulate`` (``ebctl simulate``; ``python -m ebctl.sim``); ``gateway`` (smg's routing
rules, pure) and ``fleet.run`` (N engines behind it, ``tools/sim_fleet.py``).
"""
