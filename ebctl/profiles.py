"""Cost profiles: per-(model, GPU) iteration-cost coefficients as small JSON files.

Built-in presets come from ``data/measured_profiles.json`` (the EB paper's authors' measurements with vLLM,
repository weifang231/eb-vllm, reproduce/calibration/; see that file's ``_about``). A profile only seeds
the controller: the online fit replaces each phase's costs once it is good.

Names: ``qwen3-8b/h200``, ``qwen3-8b/rtx-pro-6000``, ``qwen3-30b-a3b/h200``, ``llama-3.1-8b/h200``, ...;
anything else is read as a path to a profile file (the format ``ebctl tune calibrate`` writes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ebctl.model import Costs

_MEASURED = "measured_profiles.json"


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    gpu: str
    costs: Costs
    source: str = ""
    # one attention layer's kernel time (ms) for 512 decode queries by context length, when measured
    decode_attention_ms: tuple[tuple[int, float], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = {"name": self.name, "model": self.model, "gpu": self.gpu, "source": self.source,
             "costs": {k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in asdict(self.costs).items()}}
        if self.decode_attention_ms:
            d["decode_attention_ms"] = [list(x) for x in self.decode_attention_ms]
        return json.dumps(d, indent=1)


def _slug(s: str) -> str:
    return s.split("/")[-1].lower().replace("-instruct", "")


def _measured() -> dict[str, Any]:
    return json.loads(resources.files("ebctl.data").joinpath(_MEASURED).read_text())


def builtin() -> dict[str, Profile]:
    """The presets, keyed by ``model-slug/gpu-slug``."""
    raw = _measured()
    attn = raw.get("attention_kernel_ms", {})
    out: dict[str, Profile] = {}
    for p in raw["profiles"]:
        mb = p.get("beta_mb") or {}
        costs = Costs(alpha_p=p["alpha_p"], beta_p=p["beta_p"], alpha_d=p["alpha_d"], beta_d=p["beta_d"],
                      # β_MB^e was fitted from saturated end-to-end throughput: fixed costs are inside it
                      alpha_mb=0.0, c0=mb.get("a", math.nan), c1=mb.get("b", 0.0), c2=mb.get("c", 0.0))
        dec = attn.get(p["gpu"], {}).get("pure_decode_512q")
        table = tuple(zip(dec["context_len"], dec["ms"], strict=True)) if dec else ()
        name = f"{_slug(p['model'])}/{p['gpu'].lower()}"
        out[name] = Profile(name=name, model=p["model"], gpu=p["gpu"], costs=costs,
                            source="measured_profiles.json (weifang231/eb-vllm)", decode_attention_ms=table,
                            extra={"prefill_r2": p.get("prefill_r2"), "decode_r2": p.get("decode_r2")})
    return out


def load(name_or_path: str) -> Profile:
    """A preset by name, else a profile file; ProfileError says which names exist."""
    presets = builtin()
    key = name_or_path.strip().lower()
    if key in presets:
        return presets[key]
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ProfileError(f"profile {name_or_path!r}: no such preset ({', '.join(sorted(presets))}) "
                           "and no such file")
    try:
        d = json.loads(path.read_text())
        c = d["costs"]
        costs = Costs(**{k: (math.nan if v is None else float(v)) for k, v in c.items()})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProfileError(f"profile file {path}: {e}") from e
    for k in ("alpha_p", "beta_p", "alpha_d", "beta_d"):
        v = getattr(costs, k)
        if not (math.isfinite(v) and v >= 0):
            raise ProfileError(f"profile file {path}: costs.{k}={v!r} must be finite and >= 0")
    if costs.alpha_d <= 0:
        raise ProfileError(f"profile file {path}: costs.alpha_d must be > 0")
    table = tuple((int(a), float(b)) for a, b in d.get("decode_attention_ms", []))
    return Profile(name=d.get("name", path.stem), model=d.get("model", ""), gpu=d.get("gpu", ""), costs=costs,
                   source=str(path), decode_attention_ms=table)
