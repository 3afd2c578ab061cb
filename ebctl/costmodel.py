"""The iteration-cost model every part of ebctl shares, and the one test that says whether a fit is good.

What one engine iteration costs, from what the iteration report says it held (docs/design.md §2, "The per-iteration
contract"): per batch kind (prefill, decode, mixed) a linear function of

    x = (1, prefill_tokens, prefill_reqs, decode_reqs, decode_ctx_tokens, switched, prefill_ctx_tokens)

where ``switched`` is 1 when the previous non-idle iteration was of another kind (a decode step after a
prefill, a prefill after decode steps): the engine's cost of changing phase, if the data show one. The
intercept holds the engine's fixed per-iteration overheads (scheduling, input preparation, the weights
streamed once); the per-request terms its per-request overheads (sampling, output processing); the context
terms the attention: a decode row attends to its request's whole KV, a prompt chunk of e tokens after p
tokens of prefix to e·p + e(e + 1)/2 keys in all (``IterationReport.prefill_ctx_tokens``): the last chunk of a
long prompt costs more than its first. The paper's α/β (section 3.1) are special cases.

One model, three users: the daemon fits it online from iteration reports, ``ebctl tune calibrate`` writes
it into a profile, and the simulator prices iterations with it. A fit is used only if it passes
:func:`judge`: the median relative error of its predictions on held-out iterations is at most
``max_rel_err`` (20% by default) and no worse than predicting the training mean; a mixed fit worse than the
mean, where the mean itself passes, is replaced by the mean (a flat cost). R² is not the test:
a cost that is nearly flat in a feature (small models, CPU) is well predicted with R² ≈ 0.

Pure: numpy/scipy only, no I/O, no clock.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec
import numpy as np
from scipy.optimize import nnls

from ebctl import model
from ebctl.protocol import BatchKind, IterationReport

FEATURES = ("prefill_tokens", "prefill_reqs", "decode_reqs", "decode_ctx_tokens", "switched", "prefill_ctx_tokens")
# The features a kind's iterations can carry (a prefill holds no decode rows, a decode step no prompt).
KIND_FEATURES: dict[BatchKind, tuple[str, ...]] = {
    BatchKind.PREFILL: ("prefill_tokens", "prefill_reqs", "switched", "prefill_ctx_tokens"),
    BatchKind.DECODE: ("decode_reqs", "decode_ctx_tokens", "switched"),
    BatchKind.MIXED: ("prefill_tokens", "prefill_reqs", "decode_reqs", "decode_ctx_tokens", "switched",
                      "prefill_ctx_tokens"),
}
MAX_REL_ERR = 0.20  # the project's one threshold for a usable cost fit
MIN_SAMPLES = 20  # iterations a kind needs before it is fitted
HOLDOUT_EVERY = 5  # every 5th iteration is held out to judge the fit
_L1_ITERATIONS = 4  # reweighting passes of the final fits (more barely move the error)
_SIMPLER_WITHIN = 1.02  # drop a feature when the fit without it is at most 2% worse on held-out data
# A fit must do no worse than the mean predictor. A cost flat in every feature is fitted by a constant, which
# is the mean up to weighting, and the median error over a few hundred held-out iterations moves with the split
# alone: a fit within 10% of the mean's error counts as no worse.
_NO_WORSE_THAN_MEAN = 1.10


class PhaseCost(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Seconds per iteration of one kind: intercept + Σ coefficient · feature (all coefficients ≥ 0)."""

    intercept_s: float = 0.0
    prefill_token_s: float = 0.0
    prefill_req_s: float = 0.0
    decode_req_s: float = 0.0
    decode_ctx_token_s: float = 0.0
    switched_s: float = 0.0
    prefill_ctx_token_s: float = 0.0  # per key a prompt token attends to (0 in profiles written before it)

    def coef(self) -> np.ndarray:
        """(intercept, then one coefficient per name of :data:`FEATURES`)."""
        return np.array([self.intercept_s, self.prefill_token_s, self.prefill_req_s, self.decode_req_s,
                         self.decode_ctx_token_s, self.switched_s, self.prefill_ctx_token_s])

    def predict(self, prefill_tokens: float = 0, prefill_reqs: float = 0, decode_reqs: float = 0,
                decode_ctx_tokens: float = 0, switched: float = 0, prefill_ctx_tokens: float = 0) -> float:
        return (self.intercept_s + self.prefill_token_s * prefill_tokens + self.prefill_req_s * prefill_reqs
                + self.decode_req_s * decode_reqs + self.decode_ctx_token_s * decode_ctx_tokens
                + self.switched_s * switched + self.prefill_ctx_token_s * prefill_ctx_tokens)

    def predict_rows(self, x: np.ndarray) -> np.ndarray:
        """Seconds for each row of ``x`` (one column per name of :data:`FEATURES`)."""
        c = self.coef()
        return c[0] + np.asarray(x, dtype=float).reshape(-1, len(FEATURES)) @ c[1:]


