"""Whole-iteration costs from an engine's own iteration reports: what calibrates the simulator on a real engine
(``tools/sim_vs_real.py``) and what the daemon's ``calibrate`` op writes into a cost profile.

The simulator's clock advances by whole iterations, so what it needs is each iteration's *period*: from the
end of one iteration to the end of the next, the scheduler's planning, the forward pass and the result
processing together (the engine's overheads included), not the forward pass alone (``forward_s``, which
the daemon's online fit uses for the paper's α/β). A report's ``wall_time`` is stamped after its result was
processed, so the period of report i is ``wall_time[i] − wall_time[i−1]`` when both are consecutive
non-idle iterations of one engine (``seq`` + 1, the engine busy in between). With sglang's overlap loop a
report's wall time closes the *next* batch's forward, so calibration runs use ``--disable-overlap-schedule``
(on a CPU, where the forward runs on the scheduler's own core, overlap hides nothing anyway).

Each kind (prefill, decode, mixed) is fitted with :func:`ebctl.costmodel.fit_phase` (the project's one fit
and its held-out judgement, :func:`ebctl.costmodel.judge`), on the same features as the daemon:
prefill tokens, prefill requests, decode requests, decode context tokens, ``switched`` (the previous
non-idle iteration was of another kind), and prefill context tokens (:func:`ebctl.costmodel.report_features`).

Pure: lists of reports in, numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from ebctl.costmodel import FEATURES, IterationCosts, PhaseFit, fit_phase, phase_cost, report_features
from ebctl.protocol import BatchKind, IterationReport

KINDS = (BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED)
MAX_PERIOD_S = 5.0  # a gap longer than this between two reports is not one iteration (the engine waited)


class Samples(NamedTuple):
    """Per kind: feature rows (:data:`FEATURES` order) and the seconds each iteration took."""

    x: dict[BatchKind, np.ndarray]
    y: dict[BatchKind, np.ndarray]


def periods(runs: Iterable[Sequence[IterationReport]], *, seconds: str = "period") -> Samples:
    """The samples of one or more runs (each a list of one engine's reports in order).

    ``seconds="period"``: the iteration's period (module docstring); ``"forward"``: its ``forward_s``."""
    if seconds not in ("period", "forward"):
        raise ValueError(f"seconds={seconds!r}: 'period' or 'forward'")
    xs: dict[BatchKind, list[list[float]]] = {k: [] for k in KINDS}
    ys: dict[BatchKind, list[float]] = {k: [] for k in KINDS}
    for reports in runs:
        prev: IterationReport | None = None
        last_kind: BatchKind | None = None
        for r in sorted(reports, key=lambda r: r.seq):
            if r.kind is BatchKind.IDLE:
                prev, last_kind = None, None
                continue
            switched = last_kind is not None and last_kind is not r.kind
            if seconds == "forward":
                y = r.forward_s
            elif prev is not None and r.seq == prev.seq + 1:
                y = r.wall_time - prev.wall_time
            else:
                y = -1.0
            if 0.0 < y <= MAX_PERIOD_S:
                xs[r.kind].append(report_features(r, switched))
                ys[r.kind].append(y)
            prev, last_kind = r, r.kind
    return Samples({k: np.array(v, dtype=float).reshape(-1, len(FEATURES)) for k, v in xs.items()},
                   {k: np.array(v, dtype=float) for k, v in ys.items()})


class Calibration(NamedTuple):
    """The fitted costs (a kind with too few samples: None) and each kind's fit."""

    costs: IterationCosts
    fits: dict[BatchKind, PhaseFit]

    def summary(self) -> dict[str, dict]:
        """JSON-able fit quality per kind (the profile's ``fit`` shape)."""
        out = {}
        for kind, f in self.fits.items():
            q = f.quality
            out[str(kind)] = {"ok": q.ok, "rel_err": q.median_rel_err, "mean_rel_err": q.mean_rel_err,
                              "n": f.n, "n_test": q.n_test, "features": list(f.features), "reason": q.reason}
        return out


def fit(samples: Samples) -> Calibration:
    """Fit every kind with :func:`ebctl.costmodel.fit_phase`, then scale each kind's coefficients so that its
    predicted total time equals the measured total over the same iterations.

    fit_phase minimises *relative* error (what its judgement tests); on the right-skewed timings of a real engine (an
    iteration now and then several times its median: the OS, the Python GC, other processes) that fit sits near the
    typical iteration and below the mean, and a simulator adding up such iterations runs fast. The shape (which
    features, their ratios) is fit_phase's; the level is the mean's. A kind whose fit fails the judgement is kept (the
    simulator needs a cost for every kind) and its verdict is in :meth:`summary`."""
    fits, kept = {}, {}
    for kind in KINDS:
        f = fit_phase(samples.x[kind], samples.y[kind], kind)
        if f.cost is not None:
            pred = float(np.sum(f.cost.predict_rows(samples.x[kind])))
            scale = float(np.sum(samples.y[kind])) / pred if pred > 0 else 1.0
            f = f._replace(cost=phase_cost(f.cost.coef() * scale))
        fits[kind], kept[str(kind)] = f, f.cost
    return Calibration(IterationCosts(**kept), fits)
