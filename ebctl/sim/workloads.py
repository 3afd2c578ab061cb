"""Workloads: request lengths, and either arrival times (open loop) or a concurrency schedule (closed loop).

Names (``load``):

* the paper's synthetic mixes, lengths uniform in 0.5x-1.5x of the mean: ``decode-heavy`` (128/1024),
  ``balanced`` (512/512), ``prefill-heavy`` (1024/128), ``table3`` (512/256, the paper's Table 3);
* parametric: ``uniform:L=512,O=256``, ``geometric:L=512,O=256`` (inputs uniform as above, outputs
  geometric on {1, 2, ...} with mean O), ``gamma:a=0.5,L=512,O=256`` (outputs round(Gamma(a, O/a)) ≥ 1);
* the paper's evaluation workloads by their Table 9 statistics (``ebctl.sim.paperdata``): ``sharegpt-like``,
  ``longbench-like``, ``numinamath-like``;
* the shipped traces (``ebctl/data/traces``, attribution in its README): ``azure-conv``, ``azure-code``,
  ``mooncake-conv``;
* the paper's non-stationary scenarios (Table 3): ``dist-shift`` (μ_L 1024 → 512 → 128 while μ_O
  128 → 512 → 1024, a third of the requests each), ``conc-shift`` (512/256, concurrency 32 → 512 → 1024
  → 256 → 2048, a fifth each).

Trace files (``from_trace``): a CSV whose header names ``input_tokens`` and ``output_tokens`` (optionally
``timestamp_s`` or ``timestamp_ms``), or the Azure format ``TIMESTAMP,ContextTokens,GeneratedTokens``.
Closed loop draws ``requests`` rows at random (seeded; with replacement only if the trace is shorter);
open loop replays the first ``requests`` rows in time order, inter-arrival times × ``time_scale``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np

SYNTHETIC = {"decode-heavy": (128, 1024), "balanced": (512, 512), "prefill-heavy": (1024, 128),
             "table3": (512, 256)}
TRACES = {"azure-conv": "azure2023_conv.csv", "azure-code": "azure2023_code.csv",
          "mooncake-conv": "mooncake_conversation.csv"}
SCENARIOS = ("dist-shift", "conc-shift")
PAPER_LIKE = {"sharegpt-like": "ShareGPT", "longbench-like": "LongBench", "numinamath-like": "NuminaMath"}
DIST_SHIFT = ((1024, 128), (512, 512), (128, 1024))
CONC_SHIFT = (32, 512, 1024, 256, 2048)


@dataclass(frozen=True)
class Workload:
    """``arrival_s`` set: open loop. Else closed loop; ``phases`` ((first request index, concurrency), ...)
    overrides the run's concurrency from that request on."""

    name: str
    input_len: np.ndarray
    output_len: np.ndarray
    arrival_s: np.ndarray | None = None
    phases: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.input_len.shape != self.output_len.shape or self.input_len.ndim != 1:
            raise ValueError("input_len and output_len must be 1-d arrays of one length")
        if self.input_len.size == 0:
            raise ValueError(f"workload {self.name!r} has no requests")
        if self.input_len.min() < 1 or self.output_len.min() < 1:
            raise ValueError(f"workload {self.name!r}: every length must be >= 1")
        if self.arrival_s is not None and self.arrival_s.shape != self.input_len.shape:
            raise ValueError("arrival_s must have one entry per request")

    def __len__(self) -> int:
        return int(self.input_len.size)

    @property
    def open_loop(self) -> bool:
        return self.arrival_s is not None

    def concurrency_label(self, default: int) -> str | int:
        """What the run's concurrency was: "open-loop", the phases' values, or ``default``."""
        if self.open_loop:
            return "open-loop"
        if self.phases:
            return "→".join(str(c) for _, c in self.phases)
        return default

    def concurrency_at(self, index: int, default: int) -> int:
        c = default
        for start, conc in self.phases:
            if index >= start:
                c = conc
        return c