def phase_cost(coef: np.ndarray) -> PhaseCost:
    """The PhaseCost of a coefficient vector in :meth:`PhaseCost.coef` order."""
    c = [float(v) for v in coef]
    return PhaseCost(intercept_s=c[0], prefill_token_s=c[1], prefill_req_s=c[2], decode_req_s=c[3],
                     decode_ctx_token_s=c[4], switched_s=c[5], prefill_ctx_token_s=c[6])


class IterationCosts(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One PhaseCost per batch kind; None where nothing is known (then :meth:`predict` gives NaN)."""

    prefill: PhaseCost | None = None
    decode: PhaseCost | None = None
    mixed: PhaseCost | None = None

    def phase(self, kind: BatchKind) -> PhaseCost | None:
        return {BatchKind.PREFILL: self.prefill, BatchKind.DECODE: self.decode,
                BatchKind.MIXED: self.mixed}.get(kind)

    def predict(self, kind: BatchKind, **features: float) -> float:
        """Seconds for one iteration of ``kind`` with the given :data:`FEATURES` (0 when not given)."""
        c = self.phase(kind)
        return math.nan if c is None else c.predict(**features)

    def predict_rows(self, kind: BatchKind, x: np.ndarray) -> np.ndarray:
        """Seconds for each row of ``x`` (:data:`FEATURES` columns) as iterations of ``kind`` (NaN: unknown)."""
        c = self.phase(kind)
        return np.full(len(np.asarray(x).reshape(-1, len(FEATURES))), math.nan) if c is None else c.predict_rows(x)


def report_features(r: IterationReport, switched: bool) -> tuple[float, ...]:
    """One report's :data:`FEATURES` row. ``switched``: the engine's previous non-idle iteration was of
    another kind (the caller knows the previous report; a report alone does not)."""
    return (float(r.prefill_tokens), float(r.prefill_reqs), float(r.decode_reqs), float(r.decode_ctx_tokens),
            1.0 if switched else 0.0, float(r.prefill_ctx_tokens))


class Quality(NamedTuple):
    """What :func:`judge` found: the fit's median relative error on held-out iterations, the same error
    when predicting the training mean, and the verdict (``ok``) with its reason."""

    ok: bool
    median_rel_err: float
    mean_rel_err: float  # the baseline: predicting the mean of the training iterations
    n_test: int
    reason: str


def judge(predicted: np.ndarray, actual: np.ndarray, baseline: float, *,
          max_rel_err: float = MAX_REL_ERR) -> Quality:
    """The quality test of every cost fit in the project: on held-out iterations, the median of
    |predicted − actual| / actual must be ≤ ``max_rel_err`` and not above that of predicting ``baseline``
    (the training mean) for every iteration, 10% allowed (a constant fit of a flat cost is the mean)."""
    a = np.asarray(actual, dtype=float)
    p = np.asarray(predicted, dtype=float)
    keep = np.isfinite(a) & (a > 0) & np.isfinite(p)
    a, p = a[keep], p[keep]
    if a.size == 0:
        return Quality(False, math.nan, math.nan, 0, "no held-out iterations")
    err = float(_median_rows(np.abs(p - a) / a))
    if not math.isfinite(baseline):
        return Quality(False, err, math.nan, int(a.size), f"no mean to compare with (baseline {baseline})")
    base = float(_median_rows(np.abs(baseline - a) / a))
    if err > max_rel_err:
        return Quality(False, err, base, int(a.size), f"median error {err:.1%} > {max_rel_err:.0%}")
    if err > base * _NO_WORSE_THAN_MEAN:
        return Quality(False, err, base, int(a.size), f"median error {err:.1%} above the mean's {base:.1%}")
    return Quality(True, err, base, int(a.size), f"median error {err:.1%} (mean predictor {base:.1%})")


class PhaseFit(NamedTuple):
    """A fitted PhaseCost (fitted on all samples with the kept features), its held-out quality, and the
    features kept (the others could not be supported by the data and are 0)."""

    cost: PhaseCost | None
    quality: Quality
    features: tuple[str, ...]
    n: int
    mean_s: float = math.nan  # mean seconds of the training iterations: the baseline judge() compares with


def fit_phase(x: np.ndarray, y: np.ndarray, kind: BatchKind, *, max_rel_err: float = MAX_REL_ERR,
              min_samples: int = MIN_SAMPLES) -> PhaseFit:
    """Fit one kind's PhaseCost: non-negative coefficients that minimise the relative error.

    ``x``: one row per iteration, one column per name of :data:`FEATURES`; ``y``: seconds. Every
    ``HOLDOUT_EVERY``-th iteration is held out and judged (:func:`judge`). Features with no spread are
    dropped; then each remaining feature is dropped while the fit without it is at most 2% worse on the
    held-out iterations (a simpler model the data support as well; least squares on relative error, fast).
    The kept features are then fitted on absolute relative error (:meth:`_Relative.l1`): the test is a median,
    and on a shared machine iteration times have heavy tails (slow periods when other work runs) that pull
    a least-squares fit off the typical iteration. If a mixed fit fails :func:`judge` for predicting worse
    than the training mean while the mean's own error is under ``max_rel_err``, the fit is the mean (no
    features).
    """
    x = np.asarray(x, dtype=float).reshape(-1, len(FEATURES))
    y = np.asarray(y, dtype=float)
    # Column-major: every reduction below runs down a column (several times faster than across a row-major array).
    x = np.asfortranarray(x)
    if not (np.isfinite(x).all() and (x >= 0).all() and np.isfinite(y).all() and (y > 0).all()):
        good = (y > 0) & (y < math.inf) & ((x >= 0) & (x < math.inf)).all(axis=1)  # NaN fails every comparison
        x, y = np.asfortranarray(x[good]), y[good]
    n = int(y.size)
    if n < min_samples:
        return PhaseFit(None, Quality(False, math.nan, math.nan, 0, f"{n} iterations < {min_samples}"), (), n)
    test = np.arange(n) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    spread = _spread(x)
    cols = [FEATURES.index(f) for f in KIND_FEATURES[kind] if spread[FEATURES.index(f)]]
    train = _Relative(x[~test], y[~test])  # built once: every candidate fit below selects its columns
    d_test, y_test = _design(x[test]), y[test]

    def held_out_errs(candidates: list[list[int]]) -> np.ndarray:
        """The held-out median relative error of the L2 fit on each candidate feature set (all of one size):
        the fits, predictions and medians of a round are one batch of numpy calls, not one per candidate."""
        sel = np.array([[0, *(c + 1 for c in use)] for use in candidates], dtype=np.intp).reshape(len(candidates), -1)
        coef = np.zeros((len(sel), d_test.shape[1]))  # zero for the columns a candidate leaves out
        np.put_along_axis(coef, sel, train.l2_many(sel), axis=1)
        pred = d_test @ coef.T  # (held-out iterations, candidates)
        return _median_rows(np.abs(pred.T - y_test) / y_test)

    err = float(held_out_errs([cols])[0])
    while cols:  # backward elimination: drop the first feature (in FEATURES order) the data do not need
        drops = [[d for d in cols if d != c] for c in cols]
        errs = held_out_errs(drops)
        simpler = np.flatnonzero(errs <= err * _SIMPLER_WITHIN)
        if simpler.size == 0:
            break
        cols, err = drops[simpler[0]], min(err, float(errs[simpler[0]]))
    sel = [0, *(c + 1 for c in cols)]
    coef_train = train.l1(sel)
    mean_s = float(np.mean(y[~test]))
    quality = judge(d_test[:, sel] @ coef_train, y_test, mean_s, max_rel_err=max_rel_err)
    if kind is BatchKind.MIXED and not quality.ok and quality.median_rel_err > quality.mean_rel_err <= max_rel_err:
        # No fit of the features predicts the held-out mixed iterations as well as their training mean: the cost
        # is flat as far as the data tell (the L1 constant sits below the mean on right-skewed times, and a median
        # over a few hundred held-out iterations is that sensitive), so the fit is the flat cost itself. Not for
        # prefill and decode: their slopes are Eq. 3-6's β, and a flat fit there would set them to 0 where the
        # batch sizes seen merely do not pin them down (the profile's costs stay in use instead).
        cols, sel, coef_train = [], [0], np.array([mean_s])
        quality = judge(np.full(y_test.size, mean_s), y_test, mean_s, max_rel_err=max_rel_err)
        quality = quality._replace(reason=f"flat at the training mean: {quality.reason}")
    full = np.zeros(len(FEATURES) + 1)  # the coefficients judged: fitted on the training iterations only (a
    full[sel] = coef_train  # refit on all of them would add a second fit to a controller update)
    return PhaseFit(phase_cost(full), quality, tuple(FEATURES[c] for c in cols), n, mean_s)


class Shape(NamedTuple):
    """The mean composition of one kind's iterations, what turns per-request and per-context-token costs
    into the paper's per-token and per-request β: prompt tokens per prefill row (Σ tokens / Σ prefill
    requests: a prompt split into chunks counts once per chunk), context tokens per decode row
    (Σ context / Σ decode requests), the share of iterations that changed phase, and the keys a prompt token
    attended to (Σ prefill context / Σ prompt tokens)."""

    tokens_per_prefill_req: float = math.nan
    ctx_per_decode_req: float = math.nan
    switched_frac: float = math.nan
    ctx_per_prefill_token: float = math.nan


def shape(x: np.ndarray) -> Shape:
    """The :class:`Shape` of feature rows (NaN for a ratio with nothing to divide by)."""
    x = np.asarray(x, dtype=float).reshape(-1, len(FEATURES))
    s = np.ones(len(x)) @ x  # the column sums (a row-major column sum is several times slower in numpy)

    def ratio(num: float, den: float) -> float:
        return float(num / den) if den > 0 else math.nan
    return Shape(ratio(s[0], s[1]), ratio(s[3], s[2]), ratio(s[4], len(x)), ratio(s[5], s[0]))


def paper_costs(ic: IterationCosts, *, prefill: Shape, decode: Shape, mixed: Shape | None = None) -> model.Costs:
    """The paper's α/β (section 3.1, Eq. 3-8) from the iteration-cost model, at the batch shapes observed.

    An EB cycle (appendix B.5) costs 𝒯 = α_p + β_p·(tokens admitted) + α_d·T + β_d·(request-iterations):
    α_p is what a cycle pays once, whatever its size. So

    * α_p = prefill intercept + prefill ``switched_s`` + decode ``switched_s``: a refill opens with one
      prefill iteration, and each cycle changes phase twice (decode → prefill, prefill → decode); the
      decode step after a refill pays the second switch, once per cycle like the rest of α_p. (A refill
      the engine splits into several prefill iterations pays the extra intercepts per chunk, not per cycle:
      they are not in α_p.)
    * β_p = prefill ``prefill_token_s`` + ``prefill_req_s`` / (tokens per prefill row) + ``prefill_ctx_token_s``
      × (keys per prompt token): per-request overheads spread over the prompt tokens that carry them, and the
      attention over each chunk's prefix at the prompts the prefills carried.
    * α_d = decode intercept (a decode step's fixed cost: scheduling, the weights streamed once).
    * β_d = ``decode_req_s`` + ``decode_ctx_token_s`` × (context tokens per decode row): the paper's β_d is
      per request; the attention over each request's KV enters at the context the decode steps carried.
    * Mixed (Eq. 8), when ``ic.mixed`` is known: n_tok = prefill tokens + decode rows, r = decode rows /
      n_tok, so per-token costs m_p (prefill, as β_p) and m_d (decode row, as β_d) give
      β_MB^e(r) = m_p·(1 − r) + m_d·r: c0 = m_p, c1 = m_d − m_p, c2 = 0; α_MB = mixed intercept + its
      ``switched_s`` × the share of mixed iterations that changed phase.

    A shape ratio that is NaN counts only where its coefficient is non-zero (a coefficient is non-zero only
    for a feature that varied, so the rows that give the ratio exist); α_p etc. of an unknown kind are NaN.
    """
    nan = math.nan

    def per(coef: float, ratio: float) -> float:
        return 0.0 if coef == 0 else coef * ratio

    def per_inv(coef: float, ratio: float) -> float:
        return 0.0 if coef == 0 else coef / ratio

    p, d, m = ic.prefill, ic.decode, ic.mixed
    d_switch = d.switched_s if d is not None else 0.0
    alpha_p = nan if p is None else p.intercept_s + p.switched_s + d_switch
    beta_p = nan if p is None else (p.prefill_token_s + per_inv(p.prefill_req_s, prefill.tokens_per_prefill_req)
                                    + per(p.prefill_ctx_token_s, prefill.ctx_per_prefill_token))
    alpha_d = nan if d is None else d.intercept_s
    beta_d = nan if d is None else d.decode_req_s + per(d.decode_ctx_token_s, decode.ctx_per_decode_req)
    out = model.Costs(alpha_p=alpha_p, beta_p=beta_p, alpha_d=alpha_d, beta_d=beta_d)
    if m is None:
        return out
    mixed = mixed or Shape()
    m_p = (m.prefill_token_s + per_inv(m.prefill_req_s, mixed.tokens_per_prefill_req)
           + per(m.prefill_ctx_token_s, mixed.ctx_per_prefill_token))
    m_d = m.decode_req_s + per(m.decode_ctx_token_s, mixed.ctx_per_decode_req)
    return model.Costs(alpha_p=alpha_p, beta_p=beta_p, alpha_d=alpha_d, beta_d=beta_d,
                       alpha_mb=m.intercept_s + per(m.switched_s, mixed.switched_frac), c0=m_p, c1=m_d - m_p, c2=0.0)


def _median_rows(v: np.ndarray) -> np.ndarray | float:
    """The median of each row of ``v`` (of a 1-d ``v``: its median), as ``np.median(v, axis=-1)`` computes it
    (the mean of the two middle values of an even count) for finite values, without its generic
    machinery (which costs more than the partition itself, and the cost fit takes a median per candidate)."""
    m = v.shape[-1] // 2
    if v.shape[-1] % 2:
        return np.partition(v, m, axis=-1)[..., m]
    p = np.partition(v, (m - 1, m), axis=-1)
    return (p[..., m - 1] + p[..., m]) / 2


def _spread(x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` (rows ≥ 0), whether the fit can learn from it: at least two distinct values, not
    all equal up to rounding."""
    top = x.max(axis=0)
    return (top - x.min(axis=0) > 1e-9 * np.maximum(1.0, top)) & (len(x) > 1)


def _design(x: np.ndarray) -> np.ndarray:
    """[1, x]: the intercept's column, then one per feature."""
    d = np.empty((len(x), x.shape[1] + 1), order="F")
    d[:, 0], d[:, 1:] = 1.0, x
    return d


class _Relative:
    """The relative-error problem of one set of iterations, built once: rows [1, x] / y (a fit's relative
    residuals are a·c − 1), columns scaled to their largest value for conditioning. Fits select columns
    (0: the intercept; 1 + i: ``FEATURES[i]``) and return unscaled coefficients ≥ 0 for those columns."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.ones = np.ones(len(y))
        self.a = _design(x)
        self.a /= y[:, None]
        self.scale = self.a.max(axis=0)  # every entry is ≥ 0 (fit_phase keeps rows with x ≥ 0, y > 0)
        self.scale[self.scale == 0] = 1.0
        self.a /= self.scale
        self.gram, self.h = self.a.T @ self.a, self.ones @ self.a  # aᵀa and aᵀ1: the L2 fits need no rows

    def l2(self, sel: list[int]) -> np.ndarray:
        """Minimise Σ ((a·c − y)/y)²."""
        coef = _nnls_gram(self.gram[np.ix_(sel, sel)], self.h[sel])
        if coef is None:
            coef = _nnls_reduced(self.a[:, sel], self.ones)
        return coef / self.scale[sel]

    def l2_many(self, sels: np.ndarray) -> np.ndarray:
        """:meth:`l2` for each row of ``sels`` (k column sets of one size), one row of coefficients each. The
        unconstrained minima of all k come from one batched Cholesky and solve; a set whose minimum is
        infeasible or whose aᵀa is ill-conditioned is solved alone by :meth:`l2`."""
        gram, h = self.gram[sels[:, :, None], sels[:, None, :]], self.h[sels]
        try:
            low = np.linalg.cholesky(gram)
            # Cholesky can accept an exactly singular aᵀa (two equal columns of norm² 7: its last pivot rounds
            # to +4e-16) that LU then refuses: both inside the try
            free = np.linalg.solve(gram, h[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:  # one of them is singular: solve each alone
            return np.array([self.l2(list(s)) for s in sels])
        d = np.diagonal(low, axis1=1, axis2=2)
        alone = (d.min(axis=1) <= 1e-6 * d.max(axis=1)) | (free < 0).any(axis=1)
        coef = free / self.scale[sels]
        for i in np.flatnonzero(alone):
            coef[i] = self.l2(list(sels[i]))
        return coef

    def l1(self, sel: list[int], iters: int = _L1_ITERATIONS) -> np.ndarray:
        """(Nearly) minimise Σ |a·c − y|/y: iteratively reweighted least squares, each row weighted by
        1/√|relative residual| of the previous pass (floored at 0.1%), from the L2 fit."""
        a = self.a[:, sel]
        w = self.ones
        coef = np.zeros(len(sel))
        for _ in range(iters):
            aw = a * w[:, None]
            c = _nnls_gram(aw.T @ aw, aw.T @ w)
            coef = _nnls_reduced(aw, w) if c is None else c
            w = 1.0 / np.sqrt(np.maximum(np.abs(a @ coef - 1.0), 1e-3))
        return coef / self.scale[sel]


def _nnls_gram(gram: np.ndarray, h: np.ndarray) -> np.ndarray | None:
    """min ‖a·c − b‖² over c ≥ 0 from aᵀa = L·Lᵀ and aᵀb = h alone: ‖a·c − b‖² = ‖Lᵀc − L⁻¹h‖² + const.
    None when aᵀa is too ill-conditioned for that to be accurate (squaring the condition number): then
    the caller solves on the rows."""
    try:
        low = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        return None
    d = np.diag(low)
    if d.min() <= 1e-6 * d.max():
        return None
    try:
        free = np.linalg.solve(gram, h)
    except np.linalg.LinAlgError:
        return None
    if (free >= 0).all():  # the unconstrained minimum is feasible, so it is the constrained one (convex)
        return free
    coef, _ = nnls(low.T, np.linalg.solve(low, h), maxiter=50 * len(h))
    return coef


def _nnls_reduced(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``scipy.optimize.nnls(a, b)`` on the k × k triangle of a's QR instead of its m rows: with a = QR,
    ‖a·c − b‖² = ‖R·c − Qᵀb‖² + ‖b − QQᵀb‖², the last term free of c, so both have the same minimisers
    (rank-deficient columns included)."""
    q, r = np.linalg.qr(a)
    coef, _ = nnls(r, q.T @ b, maxiter=50 * a.shape[1])
    return coef
