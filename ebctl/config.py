"""One typed configuration: a TOML file (default /etc/ebctl/ebctl.toml) overridden by CLI flags.

Every key has a type, a default, an allowed range or set, and a one-line doc (``SPECS``). Errors name the
key, the value and what is allowed. The controller's defaults live in ``ControllerParams`` (one source);
this module adds the daemon's keys and the validation. ``ebctl config show`` prints ``to_toml(load(...))``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebctl.params import ControllerParams
from ebctl.sbs.types import SbsParams, parse_ranks

DEFAULT_PATH = "/etc/ebctl/ebctl.toml"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Spec:
    type: type
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    default_doc: str = ""  # how the reference shows a default computed at start-up (e.g. from the environment)

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is bool:
            return "true or false"
        parts = [self.type.__name__]
        if self.lo is not None:
            parts.append(f">= {self.lo}")
        if self.hi is not None:
            parts.append(f"<= {self.hi}")
        return " ".join(parts)


def default_runtime_dir() -> str:
    """systemd's RuntimeDirectory when set, else a per-user directory (created 0700 by the daemon)."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return os.environ["RUNTIME_DIRECTORY"].split(":")[0]
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return str(Path(base) / f"ebctl-{os.getuid()}")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    runtime_dir: str = field(default_factory=default_runtime_dir)
    telemetry_endpoint: str = ""  # "" → ipc://{runtime_dir}/telemetry.sock
    policy_endpoint: str = ""  # "" → ipc://{runtime_dir}/policy.sock
    control_endpoint: str = ""  # "" → ipc://{runtime_dir}/control.sock
    curve_server_key: str = ""  # secret key file (ebctl keygen) for tcp:// endpoints
    curve_client_key: str = ""  # the client's secret key file; its public half must be in curve_authorized
    curve_authorized: str = ""  # directory or file of client public keys allowed to connect
    insecure: bool = False  # allow plaintext tcp:// (never do this off a trusted network)
    metrics_port: int = 0  # 0: no Prometheus exporter
    metrics_host: str = "127.0.0.1"
    profile: str = ""  # cost profile name or file; "" → defaults, then the online fit
    node: str = ""  # node name prefixed to engine ids in status
    republish_s: float = 2.0  # re-send every policy at least this often (must stay below policy_ttl)
    engine_gone_s: float = 10.0  # an engine silent this long is shown gone (idle servers report every 2 s)
    log_level: str = "info"
    # Bounds on what peers send (``ebctl.bounds``): a report beyond one is refused and counted by bound.
    max_engines: int = 256
    max_string: int = 1024
    max_finished: int = 16384
    recent_bytes: int = 4 << 20
    max_running_limit: int = 1 << 20
    max_kv_tokens: int = 1 << 40
    allow_long_ttl: bool = False


_DAEMON_SPECS: dict[str, Spec] = {
    "runtime_dir": Spec(str, "directory of the ipc sockets, created with mode 0700",
                        default_doc="$RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/ebctl-UID or /tmp/ebctl-UID"),
    "telemetry_endpoint": Spec(str, "engines' reports come in here (PULL); empty: ipc in runtime_dir"),
    "policy_endpoint": Spec(str, "policies go out here (PUB, topic = engine id); empty: ipc in runtime_dir"),
    "control_endpoint": Spec(str, "status/tune/reload requests (REP); empty: ipc in runtime_dir"),
    "curve_server_key": Spec(str, "CURVE secret key file of the daemon, required for tcp:// endpoints"),
    "curve_client_key": Spec(str, "CURVE secret key file used by links and the CLI over tcp://"),
    "curve_authorized": Spec(str, "file or directory of client public keys allowed over tcp://"),
    "insecure": Spec(bool, "allow plaintext tcp:// endpoints (refused otherwise)"),
    "metrics_port": Spec(int, "Prometheus exporter port; 0 disables it", 0, 65535),
    "metrics_host": Spec(str, "address the exporter binds (keep it on localhost)"),
    "profile": Spec(str, "cost profile preset name (e.g. qwen3-8b/h200) or file; seeds the online fit"),
    "node": Spec(str, "node name shown with each engine id"),
    "republish_s": Spec(float, "re-send each engine's policy at least this often (s)", 0.05, 3600),
    "engine_gone_s": Spec(float, "an engine that has not reported for this long (s) is shown gone in status and "
                               "metrics (an idle sglang server reports every 2 s)", 1, 86_400),
    "log_level": Spec(str, "daemon log level", choices=("debug", "info", "warning", "error")),
    "max_engines": Spec(int, "engine ids the daemon keeps state for; reports from further ids are refused",
                        1, 65536),
    "max_string": Spec(int, "longest string a report may carry (characters): engine id, reasons, finish "
                            "reasons", 128, 1 << 20),
    "max_finished": Spec(int, "most finished requests one report may carry", 1, 10_000_000),
    "recent_bytes": Spec(int, "bytes of recent reports kept per engine (for `tune calibrate`), besides the "
                              "4,096-report cap", 1 << 16, 1 << 30),
    "max_running_limit": Spec(int, "largest plausible running-request count or engine limit in a report",
                              1, 1 << 40),
    "max_kv_tokens": Spec(int, "largest plausible KV-cache size or token count in a report", 1, 1 << 53),
    "allow_long_ttl": Spec(bool, "allow controller.ttl_s above 600 s: a policy then outlives a dead daemon "
                                 "that long"),
}

