"""The CPU demo (``ebctl ab --cpu-demo``): the A/B on the real sglang CPU server with the tiny test model, as
this project's CI runs it, for anyone without a GPU. It needs a checkout of ebctl (``tools/sglang_cpu``: the
stand-in for sglang's CPU kernels, the tiny model's builder, the server's CPU flags) and the sglang CPU
environment ``tools/sglang_env.sh`` builds once (about 2 minutes, 2.7 GB), into which ebctl is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import ebctl

CHECKOUT = Path(ebctl.__file__).resolve().parents[1]
HARNESS = CHECKOUT / "tools" / "sglang_cpu"
ISSUE_ARGS = ("--chunked-prefill-size", "256")
# torch on one OpenMP thread (on 2 cores, torch threads on both stall whenever another thread wakes)
ONE_TORCH_CORE = {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}


class NoCheckout(RuntimeError):
    """The demo's harness is not beside this ebctl (an install from a wheel)."""


def _server_module() -> Any:
    path = HARNESS / "server.py"
    if not path.is_file():
        raise NoCheckout(f"--cpu-demo needs a checkout of ebctl (tools/sglang_cpu/ beside the package); "
                         f"{path} is not there")
    spec = importlib.util.spec_from_file_location("ebctl_ab_sglang_cpu_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def base_args(model: Path) -> list[str]:
    """The tiny model's launch arguments: the harness's CPU flags (16 slots, KV 16,384 tokens,
    ``--sleep-on-idle``) and ``--chunked-prefill-size 256``."""
    return ["--model-path", str(model), *_server_module().BASE_ARGS, *ISSUE_ARGS]


def env() -> dict[str, str]:
    """What sglang needs on CPU: its CPU engine, the kernel stand-in on the path, torch on one thread."""
    return {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(HARNESS), **ONE_TORCH_CORE}


def venv(given: str | None) -> Path:
    """The sglang CPU environment: ``given``, or the one ``tools/sglang_env.sh`` builds (once, cached); with
    this checkout installed in it (editable, no dependencies)."""
    _server_module()
    if given:
        path = Path(given)
    else:
        p = subprocess.run(["bash", str(CHECKOUT / "tools" / "sglang_env.sh")], capture_output=True, text=True,
                           check=True)
        path = Path(p.stdout.strip().splitlines()[-1])
    python = path / "bin" / "python"
    if not python.exists():
        raise NoCheckout(f"--venv {path}: no bin/python there (build it with bash tools/sglang_env.sh)")
    code = "import ebctl, sglang_patch; print(ebctl.__file__, sglang_patch.__file__)"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the server will import it
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", env=clean)
    if p.returncode != 0 or not all(x.startswith(str(CHECKOUT)) for x in p.stdout.split()):
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                        str(CHECKOUT)], check=True)
    return path


def tiny_model(python: Path, where: Path) -> Path:
    """The tiny model in ``where`` (built by the harness's make_tiny_model.py; nothing to do if it is there)."""
    subprocess.run([str(python), str(HARNESS / "make_tiny_model.py"), str(where)], check=True, capture_output=True)
    return where


def context(model: Path) -> int:
    return json.loads((model / "config.json").read_text()).get("max_position_embeddings", 2048)
