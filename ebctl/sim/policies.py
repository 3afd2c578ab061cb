"""Policy sources: what the simulated engine's gate is told each iteration, all through ``Policy``.

``make(spec, ...)`` parses a policy name:

* ``v0``: no policy, the engine's stock behaviour (SGLang: prefill first whenever a prefill batch forms,
  i.e. EB with k = 1);
* ``mb``: mixed chunked prefill, decode first then prefill chunks (``Policy(mode=mb)``);
* ``eb:k=K`` / ``eb:theta=X``: EB with a fixed threshold (k = max(1, ⌊θ·N⌋)); options ``n=`` (batch cap,
  default the engine's max_running), ``kv=`` (KV reserve share, default 0) and ``defer=`` (max_defer_s,
  default inf: a pure threshold policy);
* ``eb-auto``: EB(k̂*, N̂*), a ``Controller`` (mode eb) run in-process on the engine's own reports;
* ``eb+``: the same controller with the EB+ mode rule (Eq. 8) on top.
  Both take ``method=paper|cfr|exact-fluid|measured``, ``delta=``, ``defer=``, ``window=``, ``every=``,
  ``theta=`` (θ pinned: the controller's N̂*, KV reserve and clock at that θ) and ``ttft=``/``tpot=`` (latency
  targets in seconds, ``controller.slo_ttft_s``/``slo_tpot_s``);
* ``default``: the controller exactly as a default install configures it (``ControllerParams()``, no profile:
  the default costs until its online fits pass; the engine's limit and KV capacity from its reports); options
  ``ttft=``/``tpot=``: the same with those latency targets set (``default:ttft=10,tpot=0.1``);
* ``sglang:min-free-slots=K`` / ``sglang:pd-interval=N`` (option ``min-bs=M``): stock sglang launched with
  its own static knob ``--min-free-slots-delay K`` / ``--prefill-decode-interval N``
  (``--prefill-decode-interval-min-bs M``), no ebctl (:mod:`ebctl.sim.rules_sglang` models both); the
  source's ``engine`` holds the launch flags (``EngineConfig`` fields) the runner applies.

A list of policies is comma-separated like their options (``v0,eb:theta=0.3,n=300``): ``split_specs`` starts a
new policy at each piece that begins with a policy's name and gives every ``key=value`` piece to the policy
before it.

A source is fed every ``IterationReport`` (``observe``) and asked for the policy before the next step
(``policy(now)``, simulated time). The controller's policy is re-stamped with ``now`` each step: the
in-process controller stands for a live daemon, so its policy never expires on the TTL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import numpy as np

from ebctl import model, profiles
from ebctl.controller import Controller, ControllerParams
from ebctl.decide import eq6
from ebctl.estimate import fit_hazard
from ebctl.profiles import Profile
from ebctl.protocol import IterationReport, Mode, Policy

NAMES = ("v0", "stock", "mb", "eb", "eb-auto", "eb+", "default", "sglang")
KNOWN = ("v0, mb, eb:k=K, eb:theta=X, eb-auto, eb+, default, sglang:min-free-slots=K or sglang:pd-interval=N "
         "(options after a colon, comma-separated: eb:theta=0.3,n=300)")
# sglang's static knobs: the policy option → the EngineConfig field it sets (the launch flag)
KNOBS = {"min-free-slots": "min_free_slots_delay", "pd-interval": "prefill_decode_interval",
         "min-bs": "prefill_decode_interval_min_bs"}
FIXED_OPTIONS = {"k", "theta", "n", "kv", "defer"}
AUTO_OPTIONS = {"method", "delta", "defer", "window", "every", "theta", "ttft", "tpot"}
SLO_OPTIONS = {"ttft": "slo_ttft_s", "tpot": "slo_tpot_s"}  # policy option → ControllerParams field


@dataclass(frozen=True, slots=True)
class ModeChange:
    t: float
    mode: str
    k: int
    n_max: int


class PolicySource(Protocol):
    name: str
    timeline: list[ModeChange]
    engine: dict[str, int]  # EngineConfig fields the policy launches the engine with (sglang's own knobs)

    def policy(self, now: float) -> Policy | None: ...

    def observe(self, report: IterationReport) -> None: ...


@dataclass
class Stock:
    """No policy at all: the engine's stock behaviour."""

    name: str = "v0"
    timeline: list[ModeChange] = field(default_factory=list)
    engine: dict[str, int] = field(default_factory=dict)

    def policy(self, now: float) -> Policy | None:
        return None

    def observe(self, report: IterationReport) -> None:
        pass