MAX_TTL_S = 600.0  # above it, controller.ttl_s needs daemon.allow_long_ttl


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the SGLang plugin (sglang_patch) reads at start-up in each scheduler process."""

    force_version: bool = False  # run the plugin on an sglang version it was not tested with
    id_prefix: str = ""  # engine ids are "<id_prefix>/dp<rank>"; "" → daemon.node, else "dp<rank>"
    mixed_without_flag: bool = False  # mb may mix on a server started without --enable-mixed-chunk
    trace_dir: str = ""  # each scheduler rank appends its gate decisions to a file here; "" → off
    fault: str = ""  # test switch: "HOOK:N" raises inside that hook's ebctl work at its N-th call
    report_flush_s: float = 0.1  # the link's I/O thread sends queued reports this often; each wake takes the GIL


_ENGINE_SPECS: dict[str, Spec] = {
    "force_version": Spec(bool, "run the SGLang plugin on an sglang version it was not tested with"),
    "id_prefix": Spec(str, "engine ids are '<id_prefix>/dp<rank>'; empty: daemon.node, else 'dp<rank>' (the "
                           "daemon refuses a second process reporting under an id in use)"),
    "mixed_without_flag": Spec(bool, "let mb mix on a server started without --enable-mixed-chunk, where "
                                     "nothing rules mixing out (speculative decoding, prefill CUDA graphs, ...)"),
    "trace_dir": Spec(str, "diagnosis and tests: each scheduler rank appends its gate decisions (one JSON line "
                           "each) to trace.dp<D>.r<R>.jsonl here; empty: off"),
    "report_flush_s": Spec(float, "the plugin's link thread wakes this often (s) to send the iterations queued "
                                  "since; each wake takes the scheduler process's GIL", 0.001, 1.0),
    "fault": Spec(str, "tests only: 'HOOK:N' makes the plugin raise in that hook at its N-th call; 'HOOK:N@RANK' "
                       "only in the scheduler of that rank in its group (r<RANK> of the trace files); empty: never"),
}

_CONTROLLER_SPECS: dict[str, Spec] = {
    "mode": Spec(str, "eb: EB(k*, N*); eb+: eb or mb, by Eq. 8 or (theta_method measured) by measured throughput; "
                      "mb: mixed; off: stock engine",
                 choices=("eb", "eb+", "mb", "off")),
    "cold_mode": Spec(str, "mode before min_window completions are seen", choices=("off", "eb", "mb")),
    "theta_method": Spec(str, "threshold: paper = θ0 + Δθ (Eq. 3 + 5), cfr = θ0, exact-fluid = numeric, "
                              "measured = the engine's own throughput at saturation picks θ (and in eb+ the mode)",
                         choices=("paper", "cfr", "exact-fluid", "measured")),
    "window": Spec(int, "W: completions in the sliding windows", 10, 1_000_000),
    "update_every": Spec(int, "T_upd: completions between two updates", 1, 1_000_000),
    "min_window": Spec(int, "W_min: completions before the first update", 2, 1_000_000),
    "theta_default": Spec(float, "θ used before any data (cold_mode = eb)", 1e-4, 0.99),
    "theta_min": Spec(float, "lower clip of θ*", 1e-4, 0.99),
    "theta_max": Spec(float, "upper clip of θ*", 1e-4, 0.999),
    "eps": Spec(float, "allowed OOM probability ε of Eq. 6", 1e-12, 0.5),
    "n_bound": Spec(str, "batch-size bound of appendix D.5", choices=("probabilistic", "expected", "static")),
    "n_variance": Spec(str, "Eq. 6's margin v̄: measured = from the window's input and output variances, "
                            "geometric = the paper's 1/(p0²μ_L)", choices=("measured", "geometric")),
    "n_max_limit": Spec(int, "cap on N*; 0: the engine's own max running requests as reported", 0, 1_000_000),
    "n_floor_frac": Spec(float, "N* never below this share of n_max_limit", 0.0, 1.0),
    "n_min_interval_s": Spec(float, "minimum time between two changes of N (s)", 0.0, 3600),
    "kv_capacity_tokens": Spec(int, "KV capacity C in tokens; 0: as the engine reports", 0, 10**12),
    "discrete_correction": Spec(bool, "use −ln(1−p0) for p0 (appendix B.3, source 4)"),
    "min_eta_t": Spec(float, "apply Eq. 5 only when η̂ is this many standard errors above 0", 0.0, 100.0),
    "delta": Spec(float, "Eq. 8 bias δ (s/token): > 0 favours mb, < 0 favours eb", -1.0, 1.0),
    "mode_hysteresis": Spec(float, "Eq. 8 must clear its bound by this share of β_EB^w to switch (and by 2 standard "
                                   "errors of its margin)", 0.0, 10.0),
    "mode_cooldown": Spec(int, "updates between two mode switches", 0, 10_000),
    "n_obs_alpha": Spec(float, "EMA weight of N_obs (Eq. 8: running + waiting requests, up to the engine's limit)",
                        1e-6, 1.0),
    "kv_s": Spec(float, "Eq. 23 safety multiplier s_KV", 0.0, 100.0),
    "kv_f0": Spec(float, "Eq. 23 base reserve f0", 0.0, 0.6),
    "max_defer_s": Spec(float, "a request held back this long (s) forces a refill; 0: auto, defer_factor × "
                               "the expected time to free k slots", 0.0, 86_400),
    "defer_factor": Spec(float, "auto anti-starvation clock: this many times the controller's expected time "
                                "to free k slots", 1.0, 1000.0),
    "ttl_s": Spec(float, "policy lifetime at the engine (s); then stock behaviour", 0.1, 86_400),
    "cost_online": Spec(bool, "fit the iteration costs from the reports; their α/β replace the profile's once "
                        "the fits pass"),
    "predict": Spec(bool, "measured: with a profile (daemon.profile), the engine simulator ranks the arms on the "
                    "served requests, in a worker process of the daemon, before and beside the trials "
                    "(docs/controller.md); false: the search runs unranked, no worker"),
    "cost_max_rel_err": Spec(float, "an online cost fit is used when its median relative error on held-out "
                             "iterations is at most this and not above the training mean's (a mixed fit worse "
                             "than the mean, where the mean passes, is the flat cost at the mean); replaces "
                             "`min_cost_r2`, which a "
                             "config file may no longer carry (refused, naming this key)", 0.01, 1.0),
    "cost_window": Spec(int, "iterations kept per batch kind for the cost fits", 20, 1_000_000),
    "cost_stale_s": Spec(float, "a cost fit with no iteration of its kind for this long is stale (eb+ probes the "
                                "other mode for it)", 1.0, 1e7),
    "probe_s": Spec(float, "eb+: one probe of the other mode, to learn its cost, lasts this long (s); 0: no probes",
                    0.0, 600.0),
    "probe_share": Spec(float, "eb+: probes take at most this share of the time", 0.0, 0.5),
    "tune_window": Spec(int, "measured: completions per measurement window (and at least one whole EB cycle)", 10,
                        1_000_000),
    "tune_window_s": Spec(float, "measured: a window also closes after this many seconds once it holds a quarter "
                                 "of tune_window (0: completions only)", 0.0, 3600.0),
    "tune_min_pairs": Spec(int, "measured: window pairs before a trial may decide", 1, 1000),
    "tune_max_pairs": Spec(int, "measured: a trial still undecided after this many pairs keeps the incumbent", 1, 1000),
    "tune_min_effect": Spec(float, "measured: a challenger must be this much faster (share) to replace the incumbent",
                            0.0, 1.0),
    "tune_step": Spec(float, "measured: the largest step of θ, in octaves (1: ×2; halved down to a quarter octave)",
                      0.25, 4.0),
    "tune_recheck": Spec(int, "measured: completions between settling and re-checking the neighbours and stock "
                              "(then twice as long, up to 8×)", 0, 100_000_000),
    "tune_explore_budget": Spec(float, "measured: share of the time the search may give up to trying arms (a "
                                       "trial starts only while what exploring cost stays under it)", 0.0, 1.0),
    "tune_theta_entry": Spec(float, "measured: the largest θ a search enters EB at from stock or mb (the closed "
                                    "forms' θ above it is reached by climbing, one won trial at a time)", 1e-4, 0.999),
    "tune_ttft_slack": Spec(float, "measured: a challenger other than stock whose TTFT p99 (the engine's, over "
                                   "its windows) exceeds stock's by more than this share does not win (10: no "
                                   "guard)", 0.0, 10.0),
    "tune_tpot_slack": Spec(float, "measured: a challenger other than stock whose TPOT p99 (the engine's, per "
                                   "request: (last − first token) / (output − 1)) exceeds stock's by more than this "
                                   "share does not win (10: no guard)", 0.0, 10.0),
    "tune_drift": Spec(float, "measured: change of the window's geometric mean input length (absolute log ratio) "
                              "that restarts the search (output length: twice this)", 0.01, 10.0),
    "slo_ttft_s": Spec(float, "latency target: time to first token (s); 0: none. With this or slo_tpot_s set, the "
                              "measured search (theta_method measured: θ, and in eb+ the mode) maximizes goodput, "
                              "the output tokens/s of the requests within every set target, and tune_ttft_slack and "
                              "tune_tpot_slack are off; status shows the attainment either way", 0.0, 86_400),
    "slo_tpot_s": Spec(float, "latency target: time per output token after the first, (last − first token) / "
                              "(output − 1) per request (s); 0: none (see slo_ttft_s)", 0.0, 3600),
    "k_override": Spec(int, "pin k (0: k̂* = ⌊θ̂*·N̂*⌋)", 0, 1_000_000),
    "n_override": Spec(int, "pin N (0: N̂* of Eq. 6), never above the engine's limit", 0, 1_000_000),
    "pd_interval_override": Spec(int, "pin sglang's --prefill-decode-interval under every policy, live (after a "
                                      "batch that prefilled, this many decode-only steps; 0: the measured search's "
                                      "pdi arm where latency targets are set, else the engine's launch value); "
                                      "applied by engines that report they can (the sglang plugin)", 0,
                                 1024),  # protocol.MAX_PD_INTERVAL
}

# Keys that existed once: refused with what replaced them (a silently ignored key would change nothing).
REMOVED_KEYS = {
    "controller.min_cost_r2": "removed: R² is not the test of a cost fit (a flat, well-predicted cost has "
                              "R² ≈ 0); use controller.cost_max_rel_err (held-out median relative error, "
                              "default 0.2) and delete this key",
}

# Staggered batch scheduling in sglang's DP controller (ebctl.sbs; the second paper's Algorithms 1-3).
_DISPATCH_SPECS: dict[str, Spec] = {
    "mode": Spec(str, "off: sglang's own --load-balance-method; sbs: buffer requests and release them in batches",
                 choices=("off", "sbs")),
    "fwd_window": Spec(int, "W_size: forward times averaged into T̄_fwd (Algorithm 1)", 1, 100_000),
    "t_default_s": Spec(float, "T_default: T̄_fwd before any forward was measured (s)", 1e-4, 60.0),
    "l_net_s": Spec(float, "L_net: dispatcher-to-rank latency in I_opt = (T̄_fwd + L_net)/N_active (s)", 0.0, 10.0),
    "watchdog_factor": Spec(float, "a target silent this many T̄_fwd after a release is lost (paper: 5)", 1.0, 1000.0),
    "fixed_interval_s": Spec(float, "release interval to a lost target (s); 0: the current I_opt", 0.0, 60.0),
    "chunk_tokens": Spec(int, "C_chunk: prefill tokens per rank and forward; 0: the engine's chunked prefill size",
                         0, 10_000_000),
    "n_limit": Spec(int, "N_limit: cycles a request may be left behind before it counts as overload", 0, 1_000_000),
    "iqr_k": Spec(float, "k of Algorithm 3's outlier mask Q3 + k·(Q3 − Q1) on decode KV loads", 0.0, 100.0),
    "drain_ranks": Spec(str, "DP ranks SBS sends no new request to, comma-separated ('1,3'), e.g. to drain one; "
                             "requests that name their rank still go there; empty: none"),
    "poll_s": Spec(float, "how often the DP controller reads the ranks' load snapshots while it holds or has sent "
                          "requests (s): how late it sees an end of forward", 1e-4, 1.0),
}

SPECS: dict[str, Spec] = {**{f"daemon.{k}": v for k, v in _DAEMON_SPECS.items()},
                          **{f"controller.{k}": v for k, v in _CONTROLLER_SPECS.items()},
                          **{f"engine.{k}": v for k, v in _ENGINE_SPECS.items()},
                          **{f"dispatch.{k}": v for k, v in _DISPATCH_SPECS.items()}}


@dataclass(frozen=True, slots=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    controller: ControllerParams = field(default_factory=ControllerParams)
    engine: EngineConfig = field(default_factory=EngineConfig)
    dispatch: SbsParams = field(default_factory=SbsParams)
    path: str = ""  # the file it came from ("" = none)

    def endpoint(self, which: str) -> str:
        """'telemetry' | 'policy' | 'control': the configured endpoint or the ipc default."""
        ep = getattr(self.daemon, f"{which}_endpoint")
        return ep or f"ipc://{Path(self.daemon.runtime_dir) / f'{which}.sock'}"

    def get(self, key: str) -> Any:
        section, name = key.split(".", 1)
        return getattr(getattr(self, section), name)

    def with_updates(self, updates: dict[str, Any]) -> Config:
        """A new Config with ``{"section.key": value}`` applied (strings are parsed); validated whole."""
        by_section: dict[str, dict[str, Any]] = {"daemon": {}, "controller": {}, "engine": {}, "dispatch": {}}
        for key, raw in updates.items():
            if key in REMOVED_KEYS:
                raise ConfigError(f"{key}={raw!r}: {REMOVED_KEYS[key]}")
            spec = SPECS.get(key)
            if spec is None:
                raise unknown_key(key)
            section, name = key.split(".", 1)
            by_section[section][name] = coerce(key, raw)
        cfg = Config(daemon=dataclasses.replace(self.daemon, **by_section["daemon"]),
                     controller=dataclasses.replace(self.controller, **by_section["controller"]),
                     engine=dataclasses.replace(self.engine, **by_section["engine"]),
                     dispatch=dataclasses.replace(self.dispatch, **by_section["dispatch"]), path=self.path)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Cross-key rules (single keys were checked by ``coerce``)."""
        c = self.controller
        if c.theta_min > c.theta_max:
            raise ConfigError(f"controller.theta_min={c.theta_min} > controller.theta_max={c.theta_max}: "
                              "allowed: theta_min <= theta_max")
        if c.min_window > c.window:
            raise ConfigError(f"controller.min_window={c.min_window} > controller.window={c.window}: "
                              "allowed: min_window <= window")
        try:
            parse_ranks(self.dispatch.drain_ranks)
        except ValueError as e:
            raise ConfigError(f"dispatch.drain_ranks={self.dispatch.drain_ranks!r}: {e}; allowed: DP rank ids "
                              "separated by commas, e.g. '1,3'") from None
        if c.tune_min_pairs > c.tune_max_pairs:
            raise ConfigError(f"controller.tune_min_pairs={c.tune_min_pairs} > controller.tune_max_pairs="
                              f"{c.tune_max_pairs}: no trial could ever decide; allowed: tune_min_pairs <= "
                              "tune_max_pairs")
        if c.k_override and c.n_override and c.k_override > c.n_override:
            raise ConfigError(f"controller.k_override={c.k_override} > controller.n_override={c.n_override}: "
                              "k idle slots out of fewer slots; allowed: k_override <= n_override (or 0)")
        if c.ttl_s > MAX_TTL_S and not self.daemon.allow_long_ttl:
            raise ConfigError(f"controller.ttl_s={c.ttl_s}: above {MAX_TTL_S:.0f} s, an engine would keep this "
                              "policy that long after the daemon died; set daemon.allow_long_ttl = true to mean it")
        if self.daemon.republish_s >= c.ttl_s:
            raise ConfigError(f"daemon.republish_s={self.daemon.republish_s} >= controller.ttl_s={c.ttl_s}: "
                              "policies would expire between re-sends; allowed: republish_s < ttl_s")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {"daemon": dataclasses.asdict(self.daemon), "controller": dataclasses.asdict(self.controller),
                "engine": dataclasses.asdict(self.engine), "dispatch": dataclasses.asdict(self.dispatch)}


