"""Fixtures for the tests that run the real SGLang server on CPU (marker ``sglang``).

``--sglang-venv PATH``: the SGLang CPU environment built by tools/sglang_env.sh (.ci/run passes it; then a
missing or broken environment is an error). Without the option the tests use the cached environment if
``tools/sglang_env.sh`` already built it on this machine, and are skipped otherwise (building takes
minutes and a download of about 2.7 GB: run ``bash tools/sglang_env.sh`` once).
Once per session this checkout is installed into that environment (editable, no dependencies) and a tiny
model is built in a temporary directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO / "tools" / "sglang_env.sh"
REQS = REPO / "tools" / "sglang_cpu" / "requirements-cpu.txt"


def _cached_env() -> Path | None:
    """The environment tools/sglang_env.sh would print, if it is already complete (same cache key)."""
    python = os.environ.get("EBCTL_PYTHON", "python3")
    try:
        pyver = subprocess.run([python, "-c", "import platform, sys; print(sys.version.split()[0], "
                                "platform.machine())"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    key = hashlib.sha256(REQS.read_bytes() + ENV_SCRIPT.read_bytes() + pyver.encode()).hexdigest()[:12]
    cache = Path(os.environ.get("EBCTL_SGLANG_CACHE") or Path.home() / ".cache" / "ebctl")
    venv = cache / f"sglang-cpu-{key}"
    return venv if (venv / ".complete").is_file() else None


def _probe(venv: Path) -> dict:
    """Versions and where ebctl / sglang_patch are imported from, inside ``venv`` (run outside the repo)."""
    code = ("import json, sglang, zmq, msgspec\n"
            "out = {'sglang': sglang.__version__}\n"
            "for m in ('ebctl', 'sglang_patch'):\n"
            "    try:\n"
            "        out[m] = __import__(m).__file__\n"
            "    except ImportError:\n"
            "        out[m] = None\n"
            "print(json.dumps(out))")
    p = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd="/",
                       env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def sglang_venv(request: pytest.FixtureRequest) -> Path:
    opt = request.config.getoption("--sglang-venv")
    if opt:
        venv = Path(opt)
        if not (venv / "bin" / "python").exists():
            pytest.fail(f"--sglang-venv {venv}: no bin/python there (build it with bash tools/sglang_env.sh)",
                        pytrace=False)
    else:
        if _cached_env() is None:
            pytest.skip("no SGLang CPU environment built on this machine: run `bash tools/sglang_env.sh` once "
                        "(or pass --sglang-venv PATH)")
        p = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            pytest.fail(f"tools/sglang_env.sh failed:\n{p.stderr[-3000:]}", pytrace=False)
        venv = Path(p.stdout.strip().splitlines()[-1])
    try:
        info = _probe(venv)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        pytest.fail(f"the SGLang environment {venv} is broken: {e}", pytrace=False)
    if not all(str(info.get(m) or "").startswith(str(REPO)) for m in ("ebctl", "sglang_patch")):
        with open(venv / ".ebctl-install.lock", "w") as lock:  # other checkouts may install concurrently
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-build-isolation",
                                "-e", str(REPO)], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            pytest.fail(f"installing this checkout into {venv} failed:\n{p.stderr[-3000:]}", pytrace=False)
    return venv


@pytest.fixture(scope="session")
def tiny_model(sglang_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny"
    p = subprocess.run([str(sglang_venv / "bin" / "python"), str(REPO / "tools" / "sglang_cpu" / "make_tiny_model.py"),
                        str(out)], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.fail(f"make_tiny_model.py failed:\n{p.stderr[-3000:]}", pytrace=False)
    return out


@pytest.fixture
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short directory (unix socket paths are limited to ~107 bytes; pytest keeps the last runs')."""
    return tmp_path_factory.mktemp("w")


@pytest.fixture(scope="module")
def module_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("m")
