"""The online cost fits: what the daemon learns of an engine's iteration costs from its reports.

Per batch kind a bounded window of (features, seconds) rows (:data:`ebctl.costmodel.FEATURES`; ``switched``
from the engine's previous non-idle report), fitted with :func:`ebctl.costmodel.fit_phase` and judged by
:func:`ebctl.costmodel.judge` (held-out median relative error ≤ ``max_rel_err``, no worse than the mean).
The paper's α/β (Eq. 3, 5, 6, 8) then come from ONE source at a time (:meth:`OnlineCosts.choose`): the
profile's numbers until every fit the operator's mode needs has passed, then the online fits for all of
them, never a profile number on one side of an equation and an online one on the other.

Pure: numpy only, no I/O, no clock.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgspec
import numpy as np

from ebctl import model
from ebctl.costmodel import (
    FEATURES,
    MAX_REL_ERR,
    MIN_SAMPLES,
    IterationCosts,
    PhaseFit,
    Quality,
    Shape,
    fit_phase,
    paper_costs,
    report_features,
    shape,
)
from ebctl.protocol import BatchKind, IterationReport

KINDS = (BatchKind.PREFILL, BatchKind.DECODE, BatchKind.MIXED)
_REFIT_SHARE = 10  # refit a kind once 1/10 of its window is new: a fit of a full window is too dear for every update
# A decode intercept under this share of the mean decode step is not identified by the batch sizes seen (the
# fit extrapolates far below them): Eq. 3's θ0 would be its artefact, and θ would swing from one fit to the next.
MIN_ALPHA_D_SHARE = 0.01


class IterationWindow:
    """The last ``capacity`` iterations of one kind: feature rows and seconds, in two ring buffers that start at
    ``FIRST_ROWS`` rows and double up to ``capacity`` (an engine that sends a few reports costs a few KB, not
    the ~240 KB of three full windows: what bounds the daemon under a flood of engine ids)."""

    FIRST_ROWS = 64

    def __init__(self, capacity: int) -> None:
        self.total = 0  # rows ever accepted
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._cap = int(capacity)
        rows = min(self._cap, self.FIRST_ROWS)
        self._x = np.zeros((rows, len(FEATURES)))
        self._y = np.zeros(rows)
        self._head = self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def capacity(self) -> int:
        return self._cap

    def add(self, row: tuple[float, ...], seconds: float) -> bool:
        """Store one iteration; False (nothing stored) unless seconds > 0 and every feature ≥ 0, all finite."""
        if not (math.isfinite(seconds) and seconds > 0) or not all(math.isfinite(v) and v >= 0 for v in row):
            return False
        if self._n == self._y.size < self._cap:  # full below capacity: never wrapped yet, so rows are in order
            rows = min(2 * self._y.size, self._cap)
            self._x = np.concatenate([self._x, np.zeros((rows - self._y.size, len(FEATURES)))])
            self._y = np.concatenate([self._y, np.zeros(rows - self._y.size)])
            self._head = self._n
        h = self._head
        self._x[h], self._y[h] = row, seconds
        self._head = (h + 1) % self._y.size
        self._n = min(self._n + 1, self._y.size)
        self.total += 1
        return True

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, seconds), oldest first (copies)."""
        if self._n < self._y.size:
            return self._x[: self._n].copy(), self._y[: self._n].copy()
        order = np.r_[self._head : self._y.size, 0 : self._head]
        return self._x[order], self._y[order]

    def resize(self, capacity: int) -> None:
        """Keep the newest min(len, capacity) rows."""
        x, y = self.rows()
        keep = min(len(y), int(capacity))
        self._alloc(capacity)
        self._x, self._y = np.zeros((max(keep, self._y.size), len(FEATURES))), np.zeros(max(keep, self._y.size))
        self._x[:keep], self._y[:keep] = x[len(y) - keep :], y[len(y) - keep :]
        self._n, self._head = keep, keep % self._y.size


class CostChoice(NamedTuple):
    """The α/β the controller uses, where they come from (``online``, ``profile:NAME``, ``default``), why, and
    the online fits taken (none unless ``source`` is ``online``)."""

    costs: model.Costs
    source: str
    reason: str
    kinds: tuple[BatchKind, ...] = ()


