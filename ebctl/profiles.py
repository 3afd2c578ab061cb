"""Cost profiles: what an engine's iterations cost on one (model, GPU), as small versioned JSON files.

Built-in presets come from ``data/measured_profiles.json`` (the EB paper's authors' measurements with vLLM,
repository weifang231/eb-vllm, reproduce/calibration/; see that file's ``_about``). ``ebctl tune calibrate``
writes a profile from the daemon's online fits. A profile seeds the controller: the online fits replace its
α/β once they pass (``costfit.OnlineCosts.choose``).

Names: ``qwen3-8b/h200``, ``qwen3-8b/rtx-pro-6000``, ``qwen3-30b-a3b/h200``, ``llama-3.1-8b/h200``, ...;
anything else is read as a path to a profile file.

The file (``"schema": 2``), every key but ``costs`` optional:

- ``name``, ``model``, ``gpu``, ``source`` (strings: where the numbers come from);
- ``costs``: the paper's coefficients (``model.Costs``: alpha_p, beta_p, alpha_d, beta_d ≥ 0, alpha_d > 0;
  alpha_mb, c0, c1, c2 of β_MB^e(r); null for an unknown c0);
- ``iteration_costs``: the per-kind iteration-cost model (``costmodel.IterationCosts``: prefill, decode,
  mixed, each null or {intercept_s, prefill_token_s, prefill_req_s, decode_req_s, decode_ctx_token_s,
  switched_s}), when known;
- ``fit``: how good the fits were, per kind (``calibrate`` writes ok, rel_err, mean_rel_err, n, n_test,
  mean_s, features, reason; the presets carry their authors' R²), plus ``shape`` per kind (the batch shape
  ``costs`` was derived at, ``costmodel.Shape``);
- ``decode_attention_ms``: [[context length, ms], ...], one attention layer for 512 decode queries;
- ``sim``: a dict for the simulator, passed through untouched.

A file without ``schema`` is schema 1 (what calibrate wrote before: name, model, gpu, source, costs,
decode_attention_ms, fit) and still loads. Errors name the file, the key and the value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from ebctl.costmodel import IterationCosts
from ebctl.model import Costs

SCHEMA = 2
_MEASURED = "measured_profiles.json"
_KEYS = {1: {"name", "model", "gpu", "source", "costs", "decode_attention_ms", "fit"},
         2: {"schema", "name", "model", "gpu", "source", "costs", "iteration_costs", "fit",
             "decode_attention_ms", "sim"}}


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
    iteration_costs: IterationCosts | None = None
    fit: dict[str, Any] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)
    path: str = field(default="", compare=False)  # the file it was read from ("" for a preset or a new one)

    def __post_init__(self) -> None:  # fit as JSON will hold it (NaN → None, tuples → lists): round trips equal
        object.__setattr__(self, "fit", _jsonable(self.fit))

    def to_dict(self) -> dict[str, Any]:
        """The schema-2 document (JSON types; NaN → null)."""
        d: dict[str, Any] = {"schema": SCHEMA, "name": self.name, "model": self.model, "gpu": self.gpu,
                             "source": self.source,
                             "costs": {k: _json_float(getattr(self.costs, k)) for k in Costs.__dataclass_fields__}}
        if self.iteration_costs is not None:
            d["iteration_costs"] = msgspec.to_builtins(self.iteration_costs)
        if self.fit:
            d["fit"] = self.fit
        if self.decode_attention_ms:
            d["decode_attention_ms"] = [list(x) for x in self.decode_attention_ms]
        if self.sim:
            d["sim"] = self.sim
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _json_float(v: float) -> float | None:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return _json_float(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


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
        fit = {k: {"r2": p[f"{k}_r2"]} for k in ("prefill", "decode") if p.get(f"{k}_r2") is not None}
        out[name] = Profile(name=name, model=p["model"], gpu=p["gpu"], costs=costs,
                            source="measured_profiles.json (weifang231/eb-vllm)", decode_attention_ms=table, fit=fit)
    return out


def load(name_or_path: str) -> Profile:
    """A preset by name, else a profile file; ProfileError says which names exist, or what in the file is wrong."""
    presets = builtin()
    key = name_or_path.strip().lower()
    if key in presets:
        return presets[key]
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ProfileError(f"profile {name_or_path!r}: no such preset ({', '.join(sorted(presets))}) "
                           "and no such file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(f"profile file {path}: {e}") from e
    return from_dict(doc, where=f"profile file {path}", path=str(path))


def from_dict(d: Any, *, where: str = "profile", path: str = "") -> Profile:
    """A Profile from a schema-1 or schema-2 document; ``where`` starts every error message."""
    if not isinstance(d, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    schema = d.get("schema", 1)
    if schema not in _KEYS:
        raise ProfileError(f"{where}: schema={schema!r}: this ebctl reads schema 1 (no key) and {SCHEMA}")
    unknown = sorted(set(d) - _KEYS[schema])
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r} for schema {schema} "
                           f"(allowed: {', '.join(sorted(_KEYS[schema]))})")
    strings = {}
    for k in ("name", "model", "gpu", "source"):
        v = d.get(k, "")
        if not isinstance(v, str):
            raise ProfileError(f"{where}: {k}={v!r}: must be a string")
        strings[k] = v
    return Profile(name=strings["name"] or Path(path).stem, model=strings["model"], gpu=strings["gpu"],
                   source=strings["source"], costs=_costs(d.get("costs"), where),
                   decode_attention_ms=_table(d.get("decode_attention_ms", []), where),
                   iteration_costs=_iteration_costs(d.get("iteration_costs"), where),
                   fit=_dict(d, "fit", where), sim=_dict(d, "sim", where), path=path)


def _costs(c: Any, where: str) -> Costs:
    if not isinstance(c, dict):
        raise ProfileError(f"{where}: costs={c!r}: must be an object with alpha_p, beta_p, alpha_d, beta_d")
    fields = Costs.__dataclass_fields__
    for k, v in c.items():
        if k not in fields:
            raise ProfileError(f"{where}: costs.{k}: unknown (allowed: {', '.join(fields)})")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ProfileError(f"{where}: costs.{k}={v!r}: must be a number or null")
    missing = [k for k in ("alpha_p", "beta_p", "alpha_d", "beta_d") if k not in c]
    if missing:
        raise ProfileError(f"{where}: costs.{missing[0]} is missing")
    costs = Costs(**{k: (math.nan if v is None else float(v)) for k, v in c.items()})
    for k in ("alpha_p", "beta_p", "alpha_d", "beta_d"):
        v = getattr(costs, k)
        if not (math.isfinite(v) and v >= 0):
            raise ProfileError(f"{where}: costs.{k}={c[k]!r}: must be finite and >= 0")
    if costs.alpha_d <= 0:
        raise ProfileError(f"{where}: costs.alpha_d={c['alpha_d']!r}: must be > 0 (Eq. 3 divides by it)")
    return costs


def _iteration_costs(v: Any, where: str) -> IterationCosts | None:
    if v is None:
        return None
    try:
        ic = msgspec.convert(v, IterationCosts)
    except msgspec.ValidationError as e:  # its message names the path, e.g. "at `$.decode.intercept_s`"
        raise ProfileError(f"{where}: iteration_costs: {e}") from None
    for kind in ("prefill", "decode", "mixed"):
        pc = getattr(ic, kind)
        for name, x in msgspec.to_builtins(pc or {}).items():
            if not (math.isfinite(x) and x >= 0):
                raise ProfileError(f"{where}: iteration_costs.{kind}.{name}={x!r}: must be finite and >= 0")
    return ic


def _table(rows: Any, where: str) -> tuple[tuple[int, float], ...]:
    try:
        return tuple((int(a), float(b)) for a, b in rows)
    except (TypeError, ValueError) as e:
        raise ProfileError(f"{where}: decode_attention_ms={rows!r}: expected [[context, ms], ...] ({e})") from None


def _dict(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = d.get(key) or {}
    if not isinstance(v, dict):
        raise ProfileError(f"{where}: {key}={v!r}: must be an object")
    return v
