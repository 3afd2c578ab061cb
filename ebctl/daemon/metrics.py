"""Prometheus view of the daemon: a Collector that reads the controllers when scraped.

Nothing is pushed or cached: ``collect()`` reads each engine's current policy, estimates, costs and
counters, and each dispatcher's latest report, from the records it was given (``records``, ``dispatch``).
The daemon registers it on its own ``CollectorRegistry`` and serves that registry over HTTP only when
``daemon.metrics_port`` > 0 (bound to ``daemon.metrics_host``, localhost by default).
Tests read samples with ``registry.get_sample_value``.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ebctl import fleet
from ebctl.config import DaemonConfig
from ebctl.daemon.dispatch import DispatchSide
from ebctl.daemon.records import Counters, Engine
from ebctl.protocol import Mode

PREFIX = "ebctl"
# estimate fields exported as one gauge each: name → help
ESTIMATE_GAUGES = {
    "theta0": "CFR base threshold θ̂0 (Eq. 3)",
    "delta_theta": "IFR correction Δθ (Eq. 5)",
    "theta_star": "refill threshold θ̂* = k/N",
    "n_star": "memory-safe batch size N̂* (Eq. 6)",
    "p0": "hazard intercept p̂0 (1/token)",
    "eta": "hazard slope η̂ (1/token²)",
    "fit_r2": "weighted R² of the hazard fit",
    "mu_l": "mean input length μ̂_L (tokens)",
    "mu_o": "mean output length μ̂_O (tokens)",
    "eb_lhs": "Eq. 8 left side β_MB^e(r) − β_EB^w (s/token)",
    "eb_rhs": "Eq. 8 right side, δ included (s/token)",
}


class DaemonCollector(Collector):
    """Gauges and counters per engine id and dispatcher, and the daemon's counters, read at scrape time from the
    daemon's records (the same objects the loop updates); ``restarts``: how many times ``ebctl start``
    restarted the daemon."""

    def __init__(self, engines: dict[str, Engine], dispatch: DispatchSide, counters: Counters, restarts: int,
                 daemon_cfg: Callable[[], DaemonConfig]) -> None:
        self._engines, self._dispatch, self._counters, self._restarts = engines, dispatch, counters, restarts
        self._daemon_cfg = daemon_cfg  # the daemon section in force now (node and engine_gone_s are live)

    def collect(self) -> Iterator[Metric]:
        engines = list(self._engines.items())  # one atomic copy: the loop may add engines meanwhile
        mono = time.monotonic()
        d = self._daemon_cfg()
        up = GaugeMetricFamily(f"{PREFIX}_engine_up", "1 while the engine reports (an idle one every 2 s), 0 once "
                               "silent for daemon.engine_gone_s", labels=["engine"])
        info = GaugeMetricFamily(f"{PREFIX}_engine_info", "1 per engine: the node, server and DP rank its id names "
                                 "(for selecting by node and server)", labels=["engine", "node", "server", "rank"])
        node = d.node or socket.gethostname()
        for eid, eng in engines:
            w = fleet.where(eid, d.node)
            up.add_metric([eid], 0.0 if fleet.gone(mono - eng.last_report, d.engine_gone_s) else 1.0)
            info.add_metric([eid, node, w.server, w.rank], 1.0)
        yield from (up, info)

        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["engine", *labels])

        est_g = {k: gauge(k, doc) for k, doc in ESTIMATE_GAUGES.items()}
        k_g, n_g = gauge("k", "refill threshold k (free slots)"), gauge("n_max", "batch cap N in force")
        n_obs = gauge("n_obs", "EMA of the running batch size N_obs")
        kv_g = gauge("kv_reserve_frac", "KV reserve fraction (Eq. 23)")
        pdi_g = gauge("pd_interval", "sglang's prefill-decode interval the policy asks for (0: the launch value)")
        mode_g = gauge("mode", "1 for the mode in force, 0 for the others", "mode")
        ver_g = gauge("policy_version", "version of the current policy")
        age_g = gauge("last_report_age_seconds", "seconds since the engine's last report")
        cost_g = gauge("cost", "iteration-cost coefficient in use (s, s/token or s/request)", "coef")
        err_g = gauge("cost_fit_rel_err", "held-out median relative error of the online cost fit (NaN: not fitted)",
                      "phase")
        use_g = gauge("cost_fit_in_use", "1 when the online cost fit of this phase gives the costs in use", "phase")
        reports = CounterMetricFamily(f"{PREFIX}_reports", "iteration reports received", labels=["engine"])
        updates = CounterMetricFamily(f"{PREFIX}_policy_updates", "policy recomputations", labels=["engine"])
        gaps = CounterMetricFamily(f"{PREFIX}_seq_gaps", "reports missing from the seq sequence",
                                   labels=["engine"])
        gate = CounterMetricFamily(f"{PREFIX}_gate_decisions", "the engine's phase-gate decisions by reason "
                                   "(threshold, starvation and idle are the refills)", labels=["engine", "reason"])
        defer_g = gauge("max_defer_seconds", "anti-starvation bound in the policy (auto: defer_factor × the "
                        "expected time to free k slots)")
        group_g = gauge("group_size", "scheduler ranks applying this engine's policy together (TP × CP × PP)")
        arm_g = gauge("tuner_theta", "measured θ: the arm running (NaN: stock or mb) and the incumbent", "which")
        arm_mode = gauge("tuner_arm", "measured θ: 1 for the kind of arm running (stock, mb, eb, pdi), 0 for the "
                                      "others", "kind")
        trials = CounterMetricFamily(f"{PREFIX}_tuner_trials", "measured θ: trials by outcome (won, lost, aborted)",
                                     labels=["engine", "outcome"])
        probes = CounterMetricFamily(f"{PREFIX}_probes", "eb+ probes of the other mode started", labels=["engine"])
        probe_s = CounterMetricFamily(f"{PREFIX}_probe_seconds", "seconds eb+ spent probing the other mode",
                                      labels=["engine"])
        tok_g = gauge("output_tokens_per_second", "output tokens/s of the requests that finished in the last minute")
        gain_g = gauge("gain_vs_stock", "measured θ: what the incumbent buys against stock (ratio − 1), by the "
                       "tuner's trials, with its 95% interval", "which")
        explore_g = gauge("exploration_cost_share", "measured θ: share of the time given up to trying arms, net "
                          "of the trial windows that ran ahead (negative: exploring gained)")
        slo_t = gauge("slo_target_seconds", "the operator's latency targets (controller.slo_ttft_s, slo_tpot_s; "
                      "0: not set)", "target")
        slo_a = gauge("slo_attainment", "share of the judged requests' output tokens within every set target "
                      "(all), or within one (ttft, tpot), over the last minute (NaN without targets)", "which")
        goodput_g = gauge("goodput_tokens_per_second", "output tokens/s of the requests within every set target, "
                          "over the last minute")
        model_g = gauge("model_predicted_gain", "with a profile: the running arm's gain against stock as the model "
                        "predicts it (ratio − 1; NaN before a ranking)")
        model_e = gauge("model_mean_abs_error", "with a profile: the model's mean |predicted − measured| ln ratio over "
                        "the decided trials it predicted on this engine (NaN before one)")
        arm_att = gauge("tuner_arm_attainment", "measured θ with targets: each arm's attainment in its last "
                        "measured window", "arm")
        for eid, eng in engines:
            ctl = eng.controller
            pol, st = ctl.policy, ctl.status()
            est = pol.estimates
            for k, g in est_g.items():  # NaN until the first recompute
                g.add_metric([eid], math.nan if est is None else float(getattr(est, k)))
            k_g.add_metric([eid], pol.k)
            n_g.add_metric([eid], pol.n_max)
            n_obs.add_metric([eid], st["n_obs"])
            kv_g.add_metric([eid], pol.kv_reserve_frac)
            pdi_g.add_metric([eid], pol.pd_interval)
            for m in Mode:
                mode_g.add_metric([eid, m.value], 1.0 if pol.mode is m else 0.0)
            ver_g.add_metric([eid], pol.version)
            age_g.add_metric([eid], mono - eng.last_report if math.isfinite(eng.last_report) else math.nan)
            costs, _ = ctl.costs()
            for name, v in dataclasses.asdict(costs).items():
                cost_g.add_metric([eid, name], v)
            for phase, fit in ctl.cost_fits().items():
                err_g.add_metric([eid, phase], fit.get("rel_err", math.nan))
                use_g.add_metric([eid, phase], 1.0 if fit["in_use"] else 0.0)
            reports.add_metric([eid], ctl.seen.reports)
            updates.add_metric([eid], ctl.updates)
            gaps.add_metric([eid], eng.seq_gaps)
            for reason, n in ctl.seen.gate_reasons.items():
                gate.add_metric([eid, reason], n)
            defer_g.add_metric([eid], pol.max_defer_s)
            group_g.add_metric([eid], ctl.seen.group_size)
            tok_g.add_metric([eid], st["output_tok_s"])
            g = st["gain"] or {}  # NaN without the measured search
            for which, key in (("estimate", "vs_stock"), ("low", "low"), ("high", "high")):
                gain_g.add_metric([eid, which], g.get(key, math.nan))
            explore_g.add_metric([eid], g.get("explore_share", math.nan))
            tu = st["tuner"]
            if tu is not None:
                arm_g.add_metric([eid, "arm"], tu["theta_arm"])
                arm_g.add_metric([eid, "incumbent"], tu["theta_incumbent"])
                kind = tu["arm"] if tu["arm"] in ("stock", "mb") else tu["arm"].split("@")[0]
                for k in ("stock", "mb", "eb", "pdi"):
                    arm_mode.add_metric([eid, k], 1.0 if k == kind else 0.0)
                for outcome in ("won", "lost", "aborted"):
                    trials.add_metric([eid, outcome], tu[outcome])
                for arm, share in ((tu.get("slo") or {}).get("arms") or {}).items():
                    arm_att.add_metric([eid, arm], share)
                m = tu.get("model") or {}
                model_g.add_metric([eid], m.get("predicted_vs_stock", math.nan))
                model_e.add_metric([eid], m.get("mean_abs_error", math.nan))
            slo = st["slo"]
            slo_t.add_metric([eid, "ttft"], slo["ttft_s"])
            slo_t.add_metric([eid, "tpot"], slo["tpot_s"])
            for which, key in (("all", "attainment"), ("ttft", "ttft_attainment"), ("tpot", "tpot_attainment")):
                slo_a.add_metric([eid, which], slo[key])
            goodput_g.add_metric([eid], slo["goodput_tok_s"])
            probes.add_metric([eid], st["probes"]["count"])
            probe_s.add_metric([eid], st["probes"]["seconds"])
        yield from (*est_g.values(), k_g, n_g, n_obs, kv_g, pdi_g, mode_g, ver_g, age_g, cost_g, err_g, use_g, reports,
                    updates, gaps, gate, defer_g, group_g, arm_g, arm_mode, trials, probes, probe_s, tok_g, gain_g,
                    explore_g, slo_t, slo_a, goodput_g, arm_att, model_g, model_e)
        c = self._counters
        rejected = CounterMetricFamily(f"{PREFIX}_rejected", "frames refused, by socket and reason",
                                       labels=["socket", "reason"])
        for reason, n in c.rejected.items():
            rejected.add_metric(["telemetry", reason], n)
        for reason, n in c.control_rejected.items():
            rejected.add_metric(["control", reason], n)
        yield rejected
        yield CounterMetricFamily(f"{PREFIX}_received", "valid iteration reports received (all engines)",
                                  value=c.received)
        yield CounterMetricFamily(f"{PREFIX}_published", "policies published with a new version", value=c.published)
        yield CounterMetricFamily(f"{PREFIX}_control_errors", "control requests answered ok=false (refused ones "
                                  "and the daemon's faults on one)", value=c.control_errors)
        yield CounterMetricFamily(f"{PREFIX}_control_refused", "control requests refused for the request's sake "
                                  "(malformed, unknown op, a tune or reload refused): the clients' mistakes",
                                  value=c.control_refused)
        yield CounterMetricFamily(f"{PREFIX}_faults", "the daemon's own errors on one frame, request or reload "
                                  "(logged; the daemon went on)", value=c.faults)
        yield CounterMetricFamily(f"{PREFIX}_policies_refused", "policies beyond the engine's reported limits, "
                                  "replaced by stock before publishing", value=c.policies_refused)
        hs = CounterMetricFamily(f"{PREFIX}_handshake_failed", "ZMTP/CURVE handshakes refused", labels=["kind"])
        for kind, n in c.handshake_failed.items():
            hs.add_metric([kind], n)
        yield hs
        yield from dispatch_metrics(self._dispatch, mono)
        yield GaugeMetricFamily(f"{PREFIX}_engines", "engine ids known", value=len(engines))
        yield CounterMetricFamily(f"{PREFIX}_daemon_restarts", "times ebctl start restarted the daemon (this one "
                                  "included)", value=self._restarts)


# DispatchReport counters exported as ebctl_dispatch_requests{dispatcher, how}
_DISPATCH_HOW = ("arrived", "released", "passed", "overloaded", "flushed", "aborted")


def dispatch_metrics(dispatch: DispatchSide, mono: float) -> Iterator[Metric]:
    """The DP controllers' dispatchers (SBS, ``dispatch.py``): from each one's latest report and policy."""
    recs = list(dispatch.dispatchers.items())

    def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_dispatch_{name}", doc, labels=["dispatcher", *labels])

    sbs = gauge("sbs", "1 while the dispatcher holds and releases requests (SBS), 0 on sglang's own dispatch")
    buffered = gauge("buffered", "requests held in the dispatcher's buffer now")
    interval = gauge("interval_seconds", "I_opt = (T̄_fwd + L_net)/N_active in force")
    t_fwd = gauge("t_fwd_seconds", "T̄_fwd: the ranks' mean forward time the daemon published")
    spread = gauge("load_spread", "busiest rank's tokens sent over the mean rank's, over the last report period")
    hold = gauge("hold_mean_seconds", "mean time in the buffer of the requests released in the last report period")
    lost = gauge("lost_targets", "targets in the watchdog's fixed-interval mode")
    age = gauge("last_report_age_seconds", "seconds since the dispatcher's last report")
    in_flight = gauge("rank_in_flight_tokens", "tokens sent to the rank that its load snapshot does not show yet",
                      "rank")
    reqs = CounterMetricFamily(f"{PREFIX}_dispatch_requests", "requests by what the dispatcher did with them "
                               "(arrived: buffered; released: by SBS; passed, overloaded, flushed, aborted: sent by "
                               "sglang's own dispatch)", labels=["dispatcher", "how"])
    releases = CounterMetricFamily(f"{PREFIX}_dispatch_releases", "releases made", labels=["dispatcher"])
    dog = CounterMetricFamily(f"{PREFIX}_dispatch_watchdog_firings", "targets declared lost by the watchdog",
                              labels=["dispatcher"])
    sent = CounterMetricFamily(f"{PREFIX}_dispatch_rank_requests", "requests SBS released to each rank",
                               labels=["dispatcher", "rank"])
    for did, rec in recs:
        rep, pol = rec.report, rec.policy
        age.add_metric([did], mono - rec.last_report)
        t_fwd.add_metric([did], math.nan if pol is None else pol.t_fwd_s)
        if rep is None:
            continue
        sbs.add_metric([did], 1.0 if rep.state == "sbs" else 0.0)
        buffered.add_metric([did], rep.buffered)
        interval.add_metric([did], rep.interval_s)
        spread.add_metric([did], rep.load_spread)
        hold.add_metric([did], rep.hold_mean_s)
        lost.add_metric([did], rep.lost)
        for how in _DISPATCH_HOW:
            reqs.add_metric([did, how], getattr(rep, how))
        releases.add_metric([did], rep.releases)
        dog.add_metric([did], rep.watchdog_fired)
        for r in rep.rank:
            in_flight.add_metric([did, str(r.rank)], r.in_flight_tokens)
            sent.add_metric([did, str(r.rank)], r.sent_reqs)
    yield from (sbs, buffered, interval, t_fwd, spread, hold, lost, age, in_flight, reqs, releases, dog, sent)