class OnlineCosts:
    """One engine's cost windows and fits. ``observe`` each report; ``refit`` when an update is due."""

    def __init__(self, capacity: int = 2000, max_rel_err: float = MAX_REL_ERR) -> None:
        self.max_rel_err = float(max_rel_err)
        self.windows = {k: IterationWindow(capacity) for k in KINDS}
        self.fits: dict[BatchKind, PhaseFit | None] = dict.fromkeys(KINDS)
        self.shapes: dict[BatchKind, Shape] = {k: Shape() for k in KINDS}
        self._fitted_at = dict.fromkeys(KINDS, 0)  # window.total at the last fit
        self._last_kind: BatchKind | None = None
        self.last_seen: dict[BatchKind, float] = dict.fromkeys(KINDS, -math.inf)  # wall time of the newest row

    def observe(self, r: IterationReport) -> None:
        """File the report's row under its kind; ``switched`` is 1 when the previous non-idle report of
        this engine was of another kind. A prefill report with decode rows is no kind's sample."""
        kind, last = r.kind, self._last_kind
        if kind is BatchKind.IDLE:
            return
        self._last_kind = kind
        if kind is BatchKind.PREFILL and r.decode_reqs:
            return
        if self.windows[kind].add(report_features(r, last is not None and last is not kind), r.forward_s):
            self.last_seen[kind] = r.wall_time

    def missing(self, kind: BatchKind, now: float, stale_s: float) -> str:
        """Why ``kind``'s fit cannot be trusted now: it did not pass, or its newest iteration is older than
        ``stale_s`` (EB+ probes the other mode for it, ``ebctl.probe``); empty when it is fine."""
        if not self.passed(kind):
            return f"{kind} fit missing ({self.why(kind)})"
        if now - self.last_seen[kind] > stale_s:
            return f"{kind} fit stale (no {kind} iteration for {now - self.last_seen[kind]:.0f} s)"
        return ""

    def set_params(self, capacity: int, max_rel_err: float) -> None:
        """Live reconfiguration: keeps the rows (the newest ``capacity``); every kind with rows is due for a
        refit (:meth:`due`), one per call of :meth:`refit` as always."""
        if capacity != self.windows[BatchKind.DECODE].capacity or max_rel_err != self.max_rel_err:
            for k, w in self.windows.items():
                w.resize(capacity)
                self._fitted_at[k] = w.total - len(w)  # as if the whole window were new
            self.max_rel_err = float(max_rel_err)

    def due(self) -> BatchKind | None:
        """The kind to refit next: of those with MIN_SAMPLES rows or more (fewer cannot be fitted) and
        1/``_REFIT_SHARE`` of their window new since their last fit, the one with the largest new share (the
        first in KINDS on a tie); None when no fit is due."""
        def new(k: BatchKind) -> int:
            return self.windows[k].total - self._fitted_at[k]

        due = [k for k, w in self.windows.items()
               if len(w) >= MIN_SAMPLES and new(k) >= max(1, len(w) // _REFIT_SHARE)]
        return max(due, key=lambda k: new(k) / len(self.windows[k]), default=None)

    def refit(self, *, force: bool = False) -> bool:
        """Refit the kind :meth:`due` names, if any: one kind per call, so that a controller update pays for one
        fit at most. ``force``: every kind with rows. True when a kind was refitted."""
        if force:
            kinds = [k for k, w in self.windows.items() if len(w)]
        else:
            kinds = [] if (next_kind := self.due()) is None else [next_kind]
        for k in kinds:
            w = self.windows[k]
            x, y = w.rows()
            try:
                self.fits[k] = fit_phase(x, y, k, max_rel_err=self.max_rel_err)
            except Exception as e:  # a failed fit, not a stalled controller that retries it at every report
                self.fits[k] = PhaseFit(None, Quality(False, math.nan, math.nan, 0,
                                                      f"fit failed: {type(e).__name__}: {e}"), (), len(y))
            self.shapes[k] = shape(x)
            self._fitted_at[k] = w.total
        return bool(kinds)

    def passed(self, kind: BatchKind) -> bool:
        f = self.fits[kind]
        return f is not None and f.cost is not None and f.quality.ok

    def intercept_identified(self) -> bool:
        """The decode fit passed and its intercept (α_d, ``paper_costs``) is at least MIN_ALPHA_D_SHARE of its
        mean step: below that the batch sizes seen do not pin it down, and Eq. 3 cannot use the online costs."""
        f = self.fits[BatchKind.DECODE]
        return self.passed(BatchKind.DECODE) and f.cost.intercept_s > MIN_ALPHA_D_SHARE * f.mean_s

    def why(self, kind: BatchKind) -> str:
        f = self.fits[kind]
        if f is None:
            n = len(self.windows[kind])
            return f"{n} iterations < {MIN_SAMPLES}" if n < MIN_SAMPLES else "not fitted yet"
        return f.quality.reason

    def iteration_costs(self) -> IterationCosts:
        """The passed fits (None for a kind whose fit did not pass)."""
        c = {k.value: self.fits[k].cost if self.passed(k) else None for k in KINDS}
        return IterationCosts(**c)

    def choose(self, base: model.Costs, base_source: str, *, needs_mixed: bool, enabled: bool = True) -> CostChoice:
        """The profile's costs (``base``) until the fits of prefill and decode (and mixed, when
        ``needs_mixed``: Eq. 8 of eb+) all pass; then all of them from the online fits."""
        if not enabled:
            return CostChoice(base, base_source, "online fits off (controller.cost_online = false)")
        need = [BatchKind.PREFILL, BatchKind.DECODE] + ([BatchKind.MIXED] if needs_mixed else [])
        waiting = [f"{k}: {self.why(k)}" for k in need if not self.passed(k)]
        if waiting:
            return CostChoice(base, base_source, "until the online fits pass (" + "; ".join(waiting) + ")")
        c = paper_costs(self.iteration_costs(), prefill=self.shapes[BatchKind.PREFILL],
                        decode=self.shapes[BatchKind.DECODE], mixed=self.shapes[BatchKind.MIXED])
        if not all(math.isfinite(v) and v >= 0 for v in (c.alpha_p, c.beta_p, c.beta_d)):
            return CostChoice(base, base_source, f"online fits pass but give alpha_p={c.alpha_p:.3g}, "
                              f"beta_p={c.beta_p:.3g}, beta_d={c.beta_d:.3g}")
        if not self.intercept_identified():
            return CostChoice(base, base_source, f"online fits pass but give alpha_d={c.alpha_d:.3g} s, under "
                              f"{MIN_ALPHA_D_SHARE:.0%} of the mean decode step "
                              f"({self.fits[BatchKind.DECODE].mean_s:.3g} s): the intercept is not identified at "
                              "these batch sizes, and Eq. 3 needs it")
        errs = ", ".join(f"{k} {self.fits[k].quality.median_rel_err:.1%}" for k in need)
        return CostChoice(c, "online", f"online fits passed (median held-out error: {errs})", tuple(need))

    def status(self, *choices: CostChoice) -> dict[str, Any]:
        """Per kind: ``state`` (in use by one of ``choices``, passed but not in use, failed, waiting), ``in_use``,
        ``reason``, ``n`` (iterations in the window); once fitted also ``rel_err`` (held-out median relative
        error), ``mean_rel_err`` (the mean predictor's), ``n_test``, ``mean_s``, ``features`` kept and ``coef``."""
        out: dict[str, Any] = {}
        for k in KINDS:
            f, n = self.fits[k], len(self.windows[k])
            if self.passed(k):
                state = "in use" if any(k in c.kinds for c in choices) else "passed, not in use"
            else:
                state = "failed" if f is not None and f.cost is not None else "waiting"
            d: dict[str, Any] = {"state": state, "in_use": state == "in use", "reason": self.why(k), "n": n}
            if f is not None and f.cost is not None:
                q = f.quality
                d.update(rel_err=q.median_rel_err, mean_rel_err=q.mean_rel_err, n_test=q.n_test,
                         mean_s=f.mean_s, features=list(f.features),
                         coef={name: v for name, v in msgspec.to_builtins(f.cost).items()})
            out[k.value] = d
        return out

    def fit_report(self) -> dict[str, Any]:
        """A profile's ``fit``: per kind the verdict (``ok``), the held-out errors, what was kept; and
        ``shape``, the batch shapes the paper's α/β were derived at."""
        out: dict[str, Any] = {}
        for k in KINDS:
            f = self.fits[k]
            if f is None:
                continue
            q = f.quality
            out[k.value] = {"ok": self.passed(k), "rel_err": q.median_rel_err, "mean_rel_err": q.mean_rel_err,
                            "n": f.n, "n_test": q.n_test, "mean_s": f.mean_s, "features": list(f.features),
                            "reason": q.reason}
        out["shape"] = {k.value: self.shapes[k]._asdict() for k in KINDS if self.fits[k] is not None}
        return out