def unknown_key(key: str) -> ConfigError:
    """The error for a key not in SPECS: the closest known keys (difflib), not all of them."""
    name = key.rpartition(".")[2]
    close = [k for k in SPECS if k.rpartition(".")[2] == name]  # the right name in another section
    close = close or difflib.get_close_matches(key, SPECS, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else "`ebctl config show` lists every key"
    return ConfigError(f"unknown key {key!r}: {hint}")


def assignment(item: str) -> tuple[str, str, Any]:
    """``KEY=VALUE`` as a command line gives it (``tune set``, the A/B tool's configurations): the key, the value's
    text and the value checked against the key's spec, each stripped; a ConfigError names what is wrong."""
    key, sep, text = item.partition("=")
    key, text = key.strip(), text.strip()
    if not sep or not key:
        raise ConfigError(f"{item!r}: expected KEY=VALUE, e.g. controller.mode=eb+")
    if key not in SPECS:
        raise unknown_key(key)
    return key, text, coerce(key, text)


def coerce(key: str, raw: Any) -> Any:
    """Parse (from a CLI string) or check (from TOML) one value against its spec."""
    spec = SPECS[key]

    def bad(why: str = "") -> ConfigError:
        return ConfigError(f"{key}={raw!r}: {why + '; ' if why else ''}allowed: {spec.allowed()}")

    val = raw
    if isinstance(raw, str) and spec.type is not str:
        s = raw.strip().lower()
        try:
            if spec.type is bool:
                if s not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise bad()
                val = s in ("true", "1", "yes", "on")
            elif spec.type is int:
                val = int(s.replace("_", ""))
            else:
                val = float(s)
        except ValueError:
            raise bad() from None
    if spec.type is float and isinstance(val, int) and not isinstance(val, bool):
        val = float(val)
    if not isinstance(val, spec.type) or (spec.type is int and isinstance(val, bool)):
        raise bad(f"expected {spec.type.__name__}")
    if spec.type is float and not math.isfinite(val):
        raise bad("not finite")
    if spec.choices and val not in spec.choices:
        raise bad()
    if (spec.lo is not None and val < spec.lo) or (spec.hi is not None and val > spec.hi):
        raise bad("out of range")
    return val


def from_toml(text: str, *, path: str = "") -> Config:
    where = f" in {path}" if path else ""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML{where}: {e}") from e
    updates: dict[str, Any] = {}
    for section, table in doc.items():
        if section not in ("daemon", "controller", "engine", "dispatch") or not isinstance(table, dict):
            raise ConfigError(f"unknown section [{section}]{where}: allowed: [daemon], [controller], [engine], "
                              "[dispatch]")
        for k, v in table.items():
            updates[f"{section}.{k}"] = v
    try:
        return dataclasses.replace(Config(path=path), path=path).with_updates(updates)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None


def load(path: str | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """The file (if given; a missing default path is fine, a missing explicit path is an error), then
    the overrides (``{"controller.mode": "eb+"}``), validated together."""
    cfg = Config()
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path}: not found")
        cfg = from_toml(read_text(p), path=str(p))
    elif Path(DEFAULT_PATH).is_file():
        cfg = from_toml(read_text(Path(DEFAULT_PATH)), path=DEFAULT_PATH)
    return cfg.with_updates(overrides or {})


def read_text(path: Path) -> str:
    """A config file's text; ConfigError (naming the byte) when it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config file {path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}, "
                          f"line {line}); TOML files are UTF-8") from None


def to_toml(cfg: Config, *, docs: bool = True) -> str:
    """The effective configuration as TOML, each key with its doc and allowed values."""
    lines: list[str] = []
    for section, values in cfg.as_dict().items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            spec = SPECS.get(f"{section}.{k}")
            if spec is None:
                continue
            if docs:
                lines.append(f"# {spec.doc} ({spec.allowed()})")
            lines.append(f"{k} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- the reference (docs/configuration.md) ------------------------------------------------------------------

REFERENCE_PATH = "docs/configuration.md"
REFERENCE_COMMAND = "python tools/gen_config_doc.py"

_REFERENCE_HEAD = f"""# Configuration

Every key, with its default, what is allowed and what it does. This file is generated from the key
specifications in [`ebctl/config.py`](../ebctl/config.py) (`SPECS`) by `{REFERENCE_COMMAND}`;
`tests/unit/test_config.py` fails when it is stale. Edit the specifications, not this file.

One TOML file (`/etc/ebctl/ebctl.toml` by default; an example with every key documented is
[`systemd/ebctl.toml.example`](../systemd/ebctl.toml.example)), overridden by `--set KEY=VALUE`; live changes
with `ebctl tune set` (`ebctl config show --daemon` prints what the running daemon uses). A value is checked
against its key's type and range; a refused value changes nothing, and the message names the key, the value and
what is allowed. The controller's keys follow the paper's Algorithm 1 (appendix D.7); defaults are the paper's
code's where it had one (W = 500, T_upd = 100, W_min = 30, θ ∈ [0.01, 0.80], ε = 0.01, N floor = limit/10, N
changes every 2 s at most). Where a default departs from the paper, and the controller's other decisions beyond
it: [controller.md](controller.md#decisions-beyond-the-paper).
"""

_REFERENCE_SECTIONS = {
    "daemon": "The daemon: its sockets and keys, the exporter, the cost profile, and the bounds on what peers send.",
    "controller": "The controller, one per engine: the mode, the threshold and batch cap, the cost fits and the "
                  "measured search ([controller.md](controller.md)).",
    "engine": "What the SGLang plugin reads at start-up in each scheduler process.",
    "dispatch": "Staggered batch scheduling in sglang's data-parallel controller ([sbs.md](sbs.md)).",
}


def _md_cell(text: str) -> str:
    """Table-cell text: pipes escaped, and ``<name>`` kept visible (not read as an HTML tag)."""
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text.replace("|", "\\|"))


def reference_markdown() -> str:
    """docs/configuration.md: per section, every key of ``SPECS`` with its default, what is allowed and its doc;
    then the keys a file may no longer carry (``REMOVED_KEYS``). Pure: the file is written by
    ``python tools/gen_config_doc.py``, and a test compares it with this."""
    defaults = Config()
    out = [_REFERENCE_HEAD]
    for section, about in _REFERENCE_SECTIONS.items():
        out += [f"## [{section}]", "", about, "", "| key | default | allowed | what |", "|---|---|---|---|"]
        for key, spec in SPECS.items():
            if key.partition(".")[0] != section:
                continue
            value = defaults.get(key)
            default = spec.default_doc or (f'"{value}"' if isinstance(value, str) else repr(value))
            out.append(f"| `{key}` | {_md_cell(default)} | {_md_cell(spec.allowed())} | {_md_cell(spec.doc)} |")
        out.append("")
    out += ["## Removed keys", "", "A file or flag that still carries one of these is refused with this message:", ""]
    out += [f"- `{key}`: {_md_cell(why)}" for key, why in REMOVED_KEYS.items()]
    return "\n".join(out) + "\n"