def _uniform(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    """Integers uniform in [0.5·mean, 1.5·mean], at least 1."""
    lo, hi = max(1, round(0.5 * mean)), max(1, round(1.5 * mean))
    return rng.integers(lo, hi + 1, size=n)


def synthetic(mu_l: float, mu_o: float, n: int, *, seed: int = 0, outputs: str = "uniform",
              shape: float = 1.0, name: str = "") -> Workload:
    """Inputs uniform in 0.5x-1.5x μ_L; outputs uniform likewise, geometric or Gamma(shape) with mean μ_O."""
    if n < 1 or mu_l < 1 or mu_o < 1:
        raise ValueError(f"need n >= 1 and means >= 1 (n={n}, L={mu_l}, O={mu_o})")
    rng = np.random.default_rng(seed)
    inputs = _uniform(rng, mu_l, n)
    if outputs == "uniform":
        out = _uniform(rng, mu_o, n)
    elif outputs == "geometric":
        out = rng.geometric(1.0 / mu_o, size=n)
    elif outputs == "gamma":
        if not shape > 0:
            raise ValueError(f"gamma shape a={shape}: must be > 0")
        out = np.maximum(1, np.rint(rng.gamma(shape, mu_o / shape, size=n))).astype(np.int64)
    else:
        raise ValueError(f"outputs={outputs!r}: uniform, geometric or gamma")
    return Workload(name or f"{outputs}:L={mu_l:g},O={mu_o:g}", inputs.astype(np.int64), out.astype(np.int64))


def _count(path: Path, line: int, column: str, text: str) -> int:
    """A token count cell: a whole number >= 1, else an error naming the file, the line, the column and the value."""
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{path}, line {line}: {column}={text!r} is not a number") from None
    if not (math.isfinite(v) and v == int(v)):
        raise ValueError(f"{path}, line {line}: {column}={text!r} is not a whole number of tokens")
    if v < 1:
        raise ValueError(f"{path}, line {line}: {column}={text!r}: a request needs at least 1 token")
    return int(v)


def _time(path: Path, line: int, column: str, text: str, *, iso: bool) -> float:
    try:
        return datetime.fromisoformat(text.strip()[:26]).timestamp() if iso else float(text)
    except ValueError:
        raise ValueError(f"{path}, line {line}: {column}={text!r} is not a {'timestamp' if iso else 'number'}") \
            from None


def read_rows(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(input tokens, output tokens, arrival seconds or None) of every row; a bad cell is an error that names
    the file, its line, the column and the value (nothing is clamped or skipped)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty file")
    head = [h.strip() for h in rows[0]]
    low = [h.lower() for h in head]
    ts_col, iso = None, False
    if "input_tokens" in low and "output_tokens" in low:
        i, o = low.index("input_tokens"), low.index("output_tokens")
        for name in ("timestamp_s", "timestamp_ms"):
            if name in low:
                ts_col = low.index(name)
                break
    elif {"timestamp", "contexttokens", "generatedtokens"} <= set(low):
        i, o, ts_col, iso = low.index("contexttokens"), low.index("generatedtokens"), low.index("timestamp"), True
    else:
        raise ValueError(f"{path}: header {head} names neither input_tokens/output_tokens nor "
                         "TIMESTAMP/ContextTokens/GeneratedTokens")
    scale = 1e-3 if ts_col is not None and low[ts_col] == "timestamp_ms" else 1.0
    inputs, outputs, ts = [], [], []
    for line, r in enumerate(rows[1:], start=2):
        if not r:
            continue
        if len(r) < len(head):
            raise ValueError(f"{path}, line {line}: {len(r)} cells, the header has {len(head)}")
        inputs.append(_count(path, line, head[i], r[i]))
        outputs.append(_count(path, line, head[o], r[o]))
        if ts_col is not None:
            ts.append(_time(path, line, head[ts_col], r[ts_col], iso=iso) * scale)
    if not inputs:
        raise ValueError(f"{path}: no rows")
    return (np.array(inputs, dtype=np.int64), np.array(outputs, dtype=np.int64),
            np.array(ts) if ts_col is not None else None)


def from_trace(path: str | Path, n: int, *, seed: int = 0, open_loop: bool = False, time_scale: float = 1.0,
               name: str = "") -> Workload:
    """Requests from a trace file (formats in the module docstring)."""
    path = Path(path)
    inputs, outputs, ts = read_rows(path)
    name = name or path.stem
    if open_loop:
        if ts is None:
            raise ValueError(f"{path}: no timestamp column, cannot replay open loop")
        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale}: must be > 0")
        order = np.argsort(ts, kind="stable")[:n]
        arr = (ts[order] - ts[order[0]]) * time_scale
        return Workload(name, inputs[order], outputs[order], arrival_s=arr)
    rng = np.random.default_rng(seed)
    idx = rng.choice(inputs.size, size=n, replace=n > inputs.size)
    return Workload(name, inputs[idx], outputs[idx])


def trace_path(name: str) -> Path:
    """The shipped trace file of a named workload."""
    return Path(str(resources.files("ebctl.data").joinpath("traces", TRACES[name])))


def _params(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        key, sep, val = part.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {part!r}")
        out[key.strip()] = float(val)
    return out


def names() -> list[str]:
    return [*SYNTHETIC, *PAPER_LIKE, *TRACES, *SCENARIOS, "uniform:L=..,O=..", "geometric:L=..,O=..",
            "gamma:a=..,L=..,O=.."]


def load(spec: str, n: int, *, seed: int = 0, open_loop: bool = False, time_scale: float = 1.0) -> Workload:
    """A named workload of ``n`` requests (see the module docstring), or a path to a trace file."""
    if n < 1:
        raise ValueError(f"requests={n}: must be >= 1")
    key = spec.strip()
    if key in TRACES:
        return from_trace(trace_path(key), n, seed=seed, open_loop=open_loop, time_scale=time_scale, name=key)
    if open_loop and key not in TRACES and not Path(key).is_file():
        raise ValueError(f"open loop needs arrival times: use a trace ({', '.join(TRACES)}) or a trace file")
    if key in SYNTHETIC:
        return synthetic(*SYNTHETIC[key], n, seed=seed, name=key)
    if key in PAPER_LIKE:
        from ebctl.sim import paperdata  # scipy's distributions: only when asked for

        inputs, outputs = paperdata.table9(PAPER_LIKE[key], n, seed=seed)
        return Workload(key, inputs, outputs)
    if key == "dist-shift":
        return _phased(key, [synthetic(l, o, m, seed=seed + i) for i, ((l, o), m) in
                             enumerate(zip(DIST_SHIFT, _split(n, 3), strict=True))], None)
    if key == "conc-shift":
        parts = _split(n, len(CONC_SHIFT))
        return _phased(key, [synthetic(512, 256, m, seed=seed + i) for i, m in enumerate(parts)], CONC_SHIFT)
    kind, sep, rest = key.partition(":")
    if sep and kind in ("uniform", "geometric", "gamma"):
        p = _params(rest)
        try:
            mu_l, mu_o, a = p.pop("L"), p.pop("O"), p.pop("a", 1.0)
        except KeyError as e:
            raise ValueError(f"workload {key!r}: missing {e.args[0]}=") from None
        if p:
            raise ValueError(f"workload {key!r}: unknown parameters {sorted(p)}")
        return synthetic(mu_l, mu_o, n, seed=seed, outputs=kind, shape=a, name=key)
    if Path(key).is_file():
        return from_trace(key, n, seed=seed, open_loop=open_loop, time_scale=time_scale)
    raise ValueError(f"unknown workload {spec!r}; known: {', '.join(names())}, or a trace file path")


def _split(n: int, parts: int) -> list[int]:
    base = [n // parts] * parts
    for i in range(n - sum(base)):
        base[i] += 1
    if min(base) < 1:
        raise ValueError(f"requests={n}: need at least {parts} for this scenario")
    return base


def _phased(name: str, parts: list[Workload], concurrency: tuple[int, ...] | None) -> Workload:
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
    phases = tuple(zip(starts, concurrency, strict=True)) if concurrency else ()
    return Workload(name, np.concatenate([p.input_len for p in parts]),
                    np.concatenate([p.output_len for p in parts]), phases=phases)