@dataclass
class Fixed:
    """One policy for the whole run."""

    name: str
    fixed: Policy
    timeline: list[ModeChange] = field(default_factory=list)
    engine: dict[str, int] = field(default_factory=dict)

    def policy(self, now: float) -> Policy | None:
        if not self.timeline:
            self.timeline.append(ModeChange(now, str(self.fixed.mode), self.fixed.k, self.fixed.n_max))
        return msgspec.structs.replace(self.fixed, issued_at=now)

    def observe(self, report: IterationReport) -> None:
        pass


@dataclass
class Auto:
    """A ``Controller`` in-process: it sees every report and is updated after every step. With ``predictor``
    (``sample, iteration costs → predictions``), the model's rankings the controller asks for are run at once:
    simulated time stands still while they run, where the daemon runs them in a worker."""

    name: str
    controller: Controller
    timeline: list[ModeChange] = field(default_factory=list)
    engine: dict[str, int] = field(default_factory=dict)
    predictor: Callable[..., tuple] | None = None
    _version: int = -1

    def policy(self, now: float) -> Policy | None:
        if self.predictor is not None and (req := self.controller.prediction_request()) is not None:
            self.controller.take_predictions(self.predictor(*req))
        p = self.controller.update(now)
        if p.version != self._version:
            self._version = p.version
            last = self.timeline[-1] if self.timeline else None
            if last is None or (last.mode, last.k, last.n_max) != (str(p.mode), p.k, p.n_max):
                self.timeline.append(ModeChange(now, str(p.mode), p.k, p.n_max))
        return msgspec.structs.replace(p, issued_at=now)

    def observe(self, report: IterationReport) -> None:
        self.controller.observe(report)


def _options(text: str, allowed: set[str], spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, sep, val = part.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"policy {spec!r}: bad option {part!r} (options: {', '.join(sorted(allowed))})")
        out[key] = val
    return out


def _num(opts: dict[str, str], key: str, spec: str, default: float, lo: float, hi: float = math.inf) -> float:
    if key not in opts:
        return default
    try:
        v = float(opts[key])
    except ValueError:
        raise ValueError(f"policy {spec!r}: {key}={opts[key]!r} is not a number") from None
    if not lo <= v <= hi:
        raise ValueError(f"policy {spec!r}: {key}={v:g} must be in [{lo:g}, {hi:g}]")
    return v


def _targets(opts: dict[str, str], spec: str) -> dict[str, float]:
    """The latency targets among a controller policy's options, as ``ControllerParams`` fields."""
    return {name: _num(opts, key, spec, 0.0, 0.0, 86_400.0) for key, name in SLO_OPTIONS.items() if key in opts}


