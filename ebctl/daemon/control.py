"""The daemon's control ops and the configuration they change.

* ``Settings``: the configuration in force and where it came from (the file and flags, the keys ``tune``
  changed on top, saved in the runtime directory for ``--resume``) and the seed costs of new controllers that
  ``daemon.profile`` names. ``core.Daemon`` reads it on every report; only the ops below replace it.
* ``ControlOps``: one method per op of ``protocol.CONTROL_OPS``: ``status`` (the daemon's counters and each
  engine's policy, estimates and costs), ``tune`` and ``reload`` (a new config, applied atomically or not at
  all), ``calibrate`` (a cost profile from an engine's online fits), ``config`` and ``shutdown``. Each takes
  the request's args and the wall-clock time and returns a ``ControlReply``; ``Daemon.handle_control``
  dispatches to them. It is built with what the ops read and change: the settings, the engines, the dispatch
  side, the counters, and a callable that stops the daemon.
* ``preflight``: the checks made before anything is bound, shared with ``ebctl config check``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ebctl import config, fleet, profiles, security
from ebctl.config import Config, ConfigError
from ebctl.controller import DEFAULT_COSTS
from ebctl.daemon.dispatch import DispatchSide
from ebctl.daemon.records import Counters, Engine
from ebctl.model import Costs
from ebctl.protocol import ACCEPTED_VERSIONS, PROTOCOL_VERSION, ControlReply, Estimates

log = logging.getLogger("ebctl.daemon")

MAX_IPC_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
# daemon.* keys a running daemon can change; the rest (sockets, keys, exporter) need a restart
LIVE_DAEMON_KEYS = frozenset({"republish_s", "log_level", "profile", "node"})
TUNED_FILE = "tuned.json"  # in the runtime directory: the keys changed by `tune`, for a restarted daemon


def load_costs(profile: str) -> tuple[Costs | None, str]:
    """The seed costs of new controllers from ``daemon.profile`` ((None, "") when unset)."""
    if not profile:
        return None, ""
    try:
        p = profiles.load(profile)
    except profiles.ProfileError as e:
        raise ConfigError(f"daemon.profile={profile!r}: {e}") from None
    return p.costs, f"profile:{p.name}"


def preflight(cfg: Config) -> None:
    """Every check of its configuration that the daemon makes before it binds anything, and
    ``ebctl config check`` makes too: the keys together, the cost profile, the endpoints and CURVE keys, the
    socket paths' length. Reads files, writes none. Not checked here: the runtime directory's owner and mode
    (they depend on the user the daemon runs as; it checks them at start). ConfigError or SecurityError."""
    cfg.check()
    load_costs(cfg.daemon.profile)
    security.check_endpoints(cfg)
    for which in security.ENDPOINTS:
        path = security.ipc_path(cfg.endpoint(which))
        if path is not None and len(os.fsencode(path)) > MAX_IPC_PATH:
            raise ConfigError(f"{cfg.endpoint(which)!r}: unix socket paths are limited to {MAX_IPC_PATH} "
                              "bytes; choose a shorter daemon.runtime_dir")


def _simulator_costs(eng: Engine) -> dict[str, Any]:
    """What the simulator needs to predict this engine (``ebctl simulate --profile FILE``): each iteration's
    whole period (planning, forward and result processing: wall time between consecutive reports), fitted per
    kind from the recent reports (``ebctl.calibrate``); the forward-only fit misses the engine's own
    overheads. {} when there are too few consecutive iterations."""
    from ebctl import calibrate

    cal = calibrate.fit(calibrate.periods([list(eng.recent)]))
    if all(c is None for c in (cal.costs.prefill, cal.costs.decode)):
        return {}
    return {"iteration_costs": msgspec.to_builtins(cal.costs), "fit": cal.summary(),
            "from": f"periods of the last {len(eng.recent)} reports"}


def _engine_status(eng: Engine, mono: float, gone_s: float) -> dict[str, Any]:
    """One engine as ``status`` shows it: its policy, estimates, costs and bookkeeping; ``gone`` once it has
    been silent for ``gone_s`` (``fleet.gone``)."""
    ctl = eng.controller
    pol = msgspec.to_builtins(ctl.policy)
    est = pol.pop("estimates", None) or msgspec.to_builtins(Estimates())
    for k in ("v", "type"):
        pol.pop(k, None)
    costs, source = ctl.costs()
    return {**pol, **est, **ctl.status(), **ctl.gate_status(),
            "costs": {**dataclasses.asdict(costs), "source": source}, "seq_gaps": eng.seq_gaps,
            "seq_jumps": eng.seq_jumps, "replayed_reports": eng.replayed,
            "duplicate_reports": eng.duplicates, "last_report_age_s": mono - eng.last_report,
            "last_update_age_s": mono - eng.last_update, "published_version": eng.published,
            "plugin_protocol": eng.protocol, "plugin_version": eng.plugin_version,
            "applied_version": eng.recent[-1].policy_version if eng.recent else -1,
            "gone": fleet.gone(mono - eng.last_report, gone_s)}


class Settings:
    """The configuration in force (``cfg``) and where it came from: ``base``, the file and flags before any
    ``tune``; ``overrides``, the flags (re-applied on reload: they beat the file, as at start); ``tuned``, the
    keys ``tune`` changed (kept across reloads that leave them alone); and ``costs``, ``cost_source``, the seed
    costs of new controllers from ``daemon.profile``."""

    def __init__(self, cfg: Config, overrides: dict[str, Any] | None = None) -> None:
        self.cfg = self.base = cfg
        self.overrides = dict(overrides or {})
        self.tuned: dict[str, Any] = {}
        self.costs, self.cost_source = load_costs(cfg.daemon.profile)

    def save_tuned(self) -> None:
        """Write the tuned keys into the runtime directory (0600, atomically), for a restarted daemon."""
        path = Path(self.cfg.daemon.runtime_dir) / TUNED_FILE
        tmp = path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.tuned, f)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("cannot save the tuned keys to %s: %s", path, e)

    def resume_tuned(self) -> None:
        """Re-apply the keys a previous daemon on this runtime directory had tuned (``--resume``); a key that
        no longer validates against the config is skipped, with a warning."""
        path = Path(self.cfg.daemon.runtime_dir) / TUNED_FILE
        try:
            saved = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("cannot read the tuned keys in %s: %s", path, e)
            return
        for key, value in (saved.items() if isinstance(saved, dict) else ()):
            try:
                if key.startswith("engine.") or (key.startswith("daemon.") and key[7:] not in LIVE_DAEMON_KEYS):
                    raise ConfigError(f"{key}: not a live key")
                new = self.cfg.with_updates({key: value})
                if key == "daemon.profile":
                    self.costs, self.cost_source = load_costs(new.daemon.profile)
                self.cfg = new
                self.tuned[key] = new.get(key)
            except ConfigError as e:
                log.warning("not resuming the tuned key %s=%r: %s", key, value, e)
        if self.tuned:
            log.info("resumed tuned keys: %s", ", ".join(f"{k}={v!r}" for k, v in self.tuned.items()))


class ControlOps:
    """The control ops, one method each (``status``, ``tune``, ``reload``, ``calibrate``, ``config``,
    ``shutdown``), over the records they are given; ``restarts``: how many times a supervisor (``ebctl start``)
    restarted the daemon; ``stop``: stops the daemon (``shutdown``); ``newer``: the engines refused for a newer
    protocol version (id → (version, monotonic time of the last report)), shown in status."""

    def __init__(self, settings: Settings, engines: dict[str, Engine], dispatch: DispatchSide, counters: Counters,
                 *, restarts: int, stop: Callable[[], None], newer: dict[str, tuple[int, float]] | None = None
                 ) -> None:
        self.settings, self.engines, self.dispatch, self.counters = settings, engines, dispatch, counters
        self.newer = {} if newer is None else newer
        self.restarts, self._stop_daemon = restarts, stop
        self.started = time.monotonic()
        self.last_reload: dict[str, Any] = {}  # the last reload's outcome, for status

    def status(self, args: dict[str, Any], now: float) -> ControlReply:
        mono = time.monotonic()
        cfg = self.settings.cfg
        d = cfg.daemon
        daemon = {"pid": os.getpid(), "uptime_s": mono - self.started, "protocol": PROTOCOL_VERSION,
                  "config_path": cfg.path, "node": d.node, "host": socket.gethostname(),
                  "engine_gone_s": d.engine_gone_s, "profile": d.profile or "(default costs)",
                  "endpoints": {w: cfg.endpoint(w) for w in security.ENDPOINTS},
                  "metrics": f"http://{d.metrics_host}:{d.metrics_port}/metrics" if d.metrics_port else "",
                  "counters": dataclasses.asdict(self.counters), "engines": len(self.engines),
                  "accepts_protocols": list(ACCEPTED_VERSIONS),
                  "newer_plugins": {eid: {"protocol": v, "last_report_age_s": mono - t}
                                    for eid, (v, t) in self.newer.items()},
                  "restarts": self.restarts, "tuned": dict(self.settings.tuned), "last_reload": dict(self.last_reload),
                  "warnings": self.warnings(mono),
                  "bounds": {k: getattr(d, k) for k in ("max_engines", "max_string", "max_finished", "recent_bytes",
                                                        "max_running_limit", "max_kv_tokens")}}
        engines = {eid: _engine_status(eng, mono, d.engine_gone_s) for eid, eng in self.engines.items()}
        return ControlReply(ok=True, data={"daemon": daemon, "engines": engines,
                                           "dispatchers": self.dispatch.status(mono)})

    def warnings(self, mono: float | None = None) -> list[str]:
        """What an operator should fix in the set-up that runs, though the daemon serves; at ``mono``, also the
        engines whose plugin is newer than this daemon, refused within the last ``daemon.engine_gone_s``."""
        d, out = self.settings.cfg.daemon, []
        if d.metrics_port and not security.is_loopback(d.metrics_host) and not d.insecure:
            out.append(f"daemon.metrics_host={d.metrics_host!r}: the exporter (engine ids, policies, rates) is "
                       "reachable off this host; bind it to 127.0.0.1, or set daemon.insecure = true to mean it")
        for eid, (v, seen) in sorted(self.newer.items()):
            if mono is None or mono - seen > d.engine_gone_s:
                continue
            out.append(f"engine {eid!r} runs a plugin of protocol {v}, newer than this daemon's {PROTOCOL_VERSION}: "
                       "its reports are refused and it runs stock; upgrade the daemon (docs/upgrade.md)")
        if self.last_reload and not self.last_reload["ok"]:
            out.append(f"the last reload ({self.last_reload['via']}) was refused, the running config stays: "
                       f"{self.last_reload['error']}")
        return out

    def tune(self, args: dict[str, Any], now: float) -> ControlReply:
        updates = args.get("updates")
        if not isinstance(updates, dict) or not updates:
            return ControlReply(ok=False, error="tune needs args {'updates': {'section.key': value, ...}}")
        s = self.settings
        try:
            new = s.cfg.with_updates(updates)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"{e}; nothing changed")
        engine_side = sorted(k for k in updates if k.startswith("engine."))
        if engine_side:  # read by each engine's plugin at its start, never sent over the bus
            return ControlReply(ok=False, error=f"{', '.join(engine_side)}: read by the engines at start-up, "
                                "not by the daemon (edit the config and restart the engine); nothing changed")
        fixed = sorted(k for k in updates if k.startswith("daemon.") and k[7:] not in LIVE_DAEMON_KEYS)
        if fixed:
            return ControlReply(ok=False, error=f"{', '.join(fixed)}: cannot change while the daemon runs "
                                "(edit the config and restart it); nothing changed")
        reply = self._apply(new, now)
        if reply.ok:
            for key in updates:  # a key tuned back to the file's value is no longer "tuned"
                if new.get(key) == s.base.get(key):
                    s.tuned.pop(key, None)
                else:
                    s.tuned[key] = new.get(key)
            s.save_tuned()
        return reply

    def reload(self, args: dict[str, Any], now: float) -> ControlReply:
        return self.reread("ebctl reload", now)

    def reread(self, via: str, now: float) -> ControlReply:
        """Reload the config file (the ``reload`` op, SIGHUP) and keep the outcome for status; one that raised is
        kept as an internal error, and the exception goes on to whoever contains it."""
        try:
            reply = self._reload(now)
        except Exception:
            self.last_reload = {"at": now, "via": via, "ok": False, "error": "internal error (logged)"}
            raise
        self.last_reload = {"at": now, "via": via, "ok": reply.ok, "error": reply.error}
        return reply

    def _reload(self, now: float) -> ControlReply:
        """Re-read ``cfg.path`` (plus the start-up overrides); a bad file leaves the running config alone.
        Keys changed by ``tune`` stay tuned unless the file changed them (then the file wins)."""
        s = self.settings
        if not s.cfg.path:
            return ControlReply(ok=False, error="the daemon was started without a config file: nothing to "
                                "reload (use tune, or restart with --config)")
        try:
            base = config.load(s.cfg.path, s.overrides)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"reload refused, the running config stays: {e}")
        running = s.cfg.daemon
        fixed = {f.name: getattr(running, f.name) for f in dataclasses.fields(running)
                 if f.name not in LIVE_DAEMON_KEYS and getattr(base.daemon, f.name) != getattr(running, f.name)}
        base = dataclasses.replace(base, daemon=dataclasses.replace(base.daemon, **fixed))
        kept = {k: v for k, v in s.tuned.items() if base.get(k) == s.base.get(k)}
        try:
            base.check()
            new = base.with_updates(kept)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"reload refused, the running config stays: {e}")
        reply = self._apply(new, now)
        if not reply.ok:
            return reply
        dropped = sorted(set(s.tuned) - set(kept))
        s.base, s.tuned = base, kept
        s.save_tuned()
        reply.data.update({"tuned_kept": sorted(kept), "tuned_replaced_by_file": dropped})
        if fixed:
            reply.data["needs_restart"] = sorted(f"daemon.{k}" for k in fixed)
        return reply

    def _apply(self, new: Config, now: float) -> ControlReply:
        """Make ``new`` the running config, atomically: everything that can fail happens first."""
        s = self.settings
        old = s.cfg
        try:
            costs, source = load_costs(new.daemon.profile) if new.daemon.profile != old.daemon.profile \
                else (s.costs, s.cost_source)
        except ConfigError as e:
            return ControlReply(ok=False, error=f"{e}; nothing changed")
        changed = {f"{sec}.{k}": [v, new.get(f"{sec}.{k}")] for sec, vals in old.as_dict().items()
                   for k, v in vals.items() if new.get(f"{sec}.{k}") != v}
        s.cfg, s.costs, s.cost_source = new, costs, source
        self.dispatch.set_window(new.dispatch.fwd_window)
        logging.getLogger("ebctl").setLevel(new.daemon.log_level.upper())
        if new.controller != old.controller or "daemon.profile" in changed:
            for eng in self.engines.values():
                if "daemon.profile" in changed:
                    eng.controller.base_costs = costs or DEFAULT_COSTS
                    eng.controller.base_cost_source = source or "default"
                    eng.controller.predictive = bool(new.daemon.profile)
                eng.controller.set_params(new.controller)
                eng.controller.update(now, at_once=True)  # recomputes now if the window allows; published by the shell
        log.info("config changed: %s", ", ".join(f"{k}={v[1]!r}" for k, v in changed.items()) or "nothing")
        return ControlReply(ok=True, data={"changed": changed})

    def calibrate(self, args: dict[str, Any], now: float) -> ControlReply:
        """A cost profile (schema 2, what ``profiles.load`` reads) from one engine's online cost fits, refitted
        now; refused until the prefill and decode fits pass ``controller.cost_max_rel_err``."""
        eid = str(args.get("engine") or "")
        if not self.engines:
            return ControlReply(ok=False, error="no engine has reported yet")
        if not eid:
            eid = max(self.engines, key=lambda e: self.engines[e].controller.seen.reports)
        if eid not in self.engines:
            return ControlReply(ok=False, error=f"no engine {eid!r}; engines: {', '.join(sorted(self.engines))}")
        online = self.engines[eid].controller.online_costs
        online.refit(force=True)
        choice = online.choose(DEFAULT_COSTS, "default", needs_mixed=False)
        if choice.source != "online":
            return ControlReply(ok=False, error=f"no good cost fit yet for engine {eid!r}: {choice.reason}")
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        prof = profiles.Profile(name=str(args.get("name") or f"calibrated-{eid}"), model=str(args.get("model", "")),
                                gpu=str(args.get("gpu", "")), costs=choice.costs,
                                source=f"ebctl calibrate: online fit of engine {eid} at {when}",
                                iteration_costs=online.iteration_costs(), fit=online.fit_report(),
                                sim=_simulator_costs(self.engines[eid]))
        return ControlReply(ok=True, data=prof.to_dict())

    def config(self, args: dict[str, Any], now: float) -> ControlReply:
        cfg = self.settings.cfg
        return ControlReply(ok=True, data={"path": cfg.path, **cfg.as_dict()})

    def shutdown(self, args: dict[str, Any], now: float) -> ControlReply:
        log.info("shutdown requested over the control socket")
        self._stop_daemon()
        return ControlReply(ok=True, data={"bye": os.getpid()})
