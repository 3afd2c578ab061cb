"""Where an A/B ran, for its record: the GPUs (``nvidia-smi``, else torch in the server's Python), the CPU, the
sglang, torch and ebctl versions, and the commit of the ebctl checkout (if it is one). Every probe degrades to
"not known" (None) rather than failing: a CPU machine has no ``nvidia-smi``, a user's install no git."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

# run in the server's Python: versions and what torch sees, without loading sglang
PROBE = """
import json, importlib.metadata as md, importlib.util
out = {"sglang_found": importlib.util.find_spec("sglang") is not None}
for name in ("sglang", "torch", "ebctl"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
try:
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(n)]
except Exception as e:
    out["cuda_devices"] = None
    out["torch_error"] = f"{type(e).__name__}: {e}"[:200]
print(json.dumps(out))
"""


def parse_nvidia_smi(text: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader`` → a row per GPU."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 3 and cells[0]:
            rows.append({"name": cells[0], "memory": cells[1], "driver": cells[2]})
    return rows


def device(smi: list[dict[str, str]] | None, torch_gpus: list[str] | None, cpu: str | None,
           cpus: int | None) -> dict[str, Any]:
    """The record's device: the GPUs by name (nvidia-smi's, else torch's), where they were read, the CPU."""
    if smi:
        return {"gpus": [g["name"] for g in smi], "source": "nvidia-smi", "driver": smi[0]["driver"],
                "memory": smi[0]["memory"], "cpu": cpu, "cpus": cpus}
    if torch_gpus:
        return {"gpus": list(torch_gpus), "source": "torch", "cpu": cpu, "cpus": cpus}
    return {"gpus": [], "source": "nvidia-smi and torch (none found)", "cpu": cpu, "cpus": cpus}


def cpu_model(cpuinfo: str) -> str | None:
    """The ``model name`` of /proc/cpuinfo's first processor."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None


# ---- the probes (shell) ----------------------------------------------------------------------------------

def nvidia_smi(binary: str = "nvidia-smi") -> list[dict[str, str]] | None:
    """The GPUs nvidia-smi lists; None where there is no nvidia-smi or it fails."""
    try:
        p = subprocess.run([binary, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(p.stdout) if p.returncode == 0 else None


def probe_python(python: str) -> dict[str, Any]:
    """Versions and torch's CUDA devices as the server's Python sees them ({} if it does not run)."""
    try:
        p = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd="/")
        return json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def head_commit(repo: Path) -> str | None:
    """``repo``'s HEAD (short), ``+`` if a tracked file differs from it; None outside a git work tree."""
    try:
        git = ["git", "-C", str(repo)]
        sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+" if dirty else "")


def environment(python: str, smi: str = "nvidia-smi") -> dict[str, Any]:
    """The record's ``environment``: device, versions (the server's Python's; ebctl's own where that one has
    none), the commit of the ebctl source this runs from (when it is a git checkout)."""
    from importlib import metadata

    import ebctl

    seen = probe_python(python)
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    try:
        own = metadata.version("ebctl")
    except metadata.PackageNotFoundError:
        own = None
    src = Path(ebctl.__file__).resolve().parents[1]
    return {"device": device(nvidia_smi(smi), seen.get("cuda_devices"), cpu_model(info), os.cpu_count()),
            "sglang": seen.get("sglang"), "torch": seen.get("torch"), "ebctl": seen.get("ebctl") or own,
            "python": python, "sglang_found": seen.get("sglang_found"),
            "commit": head_commit(src) if (src / ".git").exists() else None}