def make(spec: str, *, max_running: int, kv_tokens: int, costs: model.Costs | None = None,
         engine_id: str = "sim", profile: Profile | None = None) -> PolicySource:
    """Parse a policy name (module docstring) into a source for an engine of ``max_running`` slots; ``profile``:
    the simulated engine's (``default:profile=engine``)."""
    spec = spec.strip()
    head, _, rest = spec.partition(":")
    if head in ("v0", "stock") and not rest:
        return Stock(name=spec)
    if head == "mb":
        o = _options(rest, {"n"}, spec)
        n = int(_num(o, "n", spec, max_running, 1, max_running))
        return Fixed(spec, Policy(engine_id=engine_id, version=1, mode=Mode.MB, k=1, n_max=n))
    if head == "eb":
        o = _options(rest, FIXED_OPTIONS, spec)
        n = int(_num(o, "n", spec, max_running, 1, max_running))
        if ("k" in o) == ("theta" in o):
            raise ValueError(f"policy {spec!r}: give exactly one of k= or theta=")
        if "k" in o:
            k = int(_num(o, "k", spec, 1, 1, n))
        else:
            k = max(1, math.floor(_num(o, "theta", spec, 0.5, 1e-9, 1.0 - 1e-9) * n))
        p = Policy(engine_id=engine_id, version=1, mode=Mode.EB, k=k, n_max=n,
                   kv_reserve_frac=_num(o, "kv", spec, 0.0, 0.0, 0.99),
                   max_defer_s=_num(o, "defer", spec, math.inf, 0.0))
        return Fixed(spec, p)
    if head == "sglang":
        o = _options(rest, set(KNOBS), spec)
        if ("min-free-slots" in o) == ("pd-interval" in o) or ("min-bs" in o and "pd-interval" not in o):
            raise ValueError(f"policy {spec!r}: give exactly one of min-free-slots=K or pd-interval=N "
                             "(min-bs= goes with pd-interval)")
        engine = {}
        for key in o:
            v = _num(o, key, spec, 0, 0 if key == "min-bs" else 1, 1e9)
            if v != int(v):
                raise ValueError(f"policy {spec!r}: {key}={o[key]!r} is not a whole number")
            engine[KNOBS[key]] = int(v)
        return Stock(name=spec, engine=engine)
    if head == "default":
        o = _options(rest, {*SLO_OPTIONS, "profile"}, spec)
        params = ControllerParams(**_targets(o, spec))
        if "profile" not in o:
            return Auto(spec, Controller(params, engine_id=engine_id))
        given = _profile(o["profile"], profile, spec)
        ctl = Controller(params, given.costs, engine_id=engine_id, cost_source=f"profile:{given.name}",
                         predictive=True)
        return Auto(spec, ctl, predictor=_predictor(given))
    if head in ("eb-auto", "eb+"):
        o = _options(rest, AUTO_OPTIONS, spec)
        method = o.get("method", "paper")
        if method not in ("paper", "cfr", "exact-fluid", "measured"):
            raise ValueError(f"policy {spec!r}: method={method!r} must be paper, cfr, exact-fluid or measured")
        defaults = ControllerParams()
        pin = _num(o, "theta", spec, math.nan, 1e-4, 0.999) if "theta" in o else math.nan
        params = ControllerParams(
            mode="eb" if head == "eb-auto" else "eb+", theta_method=method,  # type: ignore[arg-type]
            n_max_limit=max_running, kv_capacity_tokens=kv_tokens,
            delta=_num(o, "delta", spec, defaults.delta, -1.0, 1.0),
            max_defer_s=_num(o, "defer", spec, defaults.max_defer_s, 0.0),
            window=int(_num(o, "window", spec, defaults.window, 1)),
            update_every=int(_num(o, "every", spec, defaults.update_every, 1)), **_targets(o, spec),
            **({"theta_min": pin, "theta_max": pin} if math.isfinite(pin) else {}))
        return Auto(spec, Controller(params, costs, engine_id=engine_id, cost_source="profile" if costs else ""))
    raise ValueError(f"unknown policy {spec!r}: {KNOWN}")


def _profile(name: str, engine: Profile | None, spec: str) -> Profile:
    """``default:profile=``'s profile: ``engine``, the simulated engine's own; else a preset or a file."""
    if name == "engine":
        if engine is None:
            raise ValueError(f"policy {spec!r}: profile=engine needs the engine's profile")
        return engine
    try:
        return profiles.load(name)
    except (OSError, profiles.ProfileError) as e:
        raise ValueError(f"policy {spec!r}: {e}") from None


def _predictor(prof: Profile) -> Callable[..., tuple]:
    """The model's ranking on ``prof``'s costs (``ebctl.predict``; the online fits where the request names them)."""
    from ebctl import predict
    from ebctl.sim.costs import build
    cm = build(prof)
    return lambda sample, fits: predict.predict(sample, predict.cost_model(cm, fits))


def split_specs(text: str) -> list[str]:
    """The policies of a comma-separated list whose options are comma-separated too: a piece that begins with a
    policy's name (``NAMES``, before any colon) starts a policy, a ``key=value`` piece is one more option of the
    policy before it (which must have its colon). Raises ``ValueError`` naming the piece otherwise."""
    out: list[str] = []
    for piece in filter(None, (x.strip() for x in text.split(","))):
        if piece.partition(":")[0].strip() in NAMES:
            out.append(piece)
        elif "=" in piece and out and ":" in out[-1]:
            out[-1] += "," + piece
        elif "=" in piece and out:
            raise ValueError(f"option {piece!r} follows {out[-1]!r}, which has no colon: write {out[-1]}:{piece}")
        elif "=" in piece:
            raise ValueError(f"option {piece!r} comes before any policy: {KNOWN}")
        else:
            raise ValueError(f"unknown policy {piece!r}: {KNOWN}")
    return out


def fixed_theta(spec: str) -> float | None:
    """θ of an ``eb:theta=X[,...]`` policy; None for any other."""
    head, _, rest = spec.partition(":")
    if head.strip() != "eb":
        return None
    opts = dict(part.strip().partition("=")[::2] for part in rest.split(",") if part.strip())
    try:
        return float(opts["theta"]) if "theta" in opts else None
    except ValueError:
        return None


PD_INTERVALS = (1, 2, 4, 8, 16, 32)  # --prefill-decode-interval values a sweep tries (sglang picks 22 for one model)


def static_sweep(max_running: int) -> list[str]:
    """What an operator can set instead of ebctl, one flag each: stock, mixed chunks (``mb``: the policy that
    turns them on), ``sglang:min-free-slots=K`` for K = 2, 4, 8, ... up to half the slots, and
    ``sglang:pd-interval=N`` for N in :data:`PD_INTERVALS`."""
    ks = [2 ** i for i in range(1, max_running.bit_length()) if 2 ** i <= max_running // 2]
    return ["v0", "mb", *(f"sglang:min-free-slots={k}" for k in ks), *(f"sglang:pd-interval={n}" for n in PD_INTERVALS)]


def is_static(spec: str) -> bool:
    """What an operator can set in sglang alone, no controller: stock, mixed chunks (``mb``: what
    ``--enable-mixed-chunk`` runs) or one of sglang's knobs. ebctl's fixed ``eb:`` policies are not."""
    return spec.partition(":")[0].strip() in ("v0", "stock", "mb", "sglang")


def theta_grid(lo: float = 0.05, hi: float = 0.95, step: float = 0.05) -> list[float]:
    """θ from lo to hi in steps, rounded to the hundredth the sweep's names carry."""
    return [round(lo + i * step, 2) for i in range(round((hi - lo) / step) + 1)]


def theta_sweep(lo: float = 0.05, hi: float = 0.95, step: float = 0.05, *,
                n: int | Sequence[int] | None = None) -> list[str]:
    """``eb:theta=X`` for X in lo..hi; with ``n``, at that batch cap (one for all, or one per θ)."""
    thetas = theta_grid(lo, hi, step)
    if n is None:
        return [f"eb:theta={t:.2f}" for t in thetas]
    caps = [n] * len(thetas) if isinstance(n, int) else list(n)
    if len(caps) != len(thetas):
        raise ValueError(f"{len(caps)} caps for {len(thetas)} values of theta")
    return [f"eb:theta={t:.2f},n={c}" for t, c in zip(thetas, caps, strict=True)]


def eq6_caps(thetas: Sequence[float], *, input_len: np.ndarray, output_len: np.ndarray, kv_tokens: int,
             max_running: int, params: ControllerParams | None = None) -> list[int]:
    """Eq. 6's N̂* at each θ as the controller computes it (``ebctl.decide.eq6``), the workload's lengths as its
    window: p̂0 of the hazard fit, μ̂_L, the measured margin v̄ (or the geometric one, per ``n_variance``), ε and
    the bound of ``params``, clipped to [n_floor_frac × max_running, max_running]. EB at the engine's own slot
    count is stock wherever the KV cache fills before the slots do (a refill never ends); N̂* is the cap the
    controller would run, so θ has something to act on."""
    p = params or ControllerParams()
    ins, outs = np.asarray(input_len, dtype=np.float64), np.asarray(output_len, dtype=np.float64)
    hz = fit_hazard(outs, discrete_correction=p.discrete_correction)
    mu_l = float(ins.mean())
    p0 = min(hz.p0 if hz.p0 > 0 else 1.0 / max(hz.mu_o, 1.0), 1.0)
    vbar = (model.vbar_moments(mu_l, float(ins.var()), float(outs.mean()), float(outs.var()))
            if p.n_variance == "measured" else None)
    return [eq6(p, max_running, kv_tokens, t, p0, mu_l, vbar) for t in thetas]
